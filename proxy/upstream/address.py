"""Engine addresses as operators write them, settled to the one base URL the proxy talks to.

vLLM users write an engine as `HOST:PORT`, `http://HOST:PORT` or `http://HOST:PORT/v1` (http or
https, with or without a trailing slash). An address without a path is ambiguous: vLLM serves the
OpenAI routes under `/v1`, a few OpenAI-compatible servers at the root. So such an address is asked
`GET <candidate>/models` at `/v1`, then at the root, and settles on the first that answers with a
model listing; an address that names a path is asked only there. Taking the bare address as the
base URL would open sessions at the `text` tier whose every call then fails with a 404.

Where nothing answers, the error is one line naming every URL tried and what each answered. It is
an `EngineNotUpYet` when some candidate failed as a starting engine fails (see `not_up_yet`): a
server started beside its engine waits for it (proxy/upstream/default_engine.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from tapdeck.proxy.errors import ProxyError
from tapdeck.schema.addresses import bad_host, out_of_range_port

SETTLE_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
"""A wrong host or port fails at connect; a busy engine may take a while to list its models."""


class EngineAddressError(ProxyError, ValueError):
    """An address that is not an http(s) URL (`status` 400), or where no engine answered (502)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(
            status, message, kind="invalid_request_error" if status == 400 else "engine_unreachable"
        )


class EngineNotUpYet(EngineAddressError):
    """No candidate answered with a listing, and at least one failed as an engine that is still
    starting does: it may answer later, where any other failure is an answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 502)


def not_up_yet(answer: httpx.Response | httpx.HTTPError) -> bool:
    """Whether a failed `GET …/models` is what an engine that is still starting answers.

    vLLM's api_server binds its port before it builds the engine but listens only once the weights
    are loaded and the CUDA graphs captured (`setup_server` then `build_and_serve`), so meanwhile a
    connect is refused; a slow or half-started one times out; a gateway in front of it (or vLLM
    while it scales) answers 503. A name that does not resolve, any other status, or a 200 that is
    not a listing is an answer: waiting cannot change it."""
    if isinstance(answer, httpx.Response):
        return answer.status_code == 503
    if isinstance(answer, httpx.TimeoutException):
        return True
    cause: BaseException | None = answer
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


@dataclass(frozen=True)
class SettledEngine:
    """Where an engine address led: the base URL (ending where `/models` and `/chat/completions`
    hang off) and the model listing it answered."""

    address: str
    base_url: str
    listing: dict[str, Any]

    def model_ids(self) -> list[str]:
        """The ids of the served models, in the engine's order."""
        return [str(m["id"]) for m in self.listing.get("data") or [] if isinstance(m, dict) and m.get("id")]

    def require_model(self, model: str | None) -> None:
        """Refuse (EngineAddressError 400) a model name this engine does not serve, naming the
        ones it does: calls for an unknown model fail only later, one by one, as text-tier 502s."""
        served = self.model_ids()
        if model is None or model in served:
            return
        raise EngineAddressError(
            f"the engine at {shown_url(self.base_url)} does not serve model "
            f"{model!r}; it serves {', '.join(served) or 'no model'} "
            "(--engine-model)",
            400,
        )


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:key|api[_-]?key|token|access_token|sig|signature)=)[^&#\s]*")


def shown_url(text: str) -> str:
    """`text` with any URL's credentials (`user:password@`, `?key=...`) replaced by `***`: what
    error messages and logs may show of an engine address."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def normalize_address(address: str) -> str:
    """`scheme://host[:port][/path]` without a trailing slash; `http://` when no scheme is given.

    Purely syntactic (no request). Raises EngineAddressError(400) for anything but http(s), and
    for a host no machine can have (a space in it, say).
    """
    text = address.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        host = parts.hostname if parts.port is None or parts.port > 0 else None
        url = urlunsplit((parts.scheme.lower(), parts.netloc, parts.path.rstrip("/"), "", ""))
        httpx.URL(url)  # what the client itself would refuse
    except (ValueError, httpx.InvalidURL):  # a port that is not a number, a broken IPv6 literal...
        host = url = None
    if (port := out_of_range_port(text)) is not None:
        raise EngineAddressError(
            f"engine address {shown_url(address)!r}: port {port} is out of range (1-65535)", 400
        )
    if url is None or not host or not url.startswith(("http://", "https://")):
        raise EngineAddressError(
            f"engine address {shown_url(address)!r} is not an http(s) URL; write it as "
            "HOST:PORT, http://HOST:PORT or http://HOST:PORT/v1",
            400,
        )
    if why := bad_host(host):
        raise EngineAddressError(f"engine address {shown_url(address)!r}: {why}", 400)
    return url


def candidate_base_urls(address: str) -> list[str]:
    """The base URLs an address may mean, in the order they are asked."""
    base = normalize_address(address)
    if urlsplit(base).path:
        return [base]
    return [f"{base}/v1", base]


def settle_blocking(
    address: str, *, api_key: str | None = None, timeout: httpx.Timeout | float = SETTLE_TIMEOUT
) -> SettledEngine:
    """`settle` without an event loop (for a server starting up). Raises EngineAddressError."""
    attempts = _Attempts(address)
    with httpx.Client(timeout=timeout, headers=_headers(api_key)) as http:
        for url in attempts:
            try:
                attempts.send(http.get(url))
            except httpx.HTTPError as exc:
                attempts.send(exc)
    return attempts.result


async def settle(
    address: str, *, api_key: str | None = None, timeout: httpx.Timeout | float = SETTLE_TIMEOUT
) -> SettledEngine:
    """The base URL an engine address means: the first candidate whose `GET …/models` answers with
    a model listing. Raises EngineAddressError: 400 for an address that is not a URL, 502 (one line
    naming every URL tried and its answer) when no candidate answers."""
    attempts = _Attempts(address)
    async with httpx.AsyncClient(timeout=timeout, headers=_headers(api_key)) as http:
        for url in attempts:
            try:
                attempts.send(await http.get(url))
            except httpx.HTTPError as exc:
                attempts.send(exc)
    return attempts.result


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class _Attempts:
    """The listing URLs to ask, in order, and the verdict on each answer; one loop for the blocking
    and the async client. Iterating yields the next URL until one answers with a listing."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.bases = candidate_base_urls(address)
        self.tried: list[str] = []
        self.starting = False
        """Whether some candidate failed as a starting engine fails (`not_up_yet`)."""
        self._current = ""
        self._settled: SettledEngine | None = None

    def __iter__(self) -> Iterator[str]:
        for base in self.bases:
            if self._settled is not None:
                return
            self._current = base
            yield f"{base}/models"

    def send(self, answer: httpx.Response | httpx.HTTPError) -> None:
        url = f"{self._current}/models"
        self.starting = self.starting or not_up_yet(answer)
        if isinstance(answer, httpx.HTTPError):
            self.tried.append(f"{url} ({_describe(answer)})")
            return
        listing = _listing(answer)
        if listing is None:
            self.tried.append(f"{url} ({_describe_reply(answer)})")
            return
        self._settled = SettledEngine(self.address, self._current, listing)

    @property
    def result(self) -> SettledEngine:
        if self._settled is None:
            line = shown_url(
                f"no engine answered at {self.address.strip()!r}: tried GET " + ", GET ".join(self.tried)
            )
            raise EngineNotUpYet(line) if self.starting else EngineAddressError(line, 502)
        return self._settled


def _listing(reply: httpx.Response) -> dict[str, Any] | None:
    """The body of an OpenAI model listing, or None when the reply is not one."""
    if reply.status_code != 200:
        return None
    try:
        body = reply.json()
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        return body
    return None


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer: {type(exc).__name__}"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _describe_reply(reply: httpx.Response) -> str:
    if reply.status_code in (401, 403):
        return f"HTTP {reply.status_code}: the API key was refused"
    if reply.status_code != 200:
        return f"HTTP {reply.status_code}"
    return "HTTP 200 but not a model listing"
