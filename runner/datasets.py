"""Datasets: where Harbor tasks come from, resolved to local task folders.

Spec forms (`resolve_dataset(spec)`):
- `None` or `"sample"`: tapdeck's shipped sample dataset (offline).
- `"learn"` / `"learn-eval"`: tapdeck's shipped learnable task set for terminus-2 on the embedded
  model, and its held-out eval split (offline; `cpu-grpo` trains on the first, evaluates on the
  second).
- a local folder: one Harbor task if it is a valid task folder, else each valid immediate
  subfolder, sorted (Harbor's own rule; offline).
- `org/name` or `org/name@ref`: a Harbor hub package dataset (network).
- `name` or `name@version` (not an existing path): a dataset in Harbor's registry (network).
- a git or Hugging Face URL (`https://...`, `ssh://...`, `git@host:org/name`, optional `@ref`
  or `/tree/<ref>/<subdir>`), or `repo:org/name[@ref]` for a GitHub repo: cloned by Harbor into
  its task cache (network).

Remote specs are resolved and downloaded by Harbor itself (imported lazily) in a worker thread
bounded by `timeout_s`: offline, they fail with a `DatasetError` instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from pydantic import BaseModel

from tapdeck.runner import harbor_api

SAMPLE_DATASET_NAME = "sample"
SAMPLE_DATASET_DIR = Path(__file__).parent / "sample_dataset"
LEARN_DATASET_DIR = Path(__file__).parent / "learn_dataset"
SHIPPED_DATASETS: dict[str, Path] = {
    SAMPLE_DATASET_NAME: SAMPLE_DATASET_DIR,
    "learn": LEARN_DATASET_DIR / "train",
    "learn-eval": LEARN_DATASET_DIR / "eval",
}
"""The datasets tapdeck ships, by name: folders of this package, offline."""
DEFAULT_REMOTE_TIMEOUT_S = 60.0
_GIT_PREFIXES = ("https://", "http://", "ssh://", "git://", "git@")
_INSTRUCTION_MAX_CHARS = 200
INSTRUCTION_TEXT_MAX_CHARS = 4000
"""What a catalog carries of each instruction: enough to read it before a run, bounded for
datasets of many tasks."""


class DatasetError(RuntimeError):
    """A dataset spec could not be resolved (bad path, no tasks, offline, timeout...)."""


class DatasetTimeout(DatasetError):
    """A remote spec's source gave no answer within the time allowed: the spec itself may be fine."""


class TaskRef(BaseModel):
    """One task of a dataset: its name, its local folder, the first line of its instruction and
    the instruction itself (cut to INSTRUCTION_TEXT_MAX_CHARS)."""

    name: str
    path: Path
    instruction: str
    instruction_text: str = ""


class Dataset(BaseModel):
    """A resolved dataset: every task is a local folder Harbor can run (`TaskConfig(path=...)`)."""

    name: str
    source: str
    tasks: list[TaskRef]

    def task(self, name: str) -> TaskRef:
        """The task called `name`; KeyError naming the available ones otherwise."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(
            f"no task {name!r} in dataset {self.name!r}; tasks: " + ", ".join(t.name for t in self.tasks)
        )


def instruction_text(task_dir: Path) -> str:
    """The task's instruction.md as the agent reads it, cut to INSTRUCTION_TEXT_MAX_CHARS (a
    preview, not the task); "" when it cannot be read."""
    try:
        text = (task_dir / "instruction.md").read_text(errors="replace")
    except OSError:
        return ""
    if len(text) > INSTRUCTION_TEXT_MAX_CHARS:
        return text[: INSTRUCTION_TEXT_MAX_CHARS - 1] + "…"
    return text


def first_line(instruction: str) -> str:
    """An instruction's opening line: its first paragraph on one line (wrapped markdown joined,
    heading marks dropped), cut to 200 characters."""
    words: list[str] = []
    for line in instruction.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            words.append(line)
        elif words:
            break
    first = " ".join(words)
    if len(first) > _INSTRUCTION_MAX_CHARS:
        return first[: _INSTRUCTION_MAX_CHARS - 1] + "…"
    return first


def _task_name(task_dir: Path) -> str:
    try:
        config = harbor_api.TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except (OSError, ValueError):
        return task_dir.name
    return config.task.name if config.task is not None else task_dir.name


def task_ref(task_dir: Path) -> TaskRef:
    """Describe one local task folder."""
    text = instruction_text(task_dir)
    return TaskRef(
        name=_task_name(task_dir),
        path=task_dir.resolve(),
        instruction=first_line(text),
        instruction_text=text,
    )


def is_task_dir(path: Path) -> bool:
    """Harbor's own validity test for a task folder."""
    return harbor_api.Task.is_valid_dir(path)


def local_dataset(path: Path, *, name: str | None = None) -> Dataset:
    """A local folder: one task if it is a valid task folder, else its valid immediate subfolders."""
    path = path.expanduser()
    if not path.is_dir():
        raise DatasetError(f"dataset folder {path} does not exist or is not a folder")
    if is_task_dir(path):
        task_dirs = [path]
    else:
        task_dirs = [child for child in sorted(path.iterdir()) if child.is_dir() and is_task_dir(child)]
    if not task_dirs:
        raise DatasetError(
            f"no Harbor task in {path}: a task folder holds task.toml, instruction.md, "
            "environment/ and tests/ (a dataset folder holds task folders)"
        )
    resolved = path.resolve()
    return Dataset(name=name or resolved.name, source=str(resolved), tasks=[task_ref(d) for d in task_dirs])


def sample_dataset() -> Dataset:
    """The dataset shipped with tapdeck: small real tasks that run offline on the host sandbox."""
    return local_dataset(SAMPLE_DATASET_DIR, name=SAMPLE_DATASET_NAME)


def is_git_spec(spec: str) -> bool:
    """Whether a non-local spec names a git repository (cloned by Harbor), not a registry name."""
    return spec.startswith(("repo:", *_GIT_PREFIXES)) or spec.endswith(".git")


def _remote_dataset_config(spec: str):
    """Harbor's `DatasetConfig` for a non-local spec, following `harbor run`'s parsing."""
    if spec.startswith("repo:"):
        return harbor_api.DatasetConfig(repo=spec.removeprefix("repo:"))
    if is_git_spec(spec):
        return harbor_api.DatasetConfig(repo=spec)
    name, _, version = spec.partition("@")
    if not name:
        raise DatasetError(f"cannot parse dataset spec {spec!r}")
    if "/" in name:
        return harbor_api.DatasetConfig(name=name, ref=version or "latest")
    return harbor_api.DatasetConfig(name=name, version=version or None)


async def _resolve_remote(spec: str) -> Dataset:
    config = _remote_dataset_config(spec)
    task_configs = await config.get_task_configs()
    if not task_configs:
        raise DatasetError(f"dataset {spec!r} has no tasks")
    downloaded = await harbor_api.TaskClient().download_tasks([tc.get_task_id() for tc in task_configs])
    return Dataset(name=spec, source=spec, tasks=[task_ref(p) for p in downloaded.paths])


def _run_bounded(spec: str, timeout_s: float) -> Dataset:
    """Run the async resolution on its own loop in a daemon thread, and stop waiting at timeout.

    A daemon thread (not `asyncio.run` in the caller) because a stuck DNS lookup sits in an
    executor thread that a cancelled coroutine cannot interrupt, and `asyncio.run` would wait for it.
    """
    resolved: list[Dataset] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            resolved.append(asyncio.run(_resolve_remote(spec)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=work, name=f"tapdeck-dataset-{spec}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise DatasetTimeout(
            f"dataset {spec!r} could not be resolved within {timeout_s:.0f} s "
            "(Harbor registry/git/HF sources need network access; offline, use a local folder "
            "or the sample dataset)"
        )
    if failed:
        exc = failed[0]
        if isinstance(exc, DatasetError):
            raise exc
        raise DatasetError(
            f"dataset {spec!r} could not be resolved: {type(exc).__name__}: {exc} "
            "(registry/git/HF sources need network access; offline, use a local folder or the "
            "sample dataset)"
        ) from exc
    return resolved[0]


def resolve_dataset(spec: str | None, *, timeout_s: float = DEFAULT_REMOTE_TIMEOUT_S) -> Dataset:
    """Resolve a dataset spec (see the module docstring) to local task folders.

    Blocking; callers on an event loop use `await asyncio.to_thread(resolve_dataset, spec)`.
    Raises `DatasetError` with an actionable message.
    """
    if spec is None or spec.strip() in ("", SAMPLE_DATASET_NAME):
        return sample_dataset()
    spec = spec.strip()
    if spec in SHIPPED_DATASETS:
        return local_dataset(SHIPPED_DATASETS[spec], name=spec)
    path = Path(spec).expanduser()
    if path.exists():
        return local_dataset(path)
    if spec.startswith((".", "/", "~")):
        raise DatasetError(f"dataset folder {path} does not exist")
    return _run_bounded(spec, timeout_s)
