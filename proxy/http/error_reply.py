"""Any `ProxyError` as its caller expects it: in the dialect a model call spoke, or the admin API's.

One place renders every error: the call pipeline (an error before or inside a stream), the lean
model route (an error that escapes the endpoint) and FastAPI's exception handler (admin and runner
routes, and any model-call path that reached FastAPI) all come here.

- OpenAI chat / Responses: `{"error": {"message", "type", "param", "code"}}`;
- Anthropic: `{"type": "error", "error": {"type", "message"}}`;
- Google: `{"error": {"code", "message", "status"}}`;
- admin API: `{"detail", "kind", "retryable"}` (`detail` as FastAPI writes it, so every client
  that reads FastAPI's errors reads these).

`x-should-retry` carries the retryable flag to the clients that honour it (the openai and
anthropic SDKs decide on it before the status).
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from tapdeck.proxy.dialects import detect
from tapdeck.proxy.dialects.base import Dialect, SSEEvent
from tapdeck.proxy.dialects.chat import DIALECT as CHAT
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.call_reply import CallReply
from tapdeck.proxy.http.token_counts import aux_dialect, match_aux

ADMIN_PREFIX = "/admin"


def retry_header(exc: ProxyError) -> dict[str, str]:
    """The headers that tell an SDK whether to retry (and, where known, when)."""
    headers = {"x-should-retry": "true" if exc.retryable else "false"}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return headers


def dialect_for_path(path: str) -> Dialect:
    """The dialect a model-call path speaks; chat-completions' envelope for a path of none."""
    aux_kind = match_aux("POST", path)
    return (aux_dialect(aux_kind) if aux_kind else detect(path)) or CHAT


def in_callers_terms(dialect: Dialect, exc: ProxyError) -> ProxyError:
    """`exc` naming the field the caller sent rather than the chat-completions one it became (a
    Google client never sent `tool_choice`)."""
    own = dialect.chat_field_names.get(exc.param or "")
    if own is None:
        return exc
    return ProxyError(
        exc.status,
        exc.message.replace(f"`{exc.param}`", f"`{own}`"),
        kind=exc.kind,
        retryable=exc.retryable,
        param=own,
        retry_after=exc.retry_after,
    )


def render_error(dialect: Dialect, exc: ProxyError) -> CallReply:
    """`exc` as `dialect`'s error body, for the call pipeline."""
    exc = in_callers_terms(dialect, exc)
    return CallReply(
        status=exc.status,
        body=dialect.error_body(exc.status, exc.message, exc.kind, exc.param),
        kind=exc.kind,
        headers=retry_header(exc),
    )


def render_stream_error(dialect: Dialect, exc: ProxyError) -> list[SSEEvent]:
    """`exc` as `dialect`'s in-stream error events (a stream that has started has no status)."""
    exc = in_callers_terms(dialect, exc)
    return list(dialect.stream_error(exc.status, exc.message, exc.kind))


def error_response(path: str, exc: ProxyError) -> Response:
    """`exc` as the HTTP response a request for `path` gets: the admin shape under `/admin`, else
    the error body of the dialect the path speaks."""
    if path.startswith(ADMIN_PREFIX):
        body = exc.admin_body()
    else:
        reply = render_error(dialect_for_path(path), exc)
        body = reply.body
    return JSONResponse(body, status_code=exc.status, headers=retry_header(exc))


__all__ = [
    "dialect_for_path",
    "error_response",
    "in_callers_terms",
    "render_error",
    "render_stream_error",
    "retry_header",
]
