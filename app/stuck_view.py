"""What the stuck-rollout pane says about one session, free of Textual (testable alone).

Inputs: the session's summary (from the board), its rollout's live result (from `rollout_updated`
events, with `phase_started`), its `SessionActivity` and findings (all `tapdeck.schema` models). Times are
the server's wall clock:
`server_now` is the activity's `now` advanced by the local time since it was fetched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tapdeck.schema.activity import SessionActivity
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.runs import RolloutResult
from tapdeck.schema.sessions import SessionSummary

STUCK_CALL_S = 60.0
"""A model call in flight this long is highlighted (the engine may be hung)."""
PHASE_WORDS = {
    "queued": "queued",
    "install": "agent install",
    "sandbox": "environment setup",
    "agent_setup": "agent setup",
    "agent": "agent",
    "verify": "verifier",
}
TAIL_LINES = 6
MAX_FINDINGS = 5
"""Distinct findings shown (the newest; the Rollout screen's findings tab has them all)."""


@dataclass(frozen=True)
class PaneLine:
    """One line of the pane: a label, its text, and a tone the widget maps to a theme colour."""

    label: str
    text: str
    tone: str = ""


def phase_timings(rollout: RolloutResult, server_now: float) -> list[tuple[str, float, bool]]:
    """(phase, seconds, running now) per phase the rollout went through, in order.

    Each phase lasts until the next began; the last one until the rollout finished, else until now.
    """
    started = sorted((t, p) for p, t in rollout.phase_started.items() if p in PHASE_WORDS)
    finished = rollout.finished_at
    out = []
    for i, (at, phase) in enumerate(started):
        live = i == len(started) - 1 and finished is None
        end = started[i + 1][0] if i + 1 < len(started) else (finished if finished else server_now)
        out.append((phase, max(0.0, end - at), live))
    return out


def fmt_seconds(seconds: float) -> str:
    """`0.4 s`, `63 s`, `12 m 5 s`."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} m {int(seconds % 60)} s"


def plural(n: int, word: str) -> str:
    """`1 error`, `2 errors`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def tail(text: str, lines: int = TAIL_LINES, width: int = 200) -> str:
    """The last `lines` non-empty lines of `text`, each cut to `width`."""
    kept = [line[:width] for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(kept)


def pane_lines(
    summary: SessionSummary | None,
    rollout: RolloutResult | None,
    activity: SessionActivity | None,
    findings: Sequence[Finding],
    server_now: float,
) -> list[PaneLine]:
    """Everything the pane shows, top to bottom."""
    meta = summary.metadata if summary is not None else {}
    head = " · ".join(
        str(x)
        for x in (
            (rollout.rollout_id if rollout else None) or meta.get("rollout_id") or "no rollout",
            meta.get("task") or (rollout.task if rollout else None),
            meta.get("harness") or (rollout.harness if rollout else None),
        )
        if x
    )
    lines = [PaneLine("rollout", head)]
    if rollout is not None:
        phases = phase_timings(rollout, server_now)
        text = (
            " · ".join(
                f"{PHASE_WORDS[p]} {fmt_seconds(s)}{' (now)' if live else ''}" for p, s, live in phases
            )
            or rollout.phase
        )
        lines.append(PaneLine("phases", text))
        if rollout.error_kind:
            lines.append(PaneLine("ended", f"{rollout.error_kind}: {rollout.error or ''}", "error"))
    if activity is None:
        lines.append(
            PaneLine(
                "model",
                "activity not loaded yet"
                if summary is not None
                else "no capture session: this rollout made no model calls",
                "muted",
            )
        )
    else:
        lines.extend(_call_lines(activity, server_now))
    counts = Counter(str(f) for f in findings)
    levels = {str(f): f.level for f in findings}
    for text in list(counts)[-MAX_FINDINGS:]:
        tone = {Level.FATAL: "error", Level.WARN: "warning"}.get(levels[text], "")
        times = f" (×{counts[text]})" if counts[text] > 1 else ""
        lines.append(PaneLine("finding", text + times, tone))
    return lines


def _call_lines(activity: SessionActivity, server_now: float) -> list[PaneLine]:
    lines = []
    if activity.in_flight:
        oldest = activity.in_flight[0]
        age = max(0.0, server_now - oldest.started_at)
        more = f" (+{len(activity.in_flight) - 1} more)" if len(activity.in_flight) > 1 else ""
        lines.append(
            PaneLine(
                "in flight",
                f"model call {fmt_seconds(age)} old · {oldest.dialect or '?'} · "
                f"{oldest.messages} messages{more}",
                "error" if age >= STUCK_CALL_S else "accent",
            )
        )
        updating = [
            c.engine_updating_since for c in activity.in_flight if c.engine_updating_since is not None
        ]
        if updating:
            waited = fmt_seconds(max(0.0, server_now - min(updating)))
            lines.append(
                PaneLine("engine", f"updating: refused with 503 for {waited}, tapdeck resending", "warning")
            )
    else:
        since = (
            ""
            if activity.last_ended_at is None
            else f" · last ended {fmt_seconds(max(0.0, server_now - activity.last_ended_at))} ago"
        )
        lines.append(PaneLine("in flight", f"no model call{since}", "muted"))
    counts = f"{plural(activity.calls_ended, 'call')} · {plural(activity.errors, 'error')}"
    if activity.last_finish_reason:
        counts += f" · last finish {activity.last_finish_reason}"
    lines.append(PaneLine("calls", counts))
    if activity.last_error:
        lines.append(PaneLine("last error", activity.last_error, "error"))
    if activity.last_assistant is not None:
        lines.append(PaneLine("assistant", tail(activity.last_assistant.text) or "(no text)"))
    if activity.last_tool_call is not None:
        call = activity.last_tool_call
        lines.append(PaneLine("tool call", f"{call.name}({call.arguments[:200]})", "accent"))
    if activity.last_observation is not None:
        obs = activity.last_observation
        cut = "…" if obs.truncated else ""
        lines.append(PaneLine("observation", f"({obs.role}) {cut}{tail(obs.text) or '(empty)'}"))
    return lines


def calls_per_second(
    ends: Sequence[float], server_now: float, buckets: int = 30, bucket_s: float = 2.0
) -> list[float]:
    """Calls ended per second in each of the last `buckets` windows of `bucket_s` (oldest first)."""
    counts = [0] * buckets
    start = server_now - buckets * bucket_s
    for at in ends:
        if at >= start:
            counts[min(buckets - 1, int((at - start) // bucket_s))] += 1
    return [c / bucket_s for c in counts]
