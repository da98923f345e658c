"""Any error a TUI worker raised as the one line a person can act on (the CLI's own failure lines
are app/failures.py's)."""

from __future__ import annotations

import httpx

from tapdeck.app.client import ApiError


def describe_error(error: BaseException) -> str:
    """A line a person can act on, for any error a worker raised: the server's own message when it
    refused a request, else a plain sentence. Request paths, status codes and transport details
    are left to the log."""
    if not isinstance(error, ApiError):
        if isinstance(error, (OSError, TimeoutError)):
            return f"{type(error).__name__}: {error}"
        return f"unexpected {type(error).__name__}: {error}"
    words = error.detail
    if error.kind == "server" and (error.status == 500 or not words):
        return f"the server failed: {words}" if words else "the server failed; its log says why"
    if error.kind == "not_found" and words in (None, "Not Found"):  # FastAPI's, for no such route
        return "this server does not offer that: is it the same tapdeck version as this TUI?"
    if words:
        return words
    if error.kind == "rejected":
        return "the server refused that without saying why"
    if isinstance(error.__cause__, httpx.TimeoutException):
        return "the tapdeck server did not answer in time; is it overloaded?"
    if isinstance(error.__cause__, httpx.TransportError):
        return "the tapdeck server is not reachable; is it running?"
    if error.kind == "auth":
        return (
            "the server rejected the admin key: pass the key from the server's "
            "<data-dir>/admin.key with --admin-key"
        )
    if error.kind == "bad_reply":
        return "the server's reply is not tapdeck's: is it a tapdeck server of the same version?"
    return error.message  # raised by the TUI itself, in words already (a closed event stream)
