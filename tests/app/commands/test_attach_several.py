"""`tapdeck attach URL URL…` and `--context NAME`: the contexts file (app/server_contexts.py), the
one line that refuses bad usage naming what to fix, and the TUI on two real `tapdeck serve`
processes named as contexts, in a real terminal (tmux)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tapdeck.app.server_contexts import ServerContext, load_contexts
from tapdeck.proxy.config import write_admin_key
from tests.support.ports import free_port
from tests.support.session_env import shell_assignments
from tests.support.tapdeck_process import TAPDECK, tapdeck_serve
from tests.support.tmux_driver import Tmux, exit_code

pytestmark = pytest.mark.skipif(not TAPDECK.exists(), reason="needs the installed tapdeck console script")


def _contexts(tmp: Path, text: str) -> Path:
    path = tmp / "config" / "tapdeck" / "contexts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _attach(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TAPDECK), "attach", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "XDG_CONFIG_HOME": str(tmp / "config"),
            "TAPDECK_DATA_DIR": str(tmp / "client-data"),
            "TAPDECK_ADMIN_KEY": "a-key-for-every-url",
            **(env or {}),
        },
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_a_context_reads_its_key_from_the_one_place_it_names(tmp_path, monkeypatch):
    write_admin_key(tmp_path / "a.key", "key-in-a-file")
    write_admin_key(tmp_path / "data" / "admin.key", "key-a-server-wrote")
    monkeypatch.setenv("B_KEY", "key-in-the-env")
    path = _contexts(
        tmp_path,
        f"""
[contexts.a]
url = "gpu-a:8300"
admin_key_file = "{tmp_path / "a.key"}"
ca_file = "~/ca.pem"
[contexts.b]
url = "https://gpu-b:8300/"
admin_key_env = "B_KEY"
[contexts.here]
url = "127.0.0.1:8300"
data_dir = "{tmp_path / "data"}"
[contexts.plain]
url = "127.0.0.1:8301"
""",
    )
    contexts = load_contexts(path)
    assert [c.url for c in contexts.values()] == [
        "http://gpu-a:8300",
        "https://gpu-b:8300",
        "http://127.0.0.1:8300",
        "http://127.0.0.1:8301",
    ]
    assert contexts["a"].ca_file == Path.home() / "ca.pem"
    assert [c.admin_key() for c in contexts.values()] == [
        "key-in-a-file",
        "key-in-the-env",
        "key-a-server-wrote",
        None,  # as a URL: --admin-key, $TAPDECK_ADMIN_KEY, <data-dir>/admin.key
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[contexts.a]\nurl = 'x:1'\nadmin_key = 'secret'", "write no key in this file"),
        ("[contexts.a]\nurl = 'x:1'\nulr = 'x:1'", "unknown field 'ulr'"),
        ("[contexts.a]\nadmin_key_env = 'K'", "context 'a' has no url"),
        ("[contexts.a]\nurl = 'x:1'\nadmin_key_env = 'K'\ndata_dir = '/d'", "admin_key_env and data_dir"),
        ("[contexts.a]\nurl = 'ftp://x'", "is not an http(s) URL"),
        ("[contexts.a]\nurl = 8300", "url must be a non-empty string"),
        ("[contexts.'a/b']\nurl = 'x:1'", "a name is up to 32 letters"),
        ("[servers.a]\nurl = 'x:1'", "unknown table 'servers'"),
        ("[contexts.a\nurl = 'x:1'", "is not TOML"),
    ],
)
def test_a_contexts_file_that_is_not_well_formed_is_refused_naming_what_to_fix(tmp_path, text, why):
    path = _contexts(tmp_path, text)
    with pytest.raises(ValueError, match=re.escape(why)) as refused:
        load_contexts(path)
    assert str(path) in str(refused.value)


def test_a_context_whose_key_is_not_there_names_the_context_and_the_place(tmp_path):
    unset = ServerContext("b", "http://b:1", admin_key_env="TAPDECK_TEST_NEVER_SET")
    with pytest.raises(
        ValueError, match=r"context 'b': its admin_key_env \$TAPDECK_TEST_NEVER_SET is not set"
    ):
        unset.admin_key()
    empty_dir = ServerContext("c", "http://c:1", data_dir=tmp_path)
    with pytest.raises(ValueError, match=f"context 'c': its data_dir {tmp_path} holds no admin.key"):
        empty_dir.admin_key()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ((), "give a server's URL, or --context NAME"),
        (("--context", "nope"), "--context nope: no such context in"),
        (("127.0.0.1:9", "http://127.0.0.1:9/"), "http://127.0.0.1:9 is given twice"),
        (("http://127.0.0.1:9", "https://127.0.0.1:9"), "would both be named '127.0.0.1:9'"),
        (("127.0.0.1:9", "ftp://x"), "is not an http(s) URL"),
    ],
)
def test_attach_refuses_bad_usage_in_one_line(tmp_path, args, why):
    _contexts(tmp_path, "[contexts.known]\nurl = '127.0.0.1:9'\n")
    result = _attach(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("tapdeck attach: ") and why in line
    if "no such context" in why:
        assert "(it names: known)" in line


def test_attach_without_a_contexts_file_says_where_it_looked(tmp_path):
    result = _attach(tmp_path, "--context", "gpu-a")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert f"no contexts file at {tmp_path / 'config' / 'tapdeck' / 'contexts.toml'}" in line


def test_attach_to_several_servers_none_of_which_answers_names_them_all(tmp_path):
    first, second = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    result = _attach(tmp_path, first, second)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert f"no tapdeck server answers at {first}, {second}" in line


@pytest.mark.medium
def test_attach_names_the_server_of_several_that_refused_its_key(upstream, tmp_path):
    with tapdeck_serve(
        TAPDECK, tmp_path / "a", tmp_path / "a.log", admin_key="the-right-key-a", engine_url=upstream.base_url
    ) as served:
        write_admin_key(tmp_path / "wrong.key", "not-the-key-of-a")
        _contexts(
            tmp_path, f"[contexts.a]\nurl = '{served.url}'\nadmin_key_file = '{tmp_path / 'wrong.key'}'\n"
        )
        # The other server does not answer yet: that alone would not stop the TUI.
        result = _attach(tmp_path, f"127.0.0.1:{free_port()}", "--context", "a")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"tapdeck attach: a: the server at {served.url} rejected the admin key of context 'a' "
        f"(admin_key_file {tmp_path / 'wrong.key'}) (401)"
    )


@pytest.mark.medium
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_attach_to_two_contexts_shows_both_servers_and_quits_leaving_them_up(upstream, tmp_path):
    def serve(name: str, key: str):
        return tapdeck_serve(
            TAPDECK, tmp_path / name, tmp_path / f"{name}.log", admin_key=key, engine_url=upstream.base_url
        )

    with serve("alpha", "alpha-key-alpha-key") as alpha, serve("beta", "beta-key-beta-key") as beta:
        write_admin_key(tmp_path / "alpha.key", "alpha-key-alpha-key")
        _contexts(
            tmp_path,
            f"[contexts.alpha]\nurl = '{alpha.url}'\nadmin_key_file = '{tmp_path / 'alpha.key'}'\n"
            f"[contexts.beta]\nurl = '{beta.url}'\nadmin_key_env = 'BETA_KEY'\n",
        )
        name = f"tapdeck-attach-two-{os.getpid()}"
        rc_file = tmp_path / "rc"
        env = [
            f"XDG_CONFIG_HOME={tmp_path / 'config'}",
            f"TAPDECK_DATA_DIR={tmp_path / 'client-data'}",
            "BETA_KEY=beta-key-beta-key",
            # The tmux session has the tmux server's environment: the checkout under test, as here.
            *([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []),
        ]
        command = (
            f"env -u TAPDECK_ADMIN_KEY {shell_assignments()} {' '.join(map(shlex.quote, env))} "
            f"{TAPDECK} attach "
            f"--context alpha --context beta; echo $? > {rc_file}; sleep 60"
        )
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24", command], check=True)
        tmux = Tmux(name)
        try:
            # Neither server has a session yet: the TUI opens on Setup, which says where it starts runs.
            tmux.wait_for(re.escape("connected to alpha, beta"), 120)
            tmux.wait_for(re.escape("1 Setup on alpha"), 30)
            tmux.keys("2")
            screen = tmux.wait_for(r"server\s+session\s+task", 30)
            assert "Traceback" not in screen
            tmux.keys("q")
            assert exit_code(rc_file) == "0", tmux.screen()
            assert alpha.poll() is None and beta.poll() is None
        finally:
            subprocess.run(["tmux", "kill-session", "-t", name], check=False, capture_output=True)
