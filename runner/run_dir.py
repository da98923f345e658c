"""A run's directory: its files, what they hold, and how they are read and written.

A run lives in `<data_dir>/runs/<run_id>/`:
- `plan.json`     — the plan as given plus the resolved task list (name + path per group);
- `run.json`      — state (`running`/`finished`/`cancelled`/`failed`), timestamps, the engine used;
- `results.jsonl` — one `RolloutResult` per finished rollout, appended and fsynced as each ends;
- `run.lock`      — held by the process that runs the run (`run_lock.py`);
- `trials/`       — Harbor's trial directories, one per rollout id.
`runner/batch.py` runs runs; this module only reads and writes their files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.proxy.store.no_follow import open_append, open_no_follow
from tapdeck.runner.errors import RunUnreadable
from tapdeck.schema.runs import RolloutResult, RunPlan

RESULTS = "results.jsonl"
PLAN = "plan.json"
STATE = "run.json"

log = logging.getLogger("tapdeck.runner")


def is_run_id(name: str) -> bool:
    """Whether `name` can name a run: a plain directory name under runs/ (not empty, not hidden,
    which rules out `.` and `..`, and no path separator)."""
    return bool(name) and not name.startswith(".") and "/" not in name and os.sep not in name


def rollout_id(run_id: str, group: int, index: int) -> str:
    """`<run_id>.g<group>r<index>`: unique across runs, sortable within one."""
    return f"{run_id}.g{group:03d}r{index:02d}"


def run_id_of(rollout: str) -> str | None:
    """The run a rollout id (`rollout_id`'s form) belongs to; None for a string of another form."""
    run_id, _, rest = rollout.rpartition(".")
    return run_id if is_run_id(run_id) and re.fullmatch(r"g\d+r\d+", rest) else None


def new_run_id() -> str:
    """`run-YYYYmmdd-HHMMSS-xxxx`."""
    return time.strftime("run-%Y%m%d-%H%M%S-", time.localtime()) + secrets.token_hex(2)


def load_results(path: Path) -> dict[str, RolloutResult]:
    """Finished rollouts by id (last line wins), as `read_results` reads them."""
    return read_results(path)[0]


def read_results(path: Path) -> tuple[dict[str, RolloutResult], list[str]]:
    """Finished rollouts by id (last line wins), and the lines that hold a result this version
    cannot read, as `file:line: why`.

    A torn last line (a crash mid-append) is ignored. Every other bad line is logged as a warning
    naming it and skipped: a line that is not JSON held no result that can be recovered (its
    rollout runs again on resume); a JSON line that is not a `RolloutResult` (another version's
    schema) is also returned, so that a resume does not run its finished rollout again."""
    out: dict[str, RolloutResult] = {}
    unreadable: list[str] = []
    if not path.is_file():
        return out, unreadable
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            result = RolloutResult.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            if first["type"] == "json_invalid":
                if n != last:
                    log.warning("%s:%d: not JSON, skipped (%s)", path, n, first["msg"])
                continue
            why = f"{path}:{n}: not a rollout result ({_first_error(exc, 'line')})"
            log.warning("%s, skipped", why)
            unreadable.append(why)
            continue
        out[result.rollout_id] = result
    return out, unreadable


def _first_error(exc: ValidationError, whole: str) -> str:
    """`field: why` of a validation error's first complaint (`whole` when it is about the whole)."""
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or whole}: {first['msg']}"


def read_plan(path: Path) -> tuple[RunPlan, list[dict[str, str]], float, list[str]]:
    """A run's plan.json as the run's plan, tasks, creation time and the task folders it left out
    (none in a plan.json written before they were kept); RunUnreadable naming the file and what is
    wrong with it."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
        missing = [
            key for key in ("plan", "tasks", "created_at") if not isinstance(doc, dict) or key not in doc
        ]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        tasks = doc["tasks"]
        if not isinstance(tasks, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("path"), str)
            for t in tasks
        ):
            raise ValueError("tasks is not a list of {name, path}")
        left_out = doc.get("left_out", [])
        if not isinstance(left_out, list) or not all(isinstance(line, str) for line in left_out):
            raise ValueError("left_out is not a list of strings")
        return RunPlan.model_validate(doc["plan"]), tasks, float(doc["created_at"]), left_out
    except ValidationError as exc:
        why = f"plan.{_first_error(exc, 'plan')}"
    except (OSError, ValueError, TypeError) as exc:  # unreadable, not UTF-8, not JSON, not a plan
        why = f"{type(exc).__name__}: {exc}"
    raise RunUnreadable(f"{path} is not a readable plan ({why})")


def append_result(path: Path, result: RolloutResult) -> None:
    """Append a finished rollout's result to the run's results.jsonl, on disk (fsynced) before
    this returns."""
    _end_last_line(path)
    with open_append(path) as fh:
        fh.write(result.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _end_last_line(path: Path) -> None:
    """Before a result is appended: a last line a crash left without its newline is cut when it is
    torn (it was never a result) and ended when it is whole, so that only a file's last line can
    ever be torn."""
    try:
        with os.fdopen(open_no_follow(path, os.O_RDWR), "r+b") as fh:
            if fh.seek(0, os.SEEK_END) == 0:
                return
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            start = data.rfind(b"\n") + 1
            try:
                json.loads(data[start:])
            except ValueError:
                fh.truncate(start)
            else:
                fh.write(b"\n")
    except FileNotFoundError:
        return


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write a run's plan.json or run.json whole (a reader never sees half a file)."""
    with atomic_write(path) as f:
        f.write(json.dumps(doc, indent=2).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A run's JSON file, or None when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = [
    "PLAN",
    "RESULTS",
    "STATE",
    "append_result",
    "is_run_id",
    "load_results",
    "new_run_id",
    "read_json",
    "read_plan",
    "read_results",
    "rollout_id",
    "write_json",
]
