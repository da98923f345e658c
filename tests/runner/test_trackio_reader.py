"""The trackio reader against REAL trackio databases written by a subprocess that imports trackio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tapdeck.runner.trackio_reader import (
    MetricPoint,
    TrackioReader,
    list_projects,
    series,
)

WRITER = """
import json, sys, trackio
spec = json.loads(sys.argv[1])
trackio.init(project=spec["project"], name=spec["name"], config={"lr": 1e-6})
for entry in spec["logs"]:
    trackio.log(entry["metrics"], step=entry.get("step"))
trackio.finish()
"""


def write_trackio(trackio_dir: Path, project: str, name: str, logs: list[dict]) -> None:
    """Log `logs` with the real trackio package in a fresh interpreter (as a recipe would)."""
    spec = json.dumps({"project": project, "name": name, "logs": logs})
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    out = subprocess.run(
        [sys.executable, "-c", WRITER, spec], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.medium
def test_reader_returns_exactly_the_values_trackio_logged(tmp_path: Path) -> None:
    logs = [
        {"metrics": {"train/reward": 0.25, "train/loss": 1.5}, "step": 0},
        {"metrics": {"train/reward": 0.75, "train/batch/trained_tokens_per_step": 128}, "step": 1},
        {"metrics": {"train/reward": -0.125, "note": "text is not a scalar"}, "step": 5},
    ]
    write_trackio(tmp_path, "proj", "run-1", logs)
    reader = TrackioReader(tmp_path, "proj")
    points = reader.read_new()
    got = [(p.run_name, p.step, p.name, p.value) for p in points]
    assert got == [
        ("run-1", 0, "train/reward", 0.25),
        ("run-1", 0, "train/loss", 1.5),
        ("run-1", 1, "train/reward", 0.75),
        ("run-1", 1, "train/batch/trained_tokens_per_step", 128.0),
        ("run-1", 5, "train/reward", -0.125),
    ]
    assert len({p.run_id for p in points}) == 1 and points[0].run_id  # trackio's uuid
    assert series(points, "train/reward") == [(0, 0.25), (1, 0.75), (5, -0.125)]
    assert list_projects(tmp_path) == ["proj"]
    (run,) = reader.runs()
    assert (run.run_name, run.rows, run.last_step) == ("run-1", 3, 5)


@pytest.mark.medium
def test_incremental_reads_return_only_new_points(tmp_path: Path) -> None:
    write_trackio(tmp_path, "proj", "first", [{"metrics": {"m": 1.0}, "step": 0}])
    reader = TrackioReader(tmp_path, "proj")
    assert [(p.run_name, p.value) for p in reader.read_new()] == [("first", 1.0)]
    assert reader.read_new() == []
    write_trackio(
        tmp_path, "proj", "second", [{"metrics": {"m": 2.0}, "step": 0}, {"metrics": {"m": 3.0}, "step": 1}]
    )
    new = reader.read_new()
    assert [(p.run_name, p.step, p.value) for p in new] == [("second", 0, 2.0), ("second", 1, 3.0)]
    assert reader.read_new() == []
    assert [r.run_name for r in reader.runs()] == ["first", "second"]
    # A fresh reader starts from the beginning.
    assert len(TrackioReader(tmp_path, "proj").read_new()) == 3


@pytest.mark.medium
def test_trackio_step_counter_is_read_when_no_step_is_passed(tmp_path: Path) -> None:
    write_trackio(tmp_path, "proj", "auto", [{"metrics": {"x": 0.5}}, {"metrics": {"x": 0.25}}])
    assert [(p.step, p.value) for p in TrackioReader(tmp_path, "proj").read_new()] == [(0, 0.5), (1, 0.25)]


def test_missing_project_reads_as_empty(tmp_path: Path) -> None:
    reader = TrackioReader(tmp_path / "nothing-yet", "proj")
    assert reader.read_new() == [] and reader.runs() == []
    assert list_projects(tmp_path / "nothing-yet") == []
    assert not (tmp_path / "nothing-yet").exists()


def test_reader_never_creates_a_database(tmp_path: Path) -> None:
    reader = TrackioReader(tmp_path, "proj")
    assert reader.read_new() == []
    assert not (tmp_path / "proj.db").exists()


def test_metric_point_is_typed() -> None:
    point = MetricPoint("id", "name", 3, "train/reward", 0.5)
    with pytest.raises(AttributeError):
        point.value = 1.0  # type: ignore[misc]
