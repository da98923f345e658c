"""The pieces of `live_sandboxes` a running trial is not needed for: a command run through an
environment's `exec` (on its own loop or another), its time limit, `ps`'s lines, the agent's
output file. The real host sandbox is driven in tests/runner/test_rollout_sandbox.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tapdeck.runner.errors import SandboxExecFailed, SandboxExecTimedOut
from tapdeck.runner.harbor_api import ExecResult
from tapdeck.runner.run_dir import run_id_of
from tapdeck.runner.runner_loop import RunnerLoop
from tapdeck.runner.sandboxes.live_sandboxes import (
    LISTING,
    PROC_LISTING,
    PS_COMMAND,
    LiveSandbox,
    LiveSandboxes,
    agent_output_script,
    parse_agent_output,
    parse_ps,
    run_in,
)


class _Environment:
    """Harbor's `exec` as an environment answers it: a scripted result, a wait, or an error."""

    def __init__(self, *, wait_s: float = 0.0, error: Exception | None = None) -> None:
        self.wait_s, self.error = wait_s, error
        self.calls: list[tuple[str, int | None, asyncio.AbstractEventLoop]] = []

    async def exec(self, command: str, timeout_sec: int | None = None, **_: Any) -> ExecResult:
        self.calls.append((command, timeout_sec, asyncio.get_running_loop()))
        await asyncio.sleep(self.wait_s)
        if self.error is not None:
            raise self.error
        return ExecResult(stdout="x" * 300_000, stderr=None, return_code=5)


def test_a_command_runs_on_the_trials_loop_and_its_output_is_cut_to_its_end() -> None:
    runner = RunnerLoop("test-live-sandboxes")
    environment = _Environment()
    sandboxes = LiveSandboxes()

    async def hold() -> None:
        sandboxes.hold("r1", environment)

    try:
        asyncio.run(runner.spawn(hold()).wait())  # held on the runner's loop, as a trial's hook does
        sandbox = sandboxes.get("r1")
        assert sandbox is not None and sandbox.loop is runner.loop
        reply = asyncio.run(run_in(sandbox, "echo hi", 2.5))
    finally:
        runner.stop()
    assert environment.calls[0][:2] == ("echo hi", 3) and environment.calls[0][2] is sandbox.loop
    assert reply.exit_code == 5 and reply.stderr == ""
    assert reply.stdout.startswith("[37856 earlier bytes cut]\n") and reply.stdout.endswith("x" * 100)
    sandboxes.release("r1")
    assert sandboxes.get("r1") is None


def test_a_command_past_its_limit_or_one_the_environment_refuses_is_an_error() -> None:
    async def run(environment: _Environment, timeout_s: float) -> None:
        await run_in(LiveSandbox(environment, asyncio.get_running_loop()), "true", timeout_s)

    with pytest.raises(SandboxExecTimedOut, match="ran past its 0.2 s limit"):
        asyncio.run(run(_Environment(wait_s=0.3, error=RuntimeError("Command timed out")), 0.2))
    with pytest.raises(SandboxExecFailed, match="could not run the command: RuntimeError: gone"):
        asyncio.run(run(_Environment(error=RuntimeError("gone")), 5))


def test_ps_lines_become_processes_oldest_first_without_the_listing_itself() -> None:
    text = (
        f"    1    3600     12 sleep infinity\n"
        f"   40      10      0 bash -c cd /app && {PS_COMMAND}\n"
        f"   41      10      0 {PS_COMMAND}\n"
        f"    7    3000    250 python3 agent.py --task a b\n"
        "garbage line\n"
    )
    listed = parse_ps(text)
    assert [(p.pid, p.elapsed_s, p.cpu_s, p.command) for p in listed] == [
        (1, 3600, 12, "sleep infinity"),
        (7, 3000, 250, "python3 agent.py --task a b"),
    ]


def test_a_sandbox_without_ps_lists_its_processes_from_proc_as_ps_would() -> None:
    def listed(script: str) -> dict[int, str]:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
        return {p.pid: p.command for p in parse_ps(done.stdout)}

    from_proc, from_ps = listed(PROC_LISTING), listed(PS_COMMAND)
    me = os.getpid()
    assert (
        from_proc[me] == from_ps[me] == " ".join(Path(f"/proc/{me}/cmdline").read_text().split("\0")).strip()
    )
    assert from_proc[1] == from_ps[1]
    assert "command -v ps" in LISTING and PS_COMMAND in LISTING and PROC_LISTING in LISTING


def _agent_output(folder: Path, tail_bytes: int) -> tuple[str | None, int, str]:
    """`agent_output_script` run by bash here, as a sandbox's exec runs it, and its output read."""
    script = agent_output_script(str(folder), tail_bytes)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return parse_agent_output(done.stdout)


def test_the_agents_output_is_its_newest_log_with_terminal_control_taken_out(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    assert _agent_output(agent, 100) == (None, 0, "")  # no folder yet
    agent.mkdir()
    (agent / "exit-code.txt").write_text("0")
    (agent / "setup").mkdir()
    assert _agent_output(agent, 100) == (None, 0, "")  # nothing the agent wrote
    pane = agent / "terminus_2.pane"
    pane.write_bytes(
        b"old line\r\n\x1b[1;32mroot@box\x1b[0m:/app# ls\r\nprogress 10%\rprogress 90%\x1b]0;title\x07"
    )
    os.utime(agent / "exit-code.txt", (1, 1))  # the pane is the newest
    assert _agent_output(agent, 1000) == (
        str(pane),
        pane.stat().st_size,
        "old line\nroot@box:/app# ls\nprogress 10%\nprogress 90%",
    )
    assert _agent_output(agent, 13)[2] == "90%"  # the last bytes, control sequences out


def test_a_rollout_id_names_its_run() -> None:
    assert run_id_of("run-20260101-000000-ab12.g003r07") == "run-20260101-000000-ab12"
    assert run_id_of("run-1.g000r00") == "run-1"
    for not_one in ("run-1", "run-1.x", ".g000r00", "a/b.g000r00", "run-1.g000r00x"):
        assert run_id_of(not_one) is None
