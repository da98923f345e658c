"""The stuck-rollout pane's words, from a rollout result, a session's activity and its findings."""

from __future__ import annotations

from tapdeck.app.stuck_view import STUCK_CALL_S, calls_per_second, pane_lines, phase_timings, plural
from tapdeck.schema.activity import InFlightCall, MessageView, SessionActivity, ToolCallView
from tapdeck.schema.findings import Finding
from tapdeck.schema.runs import RolloutResult

ROLLOUT = RolloutResult(
    rollout_id="run-1.g000r00",
    task="hello-file",
    harness="terminus-2",
    phase="agent",
    phase_started={"queued": 1000.0, "sandbox": 1001.0, "agent": 1003.5},
)


def test_each_phase_lasts_until_the_next_and_the_current_one_until_now() -> None:
    assert phase_timings(ROLLOUT, 1010.0) == [
        ("queued", 1.0, False),
        ("sandbox", 2.5, False),
        ("agent", 6.5, True),
    ]
    done = ROLLOUT.model_copy(
        update={"phase_started": {**ROLLOUT.phase_started, "failed": 1020.0}, "finished_at": 1020.0}
    )
    assert phase_timings(done, 5000.0)[-1] == ("agent", 16.5, False)  # the end phase is no phase


def test_a_call_in_flight_past_the_threshold_is_highlighted_with_the_last_exchange() -> None:
    activity = SessionActivity(
        session_id="s",
        now=2000.0,
        calls_ended=3,
        in_flight=[
            InFlightCall(call_id=4, started_at=2000.5 - STUCK_CALL_S - 5, dialect="openai", messages=9)
        ],
        last_assistant=MessageView(role="assistant", text="I will run the tests."),
        last_tool_call=ToolCallView(name="bash", arguments='{"cmd": "pytest"}'),
        last_observation=MessageView(
            role="tool", text="\n".join(f"line {i}" for i in range(50)), truncated=True
        ),
    )
    lines = {
        line.label: line
        for line in pane_lines(None, ROLLOUT, activity, [Finding.warn("prefix_break", "at 3")], 2000.5)
    }
    assert lines["in flight"].tone == "error" and "65 s old" in lines["in flight"].text
    assert lines["tool call"].text == 'bash({"cmd": "pytest"})'
    observed = lines["observation"].text
    assert observed.startswith("(tool) …") and observed.endswith("line 49") and "line 43" not in observed
    assert lines["phases"].text.endswith("agent 16 m 37 s (now)")
    assert lines["finding"].tone == "warning"


def test_a_call_the_engine_refuses_while_updating_says_so_with_how_long() -> None:
    activity = SessionActivity(
        session_id="s",
        now=100.0,
        in_flight=[InFlightCall(call_id=1, started_at=50.0, engine_updating_since=70.0)],
    )
    lines = {line.label: line for line in pane_lines(None, ROLLOUT, activity, [], 100.0)}
    assert lines["engine"].tone == "warning" and "503 for 30 s" in lines["engine"].text
    held = SessionActivity(session_id="s", now=100.0, in_flight=[InFlightCall(call_id=1, started_at=50.0)])
    assert "engine" not in {line.label for line in pane_lines(None, ROLLOUT, held, [], 100.0)}


def test_calls_per_second_buckets_recent_call_ends() -> None:
    rates = calls_per_second([90.0, 99.0, 99.5, 10.0], 100.0, buckets=5, bucket_s=2.0)
    assert rates == [0.5, 0.0, 0.0, 0.0, 1.0]  # the call at 10 s is before the window


def test_counts_agree_in_number_and_a_sessionless_rollout_does_not_wait_for_activity() -> None:
    assert plural(1, "error") == "1 error" and plural(0, "error") == "0 errors"
    lines = pane_lines(None, None, None, [], 0.0)
    assert [line.text for line in lines if line.label == "model"] == [
        "no capture session: this rollout made no model calls"
    ]
