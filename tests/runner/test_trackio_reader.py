"""The trackio reader against REAL trackio databases written by a subprocess that imports trackio."""

from __future__ import annotations

from pathlib import Path

import pytest

from tapdeck.runner.trackio_reader import (
    MetricPoint,
    TrackioReader,
    list_projects,
    series,
)
from tests.support.trackio_runs import write_trackio


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
