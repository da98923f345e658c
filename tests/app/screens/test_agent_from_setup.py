"""An agent CLI started from the TUI's Setup, as an operator would: pick the harness, tick the task,
ctrl+s. The rollout runs the real installed binary on the host sandbox through a real tapdeck
server whose engine answers with recorded vLLM 0.32 bodies (seconds, where the embedded engine
takes minutes to prefill an agent's first prompt), and the Runs screen shows it finish with its
captured turns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from textual.widgets import DataTable, Select, SelectionList

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tapdeck.schema.runs import RolloutResult
from tests.support.agent_clis import SOLVE, engine_for_agents, installed_or_skip, scripted_agent_reply
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import local_server_on
from tests.support.pilot_wait import until

pytestmark = pytest.mark.slow

HARNESS = "opencode"
WAIT_S = 600.0  # a bound for install (first use), sandbox, agent and verifier on shared cores


@pytest.fixture
def recorded_vllm() -> Iterator[FakeVllm]:
    """The recorded engine, answering as a capable model would: the task solved by a tool call."""
    with engine_for_agents(scripted_agent_reply(HARNESS, SOLVE)) as up:
        yield up


def _rollout(app: TapdeckApp) -> RolloutResult | None:
    detail = getattr(app.screen, "detail", None)
    return detail.rollouts[0] if detail is not None and detail.rollouts else None


async def test_agent_cli_started_from_setup_finishes_with_its_turns_on_the_runs_screen(
    recorded_vllm: FakeVllm, tmp_path: Path
) -> None:
    installed_or_skip(HARNESS)
    with local_server_on(recorded_vllm, tmp_path / "data") as server:
        app = TapdeckApp(
            TapdeckClient(server.url, server.admin_key),
            settings_path=tmp_path / "tui.json",
            initial_mode="setup",
        )
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            await until(pilot, lambda: screen.catalog is not None, "the catalog", 60)
            screen.query_one("#harness", Select).value = HARNESS
            tasks = screen.query_one("#tasks", SelectionList)
            await until(pilot, lambda: "hello-file" in [o.value for o in tasks.options], "the task list", 60)
            tasks.select("hello-file")
            await pilot.pause(0.1)
            why = str(screen.query_one("#why-harness").render())
            assert why.startswith("✓"), why
            await pilot.press("ctrl+s")
            await until(pilot, lambda: app.current_mode == "sessions", "the switch to Sessions", 60)
            await pilot.press("4")
            await until(
                pilot,
                lambda: getattr(_rollout(app), "phase", None) in ("done", "failed"),
                "the rollout to end on the Runs screen",
                WAIT_S,
            )
            rollout = _rollout(app)
            assert rollout is not None
            assert rollout.ok and rollout.error_kind is None, (rollout.error, rollout)
            # The agent wrote hello.txt through its own tool call: the verifier's reward.
            assert rollout.reward == 1.0 and rollout.turns >= 2, rollout
            table = app.screen.query_one("#rollouts-table", DataTable)
            row = [str(cell) for cell in table.get_row_at(0)]
            assert row[0] == "hello-file" and row[3] == "1.00" and row[4] == str(rollout.turns), row

        admin = {"Authorization": f"Bearer {server.admin_key}"}
        with httpx.Client(base_url=server.url, headers=admin, timeout=60) as http:
            doc = http.get(f"/admin/sessions/{rollout.session_id}/rollout").json()
            agent_turns = [t for t in doc["turns"] if t["role"] == "agent"]
            assert len(agent_turns) >= 2, doc["turns"]
            for t in agent_turns:
                turn = http.get(f"/admin/sessions/{rollout.session_id}/turns/{t['seq']}").json()
                assert turn["sampled_ids"] and len(turn["logprobs"]) == len(turn["sampled_ids"])
    # Its install ran (or was found) and its calls reached the engine with the agent's tools.
    assert any(r.get("tools") for r in recorded_vllm.requests)
