"""Addresses a client gives the server (a public URL sandboxes reach it at), checked one way."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_public_url(url: str) -> str:
    """`url` without a trailing slash, if it is an absolute http(s) URL with a host and no query.

    Raises ValueError saying what is wrong otherwise.
    """
    parsed = urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"public URL {url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
    if parsed.query or parsed.fragment:
        raise ValueError(f"public URL {url!r} must not have a query or fragment")
    return url.strip().rstrip("/")
