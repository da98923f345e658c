"""The Textual-free view layer: session states, diffs, rollout trees, run groups."""

from __future__ import annotations

import httpx
import pytest

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.views.errors import describe_error
from tapdeck.app.views.graph import (
    TURN_LABEL_WIDTH,
    LiveGraph,
    capture_mode_text,
    display_parents,
    policy_span_text,
    policy_text,
    rollout_nodes,
    rollout_roots,
    turn_label,
)
from tapdeck.app.views.runs import (
    failures_line,
    instruction_preview,
    rollout_settings_line,
    run_groups,
    run_outcomes,
)
from tapdeck.app.views.sessions import SessionBoard, diff_rows, fmt_phase, session_state
from tapdeck.app.views.text import clip, fmt_reward, id_tail, phrase_lines
from tapdeck.app.views.tokens import logprob_tone, token_detail
from tapdeck.schema.findings import Finding
from tapdeck.schema.runs import RolloutResult, RunDetail, RunPlan, RunSummary
from tapdeck.schema.sessions import GraphView, PolicySpan, SessionSummary, TurnDetail
from tests.support.graph_turns import graph_turns


def _summary(**kw) -> SessionSummary:
    base = {
        "id": "s1",
        "state": "open",
        "tier": "tokens",
        "rollout_type": "train",
        "turns": 0,
        "metadata": {},
        "created_at": 1.0,
        "seconds_since_last_call": None,
        "engine": {"url": "http://engine.test/v1"},
    }
    return SessionSummary.model_validate({**base, **kw})


def test_session_state_follows_runner_phase_then_turns():
    assert session_state(_summary(metadata={"phase": "sandbox"})) == "booting"
    assert session_state(_summary(metadata={"phase": "agent_setup"})) == "booting"
    assert session_state(_summary(metadata={"phase": "agent"}, turns=0)) == "no call yet"
    assert session_state(_summary(metadata={"phase": "agent"}, turns=3)) == "running"
    assert session_state(_summary(metadata={"phase": "done"}, state="closed")) == "finished"
    assert session_state(_summary(metadata={"phase": "failed"})) == "failed"
    assert session_state(_summary(state="closed", turns=2, fatal=1)) == "failed"
    assert session_state(_summary(turns=0)) == "no call yet"  # a raw harness session, no runner phase


def test_a_session_whose_call_waits_out_an_engine_update_reads_engine_updating_until_it_ends():
    waiting = {"metadata": {"phase": "agent"}, "turns": 2, "calls_awaiting_engine": 1}
    assert session_state(_summary(**waiting)) == "engine updating"
    board = SessionBoard()
    board.upsert(_summary(**waiting), 0.0)
    assert board.rows(0.0)["s1"][2] == ("engine updating", "warning")
    assert session_state(_summary(**waiting, state="interrupted")) == "interrupted"
    assert session_state(_summary(**{**waiting, "metadata": {"phase": "done"}})) == "finished"
    assert session_state(_summary(**{**waiting, "calls_awaiting_engine": 0})) == "running"


def test_a_cancelled_rollout_reads_cancelled_not_failed_as_on_runs():
    cancelled = {"phase": "failed", "error_kind": "cancelled"}
    assert session_state(_summary(metadata=cancelled, state="closed")) == "cancelled"
    assert session_state(_summary(metadata={"phase": "failed", "error_kind": "timeout"})) == "failed"


def test_reward_null_means_never_graded_not_zero():
    assert fmt_reward(None) == "–"
    assert fmt_reward(0) == "0.00"
    assert fmt_reward(float("nan")) == "–"


def test_diff_rows_touches_only_changed_cells():
    old = {"a": (("a", ""), ("1", "")), "b": (("b", ""), ("2", ""))}
    new = {"a": (("a", ""), ("5", "")), "c": (("c", ""), ("3", ""))}
    diff = diff_rows(old, new)
    assert diff.removed == ["b"]
    assert diff.added == [("c", (("c", ""), ("3", "")))]
    assert diff.changed == [("a", 1, ("5", ""))]
    assert diff_rows(new, new).changed == []


def test_board_idle_seconds_advance_locally_and_long_idle_is_flagged():
    board = SessionBoard()
    board.upsert(_summary(turns=2, seconds_since_last_call=50.0, metadata={"phase": "agent"}), now=100.0)
    assert board.idle_seconds("s1", 105.0) == 55.0
    row = board.rows(now=100.0)["s1"]
    assert row[7] == ("50", "")
    assert board.rows(now=111.0)["s1"][7] == ("61", "idle")


def test_a_rollout_whose_session_is_listed_is_not_also_listed_without_one():
    # Just after a batch starts: the session's own event (naming its rollout in its metadata)
    # arrives before the rollout update that names the session.
    board = SessionBoard()
    board.upsert_rollout(RolloutResult(rollout_id="run-1.g000r00", task="greet-script", phase="sandbox"))
    board.upsert_rollout(RolloutResult(rollout_id="run-1.g001r00", task="fizzbuzz-python"))
    board.upsert(
        _summary(
            id="s-30b246",
            metadata={"rollout_id": "run-1.g000r00", "phase": "sandbox", "task": "greet-script"},
        ),
        now=1.0,
    )
    assert list(board.sessionless()) == ["run-1.g001r00"]
    assert set(board.rows(now=1.0)) == {"s-30b246", "run-1.g001r00"}
    assert sorted(board.states()) == ["booting", "queued"]


def test_rollout_nodes_of_a_recorded_rollout_mark_roots_and_discarded(api_data):
    nodes = rollout_nodes(GraphView.model_validate(api_data["graphs"]["sess0000recorded"]).turns)
    assert rollout_roots(nodes) == [0, 1]  # a resample of the first prompt is its own root...
    assert nodes[1].discarded  # ...and discarded
    assert turn_label(nodes[1]) == "#1 !warn length discarded 24 tok"
    assert nodes[0].children == [2] and nodes[2].kind == "prefix"
    # Truncated by max_tokens: the badge and the finish come first, where no cut reaches.
    assert turn_label(nodes[0]) == "#0 !warn length 24 tok"


def test_retokenized_edges_are_marked():
    turns = graph_turns(
        [
            {"seq": 0, "parent": None},
            {
                "seq": 1,
                "parent": 0,
                "link_kind": "retokenized",
                "findings": [Finding.warn("retokenized", "diverges from node 0 at offset 40")],
            },
        ]
    )
    label = turn_label(rollout_nodes(turns)[1])
    assert "≈retok" in label and "!warn" in label


def test_token_in_turns_show_whether_ids_continued_them_or_text_took_over():
    ids = {"mode": "ids", "extends": 0, "same": False, "diverge_at": 52}
    metas = [
        {"capture_mode": {"mode": "text", "reason": "not_held"}},
        {"capture_mode": ids},
        {"capture_mode": {"mode": "text", "reason": "tools"}},
        {},
    ]
    turns = graph_turns(
        [
            {"seq": i, "parent": i - 1 if i else None, "token_in": meta.get("capture_mode", {}).get("mode")}
            for i, meta in enumerate(metas)
        ]
    )
    labels = [turn_label(n) for n in rollout_nodes(turns).values()]
    assert ["⇢ids" in lb for lb in labels] == [False, True, False, False]
    assert ["↩text" in lb for lb in labels] == [False, False, True, False]
    texts = [capture_mode_text(meta) for meta in metas]
    assert texts == [
        "text (fell back: not_held)",
        "token-in from #0 (text path would differ from offset 52)",
        "text (fell back: tools)",
        "",
    ]


def test_rollout_nodes_take_the_roles_the_server_gives():
    nodes = rollout_nodes(
        graph_turns([{"seq": 0, "parent": None}, {"seq": 1, "parent": None, "role": "auxiliary"}])
    )
    assert (nodes[0].role, nodes[1].role) == ("agent", "auxiliary")


def test_logprob_tones_make_unlikely_and_masked_tokens_distinct():
    assert logprob_tone(-0.01, False) == "sure"
    assert logprob_tone(-0.5, False) == "mid"
    assert logprob_tone(-2.0, False) == "low"
    assert logprob_tone(-7.0, False) == "vlow"
    assert logprob_tone(-7.0, True) == "masked"
    assert logprob_tone(None, False) == "masked"


def test_token_detail_names_logprob_probability_and_alternatives():
    turn = TurnDetail(
        seq=0,
        parent=None,
        link_kind="root",
        request={},
        response={},
        prompt_len=3,
        token_texts=["a", " list"],
        sampled_ids=[5, 1002],
        logprobs=[-0.01, -2.2],
        top_logprobs=[[], [(" list", -2.2), ("x", -3.2)]],
        mask=[1, 0],
        finish_reason="stop",
        findings=[],
        sampling={},
        meta={},
    )
    line = token_detail(turn, 1)
    assert "' list'" in line and "id 1002" in line and "logprob -2.200" in line and "p=0.111" in line
    assert "'x' -3.20" in line and "masked" in line
    assert "no alternatives captured" in token_detail(turn, 0)


def test_token_detail_of_a_recorded_turn(api_data):
    turn = TurnDetail.model_validate(api_data["turns"]["sess0000recorded"]["0"])
    assert f"logprob {turn.logprobs[0]:.3f}" in token_detail(turn, 0)


def test_run_groups(api_data):
    oracle = RunDetail.model_validate(api_data["run_details"]["run-0000"]).rollouts
    assert {g.task: (g.total, g.mean, g.pass_rate) for g in run_groups(oracle)} == {
        "hello-file": (2, 1.0, 1.0),
        "greet-script": (2, 1.0, 1.0),
    }
    # terminus-2 on SmolLM2: graded misses, and one rollout cancelled before its verifier.
    agent = RunDetail.model_validate(api_data["run_details"]["run-0001"]).rollouts
    groups = {g.task: g for g in run_groups(agent)}
    assert groups["hello-file"].total == 2 and groups["hello-file"].pass_rate == 0.0
    assert groups["greet-script"].total == 2 and sorted(map(str, groups["greet-script"].rewards)) == [
        "0.0",
        "None",
    ]
    ungraded = run_groups([r for r in agent if r.reward is None])
    assert (ungraded[0].mean, ungraded[0].pass_rate) == (None, None)  # nothing graded: no mean, no rate


def _graph(parents: dict[int, int | None]) -> dict:
    return rollout_nodes(graph_turns([{"seq": seq, "parent": p} for seq, p in parents.items()]))


def test_a_chain_of_continuations_is_listed_flat_and_only_forks_nest():
    # 0 → 1 → 2, which forks into 3 and 4; 4 → 5; a second root 6 → 7.
    nodes = _graph({0: None, 1: 0, 2: 1, 3: 2, 4: 2, 5: 4, 6: None, 7: 6})
    assert display_parents(nodes) == {0: None, 1: 0, 2: 0, 3: 2, 4: 2, 5: 4, 6: None, 7: 6}


def test_a_long_chain_stays_one_level_deep():
    nodes = _graph({0: None, **{k: k - 1 for k in range(1, 200)}})
    assert set(display_parents(nodes).values()) == {None, 0}


def test_installing_rollout_shows_the_installer_line_next_to_its_phase() -> None:
    line = "installing @google/gemini-cli@0.61.0 from npm into /root/.cache/tapdeck/agents/x"
    assert (
        fmt_phase(RolloutResult(rollout_id="r", task="t", phase="install", detail=line))
        == f"install: {line[:40]}"
    )
    assert fmt_phase(RolloutResult(rollout_id="r", task="t", phase="agent")) == "agent"
    assert session_state(_summary(metadata={"phase": "install"})) == "booting"


def test_live_graph_takes_new_turns_and_moves_older_ones():
    live = LiveGraph()
    first = GraphView(
        session_id="s1",
        tier="tokens",
        rollout_type="train",
        since=0,
        stats={},
        turns=graph_turns([{"seq": 0, "parent": None}]),
        links=[(0, None, "agent")],
        findings=[],
    )
    assert live.apply(first) and live.next_since() == 1
    # Turn 1 resamples turn 0's prompt and is continued: turn 0 becomes a discarded root.
    later = GraphView(
        session_id="s1",
        tier="tokens",
        rollout_type="train",
        since=1,
        stats={},
        turns=graph_turns([{"seq": 1, "parent": None}, {"seq": 2, "parent": 1}]),
        links=[(0, None, "discarded"), (1, None, "agent"), (2, 1, "agent")],
        findings=[],
    )
    assert live.apply(later) and live.next_since() == 3
    assert live.turns[0].role == "discarded" and rollout_nodes(live.turns.values())[0].discarded
    assert not live.apply(later.model_copy(update={"turns": []}))  # nothing new: tree kept


def test_live_graph_asks_again_for_a_turn_it_lacks():
    live = LiveGraph()
    view = GraphView(
        session_id="s1",
        tier="tokens",
        rollout_type="train",
        since=0,
        stats={},
        turns=graph_turns([{"seq": 1, "parent": None}]),
        links=[(0, None, "agent"), (1, None, "agent")],
        findings=[],
    )
    live.apply(view)
    assert live.next_since() == 0


def test_a_rollouts_settings_line_is_in_the_tense_of_its_phase(api_data):
    done = next(
        r
        for r in RunDetail.model_validate(api_data["run_details"]["run-0001"]).rollouts
        if r.settings is not None and r.phase == "done"
    )
    assert " ran with: " in rollout_settings_line(done, "terminus-2")
    queued, running = (done.model_copy(update={"phase": p}) for p in ("queued", "agent"))
    assert " will run with: " in rollout_settings_line(queued, "terminus-2")
    assert " runs with: " in rollout_settings_line(running, "terminus-2")


def test_an_id_too_long_for_its_column_keeps_its_distinct_end():
    assert id_tail("run-20261202-213112-ab12", 30) == "run-20261202-213112-ab12"
    assert id_tail("run-20261202-213112-ab12", 10) == "…3112-ab12"


def test_a_name_cut_to_its_column_ends_in_an_ellipsis():
    assert clip("fizzbuzz-python", 12) == "fizzbuzz-py…" and len(clip("fizzbuzz-python", 12)) == 12
    assert clip("hello-file", 12) == "hello-file"


def test_header_phrases_break_between_phrases_never_inside_one():
    phrases = ["session sess0000", "greet-script", "tier tokens", "turns 3", "roots 2", "forks 1"]
    assert phrase_lines(phrases, 40) == [
        "session sess0000 · greet-script",
        "· tier tokens · turns 3 · roots 2",
        "· forks 1",
    ]
    # Wider than any line: split wherever it falls (by the widget), not pushed to a line of its own.
    assert phrase_lines(
        ["turn #2", "token-in from #0 (text path would differ from offset 48)", "x 1"], 30
    ) == ["turn #2 · token-in from #0 (text path would differ from offset 48)", "· x 1"]
    assert phrase_lines(["turn #0", "", "root"], 80) == ["turn #0 · root"]


def test_turn_label_puts_number_link_and_finish_first_and_clips_with_an_ellipsis():
    turns = graph_turns(
        [
            {"seq": 0, "parent": None},
            {
                "seq": 12,
                "parent": 0,
                "link_kind": "retokenized",
                "finish_reason": "length",
                "token_in": "ids",
                "sampled_len": 1234,
                "role": "auxiliary",
                "findings": [Finding.fatal("bad_ids", "id out of range")],
            },
        ]
    )
    label = turn_label(rollout_nodes(turns)[12])
    assert label == "#12 !fatal ≈retok length auxili…"  # the mode and tokens cut first
    assert len(label) == TURN_LABEL_WIDTH
    assert turn_label(rollout_nodes(turns)[0]) == "#0 4 tok"  # an agent turn that stopped


def test_a_runs_cancelled_rollouts_are_counted_apart_from_its_failures():
    run = RunSummary.model_validate(
        {
            "id": "run-1",
            "state": "cancelled",
            "plan": {},
            "created_at": 1.0,
            "counts": {"total": 6, "done": 6, "ok": 3, "failed": 3},
            "failures": {"cancelled": 2, "timeout": 1},
        }
    )
    assert run_outcomes(run) == (1, 2)
    assert failures_line(run.failures) == "failures: timeout 1 · cancelled 2"
    assert failures_line({"cancelled": 1}) == "failures: none · cancelled 1"
    assert failures_line({}) == "failures: none"
    cancelled = RolloutResult(rollout_id="r", task="t", phase="failed", error_kind="cancelled")
    assert fmt_phase(cancelled) == "cancelled"


def test_the_failures_line_counts_the_task_folders_a_run_left_out():
    assert (
        failures_line({"timeout": 1, "cancelled": 1}, 2)
        == "failures: timeout 1 · cancelled 1 · 2 task folders left out"
    )
    assert failures_line({}, 1) == "failures: none · 1 task folder left out"


async def test_an_error_toast_is_the_servers_own_message_or_a_plain_sentence():
    async def said(reply: httpx.Response, call: str, *args: object) -> str:
        """What the toast says when the server answers `call` with `reply`."""
        client = TapdeckClient("http://h", "k", transport=httpx.MockTransport(lambda _: reply))
        try:
            with pytest.raises(ApiError) as failed:
                await getattr(client, call)(*args)
        finally:
            await client.aclose()
        return describe_error(failed.value)

    assert (
        await said(
            httpx.Response(400, json={"detail": "dataset /x: no task.toml under it"}), "start_run", RunPlan()
        )
        == "dataset /x: no task.toml under it"
    )
    assert await said(
        httpx.Response(
            502, json={"detail": "dataset source unreachable: the Harbor registry did not answer"}
        ),
        "start_run",
        RunPlan(),
    ) == ("dataset source unreachable: the Harbor registry did not answer")
    assert (
        await said(httpx.Response(404, json={"detail": "no such session"}), "session", "s1")
        == "no such session"
    )
    assert "same tapdeck version" in await said(
        httpx.Response(404, json={"detail": "Not Found"}), "train_recipes"
    )
    assert (
        await said(httpx.Response(500, text="Internal Server Error"), "catalog")
        == "the server failed: Internal Server Error"
    )
    try:
        try:
            raise httpx.ConnectError("All connection attempts failed")
        except httpx.ConnectError as exc:
            raise ApiError(
                "tapdeck server at http://127.0.0.1:1 is not reachable (All connection "
                "attempts failed); is it running?",
                kind="unreachable",
            ) from exc
    except ApiError as unreachable:
        assert describe_error(unreachable) == "the tapdeck server is not reachable; is it running?"


def test_an_instruction_preview_joins_wrapped_lines_and_keeps_markdown_blocks():
    text = (
        "# Make a config\n\nCreate `/app/config.json`: a JSON object with\nexactly three keys.\n\n"
        "- `name` set to\n  the string `tapdeck`\n- `port`: 8300\n1. first\n2. second\n\n"
        '```json\n{"a": 1}\nmore\n```\n    indented code\n| a | b |\n| 1 | 2 |\n'
    )
    assert instruction_preview(text).splitlines() == [
        "# Make a config",
        "",
        "Create `/app/config.json`: a JSON object with exactly three keys.",
        "",
        "- `name` set to the string `tapdeck`",
        "- `port`: 8300",
        "1. first",
        "2. second",
        "",
        "```json",
        '{"a": 1}',
        "more",
        "```",
        "    indented code",
        "| a | b |",
        "| 1 | 2 |",
    ]


def test_a_turn_label_shows_its_policy_version_and_a_straddle_both_readings():
    turns = graph_turns(
        [
            {"seq": 0, "parent": None, "policy_version": 3},
            {"seq": 1, "parent": 0, "policy_version_straddled": (3, 4)},
            {"seq": 2, "parent": 1, "policy_version_straddled": (None, "b")},
            {"seq": 3, "parent": 2},
        ]
    )
    labels = [turn_label(n) for n in rollout_nodes(turns).values()]
    assert labels == ["#0 v3 4 tok", "#1 v3→4 4 tok", "#2 v?→b 4 tok", "#3 4 tok"]
    assert policy_text(None, None) == ""


def test_a_rollouts_policy_span_names_its_oldest_newest_and_straddles():
    assert policy_span_text(None) == ""
    assert policy_span_text(PolicySpan(oldest=2, newest=2)) == "policy v2"
    assert policy_span_text(PolicySpan(oldest=0, newest=2, straddled=1)) == "policy v0–2 (1 straddled)"
