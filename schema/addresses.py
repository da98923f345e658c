"""Addresses a client gives the server (a public URL sandboxes reach it at), checked one way."""

from __future__ import annotations

import re
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
    if why := bad_host(parsed.hostname):
        raise ValueError(f"public URL {url!r}: {why}")
    return url.strip().rstrip("/")


def out_of_range_port(url: str) -> str | None:
    """The port written in `url` (scheme optional) when it is a number outside 1-65535, else None."""
    try:
        netloc = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}").netloc
    except ValueError:  # a broken IPv6 literal: not a URL at all, which the caller says
        return None
    host_port = netloc.rpartition("@")[2]
    port = host_port.rpartition("]")[2] if host_port.startswith("[") else host_port
    _, colon, text = port.rpartition(":")
    if colon and re.fullmatch(r"[+-]?\d+", text) and not 1 <= int(text) <= 65535:
        return text
    return None


_HOST = re.compile(r"[\w.-]+|[0-9A-Fa-f:.]+(%[\w.-]+)?")
"""A host name (IDN letters allowed) or an IPv6 literal without its brackets (a zone id allowed)."""


def bad_host(host: str) -> str | None:
    """Why `host` (a URL's host part) cannot name a machine, e.g. it has a space; None when it can."""
    return None if _HOST.fullmatch(host) else f"host {host!r} is not a host name or IP address"


def http_base_url(text: str, what: str) -> str:
    """`text` as an http(s) base URL without a trailing slash, `http://` added when it names no
    scheme. Raises ValueError naming `what` when it is not one (another scheme, no host, a port
    out of range)."""
    raw = text.strip()
    if (port := out_of_range_port(raw)) is not None:
        raise ValueError(f"{what} {text!r}: port {port} is out of range (1-65535)")
    url = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        host = parts.hostname or ""
        ok = parts.scheme.lower() in ("http", "https") and bool(host)
    except ValueError:  # a broken IPv6 literal, a port that is not a number
        ok = False
    if ok and (why := bad_host(host)):
        raise ValueError(f"{what} {text!r}: {why}")
    if not ok:
        raise ValueError(
            f"{what} {text!r} is not an http(s) URL; write it as HOST:PORT or http(s)://HOST:PORT"
        )
    return url.rstrip("/")
