"""Model calls go straight to their endpoint, ahead of every FastAPI and Starlette layer.

Profiled at 16 concurrent sessions (bench/proxy.py --profile), FastAPI spent about a fifth of the
proxy's CPU per model call before the endpoint ran: matching the path against every admin and
runner route (rebuilding each included router's route context), solving the endpoint's
dependencies and validating its parameters. Once past that, the layers FastAPI wraps around every
app still cost a few percent more per call: its telemetry check (a tracer-provider lookup per
request), its app-wide body-limit wrapper, the server-error and exception middlewares, and the
middleware stack the app's own `add_middleware` builds.

So the app itself (`ModelCallsFirst.__call__`) answers every POST outside `/admin` (the catch-all
model route) by calling that route's endpoint directly. The endpoint keeps the checks: the session
key before the body, the body cap while it is read, errors in the caller's dialect. Admin and
runner routes, and every other method, go through FastAPI as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.error_reply import error_response

Endpoint = Callable[[str, Request], Awaitable[Response]]


def is_model_call(scope: Scope) -> bool:
    """Whether a request is for the model-call route (a POST outside `/admin`)."""
    return scope["type"] == "http" and scope["method"] == "POST" and not scope["path"].startswith("/admin")


class ModelCallsFirst(FastAPI):
    """A FastAPI app that hands model calls to `model_call_endpoint(path, request)` before any of
    its own layers; everything else is FastAPI's."""

    model_call_endpoint: Endpoint | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.model_call_endpoint
        if endpoint is None or not is_model_call(scope):
            await super().__call__(scope, receive, send)
            return
        try:
            response = await endpoint(scope["path"][1:], Request(scope, receive))
        except ProxyError as exc:  # the endpoint answers its own; this catches what escapes it
            response = error_response(scope["path"], exc)
        await response(scope, receive, send)


__all__ = ["ModelCallsFirst", "is_model_call"]
