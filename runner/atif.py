"""ATIF reconciliation: does the harness's own trajectory agree with what the proxy captured?

Ours: the completion-token counts of the agent-rooted captured calls, in arrival order (the proxy's
own budget-stop replies left out). Theirs: `metrics.completion_tokens` of the agent steps in
`agent/trajectory.json` (zero-token synthetic API-error steps and non-LLM dispatch steps left out).
The verdict is `match`, `mismatch` or `none`, with findings exactly as capture-cases L71-78 pin them.

One harness behaviour is recognised rather than called a mismatch: terminus-2 re-asks after a reply
cut by `max_tokens` and never records the cut call in its trajectory. When theirs equals ours with
exactly the length-cut calls left out, the verdict is `match` with a WARN that names them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tapdeck.runner import harbor_api
from tapdeck.schema.findings import Finding

Verdict = Literal["match", "mismatch", "none"]

AUXILIARY_SHARE = 0.5
"""Theirs must cover at least this share of our calls for extra calls to count as auxiliary; the
rollout then demotes those calls (`CaptureService.mark_auxiliary`): masked out of training."""


@dataclass(frozen=True)
class CapturedCall:
    """What reconciliation needs from one captured agent-rooted call."""

    seq: int
    completion_tokens: int | None
    prompt_tokens: int | None = None
    synthetic: bool = False
    """A reply the proxy made itself (call budget reached): never a real model call."""
    truncated: bool = False
    """The engine cut the reply at max_tokens (finish_reason `length`)."""


@dataclass
class AtifReport:
    """Verdict plus the findings that explain it."""

    verdict: Verdict
    findings: list[Finding] = field(default_factory=list)
    ours: list[int | None] = field(default_factory=list)
    theirs: list[int | None] = field(default_factory=list)
    auxiliary: list[int] = field(default_factory=list)
    """Seqs of captured calls the trajectory does not account for: to be demoted to auxiliary."""


def load_trajectory(path: Path) -> tuple[dict[str, Any] | None, Finding | None]:
    """Read and validate a trajectory file with Harbor's ATIF model; a bad file is a WARN, not a crash."""
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, Finding.warn("atif_unreadable", f"{path}: {exc}")
    try:
        harbor_api.Trajectory.model_validate(data)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, or Harbor missing
        return data if isinstance(data, dict) else None, Finding.warn(
            "atif_invalid", f"{path} does not validate as ATIF: {str(exc).splitlines()[0]}"
        )
    return data, None


def reconcile_file(
    calls: list[CapturedCall], trajectory_path: Path, *, rollout_type: str = "train"
) -> AtifReport:
    """Reconcile the captured calls with the trajectory at `trajectory_path` (absent → `none`)."""
    data, problem = load_trajectory(trajectory_path)
    report = reconcile(calls, data, rollout_type=rollout_type)
    if problem is not None:
        report.findings.insert(0, problem)
    return report


def _agent_steps(trajectory: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Agent steps that stand for model calls, and how many synthetic zero-token steps were dropped."""
    kept: list[dict[str, Any]] = []
    dropped = 0
    for step in trajectory.get("steps") or []:
        if not isinstance(step, dict) or step.get("source") != "agent":
            continue
        if step.get("llm_call_count") == 0:
            continue  # deterministic dispatch, no model call behind it
        metrics = step.get("metrics") or {}
        if metrics.get("completion_tokens") == 0 and not metrics.get("prompt_tokens"):
            dropped += 1  # synthetic API-error step (Claude Code writes these)
            continue
        kept.append(step)
    return kept, dropped


def reconcile(
    calls: list[CapturedCall], trajectory: dict[str, Any] | None, *, rollout_type: str = "train"
) -> AtifReport:
    """Compare captured calls with a parsed trajectory (None → no trajectory → `none`)."""
    if trajectory is None:
        return AtifReport("none", [Finding.info("atif_absent", "the harness wrote no agent/trajectory.json")])
    findings: list[Finding] = []
    real_calls = [c for c in calls if not c.synthetic]
    ours = [c.completion_tokens for c in real_calls]
    steps, dropped = _agent_steps(trajectory)
    theirs: list[int | None] = [(s.get("metrics") or {}).get("completion_tokens") for s in steps]

    if dropped:
        findings.append(
            Finding.info("atif_synthetic_steps", f"{dropped} zero-token synthetic agent step(s) left out")
        )
    if trajectory.get("subagent_trajectories"):
        findings.append(
            Finding.fatal(
                "atif_subagents",
                f"the trajectory embeds {len(trajectory['subagent_trajectories'])} "
                "subagent trajectories: the reward cannot be attributed to one conversation",
            )
        )
    multi = [s.get("step_id") for s in steps if (s.get("llm_call_count") or 0) > 1]
    if multi:
        findings.append(
            Finding.warn("atif_multi_call_steps", f"agent steps {multi} aggregate several model calls")
        )

    def done(verdict: Verdict, auxiliary: list[int] | None = None) -> AtifReport:
        if any(f.code == "atif_subagents" for f in findings):
            verdict, auxiliary = "mismatch", None
        return AtifReport(verdict, findings, ours, theirs, auxiliary or [])

    if not steps or all(t in (0, None) for t in theirs):
        findings.append(
            Finding.warn(
                "atif_no_counts",
                "the trajectory has no agent steps with completion-token counts: nothing to compare",
            )
        )
        return done("none")

    if rollout_type == "eval":
        # Without token ids our per-call counts are the engine's usage numbers: compare calls only.
        if len(theirs) == len(ours):
            return done("match")
        return done(_mismatch(findings, ours, theirs, "call counts differ"))

    recorded = [c for c in real_calls if not c.truncated]
    truncated_unrecorded = len(recorded) < len(real_calls) and theirs == [
        c.completion_tokens for c in recorded
    ]
    if truncated_unrecorded:
        cut = [c.seq for c in real_calls if c.truncated]
        findings.append(
            Finding.warn(
                "atif_truncated_unrecorded",
                f"{len(cut)} call(s) cut by max_tokens (turns {cut}) are not in the trajectory: the "
                "harness re-asked without recording them; every other call agrees",
            )
        )
    aligned = recorded if truncated_unrecorded else real_calls

    if aligned:
        first_theirs = (steps[0].get("metrics") or {}).get("prompt_tokens")
        first_ours = aligned[0].prompt_tokens
        if first_theirs is not None and first_ours is not None and first_theirs != first_ours:
            findings.append(
                Finding.warn(
                    "atif_first_prompt_differs",
                    f"first prompt: captured {first_ours} tokens, trajectory says {first_theirs}",
                )
            )

    if theirs == ours or truncated_unrecorded:
        return done("match")
    if len(theirs) == len(ours) and any(t is None for t in theirs):
        missing = [i for i, t in enumerate(theirs) if t is None]
        if all(t == o for t, o in zip(theirs, ours, strict=True) if t is not None):
            findings.append(
                Finding.warn(
                    "atif_counts_missing",
                    f"agent steps at positions {missing} have no completion count; the rest agree",
                )
            )
            return done("match")
    if None not in theirs and len(theirs) < len(ours) and _is_subsequence(theirs, ours):
        extra = len(ours) - len(theirs)
        if len(theirs) >= AUXILIARY_SHARE * len(ours):
            unrecorded = _unmatched(theirs, real_calls)
            findings.append(
                Finding.warn(
                    "atif_extra_calls",
                    f"{extra} captured call(s) are not in the trajectory "
                    f"(turns {unrecorded}): demoted to auxiliary, masked out "
                    f"of training (ours {ours}, theirs {theirs})",
                )
            )
            return done("match", unrecorded)
        findings.append(
            Finding.fatal(
                "atif_mismatch",
                f"the trajectory accounts for only {len(theirs)} of "
                f"{len(ours)} captured calls (ours {ours}, theirs {theirs})",
            )
        )
        return done("mismatch")
    return done(_mismatch(findings, ours, theirs, "completion-token counts differ"))


def _mismatch(findings: list[Finding], ours: list[int | None], theirs: list[int | None], why: str) -> Verdict:
    findings.append(Finding.fatal("atif_mismatch", f"{why}: ours {ours}, theirs {theirs}"))
    return "mismatch"


def _unmatched(theirs: list[int | None], calls: list[CapturedCall]) -> list[int]:
    """Seqs of the calls left over when `theirs` is matched to `calls` in order, earliest first."""
    left: list[int] = []
    wanted = iter(theirs)
    want = next(wanted, None)
    for call in calls:
        if want is not None and call.completion_tokens == want:
            want = next(wanted, None)
        else:
            left.append(call.seq)
    return left


def _is_subsequence(small: list[int | None], big: list[int | None]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)
