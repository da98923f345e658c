"""A person's check of `tapdeck attach`: the TUI on a tapdeck server running in another process, as
over an SSH tunnel. The server is the installed `tapdeck serve`; attach runs in a real terminal (tmux)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.proxy.config import write_admin_key
from tests.support.fake_vllm import hanging_engine
from tests.support.session_env import shell_assignments
from tests.support.tapdeck_process import TAPDECK, tapdeck_serve
from tests.support.tmux_driver import Tmux, exit_code

ADMIN_KEY = "attach-test-admin-key"

pytestmark = pytest.mark.skipif(not TAPDECK.exists(), reason="needs the installed tapdeck console script")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(tmp: Path) -> dict[str, str]:
    """The child's environment: no settings or data written outside the test's tmp dir."""
    return {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "TAPDECK_DATA_DIR": str(tmp / "client-data"),
    }


@dataclass
class Served:
    url: str
    process: subprocess.Popen
    log: Path

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).json().get("status") == "ok"
        except (httpx.HTTPError, ValueError):
            return False


@pytest.fixture(scope="module")
def served(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`tapdeck serve` as its own process, on a free port, over the shared embedded engine."""
    tmp = tmp_path_factory.mktemp("serve")
    with tapdeck_serve(
        TAPDECK,
        tmp / "data",
        tmp / "serve.log",
        admin_key=ADMIN_KEY,
        engine_url=embedded_engine.base_url,
        engine_model=embedded_engine.served_name,
        env=_env(tmp),
    ) as process:
        yield Served(process.url, process, tmp / "serve.log")


def _attach(url: str, key: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TAPDECK), "attach", url, "--admin-key", key],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp),
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_attach_shows_a_remote_session_with_its_turn_and_quits_leaving_the_server_up(served, tmp_path):
    from openai import OpenAI

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    reply = httpx.post(
        f"{served.url}/admin/sessions", json={"metadata": {"task": "attached"}}, headers=admin, timeout=60
    )
    reply.raise_for_status()
    session = reply.json()
    agent = OpenAI(base_url=f"{served.url}/v1", api_key=session["api_key"], timeout=120)
    agent.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )

    name = f"tapdeck-attach-{os.getpid()}"
    rc_file = tmp_path / "rc"
    env = " ".join(
        [
            shell_assignments(),
            *(f"{k}={v}" for k, v in _env(tmp_path).items() if k in ("XDG_CONFIG_HOME", "TAPDECK_DATA_DIR")),
        ]
    )
    command = (
        f"env {env} {TAPDECK} attach {served.url} --admin-key {ADMIN_KEY}; echo $? > {rc_file}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", command], check=True)
    tmux = Tmux(name)
    try:
        tmux.wait_for(re.escape(f"connected to {served.url}"), 120)
        # The row: short id, task, state, then the turn count.
        screen = tmux.wait_for(rf"{re.escape(session['id'][:8])}\s+attached\s+\S+\s+1\b", 60)
        assert "Traceback" not in screen
        tmux.keys("q")
        code = exit_code(rc_file)
        assert code is not None, f"attach did not exit on q; screen:\n{tmux.screen()}"
        assert code == "0", tmux.screen()
        assert "Traceback" not in tmux.screen()
        # attach does not own the server: it is still running and answering.
        assert served.process.poll() is None
        assert served.healthy()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], check=False, capture_output=True)


@pytest.mark.medium
def test_attach_with_a_wrong_admin_key_exits_with_one_line_naming_the_key(served, tmp_path):
    result = _attach(served.url, "not-the-key", tmp_path)
    assert result.returncode == 1  # the server answered and refused: could not do the work
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "admin key" in lines[0] and "Traceback" not in result.stderr + result.stdout
    assert "--admin-key or $TAPDECK_ADMIN_KEY" in lines[0]
    assert served.healthy()


def test_attach_without_an_admin_key_says_where_it_looked(served, tmp_path):
    env = {k: v for k, v in _env(tmp_path).items() if k != "TAPDECK_ADMIN_KEY"}
    result = subprocess.run(
        [str(TAPDECK), "attach", served.url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert f"looked at --admin-key, $TAPDECK_ADMIN_KEY and {tmp_path / 'client-data' / 'admin.key'}" in line


@pytest.fixture(scope="module")
def served_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`tapdeck serve` with no key given, as on this machine: it generates one into its data dir
    (`$TAPDECK_DATA_DIR` of the attach commands below)."""
    tmp = tmp_path_factory.mktemp("serve-here")
    env = {**_env(tmp), "TAPDECK_DATA_DIR": str(tmp / "data")}
    env.pop("TAPDECK_ADMIN_KEY", None)
    with (
        hanging_engine() as engine,
        tapdeck_serve(
            TAPDECK, tmp / "data", tmp / "serve.log", admin_key=None, engine_url=engine.base_url, env=env
        ) as process,
    ):
        yield Served(process.url, process, tmp / "serve.log")


@pytest.mark.medium
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_attach_reads_the_admin_key_a_server_on_this_machine_wrote_in_its_data_dir(served_here, tmp_path):
    """It said "no admin key given" while `rollout --server` read the same file."""
    data = served_here.log.parent / "data"
    name = f"tapdeck-attach-here-{os.getpid()}"
    rc_file = tmp_path / "rc"
    command = (
        f"env -u TAPDECK_ADMIN_KEY {shell_assignments()} "
        f"XDG_CONFIG_HOME={tmp_path / 'config'} TAPDECK_DATA_DIR={data} "
        f"{TAPDECK} attach {served_here.url}; echo $? > {rc_file}; sleep 60"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", command], check=True)
    tmux = Tmux(name)
    try:
        tmux.wait_for(re.escape(f"connected to {served_here.url}"), 120)
        tmux.keys("q")
        code = exit_code(rc_file)
        assert code == "0", tmux.screen()
        assert "Traceback" not in tmux.screen()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], check=False, capture_output=True)


def test_attach_refused_the_key_of_its_data_dir_names_the_file_it_read(served_here, tmp_path):
    stale = tmp_path / "other-data"
    write_admin_key(stale / "admin.key", "a-key-another-server-wrote-long-ago")
    env = {k: v for k, v in _env(tmp_path).items() if k != "TAPDECK_ADMIN_KEY"}
    result = subprocess.run(
        [str(TAPDECK), "attach", served_here.url, "--data-dir", str(stale)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert f"the server rejected the admin key read from {stale / 'admin.key'}" in line


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://x", "is not an http(s) URL"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("http://127.0.0.1:0", "port 0 is out of range"),
        ("not a url", "host 'not a url' is not a host name or IP address"),
    ],
)
def test_attach_to_an_address_that_is_not_a_server_url_is_bad_usage(url, why, tmp_path):
    result = _attach(url, ADMIN_KEY, tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert why in line and "http://ftp://" not in line


@pytest.mark.medium
def test_attach_to_an_unreachable_url_exits_with_one_line_naming_the_url(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    result = _attach(url, ADMIN_KEY, tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert url in lines[0] and "Traceback" not in result.stderr + result.stdout
