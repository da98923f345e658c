"""Filter and sort of the Sessions and Runs tables (app/views/row_view.py), without an app."""

from __future__ import annotations

from tapdeck.app.views.row_view import (
    SORT_KEYS,
    STUCK,
    RowFacts,
    RowView,
    arrange,
    board_facts,
    filter_terms,
    rollout_facts,
    view_line,
)
from tapdeck.app.views.sessions import SessionBoard
from tapdeck.schema.runs import RolloutResult
from tapdeck.schema.sessions import SessionSummary

ROWS = [
    RowFacts("a", task="fix-git", session="a1b2", run="run-1", state="running", harness="codex", idle=5.0,
             calls=3, tokens=100, reward=None, start=10.0),
    RowFacts("b", task="hello-world", session="c3d4", run="run-1", state="finished", harness="codex",
             calls=7, tokens=50, reward=1.0, start=5.0),
    RowFacts("c", task="fix-permissions", session="e5f6", run="run-2", state="no call yet",
             harness="terminus-2", idle=90.0, calls=0, tokens=None, reward=None, start=20.0),
    RowFacts("d", task="sqlite", session="", run="run-2", state="failed", harness="oracle",
             calls=1, tokens=None, reward=0.0, start=None),
]  # fmt: skip


def keys(text: str = "", sort: str | None = None, reverse: bool = False) -> list[str]:
    return arrange(ROWS, RowView(text, sort, reverse))


def test_a_bare_word_matches_any_field_case_insensitively():
    assert keys("FIX") == ["a", "c"]
    assert keys("c3d") == ["b"]  # a session id
    assert keys("run-2") == ["c", "d"]
    assert keys("terminus") == ["c"]
    assert keys("finish") == ["b"]
    assert keys("") == ["a", "b", "c", "d"]


def test_a_prefix_narrows_to_its_field_and_every_word_must_match():
    assert keys("state:run") == ["a"]  # not "run-1" in the run column
    assert keys("task:fix state:no") == ["c"]
    assert keys("run-1 codex") == ["a", "b"]
    assert keys("run-1 oracle") == []
    assert keys("harness:oracle") == ["d"]
    assert keys("session:e5") == ["c"]


def test_a_prefix_naming_no_field_is_part_of_the_word_and_an_empty_one_matches_all():
    assert filter_terms("flavour:x state:") == [(None, "flavour:x")]
    assert keys("state:") == ["a", "b", "c", "d"]


def test_each_sort_key_orders_its_first_way_and_reverse_flips_it_with_unknowns_last():
    assert keys(sort="idle") == ["c", "a", "b", "d"]
    assert keys(sort="idle", reverse=True) == ["a", "c", "b", "d"]
    assert keys(sort="calls") == ["b", "a", "d", "c"]
    assert keys(sort="tokens") == ["a", "b", "c", "d"]
    assert keys(sort="tokens", reverse=True) == ["b", "a", "c", "d"]
    assert keys(sort="reward") == ["b", "d", "a", "c"]
    assert keys(sort="state") == ["d", "b", "c", "a"]
    assert keys(sort="start") == ["b", "a", "c", "d"]
    assert keys(sort="start", reverse=True) == ["c", "a", "b", "d"]


def test_stuck_first_puts_live_rows_longest_idle_first_then_the_rest_in_order():
    assert keys(sort=STUCK) == ["c", "a", "b", "d"]
    assert keys("codex", sort=STUCK) == ["a", "b"]


def test_stuck_first_puts_rows_waiting_on_a_call_first_the_longest_waiting_first_then_by_idle():
    rows = [
        RowFacts("idle-long", state="running", idle=300.0),
        RowFacts("calling-short", state="running", idle=40.0, calling=5.0),
        RowFacts("ended", state="finished", calls=4),
        RowFacts("calling-long", state="running", idle=12.0, calling=42.0),
        RowFacts("first-call", state="no call yet", calling=20.0),  # no call ended yet: no idle
        RowFacts("idle-short", state="running", idle=3.0),
    ]
    assert arrange(rows, RowView(sort=STUCK)) == [
        "calling-long",
        "first-call",
        "calling-short",
        "idle-long",
        "idle-short",
        "ended",
    ]


def test_the_sort_key_cycles_through_every_key_then_back_to_none():
    view, seen = RowView("x"), []
    for _ in range(len(SORT_KEYS) + 1):
        view = view.next_sort()
        seen.append(view.sort)
    assert seen == [*SORT_KEYS, None]
    assert view.filter == "x"
    assert RowView(sort="calls").flipped() == RowView(sort="calls", reverse=True)
    assert RowView(sort="calls", reverse=True).next_sort() == RowView(sort="tokens")
    assert RowView(sort="calls").stuck_first() == RowView(sort=STUCK)
    assert RowView(sort=STUCK).stuck_first() == RowView()
    assert RowView(sort=STUCK).next_sort().sort == SORT_KEYS[0]


def test_the_view_line_says_the_filter_with_its_count_and_the_sort_or_nothing():
    assert view_line(RowView(), 4, 4) == ""
    assert view_line(RowView(" state:run "), 1, 4) == "/ state:run (1 of 4)"
    assert view_line(RowView("", "idle"), 4, 4) == "sort idle ↓"
    assert view_line(RowView("", "start"), 4, 4) == "sort start ↑"
    assert view_line(RowView("fix", "idle", reverse=True), 2, 4) == "/ fix (2 of 4) · sort idle ↑"
    assert view_line(RowView("", STUCK), 4, 4) == "stuck first"


def test_a_view_round_trips_through_json_and_junk_reads_as_none():
    view = RowView("task:fix", "reward", reverse=True)
    assert RowView.from_json(view.to_json()) == view
    assert RowView.from_json({"filter": 3, "sort": "colour", "reverse": "yes"}) == RowView()
    assert RowView.from_json(["not", "a", "dict"]) == RowView()
    assert RowView.from_json({"sort": STUCK, "reverse": True}) == RowView(sort=STUCK)


def _summary(sid: str, **kw) -> SessionSummary:
    base = {
        "id": sid,
        "state": "open",
        "tier": "tokens",
        "rollout_type": "train",
        "turns": 0,
        "metadata": {},
        "created_at": 1.0,
        "engine": {"url": "http://engine.test/v1"},
    }
    return SessionSummary.model_validate({**base, **kw})


def test_board_facts_read_sessions_and_sessionless_rollouts_with_idle_for_live_ones_only():
    board = SessionBoard()
    meta = {"task": "fix-git", "run_id": "r1", "harness": "codex", "phase": "agent", "reward": 0.5}
    board.upsert(_summary("s-live", turns=2, metadata=meta, seconds_since_last_call=30.0), now=100.0)
    board.upsert(_summary("s-done", state="closed", turns=4, seconds_since_last_call=9.0), now=100.0)
    board.upsert_rollout(RolloutResult(rollout_id="r-oracle", run_id="r1", task="t", harness="oracle"))
    facts = board_facts(board, now=110.0)
    live = facts["s-live"]
    assert (live.task, live.run, live.harness, live.state) == ("fix-git", "r1", "codex", "running")
    assert (live.idle, live.calls, live.reward, live.start) == (40.0, 2, 0.5, 1.0)
    assert facts["s-done"].idle is None  # ended: its idle time is not a stuck agent's
    assert facts["r-oracle"].harness == "oracle" and facts["r-oracle"].session == ""


def test_board_facts_read_a_live_sessions_call_in_flight_advanced_locally():
    board = SessionBoard()
    meta = {"phase": "agent"}
    board.upsert(_summary("s-calling", turns=2, metadata=meta, seconds_calling=7.0), now=100.0)
    board.upsert(_summary("s-between", turns=2, metadata=meta, seconds_since_last_call=3.0), now=100.0)
    board.upsert(
        _summary("s-done", state="closed", turns=2, metadata={"phase": "done"}, seconds_calling=1.0),
        now=100.0,
    )
    facts = board_facts(board, now=104.0)
    assert (facts["s-calling"].calling, facts["s-between"].calling) == (11.0, None)
    assert facts["s-done"].calling is None  # ended: a call it left behind is not a stuck agent's
    rows = board.rows(now=104.0)
    assert rows["s-calling"][2] == ("calling 11s", "accent")
    assert rows["s-between"][2] == ("running", "accent")


def test_rollout_facts_take_live_counts_from_the_rollouts_session():
    board = SessionBoard()
    board.upsert(_summary("s1", turns=6, trainable_tokens=77, seconds_since_last_call=3.0), now=0.0)
    rollout = RolloutResult(rollout_id="ro", run_id="r1", task="t", session_id="s1", turns=2, phase="agent")
    facts = rollout_facts(rollout, board, now=2.0)
    assert (facts.key, facts.calls, facts.tokens, facts.idle, facts.state) == ("ro", 6, 77, 5.0, "running")
    assert rollout_facts(rollout, None).calls == 2
