"""The proxy's one error family: what went wrong, for whom, and whether trying again can help.

Every error the proxy answers a caller with derives from `ProxyError`; `proxy/http/error_reply.py`
renders any of them in the caller's dialect (or the admin API's shape), in one place.
"""

from __future__ import annotations

from typing import Any

RETRYABLE_STATUS = frozenset({408, 429, 499, 500, 502, 503, 504})
"""Statuses where the same request may succeed later (the engine or store comes back, the
client reconnects); the rest are refusals of the request itself."""

_KIND_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "unavailable",
}


def kind_for_status(status: int) -> str:
    """The kind an error without a more precise one gets from its status."""
    return _KIND_BY_STATUS.get(status, "api_error")


class ProxyError(Exception):
    """An error the proxy answers with: `status` (HTTP), `kind` (machine-readable), `message`
    (what happened and what to do, for a person), and whether a retry can succeed."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str | None = None,
        retryable: bool | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or kind_for_status(status)
        self.retryable = status in RETRYABLE_STATUS if retryable is None else retryable
        self.param = param
        """The request field at fault, where the dialect's error shape has a place for it."""
        self.retry_after = retry_after
        """Seconds after which a retry may succeed (sent as `Retry-After`), where that is known."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.kind!r}, {self.message!r})"

    def admin_body(self) -> dict[str, Any]:
        """This error in the admin API's shape: `{"detail", "kind", "retryable"}`."""
        return {"detail": self.message, "kind": self.kind, "retryable": self.retryable}


class DialectError(ProxyError):
    """A request the proxy refuses to translate or send (a field of the wrong shape, `n > 1`, a
    sampling knob a training session forbids); rendered in the caller's own error envelope."""

    def __init__(
        self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(status, message, kind=kind, param=param)


__all__ = ["RETRYABLE_STATUS", "DialectError", "ProxyError", "kind_for_status"]
