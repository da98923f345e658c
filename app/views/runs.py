"""The Runs screen's values: a run's groups, outcomes, failures line and engine, and what its
rollouts ran with; the Setup screen's instruction preview."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tapdeck.app.views.text import clip
from tapdeck.runner.harnesses import calls_a_model
from tapdeck.schema.runs import ENDED_PHASES, NO_ENGINE, RolloutResult, RunSummary, mean_reward, pass_rate
from tapdeck.schema.settings import ResolvedSettings


@dataclass
class GroupRow:
    """One task's group of K rollouts."""

    task: str
    total: int
    done: int
    rewards: list[float | None]
    mean: float | None
    pass_rate: float | None


_BLOCK_STARTS = ("#", "-", "*", "+", ">", "|")


def _starts_a_line(line: str) -> bool:
    """A markdown line that keeps its own line when wrapped text is joined: a heading, a list item
    (bulleted or numbered), a quote or a table row."""
    head = line.lstrip()
    number, dot, _ = head.partition(". ")
    return head.startswith(_BLOCK_STARTS) or (bool(dot) and number.isdigit())


def instruction_preview(text: str) -> str:
    """An instruction's markdown for a narrow pane: each paragraph's hard-wrapped lines joined, so
    the pane wraps it at its own width; code blocks, headings, list items, quotes and table rows
    keep their lines."""
    out: list[str] = []
    joinable = fenced = False
    for raw in text.strip().splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            out.append(line)
            joinable = False
        elif fenced or not line:
            out.append(line)
            joinable = False
        elif joinable and not _starts_a_line(line) and not raw.startswith((" " * 4, "\t")):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
            joinable = not line.lstrip().startswith(("#", "|"))
    return "\n".join(out)


def run_groups(rollouts: Iterable[RolloutResult]) -> list[GroupRow]:
    """Per-task groups of a run: rewards, mean and pass rate over graded rollouts (`schema.runs`)."""
    by_task: dict[str, list[RolloutResult]] = {}
    for r in rollouts:
        by_task.setdefault(r.task, []).append(r)
    rows = []
    for task, items in sorted(by_task.items()):
        items = sorted(items, key=lambda r: r.index)
        rewards = [r.reward for r in items]
        done = sum(1 for r in items if r.phase in ENDED_PHASES)
        rows.append(GroupRow(task, len(items), done, rewards, mean_reward(rewards), pass_rate(rewards)))
    return rows


def run_outcomes(run: RunSummary) -> tuple[int, int]:
    """(failed, cancelled) among a run's ended rollouts. The server counts a cancelled rollout as
    not ok, among the failed; cancelling is a person's choice, not a failure (as `rollout_state`
    says), so it is counted apart, from the same summary's failures by kind."""
    cancelled = run.failures.get("cancelled", 0)
    return run.counts.failed - cancelled, cancelled


def failures_line(failures: Mapping[str, int], left_out: int = 0) -> str:
    """`failures: timeout 2, not_ok 1 · cancelled 1 · 1 task folder left out`: failures by cause,
    most first, the cancelled rollouts apart from them, and the dataset's folders that were not
    tasks Harbor could run (so never rollouts)."""
    failed = sorted(
        ((kind, n) for kind, n in failures.items() if kind != "cancelled"), key=lambda item: -item[1]
    )
    line = "failures: " + (", ".join(f"{kind} {n}" for kind, n in failed) if failed else "none")
    cancelled = failures.get("cancelled", 0)
    if cancelled:
        line += f" · cancelled {cancelled}"
    if left_out:
        line += f" · {left_out} task folder{'' if left_out == 1 else 's'} left out"
    return line


def degenerate_phrase(count: int, sep: str) -> str:
    """`sep` and "N degenerate (skipped by trainers)" for a run with rollouts graded degenerate
    (`schema.rollout_health`); "" for one without."""
    return f"{sep}{count} degenerate (skipped by trainers)" if count else ""


def run_engine(run: RunSummary, width: int) -> str:
    """The engine a run's rollouts call, in at most `width` cells: "embedded", "no engine" (oracle,
    nop), or the engine's URL without its scheme and `/v1`, its host cut before its port when
    still too wide. A run from an older server says what its plan asked for."""
    used = run.engine_used or run.plan.rollout.engine
    if used == NO_ENGINE:
        return "no engine"
    short = used.split("://", 1)[-1].rstrip("/").removesuffix("/v1")
    if len(short) <= width:
        return short
    cut = min((i for i in (short.find(":"), short.find("/")) if i > 0), default=len(short))
    host, rest = short[:cut], short[cut:]
    if len(rest) > width // 2:  # a long path: its start, as any cut name
        return clip(short, width)
    return clip(host, width - len(rest)) + rest


def fmt_rate(value: Any) -> str:
    """A pass rate as a percentage, "–" when nothing was graded."""
    if value is None:
        return "–"
    return f"{float(value) * 100:.0f}%"


def ran_with(settings: ResolvedSettings, harness: str) -> str:
    """What a rollout of `harness` ran with, each value with its source: the timeouts, then the
    context, output, turns and sampling, which mean nothing where the harness calls no model."""
    if calls_a_model(harness):
        return settings.line()
    return f"{settings.timeouts_line()} (no model calls)"


def rollout_settings_line(rollout: RolloutResult, harness: str) -> str:
    """`task #i ran with: …` (`ran_with` for its run's harness), or why nothing is known yet."""
    name = f"{rollout.task} #{rollout.index}"
    if rollout.settings is None:
        return f"{name}: settings not resolved (resolved when its capture session opens)"
    tense = "ran" if rollout.phase in ENDED_PHASES else "will run" if rollout.phase == "queued" else "runs"
    return f"{name} {tense} with: {ran_with(rollout.settings, harness)}"
