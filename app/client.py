"""Async HTTP/SSE client of the tapdeck server API (the only way the TUI talks to a server).

Embedded and attached modes are one code path: both give this client a base URL and an admin key.
Every failure surfaces as `ApiError` with a message a person can act on (never a raw traceback).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from tapdeck.proxy.config import (
    ADMIN_KEY_FILE,
    GIVEN_ADMIN_KEY,
    read_admin_key,
    unsendable_admin_key,
    usable_data_dir,
)
from tapdeck.schema.activity import SessionActivity
from tapdeck.schema.catalog import Catalog
from tapdeck.schema.events import Event, parse_event
from tapdeck.schema.replay import ReplayList, ReplayLogprobs, ReplayRequest, ReplayResult
from tapdeck.schema.runs import ExportResult, RolloutResult, RunDetail, RunList, RunPlan, RunSummary
from tapdeck.schema.sandbox import EXEC_TIMEOUT_S, AgentOutput, ExecReply, ProcessList
from tapdeck.schema.sessions import (
    EngineVersions,
    GraphView,
    Health,
    RolloutDocument,
    SessionDetail,
    SessionInfo,
    SessionList,
    SessionSummary,
    TrainingTrace,
    TurnDetail,
)
from tapdeck.schema.tls import CA_FILE_ENV, untrusted_certificate
from tapdeck.schema.train import (
    RecipeInfo,
    RecipeList,
    TrainEvent,
    TrainLog,
    TrainMetrics,
    TrainPlan,
    TrainRequest,
    TrainRunInfo,
    TrainRunList,
    parse_train_event,
)

M = TypeVar("M", bound=BaseModel)

REPLAY_TIMEOUT_S = 600.0
"""A replay waits on the reference scoring every chain (the server's own limit per request)."""


EXEC_REPLY_S = 15.0
"""How long past a sandbox command's own limit its reply may take (the server's grace, the wire)."""

CA_FILE_HELP = (
    "PEM certificates to trust for an https:// server: its private CA, or a self-signed "
    "server's own certificate (default: the public CAs)."
)
"""What `--ca-file` means, in every command that reaches a server it did not start."""


def admin_key_refusal(data_dir: Path, *, found: bool) -> str:
    """Why the admin key a command looked for in `data_dir` did not get it in: none found (naming
    every place such a command looks), or the server refused the one read from the file there."""
    path = data_dir / ADMIN_KEY_FILE
    if found:
        return f"the server rejected the admin key read from {path}; pass the server's key with --admin-key"
    return (
        f"no admin key found (looked at --admin-key, $TAPDECK_ADMIN_KEY and {path}); "
        "pass the server's key with --admin-key"
    )


def given_admin_key(key: str | None) -> str | None:
    """`key` as given by --admin-key or $TAPDECK_ADMIN_KEY (None when none was); ValueError (bad
    usage) when no request could carry it."""
    if key and (unsendable := unsendable_admin_key(key, GIVEN_ADMIN_KEY)):
        raise ValueError(unsendable)
    return key or None


def command_admin_key(given: str | None, data_dir: Path) -> str | None:
    """The admin key a command sends to a server it did not start: the one given, else the one in
    `<data_dir>/admin.key`, else None. ValueError (bad usage) naming where the key came from when
    it cannot be sent, the file when it cannot be read, or a `--data-dir` that is not a directory."""
    if key := given_admin_key(given):
        return key
    try:
        usable_data_dir(data_dir)
    except ValueError as exc:
        raise ValueError(f"--data-dir: {exc}") from None
    return read_admin_key(data_dir)


class ApiError(Exception):
    """A request to the tapdeck server failed; `str()` says what happened and what to do."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        url: str = "",
        kind: str = "error",
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.url = url
        self.kind = (
            kind  # "unreachable" | "untrusted" | "auth" | "not_found" | "rejected" | "server" | "bad_reply"
        )
        self.detail = detail
        """The server's own words in its error reply (one line); None when no tapdeck reply came."""

    def for_command(self, key_dir: Path | None, *, key_found: bool) -> str:
        """The line a command prints: a refused key says where it came from. `key_dir` is the data
        directory the key was read from or looked for in; None when it was given (--admin-key or
        $TAPDECK_ADMIN_KEY, which the client's own refusal names) or the command started the server."""
        if self.kind == "auth" and key_dir is not None:
            return admin_key_refusal(key_dir, found=key_found)
        return self.message


def _detail(response: httpx.Response) -> str | None:
    """The server's error text on one line: FastAPI's `detail` or an `error.message`; None when
    the body is not JSON."""
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict):
        detail = body.get("detail", body.get("error", body))
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        if isinstance(detail, list):  # pydantic validation errors
            detail = "; ".join(
                f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                for d in detail
            )
        body = detail
    return _one_line(str(body), DETAIL_LIMIT)


DETAIL_LIMIT = 1000
"""Where a tapdeck error's detail is cut: its own messages name paths and whole commands, which a
deep data directory makes long; a foreign body (an HTML page) is cut at FOREIGN_LIMIT."""
FOREIGN_LIMIT = 300


def _one_line(text: str, limit: int) -> str:
    """`text` with every run of whitespace (newlines included) as one space, cut at `limit`."""
    return " ".join(text.split())[:limit]


def _foreign_body(response: httpx.Response) -> str | None:
    """What an error reply's body is when a tapdeck server would not send it: an HTML page, or
    any non-JSON body but a 5xx's plain text (uvicorn's own "Internal Server Error"); else None."""
    text = _one_line(response.text, 80)
    if "html" in response.headers.get("content-type", "") or text.startswith("<"):
        return "an HTML page"
    if response.status_code < 500:
        return f"text that is not JSON ({text!r})" if text else "an empty body"
    return None


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg')}"


class TapdeckClient:
    """`TapdeckClient(base_url, admin_key)`: the admin API of one tapdeck server."""

    def __init__(
        self,
        base_url: str,
        admin_key: str | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 15.0,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """`verify`: what an https server's certificate is checked against (`server_trust`)."""
        self.base_url = base_url.rstrip("/")
        self.admin_key = admin_key
        """What a command this client starts needs to reach the same server (the TUI's shell)."""
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport, verify=verify
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ApiError(
                f"tapdeck server at {self.base_url} did not answer {method} {path} in "
                f"time ({type(exc).__name__}); is it overloaded?",
                url=url,
                kind="unreachable",
            ) from exc
        except httpx.TransportError as exc:
            self._refuse_untrusted(exc, url)
            raise ApiError(
                f"tapdeck server at {self.base_url} is not reachable ({exc or type(exc).__name__}); "
                "is it running?",
                url=url,
                kind="unreachable",
            ) from exc
        return self._check(method, path, response)

    def _refuse_untrusted(self, exc: httpx.TransportError, url: str) -> None:
        """Raise the ApiError for a server certificate this client does not trust (a retry, or
        waiting for the server, cannot help)."""
        if (why := untrusted_certificate(exc)) is not None:
            raise ApiError(
                f"the tapdeck server at {self.base_url} presented a certificate this client "
                f"does not trust ({why}); pass the CA that signed it, or the server's own "
                f"certificate, with --ca-file (or ${CA_FILE_ENV})",
                url=url,
                kind="untrusted",
            ) from exc

    def _check(self, method: str, path: str, response: httpx.Response) -> Any:
        url = str(response.request.url) if response.request else path
        if response.status_code == 401:
            raise ApiError(
                f"the server rejected the admin key {GIVEN_ADMIN_KEY} (401): pass the key "
                "from the server's <data-dir>/admin.key with --admin-key",
                status=401,
                url=url,
                kind="auth",
            )
        if response.status_code >= 400:
            self._refuse(method, path, response, url)
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                f"{method} {path}: the reply is not JSON; is {self.base_url} a tapdeck server?",
                status=response.status_code,
                url=url,
                kind="bad_reply",
            ) from exc

    def _refuse(self, method: str, path: str, response: httpx.Response, url: str) -> None:
        """Raise the ApiError for an error reply (other than 401); one line whatever its body."""
        status = response.status_code
        detail = _detail(response)
        if detail is None:
            if (foreign := _foreign_body(response)) is not None:
                # tapdeck's errors are JSON: something else answered at that address.
                raise ApiError(
                    f"{method} {path}: {self.base_url} answered {status} with {foreign}; "
                    "is it a tapdeck server?",
                    status=status,
                    url=url,
                    kind="bad_reply",
                )
            detail = _one_line(response.text, FOREIGN_LIMIT) or response.reason_phrase
        if status == 404:
            raise ApiError(
                f"{method} {path}: not found ({detail})", status=404, url=url, kind="not_found", detail=detail
            )
        if status < 500:
            raise ApiError(
                f"{method} {path} refused ({status}): {detail}",
                status=status,
                url=url,
                kind="rejected",
                detail=detail,
            )
        raise ApiError(
            f"server error on {method} {path} ({status}): {detail}",
            status=status,
            url=url,
            kind="server",
            detail=detail,
        )

    async def _model(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        """A request whose reply is validated into `model` (a reply that is not is `bad_reply`)."""
        body = await self._request(method, path, **kwargs)
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise ApiError(
                f"{method} {path}: the reply does not match tapdeck's API "
                f"({exc.error_count()} errors, first: {_first_error(exc)}); is the server "
                "the same version as this client?",
                url=f"{self.base_url}{path}",
                kind="bad_reply",
            ) from exc

    # -- routes ---------------------------------------------------------------------------------
    async def health(self) -> Health:
        """`GET /health`."""
        return await self._model(Health, "GET", "/health")

    async def catalog(self) -> Catalog:
        """`GET /admin/catalog`: what this server's machine can run, and why not.

        A server's first catalog imports Harbor and probes its engine: slow on a busy machine."""
        return await self._model(Catalog, "GET", "/admin/catalog", timeout=120.0)

    async def open_session(self, spec: dict[str, Any]) -> SessionInfo:
        """`POST /admin/sessions` with a session spec (engine, metadata, budget, ...)."""
        return await self._model(SessionInfo, "POST", "/admin/sessions", json=spec)

    async def sessions(self) -> list[SessionSummary]:
        """`GET /admin/sessions`, newest first."""
        return (await self._model(SessionList, "GET", "/admin/sessions")).sessions

    async def session(self, session_id: str) -> SessionDetail:
        """`GET /admin/sessions/{id}`: the summary and its findings."""
        return await self._model(SessionDetail, "GET", f"/admin/sessions/{session_id}")

    async def rollout(self, session_id: str) -> RolloutDocument:
        """`GET /admin/sessions/{id}/rollout`: the rollout document."""
        return await self._model(RolloutDocument, "GET", f"/admin/sessions/{session_id}/rollout")

    async def graph(self, session_id: str, since: int = 0) -> GraphView:
        """`GET /admin/sessions/{id}/graph?since=N`: turn headers from N on, links, stats."""
        return await self._model(
            GraphView, "GET", f"/admin/sessions/{session_id}/graph", params={"since": since}
        )

    async def trace(self, session_id: str) -> TrainingTrace:
        """`GET /admin/sessions/{id}/trace`: the per-call training trace (refused for eval)."""
        return await self._model(TrainingTrace, "GET", f"/admin/sessions/{session_id}/trace")

    async def turn(self, session_id: str, seq: int) -> TurnDetail:
        """`GET /admin/sessions/{id}/turns/{seq}`: one turn with tokens and logprobs."""
        return await self._model(TurnDetail, "GET", f"/admin/sessions/{session_id}/turns/{seq}")

    async def activity(self, session_id: str) -> SessionActivity:
        """`GET /admin/sessions/{id}/activity`: calls in flight and the last exchange."""
        return await self._model(SessionActivity, "GET", f"/admin/sessions/{session_id}/activity")

    async def close_session(self, session_id: str) -> SessionSummary:
        """`DELETE /admin/sessions/{id}`."""
        return await self._model(SessionSummary, "DELETE", f"/admin/sessions/{session_id}")

    async def engine_versions(self) -> EngineVersions:
        """`GET /admin/engines/version`: each engine's current policy version as the server knows it."""
        return await self._model(EngineVersions, "GET", "/admin/engines/version")

    async def runs(self) -> list[RunSummary]:
        """`GET /admin/runs`."""
        return (await self._model(RunList, "GET", "/admin/runs")).runs

    async def run(self, run_id: str) -> RunDetail:
        """`GET /admin/runs/{id}`: the summary and every rollout."""
        return await self._model(RunDetail, "GET", f"/admin/runs/{run_id}")

    async def start_run(self, plan: RunPlan) -> RunSummary:
        """`POST /admin/runs` with a RunPlan."""
        return await self._model(
            RunSummary, "POST", "/admin/runs", json=plan.model_dump(mode="json", exclude_unset=True)
        )

    async def cancel_run(self, run_id: str) -> RunSummary:
        """`POST /admin/runs/{id}/cancel`."""
        return await self._model(RunSummary, "POST", f"/admin/runs/{run_id}/cancel")

    async def cancel_rollout(self, run_id: str, rollout_id: str) -> RolloutResult:
        """`POST /admin/runs/{id}/rollouts/{rollout_id}/cancel`: end one rollout as cancelled."""
        return await self._model(RolloutResult, "POST", f"/admin/runs/{run_id}/rollouts/{rollout_id}/cancel")

    # -- inside a running rollout's sandbox -------------------------------------------------------

    async def exec_in_rollout(
        self, run_id: str, rollout_id: str, command: str, timeout_s: float = EXEC_TIMEOUT_S
    ) -> ExecReply:
        """`POST /admin/runs/{id}/rollouts/{rollout_id}/exec`: run a bash command line there."""
        return await self._model(
            ExecReply,
            "POST",
            f"/admin/runs/{run_id}/rollouts/{rollout_id}/exec",
            json={"command": command, "timeout_s": timeout_s},
            timeout=timeout_s + EXEC_REPLY_S,
        )

    async def rollout_processes(self, run_id: str, rollout_id: str) -> ProcessList:
        """`GET /admin/runs/{id}/rollouts/{rollout_id}/processes`."""
        return await self._model(
            ProcessList,
            "GET",
            f"/admin/runs/{run_id}/rollouts/{rollout_id}/processes",
            timeout=EXEC_REPLY_S * 2,
        )

    async def agent_output(self, run_id: str, rollout_id: str, tail_bytes: int = 16384) -> AgentOutput:
        """`GET /admin/runs/{id}/rollouts/{rollout_id}/agent-output`: the end of the agent's log."""
        return await self._model(
            AgentOutput,
            "GET",
            f"/admin/runs/{run_id}/rollouts/{rollout_id}/agent-output",
            params={"tail_bytes": tail_bytes},
        )

    async def resume_run(self, run_id: str) -> RunSummary:
        """`POST /admin/runs/{id}/resume`."""
        return await self._model(RunSummary, "POST", f"/admin/runs/{run_id}/resume")

    async def export_run(self, run_id: str, fmt: str = "jsonl") -> ExportResult:
        """`POST /admin/runs/{id}/export`: where the rows went (a path on the server's machine)."""
        return await self._model(
            ExportResult, "POST", f"/admin/runs/{run_id}/export", json={"format": fmt}, timeout=120.0
        )

    # -- replays ---------------------------------------------------------------------------------
    async def replay(self, session_id: str, request: ReplayRequest | None = None) -> ReplayResult:
        """`POST /admin/sessions/{id}/replay`: score the session under a reference engine (default:
        the server's embedded one). A long session on a CPU engine takes minutes."""
        body = (request or ReplayRequest()).model_dump(exclude_none=True)
        return await self._model(
            ReplayResult, "POST", f"/admin/sessions/{session_id}/replay", json=body, timeout=REPLAY_TIMEOUT_S
        )

    async def replays(self, session_id: str) -> list[ReplayResult]:
        """`GET /admin/sessions/{id}/replays`: the session's stored replays, oldest first."""
        return (await self._model(ReplayList, "GET", f"/admin/sessions/{session_id}/replays")).replays

    async def replay_logprobs(self, session_id: str, replay_id: str) -> ReplayLogprobs:
        """`GET /admin/sessions/{id}/replays/{replay_id}/logprobs`: both engines' per-token logprobs."""
        return await self._model(
            ReplayLogprobs, "GET", f"/admin/sessions/{session_id}/replays/{replay_id}/logprobs"
        )

    async def delete_replay(self, session_id: str, replay_id: str) -> list[ReplayResult]:
        """`DELETE /admin/sessions/{id}/replays/{replay_id}`: the replays left (the capture stays)."""
        path = f"/admin/sessions/{session_id}/replays/{replay_id}"
        return (await self._model(ReplayList, "DELETE", path)).replays

    # -- training ---------------------------------------------------------------------------------
    async def train_recipes(self) -> list[RecipeInfo]:
        """`GET /admin/train/recipes`: recipes and whether the server's machine can start each."""
        return (await self._model(RecipeList, "GET", "/admin/train/recipes", timeout=60.0)).recipes

    async def start_train(
        self, recipe: str, *, run: str | None = None, args: list[str] | None = None
    ) -> TrainRunInfo:
        """`POST /admin/train`: launch a recipe on the server's machine."""
        body = TrainRequest(recipe=recipe, run=run, args=list(args or [])).model_dump()
        return await self._model(TrainRunInfo, "POST", "/admin/train", json=body, timeout=120.0)

    async def train_plan(
        self, recipe: str, *, run: str | None = None, args: list[str] | None = None
    ) -> TrainPlan:
        """`POST /admin/train/plan`: what a launch would run, and on which GPUs; starts nothing."""
        body = TrainRequest(recipe=recipe, run=run, args=list(args or [])).model_dump()
        return await self._model(TrainPlan, "POST", "/admin/train/plan", json=body, timeout=120.0)

    async def train_runs(self) -> list[TrainRunInfo]:
        """`GET /admin/train`: the server's training runs, newest first."""
        return (await self._model(TrainRunList, "GET", "/admin/train")).runs

    async def train_run(self, run_id: str) -> TrainRunInfo:
        """`GET /admin/train/{id}`."""
        return await self._model(TrainRunInfo, "GET", f"/admin/train/{run_id}")

    async def train_log(self, run_id: str, *, offset: int | None = None, tail: int = 200) -> TrainLog:
        """`GET /admin/train/{id}/log`: lines after a byte offset, or the last `tail` lines."""
        params: dict[str, int] = {"tail": tail}
        if offset is not None:
            params["offset"] = offset
        return await self._model(TrainLog, "GET", f"/admin/train/{run_id}/log", params=params)

    async def train_metrics(self, run_id: str, after: int = 0) -> TrainMetrics:
        """`GET /admin/train/{id}/metrics`: trackio scalars after a cursor."""
        return await self._model(
            TrainMetrics, "GET", f"/admin/train/{run_id}/metrics", params={"after": after}
        )

    async def stop_train(self, run_id: str) -> TrainRunInfo:
        """`POST /admin/train/{id}/stop`: SIGTERM, then SIGKILL, the recipe's process group."""
        return await self._model(TrainRunInfo, "POST", f"/admin/train/{run_id}/stop", timeout=60.0)

    async def train_events(self, run_id: str) -> AsyncIterator[TrainEvent]:
        """Follow `GET /admin/train/{id}/events` (SSE: log, metrics, state) until the run ends."""
        async for data in self._sse(f"/admin/train/{run_id}/events"):
            event = parse_train_event(data)
            if event is not None:
                yield event

    async def events(self) -> AsyncIterator[Event]:
        """Follow `GET /admin/events` (SSE); ends when the server does. Event types this client
        does not know are skipped."""
        async for data in self._sse("/admin/events"):
            try:
                event = parse_event(data)
            except ValidationError as exc:
                raise ApiError(
                    f"an event from {self.base_url} does not match tapdeck's API ({_first_error(exc)})",
                    url=f"{self.base_url}/admin/events",
                    kind="bad_reply",
                ) from exc
            if event is not None:
                yield event

    async def _sse(self, path: str) -> AsyncIterator[dict]:
        timeout = httpx.Timeout(10.0, read=None)
        try:
            async with self._http.stream(
                "GET", path, timeout=timeout, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._check("GET", path, response)
                data: list[str] = []
                async for line in response.aiter_lines():
                    if not line:
                        if data:
                            payload = "\n".join(data)
                            data = []
                            try:
                                event = json.loads(payload)
                            except ValueError:
                                continue
                            if isinstance(event, dict):
                                yield event
                        continue
                    if line.startswith(":"):
                        continue  # keep-alive comment
                    field, _, value = line.partition(":")
                    if field == "data":
                        data.append(value[1:] if value.startswith(" ") else value)
        except httpx.TransportError as exc:
            self._refuse_untrusted(exc, f"{self.base_url}{path}")
            raise ApiError(
                f"lost the event stream of {self.base_url} ({exc or type(exc).__name__})",
                url=f"{self.base_url}{path}",
                kind="unreachable",
            ) from exc
