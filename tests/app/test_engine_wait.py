"""A server started before its engine (issue 39): it comes up awaiting the engine, says so on
`/health` and every 10 s, answers sessions and runs on it with a 503 and Retry-After meanwhile, and
opens them on it once it answers. An address that is not one, or that answers as no engine does,
is still refused at once; a wait that runs out ends the command in one line saying how long it
waited; `rollout --server` waits with the server before it submits or resumes a run on it.

The engine is the fake vLLM, started on its port only once the server reports that it waits (as
vLLM listens only once its weights are loaded).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.commands import run_follow
from tapdeck.app.commands.run_follow import _submit, await_servers_engine
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE
from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S, ServerConfig
from tapdeck.proxy.upstream.address import EngineAddressError
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner.batch import BatchRunner, RunPlan
from tapdeck.schema.sessions import EngineWait
from tests.support.fake_vllm import FakeVllm
from tests.support.ports import free_port
from tests.support.tapdeck_process import TAPDECK, tapdeck_serve

KEY = "engine-wait-test-admin-key-0123456789"
ENGINE_LATE_S = 20
"""How long after the server its engine starts in the `tapdeck serve` process test."""
CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _refused_while_waiting(reply: httpx.Response) -> None:
    """The 503 a session or run on the awaited engine gets: Retry-After, the admin error shape."""
    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == "10" and reply.headers["x-should-retry"] == "true"
    body = reply.json()
    assert set(body) == {"detail", "kind", "retryable"}
    assert body["kind"] == "engine_loading" and body["retryable"] is True
    assert "waiting for the engine at" in body["detail"]


@pytest.mark.medium
def test_a_server_started_before_its_engine_waits_for_it_then_opens_sessions_on_it(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=address, admin_key=KEY)).start()
    up = FakeVllm()
    try:
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert server.engine_url is None
        wait = admin.get("/health").json()["engine_wait"]
        assert (wait["url"], wait["limit_s"]) == (address, DEFAULT_ENGINE_WAIT_S) and wait["waited_s"] >= 0
        # /health asks no key: without it, that the server waits, but not where its engine is.
        anyone = httpx.get(f"{server.url}/health").json()["engine_wait"]
        assert anyone["url"] is None and anyone["limit_s"] == DEFAULT_ENGINE_WAIT_S
        assert re.fullmatch(r"waiting for the engine \(\d+ s\)", EngineWait(**anyone).line())

        _refused_while_waiting(admin.post("/admin/sessions", json={}))
        _refused_while_waiting(admin.post("/admin/runs", json={"tasks": ["hello-file"]}))
        assert admin.get("/admin/runs").json()["runs"] == []  # nothing was written for it
        [row] = [e for e in admin.get("/admin/catalog").json()["engines"] if e["name"] == "embedded"]
        assert not row["reachable"] and f"waiting for the engine at {address} (" in row["why"]

        said: list[str] = []
        first = threading.Event()
        answered: list[bool] = []

        def say(line: str) -> None:
            said.append(line)
            first.set()

        waiter = threading.Thread(
            target=lambda: answered.append(server.wait_for_engine(say, every_s=0.05)), daemon=True
        )
        waiter.start()
        assert first.wait(30), "nothing was said while waiting"
        up.start(port)  # the engine comes up
        waiter.join(30)
        assert answered == [True]
        assert all(re.fullmatch(rf"waiting for the engine at {address} \(\d+ s\)", line) for line in said)

        assert server.engine_url == up.base_url  # settled on …/v1 as at start
        assert admin.get("/health").json()["engine_wait"] is None
        info = admin.post("/admin/sessions", json={})
        assert info.status_code == 200, info.text
        assert info.json()["engine"]["url"] == up.base_url and info.json()["tier"] == "tokens"
    finally:
        server.stop()
        up.stop()


def test_the_wait_says_how_long_it_has_waited_once_an_interval(tmp_path: Path) -> None:
    server = LocalServer(
        ServerConfig(port=0, data_dir=tmp_path, engine_url=f"127.0.0.1:{free_port()}", engine_wait_s=1)
    ).start()
    said: list[str] = []
    try:
        began = time.monotonic()
        with pytest.raises(EngineAddressError, match=r"\(waited \d s; --engine-wait\)$"):
            server.wait_for_engine(said.append, every_s=0.2)
        took = time.monotonic() - began
    finally:
        server.stop()
    assert said and all(re.fullmatch(r"waiting for the engine at 127\.0\.0\.1:\d+ \(\d s\)", s) for s in said)
    assert len(said) <= took / 0.2 + 1, (took, said)  # never two lines in one interval


@pytest.mark.parametrize(
    ("address", "code", "says"),
    [
        ("http://gpu box:8000", EXIT_USAGE, "host 'gpu box' is not a host name or IP address"),
        ("ftp://gpu-box/v1", EXIT_USAGE, "is not an http(s) URL"),
    ],
)
def test_serve_refuses_a_malformed_address_at_once(
    tmp_path: Path, address: str, code: int, says: str
) -> None:
    # A wait that a regression would run out (rather than hang the test): the refusal is not it.
    result = CliRunner().invoke(
        app, ["serve", "--port", "0", "--engine", address, "--engine-wait", "30", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == code, result.output
    assert says in result.output and "wait" not in result.output


def test_rollout_refuses_engine_wait_with_server_naming_whose_wait_it_is() -> None:
    # Nothing listens there: the refusal comes before anything is asked of it.
    server = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["rollout", "--server", server, "--engine-wait", "5"])
    assert result.exit_code == EXIT_USAGE, result.output
    assert " ".join(result.output.split()) == (
        "tapdeck rollout: --engine-wait is how long a server started here waits for its engine; "
        "the server at --server waits for its own (tapdeck serve --engine-wait)"
    )


@pytest.mark.parametrize(
    ("engine", "answer"),
    [(FakeVllm(listing=None), "HTTP 404"), (FakeVllm(fault="html"), "HTTP 200 but not a model listing")],
    ids=["404-everywhere", "html-200"],
)
def test_serve_refuses_an_address_that_answers_as_no_engine_at_once(
    tmp_path: Path, engine: FakeVllm, answer: str
) -> None:
    # A wait that a regression would run out (rather than hang the test): the refusal is not it.
    with engine:
        wait = ["--engine-wait", "30", "--data-dir", str(tmp_path)]
        result = CliRunner().invoke(app, ["serve", "--port", "0", "--engine", engine.url, *wait])
    assert result.exit_code == EXIT_COULD_NOT_RUN, result.output
    [line] = [ln for ln in result.output.splitlines() if ln.startswith("tapdeck serve:")]
    assert line.startswith(f"tapdeck serve: no engine answered at '{engine.url}'") and answer in line
    assert "wait" not in result.output


@pytest.mark.medium
def test_serve_whose_engine_never_answers_exits_saying_how_long_it_waited(tmp_path: Path) -> None:
    address = f"http://127.0.0.1:{free_port()}/v1"
    result = subprocess.run(
        [str(TAPDECK), "serve", "--port", "0", "--engine", address, "--engine-wait", "1"]
        + ["--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_COULD_NOT_RUN, result.stderr
    assert f"(engine: waiting for {address}; data: {tmp_path})" in result.stdout
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"tapdeck serve: no engine answered at '{address}': tried GET {address}/models "
        "([Errno 111] Connection refused) (waited "
    )
    waited = re.fullmatch(r".* \(waited (\d+) s; --engine-wait\)", line)
    assert waited and 1 <= int(waited[1]) < 30, line


@pytest.mark.medium
def test_a_serve_process_started_before_its_engine_opens_the_first_session_once_it_answers(
    tmp_path: Path,
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with (
        tapdeck_serve(
            TAPDECK, tmp_path / "data", tmp_path / "serve.log", admin_key=KEY, engine_url=address
        ) as process,
        httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as admin,
    ):
        assert admin.get("/health").json()["engine_wait"]["url"] == address
        _refused_while_waiting(admin.post("/admin/sessions", json={}))
        # The engine comes up 20 s after the server (issue 39's check), the wait said every 10 s.
        while admin.get("/health").json()["engine_wait"]["waited_s"] < ENGINE_LATE_S:
            time.sleep(0.2)
        _refused_while_waiting(admin.post("/admin/sessions", json={}))
        up = FakeVllm().start(port)
        try:
            deadline = time.monotonic() + 60
            while admin.get("/health").json()["engine_wait"] is not None:
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.1)
            info = admin.post("/admin/sessions", json={})
            assert info.status_code == 200, info.text
            assert info.json()["engine"]["url"] == up.base_url
            client = openai.OpenAI(
                base_url=info.json()["base_urls"]["openai"], api_key=info.json()["api_key"], max_retries=0
            )
            assert client.chat.completions.create(**CHAT).choices[0].message.content
        finally:
            up.stop()
    log = (tmp_path / "serve.log").read_text()
    assert f"tapdeck server at {process.url}  (engine: waiting for {address}; data: " in log
    assert f"waiting for the engine at {address} (10 s)\n" in log, log
    answered = re.search(rf"^engine: {re.escape(up.base_url)} \(answered after (\d+) s\)$", log, re.M)
    assert answered and ENGINE_LATE_S <= int(answered[1]) < ENGINE_LATE_S + 30, log


@pytest.mark.medium
def test_rollout_on_a_server_awaiting_its_engine_waits_with_it_before_submitting(tmp_path: Path) -> None:
    port = free_port()
    server = LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=f"127.0.0.1:{port}")).start()
    up = FakeVllm()
    said: list[str] = []
    first = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        first.set()

    async def wait_as_rollout_does() -> None:
        client = TapdeckClient(server.url, server.admin_key)
        try:
            await await_servers_engine(client, say, every_s=0.05)
        finally:
            await client.aclose()

    try:
        waiter = threading.Thread(target=asyncio.run, args=(wait_as_rollout_does(),), daemon=True)
        waiter.start()
        assert first.wait(30), "nothing was said while the server waited"
        up.start(port)
        waiter.join(30)
        assert not waiter.is_alive() and server.engine_url == up.base_url
        assert re.fullmatch(rf"waiting for the engine at 127\.0\.0\.1:{port} \(\d+ s\)", said[0])
    finally:
        server.stop()
        up.stop()


@pytest.mark.medium
async def test_rollout_resuming_on_a_server_awaiting_its_engine_waits_with_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = f"127.0.0.1:{free_port()}"
    made = BatchRunner(None, data_dir=tmp_path, default_engine=EngineSpec(url=f"http://{engine}/v1"))
    plan = RunPlan(harness="terminus-2", tasks=["hello-file"])
    run_id = (await made.create(plan)).id
    waited: list[str] = []

    async def wait_with_the_server(client: TapdeckClient, say) -> None:
        wait = (await client.health()).engine_wait
        waited.append(wait.url if wait else "not waiting")

    monkeypatch.setattr(run_follow, "await_servers_engine", wait_with_the_server)
    server = LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=engine)).start()
    try:
        # The stand-in returns at once: the resume after it is the 503 the wait spares a real one.
        with pytest.raises(ApiError) as refused:
            await _submit(server.url, server.admin_key, plan, run_id)
    finally:
        server.stop()
    assert waited == [engine]
    assert refused.value.status == 503
