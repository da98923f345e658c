"""Model calls go straight to their endpoint, past FastAPI's routing and dependency solving.

Profiled at 16 concurrent sessions (bench/proxy.py --profile), FastAPI spent about a fifth of the
proxy's CPU per model call before the endpoint ran: matching the path against every admin and
runner route (rebuilding each included router's route context), solving the endpoint's
dependencies and validating its parameters. Every POST outside `/admin` is a model call (the
catch-all route), so this middleware hands those to the same endpoint function directly; admin
and runner routes, and every other method, still go through FastAPI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class DirectModelCalls:
    """ASGI middleware: `POST` outside `/admin` → `endpoint(path, request)`, answered as it returns."""

    def __init__(self, app: ASGIApp, *,
                 endpoint: Callable[[str, Request], Awaitable[Response]]) -> None:
        self.app = app
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].startswith("/admin"):
            await self.app(scope, receive, send)
            return
        response = await self.endpoint(scope["path"][1:], Request(scope, receive))
        await response(scope, receive, send)


__all__ = ["DirectModelCalls"]
