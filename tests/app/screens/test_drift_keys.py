"""The drift keys over the recorded API with made-up replays (tests/support/recorded_replays.py):
Rollout's `c` (colour by Δ) and `p` (replay on the embedded engine), the Sessions pane's drift line
(`d`), the Runs screen's `d` (the run's |Δ| histogram)."""

from __future__ import annotations

import asyncio

import pytest
from textual.content import Content
from textual.widgets import DataTable, Static

from tapdeck.app.screens.drift import RunDriftScreen
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import DRIFT_STYLES, TokenView
from tests.support.pilot_wait import until
from tests.support.recorded_replays import DELTAS, UNSCORED_EVERY, delta_of, with_replays

REPLAYED = (
    "sess0000recorded",
    "sess0001recorded",
    "sess0002recorded",
    "sess0004recorded",
    "sess0005recorded",
)
"""Every recorded session with sampled tokens but the single-turn eval one."""


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def _token_styles(view: TokenView) -> list[str]:
    """Each token's style, as the view paints it (its click action left out)."""
    content = view.content
    assert isinstance(content, Content)
    by_token = {}
    for span in content.spans:
        style = str(span.style)
        index = int(style.split("@click=pick(")[1].rstrip(")"))
        by_token[index] = style.split("@click=")[0].replace("reverse bold", "").strip()
    return [by_token[i] for i in range(len(by_token))]


async def _open_first_rollout(pilot) -> TokenView:
    app = pilot.app
    await until(pilot, lambda: app.screen.query_one(SessionTable).row_count == 8, "the recorded sessions")
    await pilot.press("enter")
    await until(
        pilot,
        lambda: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
        "the first rollout's first turn",
    )
    return app.screen.query_one(TokenView)


async def test_c_without_a_replay_says_how_to_make_one_and_keeps_the_logprob_colours(make_app):
    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_first_rollout(pilot)
        await pilot.press("c")
        await until(pilot, lambda: bool(app._notifications), "a notification")
        assert not view.drift
        [note] = list(app._notifications)
        assert "No replay of this session yet: p replays it" in note.message


async def test_c_colours_the_tokens_by_drift_and_the_token_detail_shows_both_logprobs(make_app, api_data):
    app = make_app(None, data=with_replays(api_data, stored=REPLAYED))
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_first_rollout(pilot)
        screen = app.screen
        await until(pilot, lambda: view.pair is not None, "the replay's logprobs")
        assert "drift |Δ|" in _text(screen, "#rollout-header")
        before = _token_styles(view)
        await pilot.press("c")
        assert view.drift
        # Token 7's Δ (1.2) puts its ratio outside [0.5, 2]; token 10 has no reference logprob.
        styles = _token_styles(view)
        assert styles != before
        assert styles[7] == DRIFT_STYLES["outside"] and styles[5] == DRIFT_STYLES["mid"]
        assert styles[3] == DRIFT_STYLES["small"] and styles[0] == DRIFT_STYLES["same"]
        assert styles[UNSCORED_EVERY - 1] == DRIFT_STYLES["unscored"]
        await pilot.press(*["full_stop"] * 8)
        await until(pilot, lambda: view.selected == 7, "token 7 picked")
        turn = view.turn
        assert turn is not None
        sampler = turn.logprobs[7]
        detail = _text(screen, "#token-detail")
        assert f"sampler {sampler:.3f}" in detail
        assert f"reference {sampler + DELTAS[7]:.3f}" in detail
        assert f"Δ {DELTAS[7]:+.3f}" in detail
        await pilot.press("c")
        assert not view.drift


async def test_p_replays_the_session_shows_it_running_then_colours_by_drift(make_app, api_data):
    app = make_app(None, data=with_replays(api_data, postable=REPLAYED))
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_first_rollout(pilot)
        screen = app.screen
        assert screen.replay is None and not view.drift
        gate = asyncio.Event()
        post = app.client.replay

        async def held(session_id, request=None):
            await gate.wait()  # the reference is still scoring: the screen says so meanwhile
            return await post(session_id, request)

        app.client.replay = held
        await pilot.press("p")
        await until(pilot, lambda: "replaying…" in _text(screen, "#rollout-header"), "replaying… shown")
        assert screen.replaying and not view.drift
        await pilot.press("p")
        await until(
            pilot,
            lambda: any("A replay of this session is running" in n.message for n in app._notifications),
            "the second p refused",
        )
        gate.set()
        await until(pilot, lambda: view.drift and not screen.replaying, "the replay")
        assert screen.replay is not None and screen.replay.session_id == screen.session_id
        assert view.pair is not None and "drift |Δ|" in _text(screen, "#rollout-header")
        messages = [n.message for n in app._notifications]
        assert any(m.startswith("Replaying session") for m in messages)
        assert any("vs smollm2@embedded" in m for m in messages)


async def test_p_on_a_server_without_an_embedded_engine_says_so(make_app):
    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_first_rollout(pilot)
        screen = app.screen
        await pilot.press("p")
        await until(pilot, lambda: not screen.replaying, "the refused replay")
        await until(
            pilot,
            lambda: any("no embedded engine" in n.message for n in app._notifications),
            "the refusal",
        )
        assert screen.replay is None and not view.drift
        assert "replaying…" not in _text(screen, "#rollout-header")


async def test_the_sessions_pane_shows_the_sessions_drift(make_app, api_data):
    app = make_app(None, data=with_replays(api_data, stored=REPLAYED))
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("d")
        key = app.screen.highlighted()
        assert key in REPLAYED
        await until(pilot, lambda: "vs smollm2@embedded" in _text(app.screen, "#activity-text"), "the drift")
        assert "mean |Δ|" in _text(app.screen, "#activity-text")


async def test_d_on_runs_shows_the_runs_delta_histogram(make_app, api_data):
    app = make_app(None, data=with_replays(api_data, stored=REPLAYED))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.query_one(SessionTable).row_count == 8, "the recorded sessions")
        await pilot.press("4")
        await until(
            pilot,
            lambda: (
                app.current_mode == "runs" and app.screen.query_one("#groups-table", DataTable).row_count == 2
            ),
            "the runs",
        )
        detail = app.screen.detail
        sessions = [r.session_id for r in detail.rollouts if r.session_id]
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, RunDriftScreen), "the drift modal")
        modal = app.screen
        await until(pilot, lambda: modal.deltas is not None, "the run's deltas")
        turns = api_data["turns"]
        expected = [
            delta_of(i)
            for sid in sessions
            if sid in REPLAYED
            for turn in turns.get(sid, {}).values()
            for i in range(len(turn["logprobs"] or []))
        ]
        assert [d is None for d in modal.deltas] == [d is None for d in expected]
        assert [d for d in modal.deltas if d is not None] == pytest.approx(
            [d for d in expected if d is not None]
        )
        scored = sum(d is not None for d in expected)
        replayed = sum(s in REPLAYED for s in sessions)
        assert _text(modal, "#drift-sessions").startswith(
            f"{replayed} of {len(sessions)} session(s) replayed"
        )
        assert _text(modal, "#drift-summary").startswith(f"{scored:,} tok")
        rows = _text(modal, "#drift-histogram").splitlines()
        assert len(rows) == 7 and sum(int(r.split()[-2]) for r in rows) == scored
        await pilot.press("d")
        await until(
            pilot, lambda: app.current_mode == "runs" and not isinstance(app.screen, RunDriftScreen), "closed"
        )


async def test_d_on_runs_without_a_replay_says_which_key_makes_one(make_app):
    app = make_app(None)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.query_one(SessionTable).row_count == 8, "the recorded sessions")
        await pilot.press("4")
        await until(pilot, lambda: app.current_mode == "runs" and app.screen.detail is not None, "the run")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, RunDriftScreen), "the drift modal")
        modal = app.screen
        await until(pilot, lambda: modal.deltas == [], "the run's (no) replays")
        assert (
            _text(modal, "#drift-sessions")
            == "0 of 4 session(s) replayed: p on Rollout replays the open session"
        )
        assert _text(modal, "#drift-summary") == "no scored tokens"
        assert _text(modal, "#drift-histogram") == ""


async def test_another_session_opens_coloured_by_logprob_again(make_app, api_data):
    app = make_app(None, data=with_replays(api_data, stored=("sess0000recorded",)))
    async with app.run_test(size=(80, 24)) as pilot:
        view = await _open_first_rollout(pilot)
        assert app.screen.session_id == "sess0000recorded"
        await until(pilot, lambda: view.pair is not None, "the replay's logprobs")
        await pilot.press("c")
        assert view.drift
        await pilot.press("2", "down", "enter")
        await until(
            pilot,
            lambda: app.current_mode == "rollout" and app.screen.session_id == "sess0001recorded",
            "the second session",
        )
        await until(pilot, lambda: view.turn is not None, "its first turn")
        assert not view.drift and view.pair is None
