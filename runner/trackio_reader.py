"""Read trackio's metrics straight from its SQLite files, without importing trackio.

trackio (0.43) keeps one SQLite database per project, `<trackio_dir>/<project>.db` (WAL mode), with a
`metrics(id, run_id, timestamp, run_name, step, metrics, ...)` table whose `metrics` column holds an
orjson-encoded object as bytes. Importing trackio costs about a second and pulls a web stack, so the
TUI and the launcher read the files directly: read-only URI connections, and an incremental cursor
(the last `id` seen) so a 1 Hz poll only reads new rows.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

_NEW_METRICS = "SELECT id, run_id, run_name, step, metrics FROM metrics WHERE id > ? ORDER BY id"


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One scalar logged by one run at one step."""

    run_id: str
    run_name: str
    step: int
    name: str
    value: float


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run of a project: trackio's uuid, its name, how many metric rows and the last step."""

    run_id: str
    run_name: str
    rows: int
    last_step: int | None


def list_projects(trackio_dir: Path) -> list[str]:
    """Project names (one `<project>.db` each) under a trackio directory, sorted."""
    trackio_dir = Path(trackio_dir)
    if not trackio_dir.is_dir():
        return []
    return sorted(p.stem for p in trackio_dir.glob("*.db") if p.is_file())


def _connect(db: Path) -> sqlite3.Connection:
    # Read-only URI: the reader never creates a database or takes a write lock on trackio's file.
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)


def _scalar(value: object) -> float | None:
    """A finite-or-not float for numbers; None for anything a plot cannot show (text, media, null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def decode_metrics(blob: bytes | str) -> dict[str, float]:
    """The numeric entries of one stored `metrics` value (orjson bytes; older rows may be text)."""
    raw = json.loads(blob)
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, value in raw.items():
        number = _scalar(value)
        if number is not None:
            out[str(name)] = number
    return out


@dataclass
class TrackioReader:
    """Incremental reader of one project's metrics. Not thread-safe: one reader per polling thread.

    `read_new()` returns only points logged since the previous call (tracked by the row id).
    A project whose database does not exist yet reads as empty (a run may not have logged yet).
    """

    trackio_dir: Path
    project: str
    last_id: int = 0
    _runs: dict[str, str] = field(default_factory=dict)

    @property
    def db_path(self) -> Path:
        """`<trackio_dir>/<project>.db`."""
        return Path(self.trackio_dir) / f"{self.project}.db"

    def read_new(self) -> list[MetricPoint]:
        """Points from rows with an id above the last one read, in logging order."""
        db = self.db_path
        if not db.is_file():
            return []
        try:
            con = _connect(db)
        except sqlite3.OperationalError:
            return []
        try:
            rows = con.execute(_NEW_METRICS, (self.last_id,)).fetchall()
        except sqlite3.OperationalError as exc:
            # The schema is created by trackio's first write; before that the table is missing.
            if "no such table" in str(exc):
                return []
            raise
        finally:
            con.close()
        points: list[MetricPoint] = []
        for row_id, run_id, run_name, step, blob in rows:
            self.last_id = max(self.last_id, int(row_id))
            self._runs[run_id] = run_name
            for name, value in decode_metrics(blob).items():
                points.append(MetricPoint(run_id, run_name, int(step), name, value))
        return points

    def runs(self) -> list[RunInfo]:
        """Every run of the project with its metric row count and last step (oldest first)."""
        db = self.db_path
        if not db.is_file():
            return []
        con = _connect(db)
        try:
            rows = con.execute(
                "SELECT run_id, run_name, COUNT(*), MAX(step), MIN(id) FROM metrics "
                "GROUP BY run_id, run_name ORDER BY MIN(id)"
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        finally:
            con.close()
        return [RunInfo(r[0], r[1], int(r[2]), None if r[3] is None else int(r[3])) for r in rows]


def series(points: list[MetricPoint], name: str, *, run_id: str | None = None) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric, in logging order, optionally for one run only.

    Non-finite values are kept out: a plot cannot place them and trackio stores NaN as null anyway.
    """
    return [
        (p.step, p.value)
        for p in points
        if p.name == name and (run_id is None or p.run_id == run_id) and math.isfinite(p.value)
    ]
