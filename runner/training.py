"""The training launcher: one recipe run = one subprocess in its own process group.

Each run gets `<data_dir>/train/<run_id>/` holding `run.json` (state, exit code, command line, the
environment variables tapdeck set), `train.log` (the run's output, ANSI stripped, without
`TRACKIO_LOCAL_FLUSH`, trackio's `trackio show` advice made the command that shows this run's
folder) and `trackio/` (the recipe's `TRACKIO_DIR`; read it with
`tapdeck.runner.trackio_reader`). This process never imports trackio or torch: the recipe does, in
its own interpreter — this one for recipes that need
nothing more, the training environment's (`train_python()`) for those that need torch and TRL.
That interpreter imports this very tapdeck through a `PYTHONPATH` entry (`package_path()`), so a
recipe always runs the code of the server that launched it.

States: `running` → `finished` (exit 0) | `failed` (non-zero exit; `error` says why) | `stopped`
(ended by `stop()`) | `interrupted` (the server that launched it went away first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import tapdeck
from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.proxy.store.no_follow import open_append, refuse_link
from tapdeck.runner.process_group import process_running, signal_group
from tapdeck.runner.recipes import Recipe, get_recipe
from tapdeck.runner.train_env import SCRIPT as TRAIN_ENV_SCRIPT
from tapdeck.runner.train_env import env_dir

TRACKIO_PROJECT = "tapdeck"
"""Every run logs to this trackio project inside its own TRACKIO_DIR; the trackio run name is the run id."""

RunState = Literal["running", "finished", "failed", "stopped", "interrupted"]
SECRET_ENV = ("TAPDECK_ADMIN_KEY",)
"""Variables passed to a recipe but never written to run.json."""

# CSI sequences (colours, cursor moves) and OSC sequences (titles, hyperlinks) — trackio and tqdm print both.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


TRACKIO_LOCAL_FLUSH = "* Run finished. Uploading logs to Trackio (please wait...)"
"""What trackio prints at `finish()` while it writes its last metrics to its local TRACKIO_DIR:
nothing is uploaded anywhere, so the line is left out of a run's log."""


def strip_ansi(line: str) -> str:
    """The text of a terminal line: escape sequences removed; for `\\r` progress redraws, the last frame."""
    text = _ANSI.sub("", line).rstrip("\r\n")
    if "\r" in text:
        frames = [f for f in text.split("\r") if f]
        text = frames[-1] if frames else ""
    return text


_TRACKIO_SHOW = re.compile(r'^trackio show --project "(?P<project>.*)"$')
"""trackio's advice at `init()` for viewing the run, which reads its default folder, not this run's."""
_TRACKIO_SHOW_IN_PYTHON = re.compile(r"^\* or by running in Python: trackio\.show\(.*\)$")


def trackio_show_command(trackio_dir: Path, project: str, python: str) -> str:
    """The shell command that opens trackio's dashboard on a run's metrics: `trackio show` with
    `TRACKIO_DIR` set to the run's folder, by the `trackio` beside the recipe's interpreter."""
    script = Path(python).parent / "trackio"
    program = shlex.quote(str(script)) if script.is_file() else "trackio"
    return (
        f"TRACKIO_DIR={shlex.quote(str(trackio_dir.absolute()))} {program} show "
        f"--project {shlex.quote(project)}"
    )


def _log_text(raw: bytes, trackio_dir: Path, python: str) -> str | None:
    """A line of a recipe's output as its log keeps it (`strip_ansi`); None for one left out.

    trackio's own `trackio show --project P` would show another folder's projects, so it becomes
    the command that shows this run; its Python variant, wrong the same way, is left out."""
    text = strip_ansi(raw.decode("utf-8", errors="replace"))
    if text == TRACKIO_LOCAL_FLUSH or _TRACKIO_SHOW_IN_PYTHON.match(text):
        return None
    if show := _TRACKIO_SHOW.match(text):
        return trackio_show_command(trackio_dir, show["project"], python)
    return text


def train_python() -> Path:
    """The training environment's interpreter (`$TAPDECK_TRAIN_ENV`, else ~/.cache/tapdeck/train-env)."""
    return env_dir() / "bin" / "python"


class TrainEnvMissing(RuntimeError):
    """A recipe needs the training environment and it is not there."""


def recipe_python(recipe: Recipe) -> str:
    """The interpreter a recipe runs in (TrainEnvMissing when that is the training one, absent)."""
    if recipe.env != "train":
        return sys.executable
    python = train_python()
    if not python.exists():
        # The command names the script by its full path and the folder it makes, which is
        # $TAPDECK_TRAIN_ENV when that is set: a bare `scripts/train-env.sh` only works from a
        # checkout's root, and would make the environment where the server does not look.
        env = env_dir()
        where = f"TAPDECK_TRAIN_ENV={shlex.quote(str(env))} " if os.environ.get("TAPDECK_TRAIN_ENV") else ""
        script = (
            shlex.quote(str(TRAIN_ENV_SCRIPT))
            if TRAIN_ENV_SCRIPT.is_file()
            else "scripts/train-env.sh (in a tapdeck checkout)"
        )  # a wheel ships no scripts/
        # Short: the admin API's clients cut an error's detail at 300 characters.
        raise TrainEnvMissing(
            f"{recipe.name} needs the training environment (torch, TRL), not made in {env}; make "
            f"it once (minutes): {where}bash {script}"
        )
    return str(python)


def package_path(data_dir: Path) -> Path:
    """A folder whose only entry is `tapdeck`, a link to this installed package.

    On another interpreter's PYTHONPATH it imports exactly this code (editable or wheel install
    alike) without installing tapdeck there; one folder per package location.
    """
    target = Path(tapdeck.__file__).resolve().parent
    folder = train_root(data_dir) / ".pythonpath" / hashlib.sha256(str(target).encode()).hexdigest()[:12]
    link = folder / "tapdeck"
    if not link.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(target, target_is_directory=True)
        except FileExistsError:  # another launch made it meanwhile
            pass
    return folder


_ERROR_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Missing|Refused))(?::\s*(.*))?$"
)


def death_reason(lines: Sequence[str], exit_code: int | None) -> str:
    """Why a run ended badly, from the end of its log: the last exception line, else the last line."""
    how = (
        f"killed by signal {_signal_name(-exit_code)}"
        if exit_code is not None and exit_code < 0
        else f"exit code {exit_code}"
    )
    text = [line.strip() for line in lines if line.strip()]
    for line in reversed(text):
        if _ERROR_LINE.match(line):
            return f"{line} ({how})"
    return f"{text[-1]} ({how})" if text else f"no output ({how})"


def _signal_name(number: int) -> str:
    """SIGKILL for 9; real-time signals have no name in `signal.Signals`."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"{number}"


def tail_lines(path: Path, n: int, *, chunk: int = 65536) -> list[str]:
    """The last `n` lines of a text file, reading only its end."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            data = b""
            while size > 0 and data.count(b"\n") <= n:
                step = min(chunk, size)
                size -= step
                fh.seek(size)
                data = fh.read(step) + data
    except OSError:  # no log yet, or one that cannot be read
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-n:] if n > 0 else []


def train_root(data_dir: Path) -> Path:
    """`<data_dir>/train`."""
    return Path(data_dir) / "train"


def new_run_id() -> str:
    """`t-YYYYmmdd-HHMMSS-xxxx`: sortable by start time, unique enough for one machine."""
    return f"t-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class RunRecord:
    """What `run.json` holds."""

    run_id: str
    recipe: str
    argv: list[str]
    env: dict[str, str]
    """Only the variables tapdeck set for the run (the rest is inherited)."""
    cwd: str
    run_dir: str
    trackio_dir: str
    trackio_project: str
    state: RunState = "running"
    exit_code: int | None = None
    pid: int | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str | None = None
    """Why a failed run ended (its last exception line, or the last line it printed)."""

    def save(self) -> None:
        """Write run.json atomically (a reader never sees half a file)."""
        with atomic_write(Path(self.run_dir) / "run.json") as f:
            f.write(json.dumps(asdict(self), indent=2).encode())


def _alive(pid: int | None) -> bool:
    return pid is not None and process_running(pid)


def _settled(record: RunRecord) -> RunRecord:
    """A record left `running` by a process that no longer exists reads as `interrupted`."""
    if record.state == "running" and not _alive(record.pid):
        record.state = "interrupted"
        record.error = "the server that launched it stopped before the run ended"
    return record


def load_run(data_dir: Path, run_id: str) -> RunRecord:
    """The record of a launched run (FileNotFoundError when there is none)."""
    doc = json.loads((train_root(data_dir) / run_id / "run.json").read_text())
    return _settled(RunRecord(**doc))


def list_runs(data_dir: Path) -> list[RunRecord]:
    """Every launched run under `<data_dir>/train`, newest first (unreadable records skipped)."""
    root = train_root(data_dir)
    if not root.is_dir():
        return []
    records = []
    for path in root.glob("*/run.json"):
        try:
            records.append(_settled(RunRecord(**json.loads(path.read_text()))))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(records, key=lambda r: r.started_at, reverse=True)


STOP_DRAIN_S = 10.0
"""How long `stop()` waits, after SIGKILL, for the output to drain and the run to be recorded."""


class TrainingRun:
    """Start a recipe as a subprocess, stream its output, record its state, stop it.

    `on_line(text)` is called from a reader thread for every output line (ANSI stripped), which
    also goes to the run's log. `wait()` blocks until the process exits and the output
    is drained; `stop()` sends SIGTERM to the process group, then SIGKILL after `grace_s`.
    """

    def __init__(
        self,
        recipe: str | Recipe,
        args: Sequence[str] = (),
        *,
        data_dir: Path,
        run_id: str | None = None,
        python: str | None = None,
        extra_env: dict[str, str] | None = None,
        on_line: Callable[[str], None] | None = None,
        preamble: Sequence[str] = (),
    ) -> None:
        self.recipe = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
        self.run_id = run_id or new_run_id()
        self.data_dir = Path(data_dir)
        self.run_dir = train_root(self.data_dir) / self.run_id
        self.trackio_dir = self.run_dir / "trackio"
        self.log_path = self.run_dir / "train.log"
        self.argv = [python or recipe_python(self.recipe), "-u", "-m", self.recipe.module, *args]
        self.env = {
            "TRACKIO_DIR": str(self.trackio_dir),
            "TAPDECK_TRAIN_RUN_ID": self.run_id,
            "TAPDECK_TRAIN_PROJECT": TRACKIO_PROJECT,
            "TAPDECK_DATA_DIR": str(self.data_dir),
            "TAPDECK_TRAIN_DIR": str(self.run_dir),
            "PYTHONUNBUFFERED": "1",
        }
        if self.recipe.env == "train":
            inherited = os.environ.get("PYTHONPATH")
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(package_path(self.data_dir)), *([inherited] if inherited else [])]
            )
        self.env.update(extra_env or {})
        self.on_line = on_line
        self.preamble = list(preamble)
        """Lines of the launcher's own that open the log, before the recipe's output."""
        self.record: RunRecord | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._finished = threading.Event()

    # -- start --------------------------------------------------------------------------------------
    def start(self) -> TrainingRun:
        """Create the run directory, write run.json and start the process (its own session/group)."""
        if self.run_dir.exists() and (self.run_dir / "run.json").exists():
            raise FileExistsError(f"training run {self.run_id} already exists at {self.run_dir}")
        self.trackio_dir.mkdir(parents=True, exist_ok=True)
        # Refused before the recipe starts, not once it runs (proxy/store/no_follow.py).
        refuse_link(self.run_dir / "run.json")
        refuse_link(self.log_path)
        if self.preamble:
            with open_append(self.log_path) as log:
                log.writelines(line + "\n" for line in self.preamble)
            for line in self.preamble:
                self._emit(line)
        shown = {k: v for k, v in self.env.items() if k not in SECRET_ENV}
        self.record = RunRecord(
            run_id=self.run_id,
            recipe=self.recipe.name,
            argv=list(self.argv),
            env=shown,
            cwd=os.getcwd(),
            run_dir=str(self.run_dir),
            trackio_dir=str(self.trackio_dir),
            trackio_project=TRACKIO_PROJECT,
        )
        try:
            # start_new_session: the recipe and everything it spawns (vLLM clients, dataloader workers)
            # share one process group that stop() can signal as a whole.
            self._proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        except OSError as exc:
            self.record.state, self.record.finished_at = "failed", time.time()
            self.record.error = f"could not start {self.argv[0]}: {exc}"
            self.record.save()
            raise RuntimeError(f"could not start {self.argv[0]}: {exc}") from exc
        self.record.pid = self._proc.pid
        self.record.save()
        self._reader = threading.Thread(target=self._pump, name=f"train-{self.run_id}", daemon=True)
        self._reader.start()
        return self

    @property
    def pid(self) -> int | None:
        """The recipe process id (also its process group id)."""
        return self._proc.pid if self._proc else None

    @property
    def state(self) -> RunState:
        """The recorded state."""
        return self.record.state if self.record else "running"

    @property
    def exit_code(self) -> int | None:
        """The process's exit code once it ended (negative = killed by that signal)."""
        return self.record.exit_code if self.record else None

    # -- output -------------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Copy the output to the log until the process ends, then record how it ended. The record
        is written and `_finished` set whatever happens here (a full disk, a failed save), so that
        `wait()` and `stop()` never hang on a pump that died."""
        assert self._proc is not None and self._proc.stdout is not None
        log_error = None
        try:
            with open_append(self.log_path) as log:
                for raw in self._proc.stdout:
                    if (text := _log_text(raw, self.trackio_dir, self.argv[0])) is None:
                        continue
                    log.write(text + "\n")
                    log.flush()
                    self._emit(text)
        except Exception as exc:  # noqa: BLE001 - a full disk or a broken log: the run goes on unlogged
            log_error = f"its output could not be logged to {self.log_path} ({exc})"
            # Drained, so the recipe never blocks on a full pipe (and `wait()` below returns).
            with contextlib.suppress(Exception):
                for raw in self._proc.stdout:
                    if (text := _log_text(raw, self.trackio_dir, self.argv[0])) is not None:
                        self._emit(text)
        finally:
            try:
                self._record_end(self._proc.wait(), log_error)
            finally:
                self._finished.set()

    def _record_end(self, code: int, log_error: str | None) -> None:
        with self._lock:
            assert self.record is not None
            if self.record.exit_code is not None:  # stop() recorded it, done waiting for the output
                return
            self.record.exit_code = code
            self.record.finished_at = time.time()
            # A run that ended on its own just as stop() was called keeps its own verdict.
            self.record.state = (
                "stopped" if self._stopping and code != 0 else "finished" if code == 0 else "failed"
            )
            if self.record.state == "failed":
                self.record.error = death_reason(tail_lines(self.log_path, 200), code)
            if log_error:
                self.record.error = "; ".join(filter(None, [self.record.error, log_error]))
            self.record.save()

    def _emit(self, text: str) -> None:
        if self.on_line is not None:
            try:
                self.on_line(text)
            except Exception:  # noqa: BLE001 - a broken callback must not stop the pump or lose the state
                self.on_line = None

    # -- end ----------------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> int:
        """Block until the process has exited and its output is drained; the exit code."""
        if self._proc is None:
            raise RuntimeError("training run not started")
        if not self._finished.wait(timeout):
            raise TimeoutError(f"training run {self.run_id} still running")
        assert self.record is not None and self.record.exit_code is not None
        return self.record.exit_code

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM the process group, SIGKILL it after `grace_s` if anything is left; the exit code."""
        if self._proc is None:
            raise RuntimeError("training run not started")
        if self._finished.is_set():
            return self.wait()
        self._stopping = True
        pgid = self._proc.pid  # start_new_session made the recipe its group's leader
        signal_group(pgid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # Children can outlive the leader (or ignore SIGTERM): the group is killed either way.
        signal_group(pgid, signal.SIGKILL)
        try:
            return self.wait(STOP_DRAIN_S)
        except TimeoutError:
            # A descendant that left the group still holds the output pipe: the recipe itself has
            # ended, so it is recorded now; the pump, still copying that output, records nothing.
            code = self._proc.wait()
            self._record_end(code, "a process it started left its group and still holds its output")
            self._finished.set()
            return code
