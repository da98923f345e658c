"""The data-check recipe end to end: rows from the real export functions → subprocess → trackio → reader."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tapdeck.runner.recipes.data_check import (
    build_rows,
    check_turn,
    group_advantages,
    load_rollouts,
)
from tapdeck.runner.trackio_reader import TrackioReader
from tapdeck.runner.training import TRACKIO_PROJECT, TrainingRun, load_run
from tests.support.training_export import EXPECTED_ADVANTAGES, ROLLOUTS, rollout_rows


def _by_step(points):
    out: dict[int, dict[str, float]] = {}
    for p in points:
        out.setdefault(p.step, {})[p.name] = p.value
    return out


@pytest.mark.medium
def test_data_check_logs_grpo_advantages_readable_by_the_reader(tmp_path: Path, export_file: Path) -> None:
    lines: list[str] = []
    job = TrainingRun(
        "data-check", ["--rows", str(export_file)], data_dir=tmp_path, run_id="t-dc", on_line=lines.append
    ).start()
    assert job.wait() == 0, "\n".join(lines)
    assert load_run(tmp_path, "t-dc").state == "finished"
    points = TrackioReader(job.trackio_dir, TRACKIO_PROJECT).read_new()
    assert {p.run_name for p in points} == {"t-dc"}
    steps = _by_step(points)
    assert sorted(steps) == [0, 1, 2]  # one step per group, groups in id order
    for step, group in enumerate(["0", "1", "2"]):
        logged = steps[step]
        expected = [a for a in EXPECTED_ADVANTAGES[group] if a is not None]
        got = [
            logged[f"check/advantages/{i}"]
            for i in range(len(EXPECTED_ADVANTAGES[group]))
            if f"check/advantages/{i}" in logged
        ]
        assert got == pytest.approx(expected, abs=1e-9), (group, logged)
    # group 0: rewards {1, 0} scored, one null excluded (never read as 0)
    assert steps[0]["train/reward"] == 0.5
    assert steps[0]["train/reward_std"] == pytest.approx(0.5)
    assert steps[0]["check/scorable"] == 2 and steps[0]["check/group_size"] == 3
    # group 1: all null → unscorable; as in TRL its rows stay samples, with advantage 0
    assert steps[1]["check/unscorable"] == 1 and steps[1]["train/batch/samples_per_step"] == 1
    assert "train/reward" not in steps[1]
    # group 2: equal rewards → zero advantages; the retokenised pair forks: 1 of its 1 transition
    assert steps[2]["train/reward_std"] == 0.0
    assert steps[2]["train/rollout/fork_frac"] == 1.0 and steps[2]["train/rollout/realign_frac"] == 0.0
    assert steps[2]["train/rollout/samples_per_rollout"] == 1.5  # ro-e: 2 rows, ro-f: 1
    # trained tokens = every completion token of every valid rollout (all turns here are trainable)
    rows = [r for rid in ROLLOUTS for r in rollout_rows(rid)]
    assert steps[2]["check/trained_tokens_total"] == sum(len(r["completion_token_ids"]) for r in rows)
    assert steps[2]["check/rows_invalid_total"] == 0
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["ok"] and summary["rollouts"] == 6 and summary["unscorable_groups"] == 1
    adv = [json.loads(line) for line in (job.run_dir / "advantages.jsonl").read_text().splitlines()]
    assert {a["rollout_id"]: a["advantage"] for a in adv}["ro-c"] is None
    assert any(line.startswith("step 1: group 1") and "unscorable" in line for line in lines)


def test_data_check_fails_on_a_row_that_breaks_the_trainer_contract(tmp_path: Path) -> None:
    rows = rollout_rows("ro-a") + rollout_rows("ro-b")
    rows[1] = dict(rows[1], per_token_logps=[0.5] + list(rows[1]["per_token_logps"][1:]))
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in rows))
    lines: list[str] = []
    job = TrainingRun("data-check", ["--rows", str(path)], data_dir=tmp_path, on_line=lines.append).start()
    assert job.wait() == 1
    assert load_run(tmp_path, job.run_id).state == "failed"
    assert any("INVALID rollout ro-a" in line and "positive logprob" in line for line in lines)
    steps = _by_step(TrackioReader(job.trackio_dir, TRACKIO_PROJECT).read_new())
    # ro-a is excluded: ro-b alone is its group's only scorable rollout
    assert steps[0]["check/invalid_rollouts"] == 1 and steps[0]["check/advantages/0"] == 0.0


def test_data_check_leaves_out_rollouts_that_did_not_end_ok(tmp_path: Path) -> None:
    # As `tapdeck export RUN --include-failed` and the server's run export write them: ro-b cancelled.
    rows = [dict(r, ok=True) for r in rollout_rows("ro-a")] + [
        dict(r, ok=False, error_kind="cancelled") for r in rollout_rows("ro-b")
    ]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in rows))
    assert [(r.rollout_id, r.ok) for r in load_rollouts(path)] == [("ro-a", True), ("ro-b", False)]
    lines: list[str] = []
    job = TrainingRun("data-check", ["--rows", str(path)], data_dir=tmp_path, on_line=lines.append).start()
    assert job.wait() == 0, "\n".join(lines)
    assert "data-check: left out 1 rollout(s) that did not end ok (failed or cancelled): ro-b" in lines
    steps = _by_step(TrackioReader(job.trackio_dir, TRACKIO_PROJECT).read_new())
    assert steps[0]["check/group_size"] == 1 and steps[0]["train/reward"] == 1.0


def test_missing_export_is_a_clear_usage_error(tmp_path: Path) -> None:
    lines: list[str] = []
    job = TrainingRun(
        "data-check",
        ["--run", "r-none", "--data-dir", str(tmp_path)],
        data_dir=tmp_path,
        on_line=lines.append,
    ).start()
    assert job.wait() == 2
    assert any("tapdeck export r-none" in line for line in lines)


def test_data_check_with_an_out_dir_it_cannot_write_says_so_in_one_line(
    tmp_path: Path, export_file: Path
) -> None:
    lines: list[str] = []
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    job = TrainingRun(
        "data-check",
        ["--rows", str(export_file), "--out-dir", str(blocked / "out")],
        data_dir=tmp_path / "data",
        on_line=lines.append,
    ).start()
    assert job.wait() == 2
    assert lines == [
        f"data-check: cannot write its output folder {blocked / 'out'} (Not a "
        "directory); give a writable --out-dir"
    ]
    assert load_run(tmp_path / "data", job.run_id).error.startswith("data-check: cannot write")


@pytest.mark.parametrize("name", ["advantages.jsonl", "summary.json"])
def test_data_check_writes_no_output_file_through_a_link(
    tmp_path: Path, export_file: Path, name: str
) -> None:
    from tapdeck.proxy.store.no_follow import LINK_REFUSED

    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not tapdeck's\n")
    (out / name).symlink_to(victim)
    lines: list[str] = []
    job = TrainingRun(
        "data-check",
        ["--rows", str(export_file), "--out-dir", str(out)],
        data_dir=tmp_path / "data",
        on_line=lines.append,
    ).start()
    assert job.wait() == 2
    assert lines[-1] == f"data-check: cannot write {out / name}: {LINK_REFUSED}"
    assert victim.read_text() == "not tapdeck's\n"


@pytest.mark.medium
def test_data_check_reads_a_parquet_export_as_it_reads_the_jsonl(tmp_path: Path, export_file: Path) -> None:
    from tapdeck.proxy.capture.export import write_parquet

    rows = [row for rid in ROLLOUTS for row in rollout_rows(rid)]
    parquet = write_parquet(tmp_path / "rows.parquet", rows)
    from_jsonl, from_parquet = load_rollouts(export_file), load_rollouts(parquet)
    assert [(r.rollout_id, r.group_id, r.reward, r.ok, r.turns) for r in from_parquet] == [
        (r.rollout_id, r.group_id, r.reward, r.ok, r.turns) for r in from_jsonl
    ]
    lines: list[str] = []
    job = TrainingRun(
        "data-check", ["--rows", str(parquet)], data_dir=tmp_path / "data", on_line=lines.append
    ).start()
    assert job.wait() == 0, "\n".join(lines)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["ok"] and summary["rollouts"] == 6 and summary["unscorable_groups"] == 1


def test_turn_checks_name_each_contract_break(export_file: Path) -> None:
    (rollout, *_) = load_rollouts(export_file)
    turn = rollout.turns[0]
    assert check_turn(turn) == []
    n = len(turn.prompt)
    assert (
        "inside the prompt"
        in check_turn(type(turn)(0, turn.prompt, turn.completion, turn.logps, [1] + turn.mask[1:]))[0]
    )
    assert (
        "loss_mask has"
        in check_turn(type(turn)(0, turn.prompt, turn.completion, turn.logps, turn.mask[:-1]))[0]
    )
    assert (
        "per_token_logps"
        in check_turn(type(turn)(0, turn.prompt, turn.completion, turn.logps[:-1], turn.mask))[0]
    )
    assert (
        "no logprob"
        in check_turn(type(turn)(0, turn.prompt, turn.completion, [None] + turn.logps[1:], turn.mask))[0]
    )
    assert n > 0


def test_prefix_turns_chain_into_one_row_with_context_masked(export_file: Path) -> None:
    rollouts = {r.rollout_id: r for r in load_rollouts(export_file)}
    rows, tally = build_rows(rollouts["ro-a"].turns)
    assert (tally.clean, tally.fork, tally.transitions) == (2, 0, 2) and len(rows) == 1
    (row,) = rows
    last = rollouts["ro-a"].turns[-1]
    assert row.input_ids.tolist() == last.prompt + last.completion
    assert row.trained_tokens == sum(len(t.completion) for t in rollouts["ro-a"].turns)
    assert (
        row.old_log_probs[row.completion_mask == 0] == 0
    ).all()  # context only: every sampled token trains


def test_group_advantages_exclude_null_and_mark_all_null_unscorable() -> None:
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([1.0, None]) == [0.0, None]
    a, b, c = group_advantages([1.0, 0.0, 0.5])
    assert (a, b, c) == pytest.approx([0.5 / (0.5 / 1.5**0.5 + 1e-8), -0.5 / (0.5 / 1.5**0.5 + 1e-8), 0.0])
