"""What this machine can run right now, found without starting anything.

- Sandboxes: every Harbor `EnvironmentType` (available only if its class imports, i.e. its SDK is
  installed, and its preflight passes) plus tapdeck's `host` sandbox. Checks run in worker
  threads under one deadline: a preflight that hangs is reported, never waited on.
- Datasets: the sample dataset (and any local/remote specs asked for) with their tasks.
- Harnesses: the seam table, with availability given the sandboxes found.
- Engines: the embedded engine (llama_cpp importable and the model file present; not started) and
  any engine URL given (reachable via a short `GET /v1/models`; its tier from the proxy's probe).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from tapdeck.runner import datasets as datasets_mod
from tapdeck.runner import harbor_api
from tapdeck.runner import harnesses as harnesses_mod
from tapdeck.runner.rollout_settings import defaults_table, harness_defaults
from tapdeck.schema.catalog import (
    Catalog,
    DatasetInfo,
    EngineInfo,
    HarnessInfo,
    SandboxInfo,
    TaskInfo,
)
from tapdeck.schema.sessions import is_embedded_engine

HOST_SANDBOX = "host"
DOCKER_SANDBOX = "docker"
HOST_IMPORT_PATH = "tapdeck.runner.sandboxes.host:HostSandbox"
DEFAULTS = {
    "dataset": datasets_mod.SAMPLE_DATASET_NAME,
    "harness": harnesses_mod.DEFAULT_HARNESS,
    "sandbox": HOST_SANDBOX,
    "engine": "embedded",
}
SANDBOX_CHECK_TIMEOUT_S = 20.0
ENGINE_LIST_TIMEOUT_S = 3.0
ENGINE_PROBE_TIMEOUT_S = 30.0


# ------------------------------------------------------------------ sandboxes


def _first_line(text: str) -> str:
    """The first non-blank line; with the next one when it ends in ":" (an SDK's "Install it
    with:" is nothing without its command)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return text.strip()
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def _aws_credentials_configured() -> bool:
    # Read only the environment and the config files: boto3's own credential chain would also ask
    # the instance-metadata address, which is no place to send traffic from here.
    aws = Path(os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")).expanduser()
    creds = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser()
    return bool(
        os.environ.get("AWS_ACCESS_KEY_ID")
        or os.environ.get("AWS_PROFILE")
        or aws.is_file()
        or creds.is_file()
    )


UNCHECKED_BY_PREFLIGHT: dict[str, tuple[Callable[[], bool], str]] = {
    "ec2": (
        _aws_credentials_configured,
        "no AWS credentials configured (AWS_ACCESS_KEY_ID, AWS_PROFILE or ~/.aws); Harbor's "
        "preflight checks only boto3 and ssh",
    ),
    "opensandbox": (
        lambda: bool(os.environ.get("OPENSANDBOX_DOMAIN")),
        "OPENSANDBOX_DOMAIN is not set: no OpenSandbox server to start trials on",
    ),
}
"""Requirements Harbor's preflight lets pass (it only warns, or checks the SDK alone)."""


def _check_harbor_environment(env_type: str) -> tuple[bool, str]:
    """Import one Harbor environment class and run its preflight; never raises. Docker is also
    checked for what Harbor's preflight leaves out (the Compose plugin, the sample tasks' base
    images), and says what is missing."""
    ok, why = _harbor_preflight(env_type)
    if env_type == DOCKER_SANDBOX:
        from tapdeck.runner.sandboxes.docker_sandbox import check as docker_check

        docker_ok, docker_why = docker_check()
        return ok and docker_ok, docker_why if ok or not docker_ok else why
    return ok, why


def _harbor_preflight(env_type: str) -> tuple[bool, str]:
    """Import one Harbor environment class and run its preflight; never raises."""
    # Harbor's own modules are imported first: a Harbor that fails to import is no missing SDK.
    load_environment_class = harbor_api.load_environment_class
    environment_type = harbor_api.EnvironmentType
    try:
        cls = load_environment_class(environment_type(env_type))
    except ImportError as exc:
        return False, _first_line(str(exc)) + " (SDK not installed)"
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return False, f"cannot load: {type(exc).__name__}: {_first_line(str(exc))}"
    if getattr(cls.preflight, "__func__", None) is harbor_api.BaseEnvironment.preflight.__func__:
        return False, (
            "SDK installed, but Harbor has no preflight for it: its daemon or "
            "credentials cannot be checked without starting a sandbox"
        )
    try:
        cls.preflight()  # what it prints is dropped: its thread's name says it is a check's
    except SystemExit as exc:
        return False, _first_line(str(exc.code if exc.code is not None else "preflight failed"))
    except Exception as exc:  # noqa: BLE001
        return False, f"preflight failed: {type(exc).__name__}: {_first_line(str(exc))}"
    extra = UNCHECKED_BY_PREFLIGHT.get(env_type)
    if extra is not None and not extra[0]():
        return False, extra[1]
    return True, "SDK installed; Harbor's preflight passed (it checks only what it checks)"


def harbor_environment_types() -> list[str]:
    """Every `EnvironmentType` value of the installed Harbor."""
    return [member.value for member in harbor_api.EnvironmentType]


_SANDBOX_CACHE: dict[str, Any] = {}
_CHECK_THREADS = "tapdeck-sandbox"
"""The name prefix of the threads that run sandbox checks: what they print is dropped."""


class _ChecksMuted:
    """Stands in for sys.stdout or sys.stderr while sandbox checks run: what a check's thread
    prints (some preflights do) is dropped, every other thread's output goes through.

    `contextlib.redirect_stdout` cannot do this from the checks' threads: it swaps the
    process-wide stream, and four threads entering and leaving it out of order left sys.stdout on
    a check's buffer, so `tapdeck info --json` printed nothing."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if threading.current_thread().name.startswith(_CHECK_THREADS):
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_MUTE_LOCK = threading.Lock()
_muting = 0
"""How many `sandbox_catalog` calls are running checks (the streams are put back by the last)."""


@contextlib.contextmanager
def _checks_muted() -> Any:
    """Mute the checks' threads (`_ChecksMuted`) for the block; safe when several calls overlap."""
    global _muting
    with _MUTE_LOCK:
        if _muting == 0:
            sys.stdout, sys.stderr = _ChecksMuted(sys.stdout), _ChecksMuted(sys.stderr)
        _muting += 1
    try:
        yield
    finally:
        with _MUTE_LOCK:
            _muting -= 1
            if _muting == 0:
                for name in ("stdout", "stderr"):
                    if isinstance(stream := getattr(sys, name), _ChecksMuted):
                        setattr(sys, name, stream.stream)


def sandbox_catalog(
    *, timeout_s: float = SANDBOX_CHECK_TIMEOUT_S, refresh: bool = False
) -> list[SandboxInfo]:
    """The host sandbox plus every Harbor backend, each with availability and the reason.

    Cached for the process (imports and preflights are slow); `refresh=True` re-checks.
    """
    if not refresh and "value" in _SANDBOX_CACHE:
        return list(_SANDBOX_CACHE["value"])
    from tapdeck.runner.sandboxes.host import check as host_check

    ok, why = host_check()
    rows = [SandboxInfo(name=HOST_SANDBOX, available=ok, why=why, import_path=HOST_IMPORT_PATH)]
    types = harbor_environment_types()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix=_CHECK_THREADS)
    with _checks_muted():
        futures = {t: pool.submit(_check_harbor_environment, t) for t in types}
        deadline = time.monotonic() + timeout_s
        for env_type in types:
            try:
                ok, why = futures[env_type].result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                ok, why = False, f"check did not finish within {timeout_s:.0f} s"
            rows.append(SandboxInfo(name=env_type, available=ok, why=why))
    pool.shutdown(wait=False, cancel_futures=True)
    _SANDBOX_CACHE["value"] = rows
    return list(rows)


def sandbox_environment_config(name: str, **kwargs: Any):
    """Harbor's trial-side `EnvironmentConfig` for a sandbox name (`host` or an EnvironmentType).

    `kwargs` go to the environment's constructor (`EnvironmentConfig.kwargs`).
    """
    if name == HOST_SANDBOX:
        return harbor_api.EnvironmentConfig(import_path=HOST_IMPORT_PATH, kwargs=kwargs)
    if ":" in name:
        return harbor_api.EnvironmentConfig(import_path=name, kwargs=kwargs)
    try:
        env_type = harbor_api.EnvironmentType(name)
    except ValueError:
        raise ValueError(
            f"unknown sandbox {name!r}; use 'host', a Harbor environment type "
            f"({', '.join(harbor_environment_types())}) or module:Class"
        ) from None
    return harbor_api.EnvironmentConfig(type=env_type, kwargs=kwargs)


# ------------------------------------------------------------------ harnesses


def harness_catalog(sandboxes: list[SandboxInfo]) -> list[HarnessInfo]:
    """The seam table with availability: host-side needs its tools, installed needs a container."""
    containers = [s.name for s in sandboxes if s.available and s.name != HOST_SANDBOX]
    host_ok = any(s.available and s.name == HOST_SANDBOX for s in sandboxes)
    rows = []
    for h in harnesses_mod.HARNESSES.values():
        placement = harnesses_mod.Placement
        if h.placement is placement.NO_MODEL:
            available, why = True, h.notes
        elif h.placement is placement.HOST_INSTALL:
            docker_ok = any(s.available and s.name == DOCKER_SANDBOX for s in sandboxes)
            rows.append(_cli_harness_info(h, host_ok or docker_ok))
            continue
        elif h.placement is placement.HOST_SIDE:
            tmux = shutil.which("tmux") is not None
            available = tmux
            why = h.notes if tmux else "needs tmux in the sandbox (host sandbox: on the host)"
        elif containers:
            available = True
            why = f"{h.notes}; container sandboxes here: {', '.join(containers)}"
        else:
            available = False
            why = (
                f"{h.notes}; no container sandbox is available here (the host sandbox would "
                "install it into the host)"
            )
        if not h.validated:
            why += " [unvalidated]"
        rows.append(
            HarnessInfo(
                name=h.name,
                dialect=h.dialect.value,
                placement=h.placement.value,
                validated=h.validated,
                available=available,
                why=why,
            )
        )
    return rows


def _cli_harness_info(h: Any, host_ok: bool) -> HarnessInfo:
    """An agent CLI tapdeck installs: runnable on the host or docker sandbox (its install mounted)
    once installed (or installable). `host_ok`: one of those sandboxes is available."""
    from tapdeck.runner import agent_install

    record = agent_install.installed(h.name)
    package = agent_install.get_package(h.name)
    tool = "npm" if package.registry == "npm" else None
    if record is not None:
        installed = f"{record.version}, {record.size_bytes / 1e6:.0f} MB"
        state = f"installed {installed} at {record.path}"
    else:
        installed = None
        state = (
            f"not installed: `tapdeck harness install {h.name}` (or on first use) fetches "
            f"{package.spec} from {package.registry}"
        )
    available = host_ok and (record is not None or tool is None or shutil.which(tool) is not None)
    why = f"{state}; {h.notes}"
    if not host_ok:
        why = f"needs the host or docker sandbox, neither available here; {why}"
    why += f" [validated here: {h.version}]" if h.validated else " [unvalidated]"
    return HarnessInfo(
        name=h.name,
        dialect=h.dialect.value,
        placement=h.placement.value,
        validated=h.validated,
        available=available,
        why=why,
        version=h.version,
        installed=installed,
    )


# ------------------------------------------------------------------ datasets

UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    httpx.TransportError,
    ConnectionError,
    TimeoutError,
    socket.gaierror,
)
"""What a source that does not answer raises under Harbor's clients (a name that does not resolve,
a refused or timed-out connection)."""


@dataclass(frozen=True)
class DatasetProblem:
    """Why a dataset spec could not be listed, as one line."""

    message: str
    unreachable: bool
    """Its source (Harbor's registry, a git host) did not answer, so the spec may be fine: work
    that could not be done (exit 1). Every other problem is in the spec itself (bad usage, 2)."""


@dataclass(frozen=True)
class DatasetListing:
    """One dataset spec as `tapdeck info` lists it."""

    row: DatasetInfo
    problem: DatasetProblem | None
    """Why it could not be listed; None when it was."""
    unlisted: list[str]
    """Task folders of a local dataset that Harbor leaves out, as `file: what is wrong`."""


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what led to it (its causes and the errors it was raised while handling)."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _source_of(spec: str) -> str:
    """Where a remote spec is looked up, as `datasets.resolve_dataset` sends it."""
    if datasets_mod.is_git_spec(spec):
        return f"the git host of {spec}"
    return "the Harbor registry"


GIT_UNREACHABLE = re.compile(
    r"could not resolve (host|proxy)|failed to connect|couldn't connect|"
    r"connection (refused|timed out|reset)|timed out|network is unreachable|"
    r"no route to host|temporary failure in name resolution",
    re.IGNORECASE,
)
"""What git (through libcurl or ssh) says when the host did not answer."""
GIT_UNKNOWN = re.compile(
    r"not found|returned error: 40[134]|does not appear to be a git repository|"
    r"could not read username|authentication failed|could not resolve ref",
    re.IGNORECASE,
)
"""What git says when the host answered but holds no such repository or ref for us (a missing
repository and a private one look alike: hosts ask for credentials for both)."""


def _git_said(causes: list[BaseException]) -> str | None:
    """The last line git wrote to stderr before it failed, or the ref Harbor could not resolve."""
    for cause in causes:
        if isinstance(cause, subprocess.CalledProcessError) and cause.stderr:
            err = cause.stderr.decode(errors="replace") if isinstance(cause.stderr, bytes) else cause.stderr
            lines = [line.strip() for line in err.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        if isinstance(cause, ValueError) and GIT_UNKNOWN.search(str(cause)):
            return str(cause)
    return None


def dataset_problem(spec: str, exc: datasets_mod.DatasetError) -> DatasetProblem:
    """Say which it is when `spec` could not be resolved: a name its source does not know, a
    source that did not answer (the name then unchecked), or the spec's own error (a missing or
    empty folder, a spec that does not parse), so that a typo is not mistaken for being offline."""
    causes = _causes(exc)[1:]
    silent = next((c for c in causes if isinstance(c, UNREACHABLE_ERRORS)), None)
    git = _git_said(causes) if datasets_mod.is_git_spec(spec) else None
    if git is not None and GIT_UNKNOWN.search(git):
        return DatasetProblem(
            unreachable=False,
            message=(
                f"unknown dataset {spec!r}: {_source_of(spec)} answered, with no such repository or ref "
                f"(or one that needs credentials): git: {git}"
            ),
        )
    if (
        silent is not None
        or isinstance(exc, datasets_mod.DatasetTimeout)
        or (git is not None and GIT_UNREACHABLE.search(git))
    ):
        why = (
            f"{type(silent).__name__}: {silent}"
            if silent is not None
            else f"git: {git}"
            if git is not None
            else "no answer in time"
        )
        return DatasetProblem(
            unreachable=True,
            message=(
                f"dataset source unreachable: {_source_of(spec)} did not answer ({why}), so whether "
                f"{spec!r} names a dataset there is not known (there is no folder of that name "
                "here); try again once it answers, or use a local folder or the sample dataset"
            ),
        )
    # Harbor's registry clients say a name, version or tag they do not hold with a ValueError.
    missing = next((c for c in causes if isinstance(c, ValueError) and "not found" in str(c)), None)
    if missing is not None:
        return DatasetProblem(
            unreachable=False,
            message=(
                f"unknown dataset {spec!r}: no folder of that name here, and {_source_of(spec)} does "
                f"not know it ({missing})"
            ),
        )
    if git is not None:
        return DatasetProblem(unreachable=False, message=f"cannot load dataset {spec}: git: {git}")
    return DatasetProblem(unreachable=False, message=f"cannot load dataset {spec}: {exc}")


def local_folder(spec: str) -> Path | None:
    """The folder a spec names when it is a local dataset (the sample dataset's for `sample` or
    nothing, as `datasets.resolve_dataset` reads them)."""
    if spec.strip() in ("", datasets_mod.SAMPLE_DATASET_NAME):
        return datasets_mod.SAMPLE_DATASET_DIR
    if spec.strip() in datasets_mod.SHIPPED_DATASETS:
        return datasets_mod.SHIPPED_DATASETS[spec.strip()]
    path = Path(spec.strip()).expanduser()
    return path if path.is_dir() else None


def unlisted_tasks(folder: Path) -> dict[str, str]:
    """The task folders of a local dataset (or the task folder itself) that hold a task.toml but
    that Harbor does not take as tasks, by folder name, each as `file: what is wrong`: resolving
    the dataset leaves them out without a word."""
    if (folder / "task.toml").exists():
        candidates = [folder]
    else:
        candidates = [
            child for child in sorted(folder.iterdir()) if child.is_dir() and (child / "task.toml").exists()
        ]
    return {c.name: _why_not_a_task(c) for c in candidates if not datasets_mod.is_task_dir(c)}


def _why_not_a_task(task_dir: Path) -> str:
    """Why Harbor refuses a folder holding a task.toml as a task, naming the file at fault."""
    toml = task_dir / "task.toml"
    try:
        text = toml.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{toml}: cannot be read ({exc})"
    try:
        harbor_api.TaskConfig.model_validate_toml(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{toml}: not a task config ({'.'.join(map(str, first['loc']))}: {first['msg']})"
    except ValueError as exc:  # tomllib's TOMLDecodeError
        return f"{toml}: not TOML ({exc})"
    try:
        harbor_api.Task(task_dir)  # its own checks name the missing instruction or tests
    except (OSError, ValueError, RuntimeError) as exc:
        return f"{task_dir}: {_first_line(str(exc)).rstrip('.')}"
    # The one check of Harbor's `is_valid_dir` that `Task()` does not make.
    return f"{task_dir}: no environment/ folder, and task.toml names no [environment].docker_image"


def list_dataset(spec: str, *, timeout_s: float = 20.0) -> DatasetListing:
    """One dataset spec listed: its tasks, or the problem that stopped it, and the task folders
    it leaves out."""
    folder = local_folder(spec)
    unlisted = list(unlisted_tasks(folder).values()) if folder is not None else []
    try:
        ds = datasets_mod.resolve_dataset(spec, timeout_s=timeout_s)
    except datasets_mod.DatasetError as exc:
        problem = dataset_problem(spec, exc)
        return DatasetListing(
            row=DatasetInfo(name=spec, source=spec, tasks=[], error=problem.message),
            problem=problem,
            unlisted=unlisted,
        )
    row = DatasetInfo(
        name=ds.name,
        source=ds.source,
        tasks=[
            TaskInfo(name=t.name, instruction=t.instruction, instruction_text=t.instruction_text)
            for t in ds.tasks
        ],
    )
    return DatasetListing(row=row, problem=None, unlisted=unlisted)


def list_datasets(specs: list[str] | None = None, *, timeout_s: float = 20.0) -> list[DatasetListing]:
    """The shipped datasets plus `specs` (those not shipped), each listed (`list_dataset`)."""
    shipped = list(datasets_mod.SHIPPED_DATASETS)
    return [
        list_dataset(spec, timeout_s=timeout_s)
        for spec in [*shipped, *(s for s in specs or [] if s.strip() not in shipped)]
    ]


def dataset_catalog(specs: list[str] | None = None, *, timeout_s: float = 20.0) -> list[DatasetInfo]:
    """The shipped datasets plus `specs`, each listed or with the error that stopped it."""
    return [listing.row for listing in list_datasets(specs, timeout_s=timeout_s)]


# ------------------------------------------------------------------ engines


def embedded_engine_info() -> EngineInfo:
    """Whether the embedded engine could start here (nothing is started)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return EngineInfo(
            name="embedded",
            url=None,
            tier=None,
            reachable=False,
            why="llama-cpp-python is not installed (pip install 'tapdeck[engine]')",
        )
    try:
        from tapdeck.runner.engine.model_file import default_model_path

        path = default_model_path()  # converts the shipped file once (about a second)
    except (ImportError, OSError) as exc:  # not installed, or the conversion could not be written
        return EngineInfo(name="embedded", url=None, tier=None, reachable=False, why=str(exc))
    if not path.is_file():
        return EngineInfo(
            name="embedded", url=None, tier=None, reachable=False, why=f"model file {path} is missing"
        )
    # Not started, so not probed: no tier is claimed (the server probes it when it starts).
    from tapdeck.runner.engine.model import DEFAULT_N_CTX

    return EngineInfo(
        name="embedded",
        url=None,
        tier=None,
        reachable=True,
        served_model="smollm2",
        context_tokens=DEFAULT_N_CTX,
        embedded=True,
        why=f"available (not started; probed when a server starts it): SmolLM2-135M "
        f"at {path.name}; it never solves tasks (reward 0) — use --engine URL "
        "for a bigger model",
    )


async def url_engine_info(
    url: str,
    *,
    api_key: str | None = None,
    model: str | None = None,
    probe: bool = True,
    list_timeout_s: float = ENGINE_LIST_TIMEOUT_S,
    probe_timeout_s: float = ENGINE_PROBE_TIMEOUT_S,
) -> EngineInfo:
    """Reach an engine URL with a short `GET /v1/models`; with `probe`, ask the proxy's tier probe.

    The address may be `HOST:PORT`, `http://HOST:PORT` or `…/v1`: `url` in the answer is the base
    URL it settled on; `name` shows it without credentials. `model` names the served model to
    probe, as sessions do, where an engine serves several. An unprobed engine counts as the `text`
    tier (never assume the stronger tier).
    """
    from tapdeck.proxy.upstream.address import EngineAddressError, settle, shown_url

    name = shown_url(url)
    try:
        settled = await settle(url, api_key=api_key, timeout=list_timeout_s)
    except EngineAddressError as exc:
        return EngineInfo(name=name, url=None, tier=None, reachable=False, why=str(exc))
    base, models = settled.base_url, settled.model_ids()
    served = model if model in models else models[0] if len(models) == 1 else None
    lengths = [m.get("max_model_len") for m in settled.listing.get("data") or [] if isinstance(m, dict)]
    context = lengths[0] if len(lengths) == 1 and isinstance(lengths[0], int) else None
    # Led by the base URL the address settled on: that is what sessions talk to.
    listed = f"{shown_url(base)} serves " + (", ".join(str(m) for m in models) or "no models")
    if not probe:
        return EngineInfo(
            name=name,
            url=base,
            tier="text",
            reachable=True,
            served_model=served,
            why=f"{listed}; tier not probed (counts as text until probed)",
            context_tokens=context,
        )
    from tapdeck.proxy.upstream.tiers import EngineSpec
    from tapdeck.proxy.upstream.tiers import probe as probe_tier

    try:
        result = await asyncio.wait_for(
            probe_tier(EngineSpec(url=base, model=model, api_key=api_key)), timeout=probe_timeout_s
        )
    except TimeoutError:
        return EngineInfo(
            name=name,
            url=base,
            tier="text",
            reachable=True,
            served_model=served,
            why=f"{listed}; tier probe did not finish in {probe_timeout_s:.0f} s",
            context_tokens=context,
        )
    if result.max_model_len:
        context = result.max_model_len
    return EngineInfo(
        name=name,
        url=base,
        tier=result.tier.value,
        reachable=True,
        served_model=result.served_model or served,
        embedded=is_embedded_engine(result.system_fingerprint),
        why=f"{listed}; {shown_url(result.detail)}",
        context_tokens=context,
    )


def engine_catalog(
    urls: list[str] | None = None, *, api_key: str | None = None, probe: bool = True
) -> list[EngineInfo]:
    """The embedded engine plus each URL given (blocking; runs its own short event loop)."""
    rows = [embedded_engine_info()]
    if urls:

        async def gather() -> list[EngineInfo]:
            return list(
                await asyncio.gather(*(url_engine_info(u, api_key=api_key, probe=probe) for u in urls))
            )

        rows += asyncio.run(gather())
    return rows


# ------------------------------------------------------------------ all


def build_catalog(
    *,
    engine_urls: list[str] | None = None,
    engine_api_key: str | None = None,
    datasets: list[DatasetListing] | None = None,
    probe: bool = True,
    refresh: bool = False,
) -> Catalog:
    """Everything at once (blocking: call it via `asyncio.to_thread` from a server). `datasets`
    are the datasets as `list_datasets` listed them (default: the sample dataset)."""
    sandboxes = sandbox_catalog(refresh=refresh)
    return Catalog(
        datasets=dataset_catalog() if datasets is None else [d.row for d in datasets],
        harnesses=harness_catalog(sandboxes),
        sandboxes=sandboxes,
        engines=engine_catalog(engine_urls, api_key=engine_api_key, probe=probe),
        defaults=dict(DEFAULTS),
        settings_defaults=dict(defaults_table()),
        harness_defaults=harness_defaults(),
    )
