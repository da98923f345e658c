"""`data-check`: check an exported run against TRL's trainer contract and score it as GRPO would.

It does NOT train: no weights change (no CPU recipe here does; see `tapdeck.runner.recipes`). What it
does, on any machine, step by step so a live plot shows it working:

1. Reads the JSONL of a tapdeck run export — one row per captured agent turn as written by
   `tapdeck export RUN` (`tapdeck.proxy.capture.export.trace_rows` + `write_jsonl`), or one row per rollout
   with a nested `turns` list as written by `POST /admin/runs/{id}/export`. Rollouts whose rows say
   `ok: false` (failed or cancelled) are left out, named in the log.
2. Validates every turn as TRL AsyncGRPO's loop-owning worker would read it: `loss_mask` covers
   prompt+completion and is 0 on the whole prompt, `per_token_logps` is as long as the completion,
   every completion token (trained or not) has a finite, non-positive logprob, as OpenEnv's
   `TrainingTurn` requires; ids are non-negative integers.
3. Chains each rollout's turns into training rows the way TRL does (`build_rows`: clean append,
   realign or fork per transition; `--fork-threshold`, 0 as in grpo-trl's lossless mode), checks
   `input_ids`, `completion_mask`, `old_log_probs` have one length, and drops rows with no trained
   token. tests/runner/recipes/test_data_check_equals_trl.py runs TRL's own functions on the same rows.
4. Per group (`group_id`): the GRPO advantage of each scorable rollout,
   `(r − mean) / (std + 1e-8)` over the group's scorable rollouts only, with the population std
   (n, numpy's default), as TRL's AsyncGRPO worker computes it; `reward: null` is excluded (never
   read as 0, its rollout gets advantage 0 and its rows stay samples, as in TRL); a group with no
   scorable rollout is unscorable (every advantage 0).
5. Logs one trackio step per group, TRL's metric names where they exist (`train/reward`,
   `train/reward_std`, `train/batch/trained_tokens_per_step`, …) and `check/…` for what is ours
   (`check/advantages/<i>` = the i-th rollout of the group by rollout id, running totals of
   valid/invalid rows). Also writes `advantages.jsonl` and `summary.json` into `--out-dir`.

Exit code 0 when every row is valid, 1 when some row breaks the contract (listed in the log),
2 when the input cannot be read or leaves nothing to check (no rollout, or none that ended ok).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapdeck.proxy.store.atomic_write import atomic_write

EPS = 1e-8


@dataclass
class TurnRow:
    """One captured call as exported."""

    node_id: Any
    prompt: list[Any] | None
    completion: list[Any] | None
    logps: list[Any] | None
    mask: list[Any] | None


@dataclass
class Rollout:
    """One rollout: its group, reward (None = never graded) and turns in capture order."""

    rollout_id: str
    group_id: str
    reward: float | None
    ok: bool = True
    """False when its rows say it did not end ok (`ok: false`: failed or cancelled)."""
    turns: list[TurnRow] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    rows: list[TrainingRow] = field(default_factory=list)
    tally: ChainTally = field(default_factory=lambda: ChainTally())
    advantage: float | None = None


@dataclass
class TrainingRow:
    """A row as TRL's trainer takes it (before advantage and padding)."""

    input_ids: np.ndarray
    completion_mask: np.ndarray
    old_log_probs: np.ndarray

    @property
    def trained_tokens(self) -> int:
        return int(self.completion_mask.sum())


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


PARQUET_MAGIC = b"PAR1"


def export_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, row) of an export: JSONL, or the Parquet `tapdeck export --format parquet`
    writes (told apart by Parquet's leading magic bytes, whatever the file is called)."""
    with Path(path).open("rb") as f:
        parquet = f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    if parquet:
        import pyarrow.parquet as pq  # only for a Parquet export: JSONL needs no pyarrow

        # Token columns come back as lists; the nested request/response/metadata stay JSON
        # strings, which no check reads.
        yield from enumerate(pq.read_table(path).to_pylist(), 1)
        return
    with Path(path).open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from exc


def load_rollouts(path: Path) -> list[Rollout]:
    """Rollouts from an export, JSONL or Parquet (per-turn rows, or per-rollout rows with `turns`)."""
    rollouts: dict[str, Rollout] = {}
    for lineno, row in export_rows(path):
        rid = str(row.get("rollout_id") or row.get("session_id") or f"line-{lineno}")
        group = row.get("group_id", row.get("group"))
        rollout = rollouts.get(rid)
        if rollout is None:
            # No group id: the rollout is its own group (its advantage is then 0).
            rollout = rollouts[rid] = Rollout(
                rid,
                rid if group is None else str(group),
                _reward(row.get("reward")),
                row.get("ok") is not False,
            )
        turns = row["turns"] if isinstance(row.get("turns"), list) else [row]
        for t in turns:
            rollout.turns.append(
                TurnRow(
                    t.get("node_id"),
                    t.get("prompt_token_ids"),
                    t.get("completion_token_ids"),
                    t.get("per_token_logps"),
                    t.get("loss_mask"),
                )
            )
    return list(rollouts.values())


def _ids(values: list[Any]) -> np.ndarray | None:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    return np.asarray(values, dtype=np.int64)


def check_turn(turn: TurnRow) -> list[str]:
    """Contract findings for one turn (empty = TRL can use it)."""
    where = f"turn {turn.node_id}"
    prompt, completion, mask = turn.prompt, turn.completion, turn.mask
    if not (isinstance(prompt, list) and isinstance(completion, list) and isinstance(mask, list)):
        missing = [
            n
            for n, v in (
                ("prompt_token_ids", prompt),
                ("completion_token_ids", completion),
                ("loss_mask", mask),
            )
            if not isinstance(v, list)
        ]
        return [f"{where}: missing {', '.join(missing)}"]
    out = []
    if _ids(prompt) is None or _ids(completion) is None:
        out.append(f"{where}: token ids must be non-negative integers")
    n_prompt, n_completion = len(prompt), len(completion)
    if len(mask) != n_prompt + n_completion:
        return out + [
            f"{where}: loss_mask has {len(mask)} entries, prompt+completion {n_prompt}+{n_completion}"
        ]
    if any(m not in (0, 1) or isinstance(m, bool) for m in mask):
        out.append(f"{where}: loss_mask values must be 0 or 1")
    if any(mask[:n_prompt]):
        out.append(f"{where}: loss_mask is 1 inside the prompt")
    # OpenEnv's TrainingTurn (which TRL validates every trace with) wants a finite, non-positive
    # logprob for every completion token, trained or not.
    if not isinstance(turn.logps, list) or len(turn.logps) != n_completion:
        have = len(turn.logps) if isinstance(turn.logps, list) else "no"
        return out + [f"{where}: {have} per_token_logps for {n_completion} completion tokens"]
    for i, lp in enumerate(turn.logps):
        if lp is None or isinstance(lp, bool) or not isinstance(lp, (int, float)):
            out.append(f"{where}: completion token {i} has no logprob ({lp!r})")
            break
        if not math.isfinite(lp):
            out.append(f"{where}: completion token {i} has a non-finite logprob ({lp})")
            break
        if lp > 0:
            out.append(f"{where}: completion token {i} has a positive logprob ({lp})")
            break
    return out


@dataclass
class ChainTally:
    """How a rollout's turn transitions (turns − 1 of them) joined its rows, as TRL counts them."""

    clean: int = 0
    realign: int = 0
    fork: int = 0
    drift_tokens: int = 0
    drift_max: int = 0

    @property
    def transitions(self) -> int:
        return self.clean + self.realign + self.fork


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def build_rows(turns: list[TurnRow], *, fork_threshold: int = 0) -> tuple[list[TrainingRow], ChainTally]:
    """Chain turns into rows the way TRL's AsyncGRPO worker does; the rows and the transition tally.

    Per transition: the row so far is a prefix of the next prompt → the new tail is appended as
    context (clean); it diverges only after the last completion's start by fewer than
    `fork_threshold` tokens → that tail is overwritten by the prompt's as context (realign);
    otherwise a new row starts (fork). `fork_threshold` is 0 in TRL's loop-owning lossless mode
    (what grpo-trl runs), so any divergence forks; TRL's own default elsewhere is 1024. A turn's
    completion is appended with its own mask and logprobs (masked tokens keep theirs). Rows without
    a trained token are dropped, as TRL drops them.
    """
    rows: list[tuple[list[int], list[int], list[float]]] = []
    tally = ChainTally()
    last_start: int | None = None
    for turn in turns:
        prompt = [int(t) for t in turn.prompt or []]
        completion = [int(t) for t in turn.completion or []]
        out_mask = [int(m) for m in (turn.mask or [])[len(prompt) :]]
        out_logps = [float(lp) for lp in turn.logps or [0.0] * len(completion)]
        if rows:
            ids, mask, logps = rows[-1]
            matched = _common_prefix(ids, prompt)
            drift = len(ids) - matched
            tally.drift_tokens += drift
            tally.drift_max = max(tally.drift_max, drift)
            if drift == 0:
                tally.clean += 1
            elif last_start is not None and matched >= last_start and drift < fork_threshold:
                tally.realign += 1
                del ids[matched:], mask[matched:], logps[matched:]
            else:
                tally.fork += 1
                rows.append(([], [], []))
        else:
            rows.append(([], [], []))
        ids, mask, logps = rows[-1]
        tail = prompt[len(ids) :]
        ids += tail
        mask += [0] * len(tail)
        logps += [0.0] * len(tail)
        last_start = len(ids)
        ids += completion
        mask += out_mask
        logps += out_logps
    built = [
        TrainingRow(np.asarray(i, np.int64), np.asarray(m, np.int64), np.asarray(lp, np.float32))
        for i, m, lp in rows
        if any(m)
    ]
    return built, tally


def row_findings(row: TrainingRow, index: int) -> list[str]:
    """The trainer-side checks on a built row."""
    n = row.input_ids.size
    if row.completion_mask.size != n or row.old_log_probs.size != n:
        return [
            f"row {index}: input_ids {n}, completion_mask {row.completion_mask.size}, "
            f"old_log_probs {row.old_log_probs.size}"
        ]
    trained = row.old_log_probs[row.completion_mask == 1]
    if trained.size and (not np.isfinite(trained).all() or (trained > 0).any()):
        return [f"row {index}: trained tokens need finite non-positive logprobs"]
    return []


def group_advantages(rewards: list[float | None]) -> list[float | None]:
    """GRPO advantages of one group; None for unscorable rollouts (and for all of an all-null group)."""
    scored = np.asarray([r for r in rewards if r is not None], dtype=np.float64)
    if scored.size == 0:
        return [None] * len(rewards)
    mean = float(scored.mean())
    std = float(scored.std())
    return [None if r is None else (r - mean) / (std + EPS) for r in rewards]


def export_file(text: str) -> Path:
    """An argparse type: the path of a file that is there (a missing one is refused with the other
    usage errors, before a launcher starts a job that could only fail reading it)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no export file at {path}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder, not an export file")
    return path


def arg_parser() -> argparse.ArgumentParser:
    """The recipe's options."""
    p = argparse.ArgumentParser(
        prog="tapdeck.runner.recipes.data_check",
        allow_abbrev=False,
        description="Check and score exported training rows (no weight update).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rows", type=export_file, help="An export, JSONL or Parquet (tapdeck export RUN).")
    src.add_argument(
        "--run",
        help="A tapdeck run id: reads <data-dir>/exports/<run>.jsonl or <data-dir>/runs/<run>/export.jsonl.",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="Data dir for --run (default $TAPDECK_DATA_DIR or ~/.tapdeck).",
    )
    p.add_argument("--project", default=os.environ.get("TAPDECK_TRAIN_PROJECT", "tapdeck"))
    p.add_argument(
        "--name",
        default=os.environ.get("TAPDECK_TRAIN_RUN_ID", "data-check"),
        help="trackio run name (the launcher passes its run id).",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="Where advantages.jsonl and summary.json go (default: the trackio dir's parent).",
    )
    p.add_argument(
        "--fork-threshold",
        type=int,
        default=0,
        help="TRL's fork_threshold_tokens: 0 in loop-owning lossless mode (grpo-trl), 1024 otherwise.",
    )
    p.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="Seconds to pause between steps (to watch the plot fill in; default 0).",
    )
    return p


def resolve_rows(args: argparse.Namespace) -> Path:
    """The JSONL to read (`--rows`, which the parser found, or `--run`'s export), or
    FileNotFoundError saying how to produce it."""
    if args.rows is not None:
        return args.rows
    data_dir = args.data_dir or Path(os.environ.get("TAPDECK_DATA_DIR") or Path.home() / ".tapdeck")
    for candidate in (
        data_dir / "exports" / f"{args.run}.jsonl",
        data_dir / "runs" / args.run / "export.jsonl",
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"run {args.run!r} has no JSONL export under {data_dir}; write one with `tapdeck export {args.run}`"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the check; the exit code (0 all valid, 1 contract violations, 2 unreadable input or
    nothing to check)."""
    args = arg_parser().parse_args(argv)
    out_dir = args.out_dir or Path(os.environ.get("TRACKIO_DIR") or ".").resolve().parent
    try:  # first: a folder it cannot write must not cost a whole check before it says so
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"data-check: cannot write its output folder {out_dir} ({exc.strerror or exc}); "
            "give a writable --out-dir",
            file=sys.stderr,
        )
        return 2
    try:
        path = resolve_rows(args)
        rollouts = load_rollouts(path)
    except (OSError, ValueError) as exc:
        print(f"data-check: {exc}", file=sys.stderr)
        return 2
    print(f"data-check: {len(rollouts)} rollout(s) from {path}")
    not_ok = [r.rollout_id for r in rollouts if not r.ok]
    if not_ok:
        # A failed or cancelled rollout was never graded as a whole: a trainer must not learn from it.
        print(
            f"data-check: left out {len(not_ok)} rollout(s) that did not end ok (failed or "
            f"cancelled): {', '.join(not_ok)}"
        )
        rollouts = [r for r in rollouts if r.ok]
    if not rollouts:
        # Nothing checked is not a pass: a run with no finished or no ok rollout must not read as
        # "finished, ok" with no metrics.
        what = (
            "every rollout in it was left out for not ending ok"
            if not_ok
            else "it holds no rollout (the run has no finished rollout yet, or its rows were all eval-tier)"
        )
        print(f"data-check: nothing to check in {path}: {what}", file=sys.stderr)
        return 2
    print("data-check: this recipe checks and scores data; it does not update any weights")

    # Validate and build rows before logging, so a bad row is reported once, with its rollout.
    for r in rollouts:
        for turn in r.turns:
            r.findings += check_turn(turn)
        if r.findings:
            continue
        r.rows, r.tally = build_rows(r.turns, fork_threshold=args.fork_threshold)
        for i, row in enumerate(r.rows):
            r.findings += row_findings(row, i)
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        groups[r.group_id].append(r)

    import trackio  # only here: the recipe process pays its import, never the launcher or the TUI

    trackio.init(
        project=args.project,
        name=args.name,
        config={
            "recipe": "data-check",
            "rows_file": str(path),
            "updates_weights": False,
            "fork_threshold_tokens": args.fork_threshold,
        },
    )
    totals = {
        "rows_valid": 0,
        "rows_invalid": 0,
        "rollouts_invalid": 0,
        "trained_tokens": 0,
        "unscorable_groups": 0,
    }
    adv_lines = []
    try:
        for step, gid in enumerate(sorted(groups, key=_group_order)):
            members = sorted(groups[gid], key=lambda r: r.rollout_id)
            valid = [r for r in members if not r.findings]
            for r in members:
                for finding in r.findings:
                    print(f"data-check: INVALID rollout {r.rollout_id}: {finding}")
            advantages = group_advantages([r.reward for r in valid])
            for r, a in zip(valid, advantages, strict=True):
                r.advantage = a
            scored = [r.reward for r in valid if r.reward is not None]
            unscorable = not scored
            # As in TRL, an ungraded rollout's rows are still samples, with advantage 0: they add
            # tokens to the loss normaliser but no gradient.
            rows = [row for r in valid for row in r.rows]
            trained = sum(row.trained_tokens for row in rows)
            totals["rows_valid"] += sum(len(r.rows) for r in valid)
            totals["rows_invalid"] += sum(len(r.turns) for r in members if r.findings)
            totals["rollouts_invalid"] += len(members) - len(valid)
            totals["trained_tokens"] += trained
            totals["unscorable_groups"] += int(unscorable)
            turns = [len(r.turns) for r in valid] or [0]
            # TRL's completion length is a rollout's: all its turns' sampled tokens.
            lengths = [sum(len(t.completion or []) for t in r.turns) for r in valid] or [0]
            transitions = sum(r.tally.transitions for r in valid)
            metrics: dict[str, float] = {
                "train/global_step": step + 1,
                "train/batch/samples_per_step": len(rows),
                "train/batch/groups_per_step": 0 if unscorable else 1,
                "train/batch/trained_tokens_per_step": trained,
                "train/batch/forwarded_tokens_per_step": sum(row.input_ids.size for row in rows),
                "train/rollout/turns_mean": float(np.mean(turns)),
                "train/rollout/turns_max": float(max(turns)),
                "train/rollout/fork_frac": sum(r.tally.fork for r in valid) / max(1, transitions),
                "train/rollout/realign_frac": sum(r.tally.realign for r in valid) / max(1, transitions),
                "train/rollout/samples_per_rollout": float(np.mean([len(r.rows) for r in valid] or [0])),
                "train/rollout/drift_tokens_max": float(max([r.tally.drift_max for r in valid] or [0])),
                "train/completions/mean_length": float(np.mean(lengths)),
                "train/completions/max_length": float(max(lengths)),
                "check/group_size": len(members),
                "check/scorable": len(scored),
                "check/unscorable": int(unscorable),
                "check/invalid_rollouts": len(members) - len(valid),
                "check/rows_valid_total": totals["rows_valid"],
                "check/rows_invalid_total": totals["rows_invalid"],
                "check/trained_tokens_total": totals["trained_tokens"],
            }
            if scored:
                metrics["train/reward"] = float(np.mean(scored))
                metrics["train/reward_std"] = float(np.std(scored))
            for i, r in enumerate(valid):
                if r.advantage is not None:
                    metrics[f"check/advantages/{i}"] = r.advantage
                adv_lines.append(
                    {
                        "step": step,
                        "group_id": gid,
                        "index": i,
                        "rollout_id": r.rollout_id,
                        "reward": r.reward,
                        "advantage": r.advantage,
                        "rows": len(r.rows),
                        "trained_tokens": sum(row.trained_tokens for row in r.rows),
                    }
                )
            trackio.log(metrics, step=step)
            shown = ", ".join("null" if r.advantage is None else f"{r.advantage:+.3f}" for r in valid)
            reward_text = f"{metrics['train/reward']:.3f}" if "train/reward" in metrics else "—"
            print(
                f"step {step}: group {gid}: {len(members)} rollout(s), reward {reward_text}, "
                f"advantages [{shown}], "
                f"{len(rows)} row(s), {trained} trained token(s)"
                + (" — unscorable (no graded rollout)" if unscorable else "")
            )
            if args.step_delay > 0:
                time.sleep(args.step_delay)
    finally:
        trackio.finish()
    summary = {
        "rollouts": len(rollouts),
        "groups": len(groups),
        **totals,
        "ok": totals["rollouts_invalid"] == 0,
    }
    try:  # a symbolic link in a file's place (refused), a full disk: one line naming the file
        with atomic_write(out_dir / "advantages.jsonl") as f:
            f.write("".join(json.dumps(line) + "\n" for line in adv_lines).encode())
        with atomic_write(out_dir / "summary.json") as f:
            f.write(json.dumps(summary, indent=2).encode())
    except OSError as exc:
        print(f"data-check: cannot write {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print("data-check: summary " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return 0 if summary["ok"] else 1


def _group_order(gid: str) -> tuple[int, Any]:
    """Numeric group ids in numeric order, then the rest by name."""
    return (0, int(gid)) if gid.lstrip("-").isdigit() else (1, gid)


if __name__ == "__main__":
    sys.exit(main())
