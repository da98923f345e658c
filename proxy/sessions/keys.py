"""Session keys: the API key a harness sends, and the public id that names its session.

A session key is an unguessable random token with a fixed, checked charset; it is never stored or
logged (the store keeps only the public session id).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping

KEY_PREFIX = "tdk-"
_KEY_RE = re.compile(r"^tdk-[A-Za-z0-9_-]{43}$")


def new_session_key() -> str:
    """A fresh session key: `tdk-` + 32 random bytes, URL-safe base64 (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_session_id() -> str:
    """A fresh public session id (not a secret: it appears in events, logs and exports)."""
    return "s-" + secrets.token_hex(8)


def is_session_key(value: str) -> bool:
    """Charset and length check: anything else is never looked up."""
    return bool(_KEY_RE.fullmatch(value))


def key_from_request(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The API key a harness sent: `Authorization: Bearer`, `x-api-key`, `x-goog-api-key`, `?key=`.

    `headers` must be case-insensitive (Starlette's are). Returns the first present value; whether it
    names a session is for the caller to check.
    """
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    for name in ("x-api-key", "x-goog-api-key"):
        value = headers.get(name)
        if value and value.strip():
            return value.strip()
    value = query.get("key")
    return value.strip() if value and value.strip() else None
