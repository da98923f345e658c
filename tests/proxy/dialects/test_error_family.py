"""One error of each kind of the proxy's error family, through each dialect, as each real SDK
raises it: the SDK's typed error for the status, carrying the proxy's message, and the
`x-should-retry` flag (what the openai and anthropic SDKs decide a retry on) set from the error.

Kinds: a request the dialect refuses (DialectError, 400), an unknown session key (401), an engine
that cannot be reached (EngineError, 502) and a store that cannot write (StoreUnavailable, 503).
The admin API renders the same family in its own shape, and the lean model route renders an error
escaping its endpoint in the path's dialect.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types

from tapdeck.proxy.errors import DialectError
from tapdeck.proxy.http.model_route import ModelCallsFirst
from tapdeck.proxy.http.uvicorn_thread import STOPPING_MESSAGE
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.agent_recordings import google_client
from tests.support.capture_server import SCRIPTED_KEEPALIVE_S, CaptureServer, capture_server
from tests.support.fake_vllm import FakeVllm, hanging_engine, models_only_engine

DIALECTS = ["chat", "responses", "anthropic", "google"]


def _openai(info: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)


def _anthropic(info: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )


def _call(dialect: str, info: dict[str, Any], *, refused: bool = False) -> None:
    """One non-streaming call through the dialect's SDK; `refused` makes it one the dialect
    refuses to translate (a second completion, an empty conversation, an unknown role)."""
    if dialect == "chat":
        _openai(info).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8, n=2 if refused else 1
        )
    elif dialect == "responses":
        _openai(info).responses.create(
            model="m", max_output_tokens=16, input=[{"role": "robot" if refused else "user", "content": "hi"}]
        )
    elif dialect == "anthropic":
        _anthropic(info).messages.create(
            model="claude-x", max_tokens=8, messages=[] if refused else [{"role": "user", "content": "hi"}]
        )
    else:
        client = google_client(info)  # held: a collected Client closes its connection pool
        client.models.generate_content(
            model="g",
            contents="hi",
            config=types.GenerateContentConfig(max_output_tokens=8, candidate_count=2 if refused else 1),
        )


REFUSAL = {
    "chat": "n=2 is not supported",
    "responses": "'robot' is not one of",
    "anthropic": "a non-empty list of messages is required",
    "google": "candidateCount > 1 is not supported",
}


def _raised(dialect: str, info: dict[str, Any], **kwargs: Any) -> tuple[int, str, str | None]:
    """What the SDK raised: (status, message it carries, x-should-retry)."""
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError, genai_errors.APIError)) as err:
        _call(dialect, info, **kwargs)
    exc = err.value
    if isinstance(exc, genai_errors.APIError):
        return exc.code, exc.message or "", exc.response.headers.get("x-should-retry")
    return exc.status_code, str(exc), exc.response.headers.get("x-should-retry")


def _sdk_class_for(dialect: str, status: int) -> type[BaseException]:
    """The typed error each SDK raises for `status` (what an agent's own handling keys on)."""
    if dialect == "google":
        return genai_errors.ClientError if status < 500 else genai_errors.ServerError
    sdk = openai if dialect in ("chat", "responses") else anthropic
    return {
        400: sdk.BadRequestError,
        401: sdk.AuthenticationError,
        502: sdk.InternalServerError,
        503: sdk.InternalServerError,
    }[status]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_refused_request_is_a_400_each_sdk_raises_with_the_reason(
    capture: CaptureServer, dialect: str
) -> None:
    status, message, retry = _raised(dialect, capture.open_session(), refused=True)
    assert (status, retry) == (400, "false")
    assert REFUSAL[dialect] in message


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_unknown_session_key_is_a_401_each_sdk_raises_as_authentication(
    capture: CaptureServer, dialect: str
) -> None:
    info = {**capture.open_session(), "api_key": "tdk-" + "x" * 43}
    with pytest.raises(_sdk_class_for(dialect, 401)):
        _call(dialect, info)
    status, message, retry = _raised(dialect, info)
    assert (status, retry) == (401, "false")
    assert "unknown or closed session key" in message


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_unreachable_engine_is_a_retryable_502_naming_the_engine(
    capture: CaptureServer, dialect: str
) -> None:
    with models_only_engine() as engine:  # settles the address, then is gone
        reply = capture.admin.post("/admin/sessions", json={"engine": {"url": engine, "model": "m"}})
    reply.raise_for_status()
    info = reply.json()
    with pytest.raises(_sdk_class_for(dialect, 502)):
        _call(dialect, info)
    status, message, retry = _raised(dialect, info)
    assert (status, retry) == (502, "true")
    assert f"engine at {engine}/v1 is unreachable" in message


@contextlib.contextmanager
def _store_read_only(capture: CaptureServer) -> Iterator[None]:
    """The store's writer refuses every write (SQLITE_READONLY) inside the block."""
    assert capture.store is not None
    db = capture.store._db
    db.execute("PRAGMA query_only=1")
    try:
        yield
    finally:
        db.execute("PRAGMA query_only=0")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_store_that_cannot_write_is_a_retryable_503_saying_nothing_was_kept(
    capture: CaptureServer, upstream: FakeVllm, dialect: str
) -> None:
    info = capture.open_session()
    with _store_read_only(capture):
        with pytest.raises(_sdk_class_for(dialect, 503)):
            _call(dialect, info)
        status, message, retry = _raised(dialect, info)
    assert (status, retry) == (503, "true")
    assert "nothing of it was kept" in message and "SQLITE_READONLY" in message
    _call(dialect, info)  # the fault lifted, the next call is captured
    assert capture.summary(info["id"])["turns"] == 1


@pytest.mark.medium
def test_a_call_cut_short_by_the_server_stopping_is_a_503_in_each_callers_own_envelope(
    tmp_path: Path,
) -> None:
    """A call still waiting on the engine when the server stops is cancelled after uvicorn's grace
    period and answered 503. It was chat-shaped for every dialect: google-genai raised it with no
    status (`503 None`) and the anthropic SDK with an error type no Anthropic client knows."""
    raised: dict[str, Exception] = {}
    with hanging_engine() as engine:
        with capture_server(
            EngineSpec(url=engine.base_url), tmp_path, keepalive_s=SCRIPTED_KEEPALIVE_S
        ) as capture:
            info = capture.open_session()

            def call(dialect: str) -> None:
                try:
                    _call(dialect, info)
                except Exception as exc:  # noqa: BLE001 - what each SDK raised is what the test reads
                    raised[dialect] = exc

            callers = [threading.Thread(target=call, args=(d,)) for d in DIALECTS]
            for caller in callers:
                caller.start()
            deadline = time.monotonic() + 60
            while engine.held < len(DIALECTS):
                assert time.monotonic() < deadline, f"only {engine.held} calls reached the engine"
                time.sleep(0.05)
        for caller in callers:  # leaving capture_server stopped the server under the held calls
            caller.join(60)
    for dialect in DIALECTS:
        assert isinstance(raised.get(dialect), _sdk_class_for(dialect, 503)), raised
    google = raised["google"]
    assert (google.code, google.status, google.message) == (503, "UNAVAILABLE", STOPPING_MESSAGE)
    claude = raised["anthropic"]
    assert claude.body["type"] == "error"
    assert (claude.type, claude.api_message) == ("overloaded_error", STOPPING_MESSAGE)
    for dialect in ("chat", "responses"):
        exc = raised[dialect]
        assert (exc.type, exc.body["message"]) == ("server_stopping", STOPPING_MESSAGE)
        assert exc.response.headers["x-should-retry"] == "true"


def test_admin_errors_carry_their_kind_and_whether_a_retry_can_help(capture: CaptureServer) -> None:
    missing = capture.admin.get("/admin/sessions/s-0000000000000000")
    assert missing.status_code == 404
    assert missing.json() == {
        "detail": "no session s-0000000000000000",
        "kind": "not_found_error",
        "retryable": False,
    }
    session = capture.admin.post("/admin/sessions", json={"rollout_type": "eval"}).json()
    refused = capture.admin.get(f"/admin/sessions/{session['id']}/trace")
    assert refused.status_code == 409
    body = refused.json()
    assert (body["kind"], body["retryable"]) == ("export_refused", False)
    assert "eval rollout" in body["detail"]


def _escaping_app(error: Callable[[], Exception]) -> ModelCallsFirst:
    async def endpoint(path: str, request: Any) -> Any:
        raise error()

    app = ModelCallsFirst()
    app.model_call_endpoint = endpoint
    return app


@pytest.mark.parametrize(
    "path, shape",
    [
        ("/v1/chat/completions", lambda b: b["error"]["param"] == "messages"),
        ("/v1/messages", lambda b: b["type"] == "error" and b["error"]["type"] == "invalid_request_error"),
        ("/v1beta/models/g:generateContent", lambda b: b["error"]["status"] == "INVALID_ARGUMENT"),
    ],
    ids=["chat", "anthropic", "google"],
)
async def test_an_error_escaping_the_model_route_is_rendered_in_the_paths_dialect(
    path: str, shape: Callable[[dict[str, Any]], bool]
) -> None:
    app = _escaping_app(lambda: DialectError(400, "messages: no", param="messages"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        reply = await client.post(path, json={})
    assert reply.status_code == 400 and reply.headers["x-should-retry"] == "false"
    assert shape(reply.json()) and "messages: no" in reply.text
