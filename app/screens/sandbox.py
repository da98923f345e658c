"""Inside a running rollout (Sessions or Runs, `l`): the processes running in its sandbox, with
their CPU time and age, and the end of the agent's own output, both refreshed while it is open;
`s` opens a shell there (`tapdeck exec ROLLOUT`'s line shell), suspending the TUI as k9s does, and
comes back to this screen.
"""

from __future__ import annotations

import os
import subprocess
import sys

from textual import work
from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.schema.sandbox import AgentOutput, ProcessList

REFRESH_S = 2.0
OUTPUT_LINES = 200
"""The agent output lines shown (its last)."""
ADMIN_KEY_ENV = "TAPDECK_ADMIN_KEY"
"""How the shell's `tapdeck exec` gets the admin key: in its environment, not on its command line
(where `ps` would show it)."""


def shell_command(base_url: str, rollout_id: str) -> list[str]:
    """The command the shell key runs: this Python's `tapdeck exec ROLLOUT --server URL`."""
    return [
        sys.executable,
        "-c",
        "from tapdeck.app.cli import main; main()",
        "exec",
        rollout_id,
        "--server",
        base_url,
    ]


def run_shell(argv: list[str], env: dict[str, str]) -> int:
    """Run the shell on this terminal until it exits; its exit code."""
    return subprocess.run(argv, env=env, check=False).returncode


def duration(seconds: int) -> str:
    """`7 s`, `12 m 5 s`, `3 h 20 m`: whole seconds, as ps gives them."""
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} m {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} m"


def process_lines(listed: ProcessList) -> list[str]:
    """One line per process: pid, age, CPU time, command."""
    lines = [f"{'PID':<7} {'AGE':>9} {'CPU':>9}  COMMAND"]
    for p in listed.processes:
        lines.append(f"{p.pid:<7} {duration(p.elapsed_s):>9} {duration(p.cpu_s):>9}  {p.command}")
    return lines


def output_text(output: AgentOutput) -> str:
    """The agent output's last lines, headed by its file and size."""
    if output.file is None:
        return "the agent has written no output yet"
    lines = output.text.splitlines()[-OUTPUT_LINES:]
    return "\n".join([f"{output.file} ({output.size} bytes), last {len(lines)} lines:", *lines])


class SandboxScreen(ModalScreen[None]):
    """A modal over Sessions or Runs for one running rollout."""

    BINDINGS = [
        Binding("escape,q,l", "dismiss", "Close", id="sandbox.close"),
        Binding(
            "s", "shell", "Shell", tooltip="A shell in the sandbox (suspends the TUI)", id="sandbox.shell"
        ),
        Binding("r", "reload", "Refresh", id="sandbox.reload"),
    ]

    DEFAULT_CSS = """
    SandboxScreen { align: center middle; }
    SandboxScreen > Vertical { width: 96%; height: 92%; border: round $primary; background: $surface;
                               padding: 0 1; }
    SandboxScreen #sandbox-title { text-style: bold; }
    SandboxScreen #sandbox-error { color: $error; }
    SandboxScreen #sandbox-processes { height: auto; max-height: 40%; }
    SandboxScreen #sandbox-process-list { text-wrap: nowrap; text-overflow: ellipsis; }
    SandboxScreen #sandbox-output-scroll { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self, client: TapdeckClient, run_id: str, rollout_id: str) -> None:
        super().__init__()
        self.client = client
        self.run_id = run_id
        self.rollout_id = rollout_id
        self.processes: ProcessList | None = None
        self.output: AgentOutput | None = None
        self.error = ""
        """Why the last refresh got nothing (the rollout ended, say); empty when it got both."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"rollout {self.rollout_id} · inside its sandbox", id="sandbox-title")
            yield Static("", id="sandbox-error")
            with VerticalScroll(id="sandbox-processes"):
                yield Static("reading the sandbox's processes…", id="sandbox-process-list", markup=False)
            with VerticalScroll(id="sandbox-output-scroll"):
                yield Static("", id="sandbox-output", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()
        self.set_interval(REFRESH_S, self.action_reload, name="sandbox-refresh")

    def action_reload(self) -> None:
        """Read the processes and the agent's output again."""
        self.load()

    @work(exclusive=True, group="sandbox-load", exit_on_error=False)
    async def load(self) -> None:
        try:
            self.processes = await self.client.rollout_processes(self.run_id, self.rollout_id)
            self.output = await self.client.agent_output(self.run_id, self.rollout_id)
            self.error = ""
        except ApiError as exc:
            self.error = exc.detail or exc.message
        self._paint()

    def _paint(self) -> None:
        self.query_one("#sandbox-error", Static).update(self.error)
        if self.processes is not None:
            self.query_one("#sandbox-process-list", Static).update("\n".join(process_lines(self.processes)))
        if self.output is not None:
            self.query_one("#sandbox-output", Static).update(output_text(self.output))
            self.query_one("#sandbox-output-scroll", VerticalScroll).scroll_end(animate=False)

    def action_shell(self) -> None:
        """A shell in the sandbox: the TUI suspends until it exits, then this screen comes back."""
        env = {**os.environ}
        if self.client.admin_key:
            env[ADMIN_KEY_ENV] = self.client.admin_key
        argv = shell_command(self.client.base_url, self.rollout_id)
        try:
            with self.app.suspend():
                run_shell(argv, env)
        except SuspendNotSupported:
            self.app.notify(
                f"This terminal cannot suspend the TUI: run tapdeck exec {self.rollout_id} "
                f"--server {self.client.base_url} in another.",
                severity="warning",
            )
            return
        self.action_reload()
