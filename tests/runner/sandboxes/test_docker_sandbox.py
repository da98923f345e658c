"""Rollouts in Docker containers through Harbor's own docker environment (`--sandbox docker`),
offline: the sample tasks' base image is the local stand-in `scripts/container-sandbox.sh` builds.

These tests never skip silently: without a ready backend (dockerd, the compose plugin, the base
image) they fail saying what is missing, unless TAPDECK_NO_CONTAINER_TESTS=1 opts out
(docs/development.md). `./tapdeck.sh test` readies the backend first when run as root.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tapdeck.runner.cli_agents import AGENT_HOME
from tapdeck.runner.datasets import SAMPLE_DATASET_DIR, sample_dataset
from tapdeck.runner.sandboxes import docker_sandbox
from tapdeck.runner.sandboxes.docker_sandbox import OWNER_LABEL
from tapdeck.runner.sandboxes.live_sandboxes import PROC_LISTING, PS_COMMAND, parse_ps
from tapdeck.schema.sandbox import AgentOutput, ExecReply, ProcessList
from tests.support.agent_clis import (
    AGENT_CONTEXT,
    SOLVE,
    engine_for_agents,
    installed_or_skip,
    scripted_agent_reply,
)
from tests.support.fake_vllm import FakeVllm, hanging_engine
from tests.support.ports import free_port
from tests.support.runner_server import RunnerServer, make_task, runner_server_on
from tests.support.tapdeck_process import serve_process, wait_health

pytestmark = pytest.mark.slow

OPT_OUT = "TAPDECK_NO_CONTAINER_TESTS"
BASE_IMAGE = "python:3.12-slim-bookworm"
"""What the sample tasks' Dockerfiles start FROM (here, the stand-in the script builds)."""
TASKS = [t.name for t in sample_dataset().tasks]
LEAKS = {"OPENAI_API_KEY": "sk-provider-leak-check", "ANTHROPIC_API_KEY": "sk-ant-leak-check"}
"""Provider keys set in the server's own environment while a container runs: none may get in."""
_backend: list[tuple[bool, str]] = []


@pytest.fixture(autouse=True)
def docker_backend() -> None:
    """Fail (never skip) when the backend is not ready, unless the opt-out is set."""
    if not _backend:
        _backend.append(docker_sandbox.check())
    ok, why = _backend[0]
    if ok:
        return
    if os.environ.get(OPT_OUT):
        pytest.skip(f"{OPT_OUT} is set; the docker sandbox is not ready here: {why}")
    pytest.fail(
        f"the docker sandbox is not ready: {why} (or set {OPT_OUT}=1 to skip the container tests)",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerServer]:
    """A tapdeck server in this process on an embedded engine whose context holds an agent CLI's
    first prompt."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine(n_ctx=AGENT_CONTEXT).start()
    try:
        with runner_server_on(engine, tmp_path_factory.mktemp("tapdeck-docker")) as running:
            yield running
    finally:
        engine.stop()


def containers(owner: str | None = None, *, running_only: bool = False) -> list[str]:
    """Ids of the tapdeck containers of `owner` (this process by default)."""
    argv = ["docker", "ps", "--quiet", "--filter", f"label={OWNER_LABEL}={owner or docker_sandbox.owner()}"]
    return subprocess.run(
        argv if running_only else [*argv, "--all"], capture_output=True, text=True, check=True
    ).stdout.split()


def _only(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["rollouts"]) == 1, doc
    return doc["rollouts"][0]


def _until(what: str, check: Any, timeout_s: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.3)
    raise AssertionError(f"never happened within {timeout_s:.0f} s: {what}")


def _one_chain(server: RunnerServer, r: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's agent turns, checked captured with ids and logprobs, hanging off one root."""
    agent, doc = _captured(server, r)
    assert [t["parent"] for t in agent].count(None) == 1, [(t["seq"], t["parent"]) for t in doc["turns"]]
    return agent


def _captured(server: RunnerServer, r: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The session's agent turns and its rollout graph, every turn checked captured with ids and
    logprobs."""
    http = server.http
    doc = http.get(f"/admin/sessions/{r['session_id']}/rollout").json()
    agent = [t for t in doc["turns"] if t["role"] == "agent"]
    assert agent and len(doc["turns"]) == r["turns"], doc["turns"]
    for t in doc["turns"]:
        turn = http.get(f"/admin/sessions/{r['session_id']}/turns/{t['seq']}").json()
        assert turn["prompt_len"] and turn["sampled_ids"]
        assert len(turn["logprobs"]) == len(turn["sampled_ids"])
    return agent, doc


# ----------------------------------------------------------------------------- rollouts


@pytest.mark.parametrize("task", TASKS)
def test_oracle_scores_one_on_every_sample_task_in_a_container(server: RunnerServer, task: str) -> None:
    r = _only(server.run(tasks=[task], harness="oracle", sandbox="docker", timeout_s=600))
    assert r["ok"] and r["error_kind"] is None, (r["error"], r["findings"])
    assert r["sandbox"] == "docker" and r["reward"] == 1.0
    assert containers() == [], "a finished trial left its container"


def environ_task(root: Path) -> Path:
    """hello-file, whose verifier writes the environment of every process in the container (the
    container's own first process, an agent's tmux server, the verifier's shell) to environ.txt."""
    return make_task(
        root,
        "environ",
        "for f in /proc/[0-9]*/environ; do echo \"== $f\"; tr '\\0' '\\n' < \"$f\"; done "
        "> /logs/verifier/environ.txt 2>/dev/null\n"
        "echo 0 > /logs/verifier/reward.txt\n",
    )


WATCH_SH = """#!/bin/sh
# The container's first process: while it runs, every process's environment goes to environ-seen.txt.
seen=/logs/agent/environ-seen.txt
while :; do
    for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < "$f"; echo; done 2>/dev/null | sort -u > /tmp/now
    # Replaced by a rename, never truncated in place: the container may be stopped mid-write.
    sort -u /tmp/now "$seen" > "$seen.new" 2>/dev/null || cp /tmp/now "$seen.new"
    mv "$seen.new" "$seen"
    sleep 0.3
done &
exec "$@"
"""


def watched_task(task: Path) -> Path:
    """`task` with its container also recording, while it runs, the environment of every process in
    it (an agent CLI's, which is gone by the time the verifier looks) to /logs/agent/environ-seen.txt."""
    (task / "environment" / "watch.sh").write_text(WATCH_SH)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text()
        + 'COPY watch.sh /watch.sh\nRUN chmod 755 /watch.sh\nENTRYPOINT ["/watch.sh"]\n'
    )
    return task


def credentials(environ: str) -> set[str]:
    """The credential-like variables (…KEY…, …TOKEN…, …SECRET…) among `environ`'s lines, less those
    the base image sets itself (the real python image's GPG_KEY)."""
    image = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", BASE_IMAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    pattern = re.compile(r"^\w*(?:KEY|TOKEN|SECRET)\w*=")
    return {line for line in environ.splitlines() if pattern.match(line)} - set(image)


def test_terminus2_in_a_container_is_captured_as_one_chain_and_no_key_gets_in(
    server: RunnerServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in LEAKS.items():
        monkeypatch.setenv(name, value)  # what the compose command runs with
    environ_task(tmp_path)
    r = _only(
        server.run(
            dataset=str(tmp_path),
            harness="terminus-2",
            sandbox="docker",
            timeout_s=900,
            call_budget=2,
            agent_kwargs={"max_turns": 1, "llm_kwargs": {"max_tokens": 32}},
        )
    )
    assert r["ok"] and r["error_kind"] is None, (r["error"], r["findings"])
    assert r["reward"] == 0.0 and r["tier"] == "tokens" and r["turns"] >= 1
    _one_chain(server, r)
    seen = (Path(r["trial_dir"]) / "verifier" / "environ.txt").read_text()
    print(f"\nthe container's processes' environments:\n{seen}")
    assert "TMUX" in seen, "terminus-2's tmux server is not among them"
    admin_key = server.http.headers["Authorization"].removeprefix("Bearer ")
    for secret in [*LEAKS.values(), admin_key]:
        assert secret not in seen
    # terminus-2's tmux session carries the session key (as OPENAI_API_KEY), and nothing else does.
    assert [line.split("=")[0] for line in credentials(seen)] == ["OPENAI_API_KEY"], credentials(seen)
    assert containers() == []


def _only_the_session_key_was_inside(server: RunnerServer, r: dict[str, Any]) -> None:
    """Every process the watched task's container ran, the agent CLI's included, had the session
    key (as TAPDECK_SESSION_KEY) as its one credential, and no server or provider key."""
    seen = (Path(r["trial_dir"]) / "agent" / "environ-seen.txt").read_text()
    assert f"HOME={AGENT_HOME}\n" in seen, "the CLI's process was never seen"
    admin_key = server.http.headers["Authorization"].removeprefix("Bearer ")
    for secret in [*LEAKS.values(), admin_key]:
        assert secret not in seen
    assert [line.split("=")[0] for line in credentials(seen)] == ["TAPDECK_SESSION_KEY"], credentials(seen)


@pytest.mark.parametrize("name", ["codex", "opencode"])
def test_a_host_install_cli_runs_in_a_container_against_the_embedded_engine(
    server: RunnerServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The CLI's host install is mounted read-only; it reaches the loopback proxy relayed into a
    container without network; the session key is the one credential any process in the
    container had. The small model makes no tool call, so the CLI ends on its text reply (reward
    0): what is checked is the path, the capture and the credentials. Up to 220 s (codex, at load
    2, 2026-12-07): the embedded engine prefills the CLI's own first prompt, thousands of tokens,
    and that prompt is the CLI's, not the test's, to shorten."""
    installed_or_skip(name)
    for variable, value in LEAKS.items():
        monkeypatch.setenv(variable, value)
    watched_task(environ_task(tmp_path))
    r = _only(
        server.run(
            dataset=str(tmp_path),
            harness=name,
            sandbox="docker",
            timeout_s=1500,
            agent_timeout_s=1200,
            call_budget=2,
            agent_kwargs={"max_turns": 1, "tool_profile": "lean"},
            engine_tool_parser="hermes",
        )
    )
    output = Path(r["trial_dir"], "agent", f"{name}.txt")
    # The CLI ends on its text reply, or fails on it: the small model's reply may also run to the
    # embedded engine's bound (`model_output`, seen once here, 2026-12-07), a model-caused end
    # that was captured all the same.
    assert r["error_kind"] in (None, "agent_failed", "model_output"), (r["error"], output.read_text()[-2000:])
    assert r["reward"] == 0.0 and r["tier"] == "tokens" and r["turns"] >= 1
    _one_chain(server, r)
    _only_the_session_key_was_inside(server, r)
    assert containers() == []


REACH_PY = """
import socket, sys
for name, host, port in (a.split(",") for a in sys.argv[1:]):
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(name, "connected")
    except OSError as exc:
        print(name, type(exc).__name__, exc)
"""
"""Run by the verifier inside the container: which of the addresses given it connects to."""


def host_addresses() -> dict[str, str]:
    """This host's non-loopback IPv4 addresses by interface (docker0's, the machine's own, ...)."""
    argv = ["ip", "-4", "-o", "addr", "show"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = (line.split() for line in out.splitlines())
    return {w[1]: w[3].split("/")[0] for w in found if not w[3].startswith("127.")}


def reach_checked(task: Path, proxy_port: int, other_port: int) -> dict[str, str]:
    """`task` with its verifier also trying, from inside the container, the proxy's loopback port
    and another port this host listens on, at every address of this host; the targets by name."""
    targets = {"proxy": f"127.0.0.1,{proxy_port}", "other-on-loopback": f"127.0.0.1,{other_port}"}
    targets |= {f"other-on-{nic}": f"{ip},{other_port}" for nic, ip in host_addresses().items()}
    (task / "tests" / "reach.py").write_text(REACH_PY)
    argv = " ".join(f"{name},{target}" for name, target in targets.items())
    test_sh = task / "tests" / "test.sh"
    probe = f"python3 /tests/reach.py {argv} > /logs/verifier/reach.txt 2>&1\n"
    test_sh.write_text(test_sh.read_text() + probe)
    return targets


@pytest.mark.parametrize("name", ["codex", "opencode"])
def test_an_agent_clis_tool_call_solves_a_sample_task_inside_the_container(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine answering as a capable model would (recorded vLLM bodies: the CLI's shell tool
    writing hello.txt, then "done"), in seconds: the tool runs in the container, the verifier there
    gives 1, and every call is captured (the recorded bodies' token ids extend no earlier call, so
    they make no chain: the embedded engine's test checks that). The container has no network: it
    reaches the proxy, relayed in at its loopback address, and no port of this host's besides."""
    installed_or_skip(name)
    for variable, value in LEAKS.items():
        monkeypatch.setenv(variable, value)
    shutil.copytree(SAMPLE_DATASET_DIR / "hello-file", tmp_path / "tasks" / "hello-file")
    task = watched_task(tmp_path / "tasks" / "hello-file")
    with (
        socket.create_server(("0.0.0.0", 0)) as other,  # a host port the container must not reach
        engine_for_agents(scripted_agent_reply(name, SOLVE)) as engine,
        runner_server_on(engine, tmp_path / "data") as server,
    ):
        targets = reach_checked(task, urlsplit(server.local.url).port, other.getsockname()[1])
        r = _only(
            server.run(
                dataset=str(tmp_path / "tasks"),
                harness=name,
                sandbox="docker",
                timeout_s=600,
                agent_kwargs={"max_turns": 4, "tool_profile": "lean"},
            )
        )
        output = Path(r["trial_dir"], "agent", f"{name}.txt")
        assert r["ok"] and r["error_kind"] is None, (r["error"], output.read_text()[-2000:])
        assert r["reward"] == 1.0 and r["turns"] >= 2
        _captured(server, r)
        _only_the_session_key_was_inside(server, r)
    lines = (Path(r["trial_dir"]) / "verifier" / "reach.txt").read_text().splitlines()
    reached = dict(line.split(" ", 1) for line in lines)
    print(f"\nfrom inside the container: {reached}")
    assert reached.keys() == targets.keys() and len(targets) >= 3, (reached, targets)
    assert {t for t, how in reached.items() if how == "connected"} == {"proxy"}, reached
    assert containers() == []


# ----------------------------------------------------------------------------- faults


def test_a_container_that_cannot_build_fails_its_rollout_naming_the_cause_and_the_batch_goes_on(
    server: RunnerServer, tmp_path: Path
) -> None:
    broken = make_task(tmp_path, "broken-image", "echo 1 > /logs/verifier/reward.txt\n")
    (broken / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim-bookworm\nRUN echo the-build-step-that-fails && exit 7\n"
    )
    shutil.copytree(SAMPLE_DATASET_DIR / "hello-file", tmp_path / "hello-file")
    doc = server.run(dataset=str(tmp_path), harness="oracle", sandbox="docker", timeout_s=600)
    by_task = {r["task"]: r for r in doc["rollouts"]}
    assert doc["counts"]["done"] == 2
    failed = by_task["broken-image"]
    assert not failed["ok"] and failed["error_kind"] == "sandbox_failed" and failed["reward"] is None
    # The cause, not Harbor's compose command line: the step that failed and its exit code.
    assert "docker compose build failed" in failed["error"], failed["error"]
    assert "echo the-build-step-that-fails && exit 7" in failed["error"] and "code: 7" in failed["error"]
    assert by_task["hello-file"]["ok"] and by_task["hello-file"]["reward"] == 1.0
    assert containers() == []


def test_a_container_that_cannot_start_fails_its_rollout_naming_the_cause(
    server: RunnerServer, tmp_path: Path
) -> None:
    broken = make_task(tmp_path, "no-entrypoint", "echo 1 > /logs/verifier/reward.txt\n")
    dockerfile = broken / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + 'ENTRYPOINT ["/no/such/entrypoint"]\n')
    r = _only(server.run(dataset=str(tmp_path), harness="oracle", sandbox="docker", timeout_s=600))
    assert not r["ok"] and r["error_kind"] == "sandbox_failed" and r["reward"] is None, r
    # It builds; starting it is what fails, and the error says so and why.
    assert "docker compose up" in r["error"] and "/no/such/entrypoint" in r["error"], r["error"]
    assert containers() == []


def sleeping_task(root: Path) -> Path:
    """hello-file whose solution sleeps: its container stays up in the agent phase."""
    task = make_task(root, "sleeper", "echo 1 > /logs/verifier/reward.txt\n", agent_timeout_s=600)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 600\n")
    return task


def test_cancel_stops_the_container(server: RunnerServer, tmp_path: Path) -> None:
    sleeping_task(tmp_path)
    run = server.start(dataset=str(tmp_path), harness="oracle", sandbox="docker", timeout_s=900)
    rid = f"{run['id']}.g000r00"
    _until("the sleeping container runs", lambda: containers(running_only=True))
    _until(
        "the rollout is in its agent phase",
        lambda: server.http.get(f"/admin/runs/{run['id']}").json()["rollouts"][0]["phase"] == "agent",
    )
    assert server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid}/cancel").status_code == 200
    r = _only(server.wait(run["id"], timeout_s=300))
    assert r["error_kind"] == "cancelled", r
    assert containers() == [], "the cancelled rollout's container is still there"


def test_a_running_containers_sandbox_answers_commands_processes_and_its_agents_output(
    tmp_path: Path,
) -> None:
    """`tapdeck exec`'s routes reach a container as they reach the host sandbox (Harbor's docker
    `exec`), and the /proc listing for an image without `ps` lists the container's processes."""
    marker = f"tapdeck-held-{os.getpid()}"
    task = make_task(
        tmp_path / "dataset", "held", "echo 1 > /logs/verifier/reward.txt\n", agent_timeout_s=600
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\necho 'the agent says {marker}'\nexec -a {marker} sleep 1000\n"
    )
    with hanging_engine() as engine, runner_server_on(engine, tmp_path / "data") as server:
        run = server.start(
            dataset=str(tmp_path / "dataset"), harness="oracle", sandbox="docker", timeout_s=900
        )
        rid = f"{run['id']}.g000r00"
        base = f"/admin/runs/{run['id']}/rollouts/{rid}"

        def held() -> ProcessList | None:
            reply = server.http.get(f"{base}/processes")
            if reply.status_code != 200:
                assert reply.status_code == 409, reply.text
                return None
            listed = ProcessList.model_validate(reply.json())
            return listed if any(p.command == f"{marker} 1000" for p in listed.processes) else None

        listed = _until("the agent's process in the container", held)
        assert not any(PS_COMMAND in p.command for p in listed.processes)
        # The listing of a sandbox without `ps` (Debian's slim images), read from /proc there.
        proc = server.http.post(f"{base}/exec", json={"command": PROC_LISTING}).json()
        assert f"{marker} 1000" in [p.command for p in parse_ps(proc["stdout"])]
        ran = ExecReply.model_validate(
            server.http.post(
                f"{base}/exec", json={"command": "test -f /.dockerenv && echo inside; exit 4"}
            ).json()
        )
        assert (ran.exit_code, ran.stdout) == (4, "inside\n")
        output = AgentOutput.model_validate(server.http.get(f"{base}/agent-output").json())
        assert output.file == "/logs/agent/oracle.txt" and f"the agent says {marker}" in output.text

        assert server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid}/cancel").status_code == 200
        server.wait(run["id"], 300)
        refused = server.http.post(f"{base}/exec", json={"command": "true"})
        assert refused.status_code == 409 and "has ended" in refused.json()["detail"]


def test_a_killed_server_leaves_no_container_running_after_the_next_start(tmp_path: Path) -> None:
    sleeping_task(tmp_path / "tasks")
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    engine = FakeVllm().start()  # oracle calls no model; the server wants an engine all the same
    proc = serve_process(port, data, engine.base_url)
    owner = docker_sandbox.owner(proc.pid)
    try:
        wait_health(url, proc)
        admin = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
        started = httpx.post(
            f"{url}/admin/runs",
            headers=admin,
            json={"dataset": str(tmp_path / "tasks"), "harness": "oracle", "sandbox": "docker"},
            timeout=60,
        )
        assert started.status_code == 200, started.text
        _until("the server's container runs", lambda: containers(owner, running_only=True))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        time.sleep(2)
        assert containers(owner, running_only=True), "the container died with the server: nothing to clean"

        proc = serve_process(port, data, engine.base_url)
        wait_health(url, proc)
        _until("the next start removed the container", lambda: containers(owner) == [], timeout_s=90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        engine.stop()
        for left in containers(owner):
            subprocess.run(["docker", "rm", "--force", left], capture_output=True, check=False)
