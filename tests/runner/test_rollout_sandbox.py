"""Inside a running rollout (`/admin/runs/{id}/rollouts/{rollout_id}/exec`, `/processes`,
`/agent-output`, `tapdeck exec`): a real host-sandbox trial held running by its agent (the oracle
running a solve.sh that prints a line and sleeps), reached only through the admin API."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest
from click.testing import Result
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.runner.sandboxes.live_sandboxes import PS_COMMAND
from tapdeck.schema.sandbox import AgentOutput, ExecReply, ProcessList
from tests.support.fake_vllm import hanging_engine
from tests.support.runner_server import RunnerServer, make_task, runner_server_on

pytestmark = pytest.mark.medium
WAIT_S = 180.0  # a bound for a trial to reach its agent on 2 shared cores, not a speed check


def _until_up(server: RunnerServer, base: str, marker: str) -> ProcessList:
    deadline = time.monotonic() + WAIT_S
    while True:
        reply = server.http.get(f"{base}/processes")
        if reply.status_code == 200:
            listed = ProcessList.model_validate(reply.json())
            if any(marker in p.command for p in listed.processes):
                return listed
        else:
            assert reply.status_code == 409, reply.text  # not up yet, never another refusal
        assert time.monotonic() < deadline, f"the agent never ran: {reply.text}"
        time.sleep(0.3)


def _exec_cli(server: RunnerServer, rollout: str, *args: str) -> Result:
    return CliRunner().invoke(
        app,
        ["exec", rollout, "--server", server.local.url, "--admin-key", server.local.admin_key, *args],
    )


def test_a_running_rollouts_sandbox_answers_commands_processes_and_its_agents_output(tmp_path: Path) -> None:
    marker = f"tapdeck-held-{secrets.token_hex(4)}"
    task = make_task(
        tmp_path / "dataset", "held", "echo 1 > /logs/verifier/reward.txt\n", agent_timeout_s=600
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\necho 'the agent says {marker}'\necho hello > inside.txt\nexec -a {marker} sleep 1000\n"
    )
    with hanging_engine() as engine, runner_server_on(engine, tmp_path / "data") as server:
        run = server.start(dataset=str(tmp_path / "dataset"), harness="oracle", timeout_s=600)
        rid = f"{run['id']}.g000r00"
        base = f"/admin/runs/{run['id']}/rollouts/{rid}"
        listed = _until_up(server, base, marker)
        held = next(p for p in listed.processes if marker in p.command)
        assert held.command == f"{marker} 1000"
        assert not any(PS_COMMAND in p.command for p in listed.processes)  # the listing's own left out

        ran = server.http.post(f"{base}/exec", json={"command": "cat inside.txt; echo oops >&2; exit 7"})
        assert ran.status_code == 200, ran.text
        reply = ExecReply.model_validate(ran.json())
        assert (reply.exit_code, reply.stdout, reply.stderr) == (7, "hello\n", "oops\n")

        slow = server.http.post(f"{base}/exec", json={"command": "sleep 30", "timeout_s": 1})
        assert slow.status_code == 504 and "1 s limit" in slow.json()["detail"]

        output = AgentOutput.model_validate(server.http.get(f"{base}/agent-output").json())
        assert output.file is not None and output.file.endswith("agent/oracle.txt")
        assert f"the agent says {marker}" in output.text

        cli = _exec_cli(server, rid, "--", "sh", "-c", "echo from the cli; exit 3")
        assert (cli.exit_code, cli.stdout) == (3, "from the cli\n"), cli.stderr
        piped = _exec_cli(server, rid, "--", "echo a b | wc -w")  # one argument: a command line as it is
        assert (piped.exit_code, piped.stdout.strip()) == (0, "2")
        late = _exec_cli(server, rid, "--timeout", "1", "--", "sleep 30")
        assert late.exit_code == 124 and "1 s limit" in late.stderr
        shell = CliRunner().invoke(
            app,
            ["exec", rid, "--server", server.local.url, "--admin-key", server.local.admin_key],
            input="cat inside.txt\n\nexit 9\nexit\n",
        )
        assert shell.exit_code == 9 and shell.stdout.count("hello\n") == 1, shell.output

        # A session's key is no admin key: the route is not reachable with it.
        session = server.http.post("/admin/sessions", json={}).json()
        as_session = httpx.post(
            f"{server.local.url}{base}/exec",
            json={"command": "true"},
            headers={"Authorization": f"Bearer {session['api_key']}"},
        )
        assert as_session.status_code == 401
        unknown = server.http.post(
            f"/admin/runs/{run['id']}/rollouts/{run['id']}.g009r00/exec", json={"command": "true"}
        )
        assert unknown.status_code == 404

        assert server.http.post(f"/admin/runs/{run['id']}/rollouts/{rid}/cancel").status_code == 200
        server.wait(run["id"], WAIT_S)
        for refused in (
            server.http.post(f"{base}/exec", json={"command": "true"}),
            server.http.get(f"{base}/processes"),
            server.http.get(f"{base}/agent-output"),
        ):
            assert refused.status_code == 409
            assert refused.json()["detail"] == f"rollout {rid} has ended (cancelled): its sandbox is gone"
        ended = _exec_cli(server, rid, "--", "true")
        assert ended.exit_code == 1
        assert ended.stderr.strip().endswith(f"rollout {rid} has ended (cancelled): its sandbox is gone")
        gone = _exec_cli(server, "run-nope.g000r00", "--", "true")
        assert gone.exit_code == 1 and "no run run-nope" in gone.stderr
