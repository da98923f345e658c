"""Inside a running rollout from the TUI: `l` on a Sessions or Runs row opens its sandbox's process
list and the agent's own output, refreshed; `s` there runs `tapdeck exec`'s shell with the TUI
suspended and comes back to the same screen. Driven against a real server whose engine never
answers (a terminus-2 rollout held in its first model call, its sandbox up)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tapdeck.app.client import ApiError
from tapdeck.app.screens import sandbox
from tapdeck.app.screens.sandbox import SandboxScreen
from tapdeck.app.screens.sessions import SessionsScreen
from tests.support.pilot_wait import until

pytestmark = pytest.mark.medium


def _notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def _until_agent_runs(pilot, app, run_id: str) -> str:
    """The rollout's id, once its sandbox is held (its agent started); a bound of 4 minutes for a
    trial to reach its agent on a loaded machine, not a speed check."""
    rid = f"{run_id}.g000r00"
    for _ in range(480):
        with contextlib.suppress(ApiError):  # 409 until the agent starts
            await app.client.rollout_processes(run_id, rid)
            return rid
        await pilot.pause(0.5)
    raise AssertionError(f"rollout {rid}'s sandbox never came up")


@pytest.mark.parametrize("mode", ["sessions", "runs"])
async def test_l_opens_the_rollouts_sandbox_and_s_runs_its_shell_with_the_tui_suspended(
    hung_server, mode, monkeypatch
) -> None:
    async with hung_server.one_rollout_run(mode) as (app, pilot, run):
        rid = await _until_agent_runs(pilot, app, run.id)
        board = app.screen
        if isinstance(board, SessionsScreen):
            await until(pilot, lambda: board.highlighted() is not None, "the rollout's session row", 60)
        else:
            await until(pilot, lambda: board._selected_rollout() is not None, "the rollout's row", 60)
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, SandboxScreen), "the sandbox screen", 10)
        screen = app.screen
        assert (screen.run_id, screen.rollout_id) == (run.id, rid)
        await until(
            pilot,
            lambda: screen.processes is not None and screen.output is not None,
            "the processes and the agent's output",
            60,
        )
        assert any("tmux" in p.command for p in screen.processes.processes), screen.processes
        assert screen.output.file == "/logs/agent/terminus_2.pane"
        shown = str(screen.query_one("#sandbox-process-list").render())
        assert shown.startswith("PID") and "tmux" in shown

        # A terminal Textual cannot suspend (this headless one): said, and the screen stays.
        await pilot.press("s")
        assert any(
            n.startswith("This terminal cannot suspend the TUI: run tapdeck exec") for n in _notes(app)
        )

        ran: list[tuple[list[str], dict[str, str]]] = []
        suspended: list[bool] = []

        @contextlib.contextmanager
        def suspend() -> Iterator[None]:
            suspended.append(True)
            yield
            suspended.append(False)

        monkeypatch.setattr(app, "suspend", suspend)
        monkeypatch.setattr(sandbox, "run_shell", lambda argv, env: ran.append((argv, env)) or 0)
        await pilot.press("s")
        [(argv, env)] = ran
        assert argv[-4:] == ["exec", rid, "--server", app.client.base_url]
        assert env["TAPDECK_ADMIN_KEY"] == hung_server.server.admin_key
        assert hung_server.server.admin_key not in argv  # never on a command line
        assert suspended == [True, False]
        assert app.screen is screen  # back on the same screen

        await pilot.press("escape")
        await until(pilot, lambda: app.screen is board, "the board again", 10)
