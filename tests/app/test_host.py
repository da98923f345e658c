"""LocalServer start-up rules: bind first, clear errors, nothing left running after a failure,
and a restarted server that still lists and exports what the previous one captured."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ConfigError, ServerConfig, read_admin_key
from tapdeck.proxy.http.uvicorn_thread import PortInUseError, ThreadedServer, bind_socket
from tests.support.tapdeck_process import serve_process

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def test_held_port_is_a_clear_error_naming_it(upstream, tmp_path: Path):
    holder = bind_socket("127.0.0.1", 0)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(PortInUseError, match=str(port)):
            LocalServer(ServerConfig(port=port, data_dir=tmp_path, engine_url=upstream.base_url)).start()
        assert not (tmp_path / "capture.db").exists(), "nothing may start before the port is bound"
    finally:
        holder.close()


def test_failed_later_start_step_frees_the_port(upstream, tmp_path: Path, port_factory):
    port = port_factory()
    (tmp_path / "capture.db").mkdir()  # the store cannot open a directory: a late start failure
    with pytest.raises(IsADirectoryError):
        LocalServer(ServerConfig(port=port, data_dir=tmp_path, engine_url=upstream.base_url)).start()
    bind_socket("127.0.0.1", port).close()


# uvicorn ends a failed start-up with sys.exit, here in the serving thread (which threading ignores).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_lifespan_failure_at_start_up_frees_the_port(port_factory):
    @contextlib.asynccontextmanager
    async def failing(_app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("start-up step failed")
        yield

    port = port_factory()
    with pytest.raises(RuntimeError, match="exited during start-up"):
        ThreadedServer(FastAPI(lifespan=failing), "127.0.0.1", port, name="failing").start()
    bind_socket("127.0.0.1", port).close()


def test_non_loopback_bind_without_admin_key_refused_before_binding(tmp_path: Path):
    with pytest.raises(ConfigError, match="--admin-key"):
        LocalServer(
            ServerConfig(host="0.0.0.0", port=0, data_dir=tmp_path, engine_url="http://127.0.0.1:1/v1")
        ).start()
    assert not (tmp_path / "admin.key").exists()


def test_generated_admin_key_written_and_explicit_key_used(upstream, make_server, tmp_path: Path):
    server = make_server(upstream.base_url)
    assert server.admin_key_generated
    assert read_admin_key(server.config.data_dir) == server.admin_key
    other = make_server(upstream.base_url, data_dir=tmp_path / "other", admin_key="operator-chosen")
    assert not other.admin_key_generated and other.admin_key == "operator-chosen"
    assert not (tmp_path / "other" / "admin.key").exists()
    ok = httpx.get(f"{other.url}/admin/sessions", headers={"Authorization": "Bearer operator-chosen"})
    assert ok.status_code == 200


def test_a_second_server_on_a_data_dir_leaves_the_running_ones_admin_key_file(upstream, tmp_path: Path):
    cfg = ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)
    first = LocalServer(cfg).start()
    try:
        second = LocalServer(cfg).start()
        try:
            # Clients that read admin.key (train/rollout --server) keep reaching the first server.
            assert second.admin_key_generated and not second.admin_key_written
            assert read_admin_key(tmp_path) == first.admin_key != second.admin_key
            ok = httpx.get(
                f"{second.url}/admin/sessions", headers={"Authorization": f"Bearer {second.admin_key}"}
            )
            assert ok.status_code == 200
        finally:
            second.stop()
    finally:
        first.stop()
    third = LocalServer(cfg).start()  # nothing runs there now: the file is its own
    try:
        assert third.admin_key_written and read_admin_key(tmp_path) == third.admin_key
    finally:
        third.stop()


def test_a_restarted_server_keeps_the_admin_key_its_predecessor_wrote(upstream, tmp_path: Path):
    """Clients attached to the first server (TUIs, `rollout --server`) hold its key: a restart on
    the same data dir must not lock them out."""
    cfg = ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)
    first = LocalServer(cfg).start()
    first.stop()
    second = LocalServer(cfg).start()
    try:
        assert second.admin_key == first.admin_key == read_admin_key(tmp_path)
        assert second.admin_key_kept and second.admin_key_written
        ok = httpx.get(f"{second.url}/admin/sessions", headers={"Authorization": f"Bearer {first.admin_key}"})
        assert ok.status_code == 200
    finally:
        second.stop()
    (tmp_path / "admin.key").write_text("weak\n")  # not a key a server would generate: replaced
    third = LocalServer(cfg).start()
    try:
        assert not third.admin_key_kept and third.admin_key != "weak"
        assert read_admin_key(tmp_path) == third.admin_key
    finally:
        third.stop()


@pytest.mark.medium
def test_serve_beside_a_running_server_does_not_claim_its_key_is_in_the_file(
    upstream, tmp_path: Path, port_factory
):
    first = serve_process(port_factory(), tmp_path, upstream.base_url)
    second = None
    try:
        assert "also in" in _key_line(first)
        second = serve_process(port_factory(), tmp_path, upstream.base_url)
        line = _key_line(second)
        key = line.split()[2]
        assert read_admin_key(tmp_path) != key
        assert "also in" not in line
        assert f"not written to {tmp_path / 'admin.key'}" in line
    finally:
        for proc in (second, first):
            if proc is not None:
                proc.terminate()
                proc.communicate(timeout=60)


def _key_line(proc) -> str:
    """`tapdeck serve`'s `admin key:` start-up line (its last), read from its stdout."""
    for raw in proc.stdout:
        line = raw.decode()
        if line.startswith("admin key:"):
            return line
    raise AssertionError(f"serve exited before its admin key line: {proc.stderr.read().decode()}")


@pytest.mark.medium
def test_stopping_the_server_ends_its_event_streams_cleanly_without_a_traceback(
    upstream, tmp_path: Path, caplog
):
    """Attached TUIs hold `/admin/events` open, and an agent's model call may wait on the engine: a
    Ctrl-C of `serve` cancelled each after uvicorn's grace period, with an `Exception in ASGI
    application` traceback apiece."""
    server = LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)).start()
    ended: list[str] = []
    answered: list = []
    session = httpx.post(
        f"{server.url}/admin/sessions", json={}, headers={"Authorization": f"Bearer {server.admin_key}"}
    ).json()
    upstream.delay = 120.0

    def call() -> None:
        try:
            answered.append(
                httpx.post(
                    f"{server.url}/v1/chat/completions",
                    json=CHAT,
                    timeout=120,
                    headers={"Authorization": f"Bearer {session['api_key']}"},
                )
            )
        except httpx.HTTPError as exc:
            answered.append(exc)

    def follow() -> None:
        with httpx.stream(
            "GET",
            f"{server.url}/admin/events",
            timeout=60,
            headers={"Authorization": f"Bearer {server.admin_key}"},
        ) as resp:
            try:
                for _ in resp.iter_bytes():
                    pass
                ended.append("cleanly")
            except httpx.HTTPError as exc:
                ended.append(f"cut: {exc}")

    reader, caller = threading.Thread(target=follow), threading.Thread(target=call)
    probes = len(upstream.requests)  # opening the session may have probed the engine already
    try:
        reader.start()
        caller.start()
        deadline = time.monotonic() + 60
        while server.service.events.subscriber_count == 0 or len(upstream.requests) == probes:
            assert time.monotonic() < deadline, "the event stream never opened or the call never left"
            time.sleep(0.05)
    finally:
        with caplog.at_level(logging.ERROR):
            server.stop()
    reader.join(60)
    caller.join(60)
    assert ended == ["cleanly"]
    # The call waiting on the engine is cut short with a 503 the harness can read (and retry).
    assert isinstance(answered[0], httpx.Response) and answered[0].status_code == 503, answered
    assert "stopping" in answered[0].json()["error"]["message"]
    # uvicorn's one line saying it cancelled the call is all the log has to say.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert all(e.startswith("Cancel 1 running task(s)") for e in errors), errors


@pytest.mark.medium
def test_restarted_server_lists_old_sessions_as_interrupted_and_exports_them(upstream, tmp_path: Path):
    cfg = ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)
    first = LocalServer(cfg).start()
    try:
        admin = {"Authorization": f"Bearer {first.admin_key}"}
        open_id = httpx.post(f"{first.url}/admin/sessions", json={}, headers=admin).json()
        closed = httpx.post(f"{first.url}/admin/sessions", json={}, headers=admin).json()
        for info in (open_id, closed):
            r = httpx.post(
                f"{first.url}/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {info['api_key']}"},
            )
            assert r.status_code == 200, r.text
        httpx.delete(f"{first.url}/admin/sessions/{closed['id']}", headers=admin)
    finally:
        first.stop()

    second = LocalServer(cfg).start()
    try:
        admin = {"Authorization": f"Bearer {second.admin_key}"}
        sessions = {
            s["id"]: s for s in httpx.get(f"{second.url}/admin/sessions", headers=admin).json()["sessions"]
        }
        assert sessions[open_id["id"]]["state"] == "interrupted"
        assert sessions[closed["id"]]["state"] == "closed"
        assert sessions[open_id["id"]]["turns"] == 1
        assert sessions[open_id["id"]]["last_call_at"] is not None
        # session-level findings (the probe's) survive the restart too
        findings = httpx.get(f"{second.url}/admin/sessions/{open_id['id']}", headers=admin).json()["findings"]
        assert any(f["code"] == "logprobs_mode_unknown" for f in findings)
        doc = httpx.get(f"{second.url}/admin/sessions/{open_id['id']}/rollout", headers=admin).json()
        assert doc["stats"]["turns"] == 1
        trace = httpx.get(f"{second.url}/admin/sessions/{open_id['id']}/trace", headers=admin).json()
        assert len(trace["turns"]) == 1 and trace["turns"][0]["prompt_token_ids"]
        # the old key died with the old server
        r = httpx.post(
            f"{second.url}/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {open_id['api_key']}"},
        )
        assert r.status_code == 401
    finally:
        second.stop()


def test_port_is_free_after_stop(upstream, tmp_path: Path, port_factory):
    port = port_factory()
    server = LocalServer(ServerConfig(port=port, data_dir=tmp_path, engine_url=upstream.base_url)).start()
    server.stop()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_serve_cli_refuses_public_bind_and_names_a_held_port(tmp_path: Path):
    from typer.testing import CliRunner

    from tapdeck.app.cli import app

    runner = CliRunner()
    res = runner.invoke(
        app, ["serve", "--host", "0.0.0.0", "--engine", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path)]
    )
    assert res.exit_code == 2 and "--admin-key" in res.output
    holder = bind_socket("127.0.0.1", 0)
    port = holder.getsockname()[1]
    try:
        res = runner.invoke(
            app,
            ["serve", "--port", str(port), "--engine", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path)],
        )
        assert res.exit_code == 2 and str(port) in res.output
    finally:
        holder.close()


def test_a_second_serve_on_a_held_port_says_only_that_the_port_is_held(tmp_path: Path):
    """It said it was starting the embedded engine first, which it never did."""
    from typer.testing import CliRunner

    from tapdeck.app.cli import app

    holder = bind_socket("127.0.0.1", 0)
    port = holder.getsockname()[1]
    try:
        res = CliRunner().invoke(app, ["serve", "--port", str(port), "--data-dir", str(tmp_path)])
    finally:
        holder.close()
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"tapdeck serve: cannot bind 127.0.0.1:{port}: Address already in use (is another server already "
        f"using port {port}?)"
    ]


def test_serve_cli_reads_the_admin_key_from_a_file_and_refuses_weak_ones_on_public_binds(tmp_path: Path):
    from typer.testing import CliRunner

    from tapdeck.app.cli import app

    runner = CliRunner()
    key_file = tmp_path / "admin.key.in"
    key_file.write_text("short\n")
    base = ["serve", "--host", "0.0.0.0", "--engine", "http://127.0.0.1:9/v1", "--data-dir", str(tmp_path)]
    res = runner.invoke(app, [*base, "--admin-key-file", str(key_file)])
    assert res.exit_code == 2 and "weak admin key" in res.output
    res = runner.invoke(app, [*base, "--admin-key-file", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "cannot read the admin key file" in res.output
    res = runner.invoke(app, [*base, "--admin-key-file", str(key_file)], env={"TAPDECK_ADMIN_KEY": "k" * 40})
    assert res.exit_code == 2 and "give the admin key once" in res.output
    assert not (tmp_path / "capture.db").exists()  # refused before anything was made


@pytest.mark.medium
def test_serve_freezes_what_start_up_built_and_collects_young_objects_less_often():
    import gc

    from tapdeck.app.commands.serve import YOUNG_GC_THRESHOLD, settle_collector

    before = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, *before[1:]) and YOUNG_GC_THRESHOLD > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.medium
def test_a_restarted_server_counts_each_sessions_fatal_and_warn_findings_as_before(upstream, tmp_path: Path):
    """The Sessions board marks a session by its findings (and calls one with a FATAL failed):
    a restart must not wipe those counts from the sessions it lists."""
    cfg = ServerConfig(port=0, data_dir=tmp_path, engine_url=upstream.base_url)

    def counts(server: LocalServer) -> dict[str, tuple[int, int]]:
        admin = {"Authorization": f"Bearer {server.admin_key}"}
        listed = httpx.get(f"{server.url}/admin/sessions", headers=admin).json()["sessions"]
        return {s["id"]: (s["fatal"], s["warn"]) for s in listed}

    first = LocalServer(cfg).start()
    try:
        admin = {"Authorization": f"Bearer {first.admin_key}"}
        ids = []
        for close in (True, False):
            info = httpx.post(f"{first.url}/admin/sessions", json={}, headers=admin).json()
            r = httpx.post(
                f"{first.url}/v1/chat/completions",
                json=CHAT,  # cut at 4 tokens: WARN
                headers={"Authorization": f"Bearer {info['api_key']}"},
            )
            assert r.status_code == 200, r.text
            if close:
                httpx.delete(f"{first.url}/admin/sessions/{info['id']}", headers=admin)
            ids.append(info["id"])
        before = counts(first)
    finally:
        first.stop()
    assert all(warn >= 1 for _fatal, warn in before.values()), before

    second = LocalServer(cfg).start()
    try:
        assert counts(second) == before
    finally:
        second.stop()
