"""One embedded engine per machine: a running one is announced in a file, and another tapdeck
process reuses it instead of loading a second llama.cpp.

Two engines on a 2-core machine (a `tapdeck rollout` started while the TUI runs) slowed both by an
order of magnitude: each spins all cores. So the process that starts the embedded engine writes its
address to `<registry>/embedded.json`; the next one, holding the same lock, finds it, checks that
its process lives and that `/v1/models` answers with the same model and context, and points at it.
The announcement is removed by its owner on stop; a stale one (owner dead, or a different engine
answering) is replaced. The engine lives as long as the process that started it: a process that
reuses it sees `engine_unreachable` once that owner is gone (`SharedEngine.gone()` says why, so
`tapdeck rollout` can stop its run instead of failing every call).

`$TAPDECK_ENGINE_REGISTRY` moves the folder (tests use it to keep to themselves).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from pydantic import BaseModel, ValidationError

from tapdeck.proxy.store.atomic_write import atomic_write
from tapdeck.proxy.store.no_follow import open_no_follow
from tapdeck.runner.engine.embedded import EmbeddedEngine

REGISTRY_ENV = "TAPDECK_ENGINE_REGISTRY"
_ANNOUNCEMENT = "embedded.json"
_LOCK = "embedded.lock"
_CHECK_TIMEOUT_S = 5.0


def registry_dir() -> Path:
    """`$TAPDECK_ENGINE_REGISTRY`, else `~/.cache/tapdeck/engine`."""
    env = os.environ.get(REGISTRY_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tapdeck" / "engine"


class Announcement(BaseModel):
    """What the owner of a running embedded engine writes down for other processes."""

    pid: int
    base_url: str
    served_name: str
    model_path: str
    n_ctx: int
    started_at: float


class SharedEngine:
    """The machine's embedded engine as one process sees it: started here (`owned`) or reused."""

    def __init__(
        self,
        base_url: str,
        served_name: str,
        n_ctx: int,
        *,
        engine: EmbeddedEngine | None = None,
        announcement: Path | None = None,
        owner_pid: int | None = None,
    ) -> None:
        self.base_url = base_url
        self.served_name = served_name
        self.n_ctx = n_ctx
        self.engine = engine
        self.owner_pid = os.getpid() if engine is not None else owner_pid
        """The process that runs the engine (this one when `owned`)."""
        self._announcement = announcement

    @property
    def owned(self) -> bool:
        """True when this process runs the engine (and stops it)."""
        return self.engine is not None

    def reuse_line(self) -> str:
        """What a command says when it reuses another process's engine: that engine's lifetime
        is not the command's, so the operator learns which process to keep."""
        return (
            f"using the embedded engine already served by pid {self.owner_pid} at "
            f"{self.base_url} (it stops when that process does)"
        )

    def gone(self) -> str | None:
        """Why a reused engine no longer serves (its owner exited, or it stopped answering
        `/models`); None while it serves, and always for an engine this process owns."""
        if self.owned or self.owner_pid is None:
            return None
        if not _alive(self.owner_pid):
            return f"process {self.owner_pid}, which served it, has exited"
        try:
            resp = httpx.get(f"{self.base_url}/models", timeout=_CHECK_TIMEOUT_S)
        except httpx.TimeoutException:
            return None  # busy generating on a loaded machine is not gone
        except httpx.HTTPError as exc:
            return f"it no longer answers at {self.base_url} ({type(exc).__name__})"
        if resp.status_code != 200:
            return f"it answers HTTP {resp.status_code} at {self.base_url}/models"
        return None

    def stop(self) -> None:
        """Stop the engine if this process owns it, and withdraw its announcement."""
        if self.engine is None:
            return
        if self._announcement is not None:
            with _locked(self._announcement.parent):
                current = _read(self._announcement)
                if (
                    current is not None
                    and current.pid == os.getpid()
                    and current.base_url == self.engine.base_url
                ):
                    self._announcement.unlink(missing_ok=True)
        self.engine.stop()
        self.engine = None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with os.fdopen(open_no_follow(folder / _LOCK, os.O_RDWR | os.O_CREAT), "r+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path) -> Announcement | None:
    try:
        return Announcement.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, but not ours to share
        return False
    return True


def _answers(ann: Announcement) -> bool:
    """The announced engine serves the same model with the same context."""
    try:
        resp = httpx.get(f"{ann.base_url}/models", timeout=_CHECK_TIMEOUT_S)
        models = resp.json()["data"] if resp.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False
    return any(
        m.get("id") == ann.served_name
        and m.get("root") == ann.model_path
        and m.get("max_model_len") == ann.n_ctx
        for m in models
        if isinstance(m, dict)
    )


def find_running(model_path: Path, n_ctx: int, folder: Path | None = None) -> Announcement | None:
    """The announced engine when it lives and serves `model_path` at `n_ctx`, else None."""
    ann = _read((folder or registry_dir()) / _ANNOUNCEMENT)
    if ann is None or ann.model_path != str(model_path) or ann.n_ctx != n_ctx:
        return None
    return ann if _alive(ann.pid) and _answers(ann) else None


def acquire_embedded_engine(
    model_path: Path | None = None, *, n_ctx: int | None = None, folder: Path | None = None
) -> SharedEngine:
    """The machine's embedded engine: the running one when there is one, else started here.

    Start and announcement happen under a file lock, so two processes starting at once end up
    with one engine.
    """
    from tapdeck.runner.engine.model import DEFAULT_N_CTX
    from tapdeck.runner.engine.model_file import default_model_path

    folder = folder or registry_dir()
    path = Path(model_path or default_model_path()).resolve()
    n_ctx = n_ctx or DEFAULT_N_CTX
    with _locked(folder):
        running = find_running(path, n_ctx, folder)
        if running is not None:
            return SharedEngine(running.base_url, running.served_name, running.n_ctx, owner_pid=running.pid)
        engine = EmbeddedEngine(path, n_ctx=n_ctx).start()
        assert engine.core is not None, "start() loaded the model"
        ann = Announcement(
            pid=os.getpid(),
            base_url=engine.base_url,
            served_name=engine.served_name,
            model_path=str(path),
            n_ctx=engine.core.model.n_ctx,
            started_at=time.time(),
        )
        target = folder / _ANNOUNCEMENT
        with atomic_write(target) as f:
            f.write(ann.model_dump_json().encode())
        return SharedEngine(
            engine.base_url, engine.served_name, ann.n_ctx, engine=engine, announcement=target
        )
