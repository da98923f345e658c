"""One rollout = one capture session + one Harbor trial. It never raises.

Flow: open a capture session on the proxy (engine probed, per-session call budget) → point the
harness at the proxy through its seam (the session key is the only credential it gets) → create and
run a Harbor `Trial` (its own retries are never used: `Trial` has none, and a retry would merge two
attempts into one graph) → read the reward with the reward rule → reconcile the harness's ATIF
trajectory with the capture → judge ok-ness → close the session (shielded) → return a
`RolloutResult` with a classified error when something failed.

A hard `asyncio.timeout` bounds the whole rollout, sandbox start included; Harbor's own teardown
(environment stop) is shielded, and so is ours. Progress goes to the capture session's metadata
(`phase`, `reward`, `run_id`) and to the event bus as `rollout_updated`.

No process environment is touched: the proxy URL and the session key reach the harness through its
Trial config only, so concurrent rollouts cannot see each other's keys (capture-cases M79-81 avoided
by construction, not by a lock), and no real provider key is ever put into a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tapdeck.proxy.config import is_loopback
from tapdeck.proxy.sessions.spec import SessionSpec, base_urls_for
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.runner import harbor_api
from tapdeck.runner.atif import CapturedCall, reconcile_file
from tapdeck.runner.rewards import choose_reward, read_reward_files
from tapdeck.runner.rollout_settings import (
    DEFAULT_HARD_LIMIT_S,
    DEFAULT_MAX_TURNS,
    RUNAWAY_OUTPUT_TOKENS,
    SettingsDoNotFit,
    resolve,
)
from tapdeck.runner.sandboxes.docker_sandbox import compose_failure
from tapdeck.runner.sandboxes.live_sandboxes import LiveSandboxes
from tapdeck.runner.service_protocol import CaptureServiceProtocol
from tapdeck.schema.events import RolloutUpdated
from tapdeck.schema.findings import Finding, Level
from tapdeck.schema.rollout_health import DEGENERATE
from tapdeck.schema.runs import Phase, RolloutResult, RolloutTemplate
from tapdeck.schema.sessions import SessionInfo, Tier, is_embedded_engine
from tapdeck.schema.settings import ResolvedSettings

log = logging.getLogger("tapdeck.runner")

MAX_FINDINGS = 200
"""Findings kept on a result (the session keeps all of them)."""
BUDGET_PER_TURN = 3
"""Call budget = this × max_turns: terminus-2 re-asks after a length cut without counting a turn."""


@dataclass
class RolloutSpec:
    """One rollout of a plan: which task, where its trial goes, and the plan's rollout template;
    the agent, sandbox and engine are chosen per rollout."""

    task: str
    task_path: Path
    trials_dir: Path
    rollout: RolloutTemplate = field(default_factory=RolloutTemplate)
    """How it runs (the plan's `rollout`); settings are resolved against the engine once the
    session is open."""
    engine: EngineSpec | None = None
    """The template's engine, resolved; None → the capture service's default (the embedded one)."""
    trial_name: str | None = None
    rollout_id: str | None = None
    run_id: str | None = None
    group: int = 0
    index: int = 0
    data_dir: Path | None = None
    """The tapdeck data dir the rollout runs for, hidden from a host sandbox's trial."""
    sandboxes: LiveSandboxes | None = None
    """Where the rollout holds its sandbox while its agent runs (`tapdeck exec`, the TUI's look
    inside); None: nowhere."""


# Harbor exception type names → our error kinds. Anything not listed is classified by phase.
_EXCEPTION_KINDS: dict[str, str] = {
    "AgentTimeoutError": "agent_timeout",
    "AgentSetupTimeoutError": "sandbox_failed",
    "EnvironmentStartTimeoutError": "sandbox_failed",
    "HealthcheckError": "sandbox_failed",
    "VerifierTimeoutError": "verifier_failed",
    "RewardFileNotFoundError": "verifier_failed",
    "RewardFileEmptyError": "verifier_failed",
    "VerifierOutputParseError": "verifier_failed",
    "AddTestsDirError": "verifier_failed",
    "DownloadVerifierDirError": "verifier_failed",
    "ContextLengthExceededError": "context_length",
    "ContextWindowExceededError": "context_length",
    "OutputLengthExceededError": "context_length",
    "CancelledError": "cancelled",
    "NonZeroAgentExitCodeError": "agent_failed",
    "AuthenticationError": "proxy_rejected",
    "PermissionDeniedError": "proxy_rejected",
    "BadRequestError": "engine_rejected",
    "UnprocessableEntityError": "engine_rejected",
    "NotFoundError": "engine_rejected",
    "ProxyUnreachableError": "proxy_unreachable",
    "AgentNotInstalledError": "harness_install_failed",
}
_ENGINE_TYPES = frozenset(
    {
        "APIConnectionError",
        "ApiConnectionError",
        "NetworkConnectionError",
        "InternalServerError",
        "ServiceUnavailableError",
        "APIError",
        "ApiError",
        "Timeout",
        "ApiInternalServerError",
        "UnknownApiError",
        "ApiResponseStalledError",
        "ApiConnectionClosedError",
        "RateLimitError",
    }
)


ENGINE_BLAMED = ("agent_failed", "agent_timeout", "no_model_calls", "engine_rejected")
"""Agent failures classified `engine_unreachable` when the session saw the engine fail."""


def classify_exception(exception_type: str, phase: Phase) -> str:
    """Our error kind for a Harbor `exception_info.exception_type` raised during `phase`."""
    if exception_type in _EXCEPTION_KINDS:
        return _EXCEPTION_KINDS[exception_type]
    if exception_type in _ENGINE_TYPES:
        return "engine_unreachable"
    return {
        "sandbox": "sandbox_failed",
        "agent_setup": "sandbox_failed",
        "agent": "agent_failed",
        "verify": "verifier_failed",
    }.get(phase, "internal")


def _failed_phase(result: Any) -> Phase:
    """Which phase a trial's recorded exception happened in: the last phase Harbor started before
    the exception occurred. Harbor still runs the verifier after an agent that failed or timed
    out, so the last phase that ran is not where the failure was."""
    occurred = result.exception_info.occurred_at if result.exception_info is not None else None
    phases: tuple[tuple[Phase, Any], ...] = (
        ("agent_setup", result.agent_setup),
        ("agent", result.agent_execution),
        ("verify", result.verifier),
    )
    failed: Phase = "sandbox"
    for phase, timing in phases:
        if timing is None:
            break
        if occurred is not None and timing.started_at is not None and timing.started_at > occurred:
            break
        failed = phase
    return failed


def _seconds(timing: Any) -> float | None:
    if timing is None or timing.started_at is None or timing.finished_at is None:
        return None
    started: datetime = timing.started_at
    return max(0.0, (timing.finished_at - started).total_seconds())


class _Progress:
    """The rollout's live result: phase changes go to the session metadata and the event bus."""

    def __init__(
        self,
        service: CaptureServiceProtocol,
        result: RolloutResult,
        on_update: Callable[[RolloutResult], None] | None,
    ) -> None:
        self.service = service
        self.result = result
        self.on_update = on_update

    def phase(self, phase: Phase) -> None:
        self.result.phase = phase
        self.result.phase_started.setdefault(phase, time.time())
        self.publish()

    def publish(self) -> None:
        r = self.result
        if r.session_id is not None:
            with contextlib.suppress(Exception):  # a progress note must never fail a rollout
                self.service.annotate(
                    r.session_id,
                    phase=r.phase,
                    reward=r.reward,
                    run_id=r.run_id,
                    rollout_id=r.rollout_id,
                    task=r.task,
                    group=r.group,
                )
        snapshot = r.model_copy(deep=True)
        if self.on_update is not None:
            with contextlib.suppress(Exception):
                self.on_update(snapshot)
        else:
            with contextlib.suppress(Exception):
                self.service.events.publish(
                    RolloutUpdated(run_id=r.run_id, rollout=snapshot).model_dump(mode="json")
                )


async def run_rollout(
    service: CaptureServiceProtocol,
    spec: RolloutSpec,
    *,
    on_update: Callable[[RolloutResult], None] | None = None,
) -> RolloutResult:
    """Run one rollout on `service` (a CaptureService on this loop). Never raises.

    Cancellation of the calling task comes back as a result with `error_kind="cancelled"` after the
    sandbox has been torn down.
    """
    from tapdeck.runner.harnesses import get_harness

    rid = spec.rollout_id or spec.trial_name or f"{spec.task}-{spec.index}"
    result = RolloutResult(
        rollout_id=rid,
        run_id=spec.run_id,
        task=spec.task,
        group=spec.group,
        index=spec.index,
        harness=spec.rollout.harness,
        sandbox=spec.rollout.sandbox,
        started_at=time.time(),
    )
    progress = _Progress(service, result, on_update)
    findings: list[Finding] = []
    trial_result: Any = None
    trial_dir: Path | None = None
    started = time.monotonic()
    uses_model = True
    hard_limit = spec.rollout.timeout_s or DEFAULT_HARD_LIMIT_S
    try:
        async with asyncio.timeout(hard_limit) as deadline:
            try:
                uses_model = get_harness(spec.rollout.harness).makes_model_calls
            except KeyError as exc:
                raise RolloutSetupError("bad_plan", str(exc).strip("'\"")) from None
            environment = environment_config(spec.rollout.sandbox, spec.rollout.sandbox_kwargs)
            await _install_agent_cli(spec.rollout.harness, progress)
            info: SessionInfo | None = None
            progress.phase("sandbox")
            await asyncio.to_thread(_preflight, environment)
            if uses_model:
                info = await _open_session(service, spec, rid)
                result.session_id = info.id
                result.tier = str(info.tier)
                result.rollout_type = info.rollout_type
                result.timings["session_open"] = time.monotonic() - started
                progress.publish()
                if info.tier is Tier.TEXT:
                    reason = await _engine_unreachable(info.engine.url, spec.engine)
                    if reason is not None:
                        raise RolloutSetupError("engine_unreachable", reason)
            result.settings = _resolve_settings(spec, info)
            if result.settings.hard_limit_s != hard_limit:
                # Raised to fit a longer agent timeout (or the plan's own): counted from the start.
                hard_limit = result.settings.hard_limit_s
                deadline.reschedule(
                    asyncio.get_running_loop().time() + hard_limit - (time.monotonic() - started)
                )
            if info is not None:
                if result.settings.max_output_tokens is not None:
                    # Enforced on the wire: codex, for one, asks for none whatever it is told.
                    service.limit_output(info.id, result.settings.max_output_tokens)
                with contextlib.suppress(Exception):  # a note on the session, never a failure
                    service.annotate(
                        info.id,
                        context_tokens=result.settings.context_tokens,
                        max_output_tokens=result.settings.max_output_tokens,
                    )
            progress.publish()
            if info is not None and spec.rollout.public_url:
                info = info.model_copy(update={"base_urls": base_urls_for(spec.rollout.public_url)})
            if spec.rollout.sandbox == "host":
                environment = environment_config(
                    spec.rollout.sandbox,
                    host_sandbox_kwargs(spec, info.base_urls["openai"] if info is not None else None),
                )
            elif spec.rollout.sandbox == "docker":
                environment = await asyncio.to_thread(
                    docker_environment, spec, info.base_urls["openai"] if info is not None else None
                )
            config = _trial_config(spec, rid, info, environment, result.settings)
            trial_dir = Path(config.trials_dir) / config.trial_name
            result.trial_dir = str(trial_dir)
            trial_result = await _run_trial(config, progress, spec.sandboxes, rid)
    except TimeoutError:
        _fail(result, "timeout", f"the rollout exceeded its {hard_limit:g} s limit (in phase {result.phase})")
    except asyncio.CancelledError:
        # Turned into a result on purpose (a rollout never raises); the caller sees it as such.
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        _fail(result, "cancelled", f"cancelled in phase {result.phase}")
    except Exception as exc:  # a bug or a broken setup: classified, never raised
        kind = getattr(exc, "error_kind", None) or "internal"
        if kind == "internal":
            log.exception("rollout %s failed", rid)
        else:
            log.warning("rollout %s: %s: %s", rid, kind, exc)
        _fail(result, kind, str(exc) if kind != "internal" else f"{type(exc).__name__}: {exc}")
        if kind == "internal":
            findings.append(Finding.fatal("internal", traceback.format_exc(limit=3).strip()))
    finally:
        result.timings["total"] = time.monotonic() - started
    # Everything below is local bookkeeping plus shielded session calls: quick and bounded.
    try:
        await asyncio.shield(_finish(service, spec, result, trial_result, trial_dir, findings, uses_model))
    except asyncio.CancelledError:
        if result.error_kind is None:
            _fail(result, "cancelled", "cancelled while finishing")
    except Exception as exc:
        log.exception("rollout %s: finishing failed", rid)
        if result.error_kind is None:
            _fail(result, "internal", f"{type(exc).__name__}: {exc}")
    result.finished_at = time.time()
    progress.phase("done" if result.ok else "failed")
    return result


async def _install_agent_cli(harness: str, progress: _Progress) -> None:
    """An agent CLI tapdeck runs from its own install is installed on first use, each installer
    line published as the rollout's `detail` (the TUI's Runs table shows it)."""
    from tapdeck.runner import agent_install

    if harness not in agent_install.PACKAGES or agent_install.installed(harness) is not None:
        return
    progress.phase("install")
    loop = asyncio.get_running_loop()

    def show(line: str) -> None:
        progress.result.detail = line[:200]
        loop.call_soon_threadsafe(progress.publish)

    try:
        await asyncio.to_thread(agent_install.install, harness, on_progress=show)
    except agent_install.InstallError as exc:
        raise RolloutSetupError("agent_install_failed", f"{harness}: {exc}") from None
    finally:
        progress.result.detail = None


class RolloutSetupError(RuntimeError):
    """A rollout that could not be set up (unknown harness/sandbox...), with its error kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.error_kind = kind


def _fail(result: RolloutResult, kind: str, message: str) -> RolloutResult:
    if result.error_kind is None:
        result.error_kind = kind
        result.error = message
    result.ok = False
    return result


async def _open_session(service: CaptureServiceProtocol, spec: RolloutSpec, rid: str) -> SessionInfo:
    template = spec.rollout
    budget = template.call_budget or BUDGET_PER_TURN * (template.settings.max_turns or DEFAULT_MAX_TURNS)
    metadata = {
        "run_id": spec.run_id,
        "rollout_id": rid,
        "task": spec.task,
        "group": spec.group,
        "index": spec.index,
        "harness": template.harness,
        "sandbox": template.sandbox,
        "phase": "sandbox",
        **(template.metadata or {}),
    }
    try:
        return await service.open_session(
            SessionSpec(
                engine=spec.engine,
                metadata=metadata,
                call_budget=budget,
                rollout_type="auto",
                alternatives=template.alternatives,
                training_sampling=_session_sampling(spec),
                token_in=template.token_in,
                min_loss_mask_fraction=template.min_loss_mask_fraction,
            )
        )
    except Exception as exc:
        raise RolloutSetupError(
            "engine_unreachable" if "engine" in str(exc).lower() else "internal",
            f"could not open a capture session: {exc}",
        ) from exc


def _session_sampling(spec: RolloutSpec) -> dict[str, Any] | None:
    """The session's enforced policy: a trainer's, else the settings' temperature (if above 0)."""
    if spec.rollout.training_sampling is not None:
        return spec.rollout.training_sampling
    temperature = spec.rollout.settings.temperature
    return {"temperature": temperature} if temperature else None


def _resolve_settings(spec: RolloutSpec, info: SessionInfo | None) -> ResolvedSettings:
    """The settings in force, against the engine the session reported; refused before the trial."""
    try:
        return resolve(
            spec.rollout.settings,
            harness=spec.rollout.harness,
            engine_context=info.engine.max_model_len if info is not None else None,
            task_path=spec.task_path,
            hard_limit_s=spec.rollout.timeout_s,
            embedded=info is not None and is_embedded_engine(info.engine.system_fingerprint),
        )
    except SettingsDoNotFit as exc:
        raise RolloutSetupError("settings_do_not_fit", f"setting {exc}") from None


async def _engine_unreachable(url: str, spec: EngineSpec | None) -> str | None:
    """At the text tier, check the engine answers at all: a dead engine fails fast, before a sandbox boots."""
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec is not None and spec.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            await client.get(url.rstrip("/") + "/models", headers=headers)
    except httpx.HTTPError as exc:
        return f"engine {url} is unreachable ({type(exc).__name__}: {exc or 'no answer'})"
    return None


def environment_config(sandbox: str, kwargs: dict[str, Any] | None = None) -> Any:
    """Harbor's EnvironmentConfig for a sandbox name: `host`, a Harbor backend, or `module:Class`."""
    from tapdeck.runner.catalog import sandbox_environment_config

    try:
        return sandbox_environment_config(sandbox, **(kwargs or {}))
    except ValueError as exc:
        raise RolloutSetupError("bad_plan", str(exc)) from None


def loopback_port(proxy_url: str | None) -> int | None:
    """The proxy's port when it listens on this host's loopback (what a sandbox can relay in)."""
    parsed = urlsplit(proxy_url or "")
    if parsed.port and parsed.hostname and is_loopback(parsed.hostname):
        return parsed.port
    return None


def host_sandbox_kwargs(spec: RolloutSpec, proxy_url: str | None) -> dict[str, Any]:
    """Host sandbox kwargs: the proxy's loopback port carried into a trial cut off from the
    network, agent CLIs cut off by default (they need nothing but the proxy), and the data dir
    (the store, the admin key, every rollout's trial folder) out of the trial's view."""
    from tapdeck.runner.harnesses import Placement, get_harness

    kwargs = dict(spec.rollout.sandbox_kwargs or {})
    if spec.data_dir is not None and not _holds_agent_installs(spec, spec.data_dir):
        kwargs["hidden_paths"] = [*kwargs.get("hidden_paths", ()), str(spec.data_dir)]
    if (port := loopback_port(proxy_url)) is not None:
        kwargs.setdefault("loopback_ports", [port])
        if get_harness(spec.rollout.harness).placement is Placement.HOST_INSTALL:
            kwargs.setdefault("network", "none")
    return kwargs


def docker_environment(spec: RolloutSpec, proxy_url: str | None) -> Any:
    """Harbor's docker environment as tapdeck runs it (`sandboxes/docker_sandbox.py`): on the
    network the sandbox option `network` names (by default, an agent CLI's container has none but
    the relayed proxy port), the agent CLI's install mounted read-only; containers a dead tapdeck
    left are removed first."""
    from tapdeck.runner.harnesses import Placement, get_harness
    from tapdeck.runner.sandboxes import abandoned_containers, docker_sandbox

    abandoned_containers.remove_abandoned()
    kwargs = dict(spec.rollout.sandbox_kwargs or {})
    proxy_port = loopback_port(proxy_url)
    try:
        network = docker_sandbox.network_mode(
            str(kwargs.pop("network", "auto")),
            agent_in_container=get_harness(spec.rollout.harness).placement is Placement.HOST_INSTALL,
            proxy_port=proxy_port,
        )
    except ValueError as exc:
        raise RolloutSetupError("bad_plan", str(exc)) from None
    agents_dir = spec.rollout.settings.harness_kwargs.get("agents_dir")
    return docker_sandbox.environment_config(
        harness=spec.rollout.harness,
        network=network,
        proxy_port=proxy_port,
        kwargs=kwargs,
        agents_dir=Path(agents_dir) if agents_dir else None,
    )


def _holds_agent_installs(spec: RolloutSpec, folder: Path) -> bool:
    """Whether `folder` holds the agent CLI installs this rollout runs from (`TAPDECK_AGENTS_DIR`
    or the harness's `agents_dir` put there): hiding it would hide the agent from its trial."""
    from tapdeck.runner.agent_install import agents_dir
    from tapdeck.runner.harnesses import Placement, get_harness

    if get_harness(spec.rollout.harness).placement is not Placement.HOST_INSTALL:
        return False
    installs = Path(spec.rollout.settings.harness_kwargs.get("agents_dir") or agents_dir()).resolve()
    return installs.is_relative_to(folder.resolve())


def _preflight(environment: Any) -> None:
    """Harbor's own sandbox preflight (Trial never runs it); SystemExit → sandbox_failed."""
    factory = harbor_api.EnvironmentFactory  # a Harbor that fails to import is not the sandbox's fault
    try:
        factory.run_preflight(environment.type, environment.import_path)
    except SystemExit as exc:
        raise RolloutSetupError("sandbox_failed", f"sandbox preflight failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the preflight raises, the sandbox failed
        raise RolloutSetupError(
            "sandbox_failed", f"sandbox preflight failed: {type(exc).__name__}: {exc}"
        ) from None


def _trial_config(
    spec: RolloutSpec, rid: str, info: SessionInfo | None, environment: Any, settings: ResolvedSettings
) -> Any:
    """The Harbor TrialConfig: task, harness seam (pointed at the proxy), sandbox."""
    from tapdeck.runner.harnesses import RunDefaults, build_agent_config

    defaults = RunDefaults(
        context_tokens=settings.context_tokens,
        max_output_tokens=settings.max_output_tokens,
        max_turns=settings.max_turns,
        agent_timeout_s=settings.agent_timeout_s,
        tool_profile=settings.tool_profile,
        sampling=settings.sampling,
    )
    try:
        agent = build_agent_config(
            spec.rollout.harness,
            base_urls=info.base_urls if info else None,
            session_key=info.api_key if info else None,
            served_model=info.engine.model if info else None,
            defaults=defaults,
            agent_kwargs=settings.harness_kwargs,
        )
    except (KeyError, ValueError) as exc:
        raise RolloutSetupError("bad_plan", str(exc).strip("'\"")) from exc
    return harbor_api.TrialConfig(
        task=harbor_api.TrialTaskConfig(path=spec.task_path),
        trials_dir=spec.trials_dir,
        trial_name=spec.trial_name or rid,
        agent=agent,
        environment=environment,
    )


async def _run_trial(config: Any, progress: _Progress, sandboxes: LiveSandboxes | None, rid: str) -> Any:
    """Create and run the Harbor trial, mirroring its lifecycle into the rollout's phase; its
    sandbox is held in `sandboxes` from its agent's start to the trial's end."""
    events, trial_class = harbor_api.TrialEvent, harbor_api.Trial  # Harbor's import is not the task's
    try:
        trial = await trial_class.create(config)
    except Exception as exc:
        raise RolloutSetupError(
            "bad_task", f"Harbor could not load the trial: {type(exc).__name__}: {exc}"
        ) from exc
    if sandboxes is not None:

        async def hold(_event: Any) -> None:
            sandboxes.hold(rid, trial.agent_environment)

        # Before the phase hook: a rollout seen in its agent phase has its sandbox held.
        trial.add_hook(events.AGENT_START, hold)
    phases: dict[harbor_api.TrialEvent, Phase] = {
        events.ENVIRONMENT_START: "sandbox",
        events.AGENT_START: "agent",
        events.VERIFICATION_START: "verify",
    }
    for event, phase in phases.items():

        async def hook(_event: Any, phase: Phase = phase) -> None:
            progress.phase(phase)

        trial.add_hook(event, hook)
    try:
        return await trial.run()
    finally:
        if sandboxes is not None:
            sandboxes.release(rid)


async def _finish(
    service: CaptureServiceProtocol,
    spec: RolloutSpec,
    result: RolloutResult,
    trial_result: Any,
    trial_dir: Path | None,
    findings: list[Finding],
    uses_model: bool,
) -> None:
    """Reward, capture summary, ATIF, ok-ness; close the session."""
    if trial_result is not None:
        _read_trial(spec, result, trial_result, trial_dir, findings)
    elif trial_dir is not None:
        _read_timings(result, trial_dir)
    if result.session_id is not None:
        summary = await service.close_session(result.session_id)
        result.turns = summary.turns
        result.tier = str(summary.tier)
        result.rollout_type = summary.rollout_type
        # Built on a thread: a long rollout's document must not hold the loop other rollouts use.
        capture = await asyncio.to_thread(service.findings, result.session_id)
        document: dict[str, Any] | None = None
        if trial_dir is not None:
            document = await asyncio.to_thread(service.rollout_document, result.session_id)
            calls = captured_calls(document)
            report = reconcile_file(
                calls, trial_dir / "agent" / "trajectory.json", rollout_type=summary.rollout_type
            )
            result.atif = report.verdict
            findings.extend(report.findings)
            if report.auxiliary:
                # A closed session's graph is rebuilt from the store: on a thread, like the above.
                await asyncio.to_thread(
                    service.mark_auxiliary,
                    result.session_id,
                    report.auxiliary,
                    "not in the harness's ATIF trajectory",
                )
                summary = service.get(result.session_id)
        findings[:0] = capture
        down = next((f for f in capture if f.code == "engine_unreachable"), None)
        if down is not None and (
            result.error_kind in ENGINE_BLAMED or (result.error_kind is None and summary.turns == 0)
        ):
            # The agent failed (or made no captured call) because the engine could not answer; an
            # agent that recovered from a passing engine fault and finished keeps its own verdict.
            result.error_kind, result.error = (
                "engine_unreachable",
                (
                    f"the engine stopped answering during the rollout ({down.detail}); the agent "
                    f"then: {result.error or 'ended'}"
                )[:700],
            )
        if result.error_kind == "agent_failed" and document is not None:
            _blame_a_cut_reply(result, document)
        if result.error_kind == "agent_timeout":
            result.error = f"{result.error}{_timeout_advice(summary.turns)}"
        if result.error_kind is None:
            if uses_model and summary.turns == 0:
                _fail(result, "no_model_calls", "the harness made no model call through the proxy")
            elif summary.rollout_type == "train" and summary.trainable_tokens == 0:
                _fail(result, "no_trainable", "a train rollout with no trainable sequence")
    if result.error_kind is None and any(f.level is Level.FATAL for f in findings):
        first = next(f for f in findings if f.level is Level.FATAL)
        _fail(result, "capture_fatal", str(first))
    # The health grade is read from the result (a run's counts, trainers): never cut off.
    result.findings = findings[:MAX_FINDINGS] + [f for f in findings[MAX_FINDINGS:] if f.code == DEGENERATE]
    if len(findings) > MAX_FINDINGS:
        result.findings.append(
            Finding.info("findings_truncated", f"{len(findings) - MAX_FINDINGS} more in the session")
        )
    result.ok = result.error_kind is None
    if result.session_id is not None:
        with contextlib.suppress(Exception):
            service.annotate(
                result.session_id,
                phase="done" if result.ok else "failed",
                reward=result.reward,
                ok=result.ok,
                error_kind=result.error_kind,
            )


def _blame_a_cut_reply(result: RolloutResult, document: dict[str, Any]) -> None:
    """An agent that exited non-zero after its last reply was cut at an output limit: `output_cap`
    when a limit of tapdeck's cut an answer short (the rollout's setting, or the proxy's cap where
    the agent asked for more or for none), a failure of the settings; `model_output` when the model
    ran through the agent's own request, or through the embedded engine's runaway bound
    (`RUNAWAY_OUTPUT_TOKENS`), without ending its reply, a failure of the model."""
    agent = [t for t in document.get("turns") or [] if t.get("role") == "agent"]
    last = max(agent, key=lambda t: t["seq"], default=None)
    if (
        last is None
        or last.get("finish_reason") != "length"
        or not isinstance(sampled := last.get("sampled_len"), int)
    ):
        return
    sampling = last.get("sampling") or {}
    asked = (sampling.get("requested") or {}).get("max_tokens")
    sent = (sampling.get("submitted") or {}).get("max_tokens")
    settings, harness = result.settings, result.harness
    limit = settings.max_output_tokens if settings is not None else None
    model: str | None = None
    where = ""
    if settings is not None and limit is not None and sampled >= limit:
        if settings.max_output_source == "harness-default" and limit >= RUNAWAY_OUTPUT_TOKENS:
            model = (
                f"the model's reply ran to the embedded engine's {limit}-token bound "
                "without ending (the replies it ends come in a few hundred tokens)"
            )
        else:
            where = f"the {limit}-token output limit ({settings.max_output_source})"
    elif isinstance(sent, int) and sampled >= sent and (not isinstance(asked, int) or sent < asked):
        where = f"{sent} output tokens, the proxy's cap for this engine"
    elif isinstance(asked, int) and sampled >= asked:
        model = (
            f"the model's reply ran through the {asked} output tokens {harness} itself asked "
            "for without ending"
        )
    else:
        return  # cut short of any limit (the engine's context, say): the agent's failure
    if model is not None:
        result.error_kind, result.error = (
            "model_output",
            (f"{model}, and {harness} exits on a cut reply; the agent: {result.error}")[:700],
        )
    else:
        result.error_kind, result.error = (
            "output_cap",
            (
                f"{harness} exited on its reply cut at {where}, which it does not survive; "
                f"--max-output-tokens raises it; the agent: {result.error}"
            )[:700],
        )


def _timeout_advice(turns: int) -> str:
    """What an agent timeout's message adds: how far the agent got (no call back at all is an
    engine too slow for its first prompt) and the flag that raises the limit."""
    got = (
        "before any model call came back"
        if turns == 0
        else f"after {turns} model call{'s' if turns != 1 else ''}"
    )
    return f", {got}; --agent-timeout raises it"


def _read_timings(result: RolloutResult, trial_dir: Path) -> None:
    """Phase timings of a trial we cut short (Harbor still writes result.json when cancelled)."""
    try:
        trial = harbor_api.TrialResult.model_validate_json((trial_dir / "result.json").read_text())
    except (OSError, ValueError):
        return
    _copy_timings(result, trial)


def _copy_timings(result: RolloutResult, trial: Any) -> None:
    for name in ("environment_setup", "agent_setup", "agent_execution", "verifier"):
        seconds = _seconds(getattr(trial, name, None))
        if seconds is not None:
            result.timings[name] = seconds


def _read_trial(
    spec: RolloutSpec, result: RolloutResult, trial: Any, trial_dir: Path | None, findings: list[Finding]
) -> None:
    """Timings, reward and the classified exception from a TrialResult."""
    _copy_timings(result, trial)
    raw = trial.verifier_result.rewards if trial.verifier_result is not None else None
    exc = trial.exception_info
    recovered = False
    if raw is None and trial_dir is not None:
        raw, read_findings = read_reward_files(trial_dir / "verifier")
        findings.extend(read_findings)
        # Harbor drops a whole reward.json for one bad value; re-read, it is recovered per value.
        recovered = raw is not None and exc is not None and exc.exception_type == "VerifierOutputParseError"
    choice = choose_reward(raw, spec.rollout.reward_key)
    result.reward, result.rewards, result.reward_key = choice.reward, choice.rewards, choice.key
    findings.extend(choice.findings)
    if exc is not None and not (recovered and choice.reward is not None):
        phase = _failed_phase(trial)
        kind = classify_exception(exc.exception_type, phase)
        message = compose_failure(exc.exception_message) or (
            exc.exception_message.strip().splitlines()[0] if exc.exception_message.strip() else ""
        )
        _fail(result, kind, f"{exc.exception_type} during {phase}: {message}"[:500])
    elif exc is not None:
        findings.append(
            Finding.warn(
                "reward_recovered",
                f"Harbor refused the reward file ({exc.exception_type}); read value by value instead",
            )
        )
    if choice.error_kind is not None:
        _fail(result, choice.error_kind, choice.error or choice.error_kind)


def captured_calls(document: dict[str, Any]) -> list[CapturedCall]:
    """Agent-role calls of a rollout document, in arrival order (auxiliary and discarded ones out).

    Counts are the captured ids where the tier has them, else the engine's usage numbers.
    """
    calls = []
    for turn in sorted(document.get("turns") or [], key=lambda t: t["seq"]):
        if turn.get("role") != "agent":
            continue
        usage = (turn.get("meta") or {}).get("usage") or {}
        completion = turn.get("sampled_len")
        prompt = turn.get("prompt_len")
        calls.append(
            CapturedCall(
                seq=turn["seq"],
                completion_tokens=completion if completion is not None else usage.get("completion_tokens"),
                prompt_tokens=prompt if prompt is not None else usage.get("prompt_tokens"),
                synthetic=bool((turn.get("meta") or {}).get("synthetic")),
                truncated=turn.get("finish_reason") == "length",
            )
        )
    return calls
