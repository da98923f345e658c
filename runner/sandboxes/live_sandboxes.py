"""The sandboxes of the rollouts this process runs, held while each runs, and what an operator does
in one: run a command (Harbor's environment `exec`, so host, Docker and Podman alike), list its
processes, read the end of the agent's own output.

A rollout holds its sandbox from the moment its agent starts (the environment is up, the agent
set up) until its trial returns. Commands run on the loop the trial runs on (the runner's):
Harbor's environments start their subprocesses there, and the server's uvloop hangs on some.
"""

from __future__ import annotations

import asyncio
import math
import re
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from tapdeck.runner.errors import SandboxExecFailed, SandboxExecTimedOut
from tapdeck.schema.sandbox import ExecReply, SandboxProcess

OUTPUT_LIMIT_BYTES = 256 * 1024
"""What a reply keeps of each stream of a command (its end): a page of a terminal many times over,
and small enough for one JSON reply."""
EXEC_GRACE_S = 5.0
"""How long past its own limit a command's environment gets to kill it and answer."""
PS_COMMAND = "ps -ww -eo pid=,etimes=,times=,args="
"""Every process: pid, seconds since it started, CPU seconds, whole command line (no header)."""
PROC_LISTING = (
    "hz=$(getconf CLK_TCK 2>/dev/null || echo 100); read -r up _ < /proc/uptime; up=${up%.*}; "
    "for d in /proc/[0-9]*; do "
    'read -r stat 2>/dev/null < "$d/stat" || continue; '
    "comm=${stat#*(}; comm=${comm%)*}; set -- ${stat##*) }; "
    "cmd=$(tr '\\0' ' ' 2>/dev/null < \"$d/cmdline\"); cmd=${cmd% }; "
    'echo "${d#/proc/} $(( up - ${20} / hz )) $(( (${12} + ${13}) / hz )) ${cmd:-[$comm]}"; '
    "done"
)
"""The same lines read from /proc by bash, for a sandbox without `ps` (Debian's slim images have
none): after the `)` that ends a stat line's command name, field 12 is utime, 13 stime, 20 the
start time, in clock ticks since boot."""
LISTING = f"if command -v ps >/dev/null 2>&1; then {PS_COMMAND}; else {PROC_LISTING}; fi"
PS_TIMEOUT_S = 15.0
AGENT_OUTPUT_SUFFIXES = (".pane", ".txt")
"""The agent's own output in the trial's `agent/` folder: terminus-2's tmux pane (`*.pane`), a
CLI agent's or Harbor agent's log (`<agent>.txt`)."""
AGENT_LOG_DIR = "/logs/agent"
"""Harbor's agent log folder, as the sandbox sees it."""
NOT_AGENT_OUTPUT = frozenset({"exit-code.txt"})
"""Files of that folder that are not output (the oracle's exit code)."""
_TERMINAL_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


@dataclass(frozen=True)
class LiveSandbox:
    """A running rollout's sandbox: its Harbor environment and the loop the trial runs on."""

    environment: Any
    loop: asyncio.AbstractEventLoop


class LiveSandboxes:
    """The sandboxes held now, by rollout id; safe to read from any thread."""

    def __init__(self) -> None:
        self._held: dict[str, LiveSandbox] = {}
        self._lock = threading.Lock()

    def hold(self, rollout_id: str, environment: Any) -> None:
        """Called on the trial's loop once its agent starts."""
        with self._lock:
            self._held[rollout_id] = LiveSandbox(environment, asyncio.get_running_loop())

    def release(self, rollout_id: str) -> None:
        """Called when the trial returns, however it ended."""
        with self._lock:
            self._held.pop(rollout_id, None)

    def get(self, rollout_id: str) -> LiveSandbox | None:
        """The rollout's sandbox, when it is held now."""
        with self._lock:
            return self._held.get(rollout_id)


async def run_in(sandbox: LiveSandbox, command: str, timeout_s: float) -> ExecReply:
    """Run `command` in the sandbox (bash, its working directory, its default user) and return its
    exit code and the end of its output. SandboxExecTimedOut past `timeout_s` (the environment kills
    it); SandboxExecFailed when the environment cannot run it (its sandbox stopping, say)."""
    started = time.monotonic()
    work = sandbox.environment.exec(command, timeout_sec=math.ceil(timeout_s))
    try:
        async with asyncio.timeout(timeout_s + EXEC_GRACE_S):
            if asyncio.get_running_loop() is sandbox.loop:
                result = await work
            else:
                result = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, sandbox.loop))
    except TimeoutError:
        raise SandboxExecTimedOut(_timed_out(timeout_s)) from None
    except Exception as exc:  # noqa: BLE001 - whatever the environment raises, the command did not run
        seconds = time.monotonic() - started
        if seconds >= timeout_s:  # Harbor's environments raise RuntimeError on their own timeout
            raise SandboxExecTimedOut(_timed_out(timeout_s)) from None
        raise SandboxExecFailed(
            f"the sandbox could not run the command: {type(exc).__name__}: {exc}"[:500]
        ) from None
    return ExecReply(
        exit_code=result.return_code,
        stdout=_tail(result.stdout or "", OUTPUT_LIMIT_BYTES),
        stderr=_tail(result.stderr or "", OUTPUT_LIMIT_BYTES),
        seconds=round(time.monotonic() - started, 3),
    )


def _timed_out(timeout_s: float) -> str:
    return f"the command ran past its {timeout_s:g} s limit and was killed (a longer one: timeout_s)"


def _tail(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[-limit:].decode("utf-8", errors="replace")
    return f"[{len(data) - limit} earlier bytes cut]\n{kept}"


async def processes(sandbox: LiveSandbox) -> list[SandboxProcess]:
    """The processes running in the sandbox, oldest first, without the listing's own."""
    reply = await run_in(sandbox, LISTING, PS_TIMEOUT_S)
    if reply.exit_code != 0:
        why = (reply.stderr or reply.stdout).strip().splitlines()
        raise SandboxExecFailed(
            f"listing the processes failed in the sandbox (exit {reply.exit_code}): "
            f"{why[-1] if why else 'no output'}"
        )
    return parse_ps(reply.stdout)


def parse_ps(text: str) -> list[SandboxProcess]:
    """`LISTING`'s lines as processes, oldest first; its own lines (the ps, the shell that ran it)
    left out."""
    found = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or not all(p.isdigit() for p in parts[:3]) or PS_COMMAND in parts[3]:
            continue
        pid, elapsed, cpu, command = parts
        found.append(SandboxProcess(pid=int(pid), elapsed_s=int(elapsed), cpu_s=int(cpu), command=command))
    return sorted(found, key=lambda p: (-p.elapsed_s, p.pid))


def agent_output_script(folder: str, tail_bytes: int) -> str:
    """The bash that prints, in `folder`, the agent's output file (the one written last, when
    several are), its size, then its last `tail_bytes`; nothing when there is none yet."""
    names = " ".join(f"*{suffix}" for suffix in AGENT_OUTPUT_SUFFIXES)
    skip = " ".join(f"-e {shlex.quote(name)}" for name in sorted(NOT_AGENT_OUTPUT))
    return (
        f"cd {shlex.quote(folder)} 2>/dev/null || exit 0; "
        f"f=$(ls -t -- {names} 2>/dev/null | grep -vx {skip} | head -n 1); "
        '[ -n "$f" ] || exit 0; '
        f'printf \'%s\\n%s\\n\' "$PWD/$f" "$(wc -c < "$f")"; tail -c {int(tail_bytes)} -- "$f"'
    )


async def agent_output(sandbox: LiveSandbox, tail_bytes: int) -> tuple[str | None, int, str]:
    """The agent's output file in the sandbox (Harbor's `/logs/agent`), its size, and its last
    `tail_bytes` as plain text (terminal control sequences out: terminus-2's pane is a raw
    terminal stream). Read through `exec`, as everything here: a sandbox's /logs reaches the
    trial's folder only when the trial ends, on some sandboxes."""
    reply = await run_in(sandbox, agent_output_script(AGENT_LOG_DIR, tail_bytes), PS_TIMEOUT_S)
    return parse_agent_output(reply.stdout)


def parse_agent_output(stdout: str) -> tuple[str | None, int, str]:
    """`agent_output_script`'s output as (file, size, text)."""
    head = stdout.split("\n", 2)
    if len(head) < 3 or not head[1].strip().isdigit():
        return None, 0, ""
    text = _TERMINAL_CONTROL.sub("", head[2])
    return head[0], int(head[1]), text.replace("\r\n", "\n").replace("\r", "\n")
