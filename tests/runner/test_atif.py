"""ATIF reconciliation, one test per capture-cases L item (71-78).

Trajectories are built with Harbor's own ATIF models so they are shaped exactly as harnesses write them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harbor.models.trajectories import Agent, Metrics, Step, Trajectory

from tapdeck.runner.atif import CapturedCall, reconcile, reconcile_file
from tapdeck.schema.findings import Level


def _trajectory(
    counts: list[int | None],
    *,
    prompts: list[int] | None = None,
    llm_call_counts: list[int | None] | None = None,
    subagents: bool = False,
) -> dict[str, Any]:
    steps = [Step(step_id=1, source="user", message="do the task")]
    for i, count in enumerate(counts):
        metrics = Metrics(completion_tokens=count, prompt_tokens=prompts[i] if prompts else 100 + i)
        steps.append(
            Step(
                step_id=len(steps) + 1,
                source="agent",
                message=f"reply {i}",
                metrics=metrics,
                llm_call_count=llm_call_counts[i] if llm_call_counts else None,
            )
        )
    traj = Trajectory(session_id="s", agent=Agent(name="terminus-2", version="2.0"), steps=steps)
    if subagents:
        sub = Trajectory(
            session_id="s",
            trajectory_id="sub-1",
            agent=Agent(name="helper", version="1"),
            steps=[Step(step_id=1, source="user", message="sub")],
        )
        traj = traj.model_copy(update={"subagent_trajectories": [sub]})
    return traj.to_json_dict()


def _calls(
    counts: list[int | None], *, first_prompt: int = 100, synthetic: set[int] = frozenset()
) -> list[CapturedCall]:
    return [
        CapturedCall(seq=i, completion_tokens=c, prompt_tokens=first_prompt + i, synthetic=i in synthetic)
        for i, c in enumerate(counts)
    ]


def _codes(report) -> dict[str, Level]:
    return {f.code: f.level for f in report.findings}


def test_no_trajectory_file_is_none_with_info(tmp_path: Path) -> None:
    report = reconcile_file(_calls([5]), tmp_path / "agent" / "trajectory.json")
    assert report.verdict == "none"
    assert _codes(report) == {"atif_absent": Level.INFO}


def test_equal_counts_in_arrival_order_match(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(_trajectory([12, 40, 7])))
    report = reconcile_file(_calls([12, 40, 7]), path)
    assert report.verdict == "match" and report.findings == []


def test_same_counts_in_another_order_mismatch() -> None:
    report = reconcile(_calls([12, 40, 7]), _trajectory([40, 12, 7]))
    assert report.verdict == "mismatch"
    fatal = [f for f in report.findings if f.level is Level.FATAL]
    assert fatal and "[12, 40, 7]" in fatal[0].detail and "[40, 12, 7]" in fatal[0].detail


def test_theirs_a_subsequence_covering_half_or_more_is_auxiliary_warn() -> None:
    report = reconcile(_calls([12, 3, 40, 7]), _trajectory([12, 40, 7]))
    assert report.verdict == "match"
    assert _codes(report) == {"atif_extra_calls": Level.WARN}


def test_theirs_a_subsequence_covering_under_half_is_fatal() -> None:
    ours = [12, 3, 4, 5, 40, 6, 7, 8, 9, 10]
    report = reconcile(_calls(ours), _trajectory([12, 40]))
    assert report.verdict == "mismatch"
    assert _codes(report)["atif_mismatch"] is Level.FATAL


def test_all_zero_counts_warn_not_mismatch() -> None:
    report = reconcile(_calls([12, 40]), _trajectory([0, 0]))
    assert report.verdict != "mismatch"
    assert _codes(report) == {"atif_no_counts": Level.WARN}


def test_no_agent_steps_warn_not_mismatch() -> None:
    report = reconcile(_calls([12, 40]), _trajectory([]))
    assert report.verdict != "mismatch"
    assert _codes(report) == {"atif_no_counts": Level.WARN}


def test_some_counts_missing_rest_equal_warn() -> None:
    report = reconcile(_calls([12, 40, 7]), _trajectory([12, None, 7]))
    assert report.verdict == "match"
    assert _codes(report) == {"atif_counts_missing": Level.WARN}


def test_subagent_trajectories_are_fatal() -> None:
    report = reconcile(_calls([12]), _trajectory([12], subagents=True))
    assert report.verdict == "mismatch"
    assert _codes(report)["atif_subagents"] is Level.FATAL


def test_zero_token_synthetic_steps_are_dropped_before_comparing() -> None:
    traj = _trajectory([12, 0, 7], prompts=[100, 0, 102])
    report = reconcile(_calls([12, 7]), traj)
    assert report.verdict == "match"
    assert _codes(report) == {"atif_synthetic_steps": Level.INFO}


def test_our_budget_stop_replies_are_dropped_before_comparing() -> None:
    report = reconcile(_calls([12, 7, 9], synthetic={2}), _trajectory([12, 7]))
    assert report.verdict == "match" and report.findings == []


def test_multi_call_step_warns() -> None:
    report = reconcile(_calls([12, 7]), _trajectory([12, 7], llm_call_counts=[1, 2]))
    assert report.verdict == "match"
    assert _codes(report) == {"atif_multi_call_steps": Level.WARN}


def test_first_prompt_length_difference_warns() -> None:
    report = reconcile(_calls([12, 7], first_prompt=90), _trajectory([12, 7], prompts=[100, 101]))
    assert report.verdict == "match"
    assert _codes(report) == {"atif_first_prompt_differs": Level.WARN}


def test_eval_rollouts_compare_call_counts_only() -> None:
    calls = _calls([None, None], first_prompt=1)
    assert reconcile(calls, _trajectory([12, 7]), rollout_type="eval").verdict == "match"
    assert reconcile(calls, _trajectory([12]), rollout_type="eval").verdict == "mismatch"


def test_anything_else_is_a_fatal_mismatch_with_both_lists() -> None:
    report = reconcile(_calls([12, 40]), _trajectory([12, 41]))
    assert report.verdict == "mismatch"
    fatal = [f for f in report.findings if f.level is Level.FATAL]
    assert len(fatal) == 1 and "[12, 40]" in fatal[0].detail and "[12, 41]" in fatal[0].detail


def test_unparseable_trajectory_is_a_warn_and_none(tmp_path: Path) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text("{not json")
    report = reconcile_file(_calls([5]), path)
    assert report.verdict == "none"
    assert _codes(report)["atif_unreadable"] is Level.WARN


def test_length_cut_calls_missing_from_the_trajectory_match_with_a_warning() -> None:
    # terminus-2 re-asks after a max_tokens cut without recording the cut call (measured here:
    # ours [256, 178, 256, 96], theirs [178, 96]). The first prompt is compared with the first
    # recorded call's, not with the cut one's.
    calls = [
        CapturedCall(seq=0, completion_tokens=256, prompt_tokens=838, truncated=True),
        CapturedCall(seq=1, completion_tokens=178, prompt_tokens=1177),
        CapturedCall(seq=2, completion_tokens=256, prompt_tokens=1400, truncated=True),
        CapturedCall(seq=3, completion_tokens=96, prompt_tokens=1700),
    ]
    report = reconcile(calls, _trajectory([178, 96], prompts=[1177, 1700]))
    assert report.verdict == "match"
    assert _codes(report) == {"atif_truncated_unrecorded": Level.WARN}
    assert "turns [0, 2]" in str(report.findings[0])


def test_recorded_calls_missing_besides_the_length_cut_ones_are_still_a_mismatch() -> None:
    # Left out are the cut call and two complete ones: under half of ours is accounted for.
    calls = [
        CapturedCall(seq=0, completion_tokens=256, prompt_tokens=838, truncated=True),
        CapturedCall(seq=1, completion_tokens=178, prompt_tokens=1177),
        CapturedCall(seq=2, completion_tokens=60, prompt_tokens=1400),
        CapturedCall(seq=3, completion_tokens=61, prompt_tokens=1500),
        CapturedCall(seq=4, completion_tokens=96, prompt_tokens=1700),
    ]
    report = reconcile(calls, _trajectory([178, 96], prompts=[1177, 1700]))
    assert report.verdict == "mismatch"
    assert _codes(report)["atif_mismatch"] is Level.FATAL


def test_calls_the_trajectory_never_recorded_are_named_for_demotion() -> None:
    report = reconcile(_calls([12, 40, 7, 9]), _trajectory([12, 7, 9]))
    assert report.verdict == "match" and report.auxiliary == [1]
    assert "demoted to auxiliary" in report.findings[0].detail
    assert reconcile(_calls([12, 40, 7]), _trajectory([12, 40, 7])).auxiliary == []


def _recorded_session(tmp_path: Path):
    """A closed train session on a real store holding the three recorded vLLM turns of one
    conversation (a chain), opened by a fresh capture service as a restarted server would."""
    from tapdeck.proxy.capture.graph import RolloutGraph
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tests.support.recorded_turns import turn_from_fixture

    store = Store(tmp_path / "capture.db")
    store.create_session(
        {
            "id": "s-00000000000000a1",
            "state": "closed",
            "tier": "tokens",
            "rollout_type": "train",
            "engine": {"url": "http://e/v1"},
            "metadata": {},
            "created_at": 1.0,
        }
    )
    graph = RolloutGraph()
    for i, name in enumerate(["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]):
        turn = turn_from_fixture(name, i, "s-00000000000000a1")
        store.append_turn(turn, graph.add(turn))
    return store, lambda: CaptureService(store, default_engine=None, public_url="http://x")


def _roles(service, sid: str) -> list[str]:
    return [t["role"] for t in sorted(service.rollout_document(sid)["turns"], key=lambda t: t["seq"])]


def _trained_seqs(service, sid: str) -> list[str]:
    return [e["node_id"] for e in service.training_trace(sid)["turns"]]


def test_extra_calls_are_demoted_to_auxiliary_and_masked_out_of_training(tmp_path: Path) -> None:
    from tapdeck.runner.rollout import captured_calls

    store, restart = _recorded_session(tmp_path)
    sid = "s-00000000000000a1"
    service = restart()
    calls = captured_calls(service.rollout_document(sid))
    counts = [c.completion_tokens for c in calls]
    assert _roles(service, sid) == ["agent"] * 3 and _trained_seqs(service, sid) == ["0", "1", "2"]

    # The harness recorded the first and last calls only: the middle one is demoted.
    report = reconcile(calls, _trajectory([counts[0], counts[2]], prompts=[calls[0].prompt_tokens, 0]))
    assert report.verdict == "match" and report.auxiliary == [1]
    service.mark_auxiliary(sid, report.auxiliary, "not in the harness's ATIF trajectory")
    assert _roles(service, sid) == ["agent", "auxiliary", "agent"]
    assert _trained_seqs(service, sid) == ["0", "2"]
    middle = service.turn_detail(sid, 1)
    assert set(middle["mask"]) == {0} and middle["meta"]["call_role"] == "auxiliary"

    # A restarted server demotes it again (kept with the session).
    assert _roles(restart(), sid) == ["agent", "auxiliary", "agent"]
    store.close()


def test_a_trajectory_recording_every_call_demotes_nothing(tmp_path: Path) -> None:
    from tapdeck.runner.rollout import captured_calls

    store, restart = _recorded_session(tmp_path)
    sid = "s-00000000000000a1"
    service = restart()
    calls = captured_calls(service.rollout_document(sid))
    report = reconcile(
        calls,
        _trajectory([c.completion_tokens for c in calls], prompts=[c.prompt_tokens or 0 for c in calls]),
    )
    assert report.verdict == "match" and report.auxiliary == []
    assert _roles(service, sid) == ["agent"] * 3 and _trained_seqs(service, sid) == ["0", "1", "2"]
    store.close()


def test_a_demoted_call_stays_out_of_an_export_read_straight_from_the_store(tmp_path: Path) -> None:
    """`tapdeck export` reads the store without a server: the calls the harness's trajectory never
    recorded must stay out of its training rows there too, as they do in the server's export."""
    from tapdeck.app.commands.export import session_rows
    from tapdeck.proxy.store.database import Store
    from tapdeck.runner.rollout import captured_calls

    store, restart = _recorded_session(tmp_path)
    sid = "s-00000000000000a1"
    service = restart()
    calls = captured_calls(service.rollout_document(sid))
    counts = [c.completion_tokens for c in calls]
    report = reconcile(calls, _trajectory([counts[0], counts[2]], prompts=[calls[0].prompt_tokens, 0]))
    service.mark_auxiliary(sid, report.auxiliary, "not in the harness's ATIF trajectory")
    store.close()

    reader = Store(tmp_path / "capture.db", read_only=True)
    try:
        assert [row["node_id"] for row in session_rows(reader, sid)] == ["0", "2"]
    finally:
        reader.close()
