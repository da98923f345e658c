"""The one fake vLLM engine of the tests: vLLM 0.32's recorded bodies (tests/fixtures/vllm),
served on loopback (a real HTTP server: `with FakeVllm() as engine`, or `start()`/`stop()`) or in
this process (an httpx transport: `client()`, for the engine client's unit tests).

What tests need of it differently, and what sets it:

- the reply to a chat call: `answer`, a recorded exchange by name (shaped to the request as vLLM
  shapes it: no logprobs asked, no ids or logprobs given), or a function of the request body giving
  `(status, body)` (a text body goes out as an HTML page, bytes as JSON exactly as given); None
  for no chat route at all;
- replies only to exact requests vLLM was recorded answering (`exchanges`, and `add()`; a request
  can be looked up as the recorded one it stands for with `recorded_as`): any other request is then
  refused with a 400, so code asking what vLLM was never asked fails;
- the refusals real vLLM gives (`refuse_like_vllm`);
- failures vLLM cannot be made to produce on demand (`fault`: see FAULTS);
- timing: `delay` before each chat reply, `hold` for chat calls held until released, their caller
  leaves or `hold_s` passes, `listing_delay` for a busy engine's `/models`;
- a weight update, as vLLM goes through one: `POST /pause?mode=keep` (vLLM's
  `vllm/entrypoints/serve/rlhf/api_router.py`, served with VLLM_SERVER_DEV_MODE) freezes chat calls,
  in flight and new, until `POST /resume` (`GET /is_paused` says which); `scaling` answers every
  request with the 503 vLLM's elastic-EP `ScalingMiddleware` gives while it reconfigures, for ever
  or for the next `scaling_refusals` requests;
- vLLM's `prompt_logprobs` on `/v1/completions` with a token-id prompt (`prompt_scores`: each
  prompt token's logprob and text, or None for an engine that ignores the field), in the recorded
  completions body's shape;
- the models listing (`listing`; None for no `/models` route) and where the routes are
  (`base_path`); `/tokenize` (`tokenize`);
- the policy version: `weight_info` for vLLM's `GET /weight_info` (dev mode, at the server root:
  `{"weight_version": <str or null>}`; NO_ROUTE for an engine without it, as vLLM outside dev
  mode), `reply_weight_version` for SGLang's `metadata.weight_version` in each reply; `gate`
  holds chat calls until the test sets it (`arrived` is set once one waits there), so a weight
  update can land while a call is in flight.

Every request is kept in `sent`, every chat body in `requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal, NamedTuple

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.proxy.upstream.tiers import PROBES
from tests.support.vllm_recordings import vllm_error, vllm_error_case, vllm_fixture, vllm_reply_to

Fault = Literal[
    "no_logprobs", "html", "context_full", "http500", "no_choices", "truncated_json", "empty_503", "long"
]
FAULTS: dict[str, str] = {
    "no_logprobs": "the reply has no ids or logprobs whatever was asked (an engine ignoring the "
    "capture fields)",
    "html": "a gateway's HTML error page with status 200, for chat calls and the listing",
    "context_full": "vLLM's recorded 400 for a prompt over the context",
    "http500": "a 500 from an engine whose core died",
    "no_choices": "a 200 whose body has no choices",
    "truncated_json": "the reply cut short after 150 bytes (a proxy in front cut it)",
    "empty_503": "a 503 with an empty body",
    "long": "the reply with content of `long_chars` characters",
}
"""What each `fault` does to a chat call."""

Answer = Callable[[dict[str, Any]], tuple[int, Any]]
NO_ROUTE: Any = object()
"""`weight_info` of an engine that does not serve `/weight_info` (a 404, as vLLM outside dev mode)."""
HTML_PAGE = "<html><body>502 Bad Gateway</body></html>"
NOT_RECORDED = vllm_error(400, "no recorded vLLM reply to this body")
SCALING_503 = {"error": "The model is currently scaling. Please try again later."}
"""vLLM's body for every request while it reconfigures (`ScalingMiddleware` in
vllm/entrypoints/serve/elastic_ep/middleware.py): a string `error`, not its usual error object."""


class Sent(NamedTuple):
    """One request the engine received."""

    method: str
    url: str
    path: str
    headers: dict[str, str]
    body: Any
    """The JSON body (None for a GET)."""


class _Reply(NamedTuple):
    status: int
    content: bytes
    content_type: str | None


def not_a_probe(body: dict[str, Any]) -> bool:
    """A model call other than the proxy's one-token engine probe."""
    return body.get("max_tokens") != 1


def continues_a_conversation(body: dict[str, Any]) -> bool:
    """A call whose messages hold an assistant message: a later turn of a rollout."""
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in body.get("messages", []))


def vllm_listing(served: list[str] | None = None, max_model_len: int | None = None) -> dict[str, Any]:
    """The recorded `/v1/models` listing, listing `served` instead of its one model and reporting
    `max_model_len` as vLLM does for `--max-model-len`, when given."""
    listing = vllm_fixture("models")["models"]["response"]
    entry = listing["data"][0]
    if max_model_len is not None:
        entry["max_model_len"] = max_model_len
    if served is not None:
        listing["data"] = [{**entry, "id": name, "root": name} for name in served]
    return listing


def vllm_refusal(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The refusal real vLLM 0.32 serving smollm2 gives this body (recorded), or None if it would
    accept it."""
    if body.get("model") != "smollm2":
        return vllm_error_case("unknown_model")
    if body.get("tools") == []:
        return vllm_error_case("empty_tools")
    if "stream_options" in body and not body.get("stream"):
        return vllm_error_case("stream_options_without_stream")
    if (body.get("max_tokens") or 0) > 2048:
        return vllm_error_case("max_tokens_over_context")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        return vllm_error_case("top_logprobs_without_logprobs")
    if (body.get("top_logprobs") or 0) > 20:
        return vllm_error_case("top_logprobs_too_large")
    return None


def _exchange_key(path: str, body: Any) -> str:
    return path + " " + json.dumps(body, sort_keys=True)


def _json(status: int, body: Any) -> _Reply:
    # As Starlette's JSONResponse and httpx encode JSON.
    content = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return _Reply(status, content, "application/json")


class FakeVllm:
    """A vLLM-shaped engine answering with recorded bodies; see the module docstring."""

    def __init__(
        self,
        *,
        answer: str | Answer | None = "chat_basic",
        exchanges: tuple[str, ...] = (),
        refuse_like_vllm: bool = False,
        fault: Fault | None = None,
        delay: float = 0.0,
        hold: Callable[[dict[str, Any]], bool] | None = None,
        hold_s: float = 600.0,
        listing: dict[str, Any] | None | Literal["recorded"] = "recorded",
        listing_delay: float = 0.0,
        base_path: str = "/v1",
        tokenize: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        recorded_as: Callable[[str, Any], Any] | None = None,
        long_chars: int = 2_000_000,
        weight_info: str | None = NO_ROUTE,
        reply_weight_version: str | None = None,
        gate: threading.Event | None = None,
        scaling: bool = False,
        scaling_refusals: int | None = None,
        prompt_scores: Callable[[list[int]], list[tuple[float, str]] | None] | None = None,
    ) -> None:
        self.answer = answer
        self.refuse_like_vllm = refuse_like_vllm
        self.fault = fault
        self.delay = delay
        """Seconds each chat call takes; a caller that leaves meanwhile is counted in `cancelled`."""
        self.hold = hold
        """Chat calls for which this holds wait while it is set (None releases them: they are then
        answered), until their caller leaves or `hold_s` passes (then a 499)."""
        self.hold_s = hold_s
        self.listing = vllm_listing() if listing == "recorded" else listing
        self.listing_delay = listing_delay
        self.base_path = base_path
        self.tokenize = tokenize
        self.long_chars = long_chars
        self.recorded_as = recorded_as
        self.weight_info = weight_info
        """What `GET /weight_info` answers as `weight_version` (a test changes it as a trainer's
        `update_weight_version` would); NO_ROUTE: a 404."""
        self.reply_weight_version = reply_weight_version
        """SGLang's shape: each chat reply's `metadata.weight_version` (None: no metadata)."""
        self.gate = gate
        """Chat calls wait until it is set (None: they do not wait)."""
        self.prompt_scores = prompt_scores
        """`/v1/completions` with `prompt_logprobs`: for the ids sent, the (logprob, decoded text)
        of every token after the first, or None to answer `prompt_logprobs: null`."""
        self.arrived = threading.Event()
        """Set once a chat call waits at `gate`."""
        self.scaling = scaling
        """Every request gets vLLM's scaling 503 (SCALING_503) while set."""
        self.scaling_refusals = scaling_refusals
        """While `scaling`, how many more requests are refused before it ends by itself (None: it
        ends only when a test clears `scaling`)."""
        self.refused_scaling = 0
        """Requests answered with the scaling 503."""
        self._resumed: asyncio.Event | None = None
        """Set while generation runs; cleared by `/pause?mode=keep` (made on the server's loop)."""
        self._exchanges: dict[str, tuple[int, Any]] = {}
        self._any_body: dict[str, tuple[int, Any]] = {}
        for name in exchanges:
            rec = vllm_fixture(name)
            self._exchanges[_exchange_key(rec["endpoint"], rec["request"])] = (rec["status"], rec["response"])
        self.sent: list[Sent] = []
        self.requests: list[dict[str, Any]] = []
        """Every chat call's body."""
        self.cancelled = 0
        """Chat calls whose caller left during `delay`."""
        self.held = 0
        """Chat calls held now (by `hold`, or by a pause)."""
        self.server: ThreadedServer | None = None
        self.port = 0
        """The port it was started on (kept when it stops)."""

    # --- what it answers ---------------------------------------------------------------------

    def add(self, path: str, body: dict[str, Any] | None, status: int, reply: Any) -> None:
        """Answer `body` at `path` (any body when None) with `reply`, before anything else."""
        if body is None:
            self._any_body[path] = (status, reply)
        else:
            self._exchanges[_exchange_key(path, body)] = (status, reply)

    @property
    def served_name(self) -> str:
        """The model the listing names first."""
        return (self.listing or vllm_listing())["data"][0]["id"]

    async def _respond(
        self,
        method: str,
        url: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        left: Callable[[], Awaitable[bool]],
    ) -> _Reply:
        body = json.loads(raw) if method == "POST" and raw else None
        self.sent.append(Sent(method, url, path, headers, body))
        if self.scaling:
            if self.scaling_refusals is not None:
                self.scaling_refusals -= 1
                self.scaling = self.scaling_refusals > 0
            self.refused_scaling += 1
            return _json(503, SCALING_503)
        if path in ("/pause", "/resume", "/is_paused"):
            return self._pause_route(method, path, url)
        if method == "GET" and path == "/weight_info" and self.weight_info is not NO_ROUTE:
            return _json(200, {"weight_version": self.weight_info})
        if method == "GET" and path == f"{self.base_path}/models" and self.listing is not None:
            if self.fault == "html":
                return _Reply(200, HTML_PAGE.encode(), "text/html; charset=utf-8")
            if await self._waited(self.listing_delay, left):
                return _Reply(499, b"", None)
            return _json(200, self.listing)
        if method == "POST":
            as_recorded = self.recorded_as(path, body) if self.recorded_as is not None else body
            recorded = self._exchanges.get(_exchange_key(path, as_recorded)) or self._any_body.get(path)
            if recorded is not None:
                return _json(*recorded)
            if path == f"{self.base_path}/completions" and self.prompt_scores is not None:
                return _json(200, self._scored(body))
            if path == "/tokenize" and self.tokenize is not None:
                reply = self.tokenize(body)
                return _json(200, reply) if reply is not None else _json(400, NOT_RECORDED)
            if path == f"{self.base_path}/chat/completions" and self.answer is not None:
                return await self._chat(body, left)
            if self._exchanges or self._any_body:
                return _json(400, NOT_RECORDED)
        return _json(404, {"detail": "Not Found"})

    def _pause_route(self, method: str, path: str, url: str) -> _Reply:
        """vLLM's pause routes as it answers them; only `keep` mode is modelled (a call in flight
        is frozen, not aborted or drained)."""
        if self._resumed is None:
            self._resumed = asyncio.Event()
            self._resumed.set()
        if method == "GET" and path == "/is_paused":
            return _json(200, {"is_paused": not self._resumed.is_set()})
        if method == "POST" and path == "/resume":
            self._resumed.set()
            return _json(200, {"status": "resumed"})
        if method == "POST" and path == "/pause":
            mode = httpx.URL(url).params.get("mode", "abort")
            if mode != "keep":
                return _json(400, {"error": f"the fake engine models only mode=keep, not {mode!r}"})
            self._resumed.clear()
            return _json(200, {"status": "paused"})
        return _json(405, {"detail": "Method Not Allowed"})

    async def _paused(self, left: Callable[[], Awaitable[bool]]) -> bool:
        """Wait while generation is paused; True if the caller left meanwhile."""
        resumed = self._resumed
        if resumed is None or resumed.is_set():
            return False
        self.held += 1
        try:
            while not resumed.is_set():
                if await left():
                    return True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(resumed.wait(), 0.05)
            return False
        finally:
            self.held -= 1

    def _scored(self, body: dict[str, Any]) -> dict[str, Any]:
        """The recorded completions body for a token-id prompt, with vLLM's `prompt_logprobs`:
        None first, then `{str(token id): {logprob, rank, decoded_token}}` per token."""
        assert self.prompt_scores is not None
        ids = list(body["prompt"])
        reply = json.loads(json.dumps(vllm_fixture("completions_ids")["response"]))
        choice = reply["choices"][0]
        scores = self.prompt_scores(ids)
        if scores is not None and body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": lp, "rank": 1, "decoded_token": text}}
                for t, (lp, text) in zip(ids[1:], scores, strict=True)
            ]
        choice["prompt_token_ids"] = ids if body.get("return_token_ids") else None
        reply["usage"]["prompt_tokens"] = len(ids)
        return reply

    async def _waited(self, seconds: float, left: Callable[[], Awaitable[bool]]) -> bool:
        """Sleep `seconds`; True if the caller left meanwhile (uvicorn does not cancel a handler
        when its client leaves: it has to look)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if await left():
                return True
            await asyncio.sleep(min(0.02, max(deadline - loop.time(), 0)))
        return False

    async def _chat(self, body: dict[str, Any], left: Callable[[], Awaitable[bool]]) -> _Reply:
        self.requests.append(body)
        if self.refuse_like_vllm and (refusal := vllm_refusal(body)) is not None:
            return _json(*refusal)
        if await self._paused(left):
            self.cancelled += 1
            return _Reply(499, b"", None)
        if self.delay and await self._waited(self.delay, left):
            self.cancelled += 1
            return _Reply(499, b"", None)
        if self.hold is not None and self.hold(body):
            self.held += 1
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.hold_s
                while self.hold is not None:
                    if await left() or loop.time() > deadline:
                        return _Reply(499, b"", None)
                    await asyncio.sleep(0.05)
            finally:
                self.held -= 1
        if self.gate is not None and not_a_probe(body):
            self.arrived.set()
            await asyncio.to_thread(self.gate.wait)
        if self.fault == "html":
            return _Reply(200, HTML_PAGE.encode(), "text/html; charset=utf-8")
        if self.fault == "context_full":
            return _json(*vllm_error_case("prompt_over_context"))
        if self.fault == "http500":
            return _json(
                500, {"error": {"message": "engine core died", "type": "InternalServerError", "code": 500}}
            )
        if self.fault == "no_choices":
            return _json(200, {"id": "x", "object": "chat.completion", "choices": []})
        if self.fault == "empty_503":
            return _Reply(503, b"", None)
        if callable(self.answer):
            status, reply = self.answer(body)
        else:
            status, reply = 200, vllm_reply_to(body, vllm_fixture(self.answer)["response"])
        if isinstance(reply, str):
            return _Reply(status, reply.encode(), "text/html")
        if isinstance(reply, bytes):  # a JSON body as sent, also one a JSON encoder would refuse
            return _Reply(status, reply, "application/json")
        if self.fault == "no_logprobs":
            reply = vllm_reply_to({}, reply)
        elif self.fault == "long":
            reply["choices"][0]["message"]["content"] = "x" * self.long_chars
        elif self.fault == "truncated_json":
            return _Reply(status, _json(status, reply).content[:150], "application/json")
        if self.reply_weight_version is not None and isinstance(reply, dict):
            reply = {**reply, "metadata": {"weight_version": self.reply_weight_version}}
        return _json(status, reply)

    def pause(self) -> None:
        """What a trainer does before it syncs weights: `POST /pause?mode=keep` (needs `start()`)."""
        httpx.post(f"{self.url}/pause", params={"mode": "keep"}).raise_for_status()

    def resume(self) -> None:
        """What it does after: `POST /resume`; the frozen calls are answered."""
        httpx.post(f"{self.url}/resume").raise_for_status()

    # --- in this process -----------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        """An httpx transport answering as this engine (no socket; a caller never leaves)."""

        async def handle(request: httpx.Request) -> httpx.Response:
            async def stays() -> bool:
                return False

            reply = await self._respond(
                request.method,
                str(request.url),
                request.url.path,
                dict(request.headers),
                await request.aread(),
                stays,
            )
            headers = {"content-type": reply.content_type} if reply.content_type else {}
            return httpx.Response(reply.status, content=reply.content, headers=headers)

        return httpx.MockTransport(handle)

    def client(self) -> httpx.AsyncClient:
        """An httpx client whose every request this engine answers, wherever it is addressed."""
        return httpx.AsyncClient(transport=self.transport())

    # --- on loopback ---------------------------------------------------------------------------

    def _app(self) -> Starlette:
        async def route(request: Request) -> Response:
            reply = await self._respond(
                request.method,
                str(request.url),
                request.url.path,
                dict(request.headers),
                await request.body(),
                request.is_disconnected,
            )
            return Response(reply.content, status_code=reply.status, media_type=reply.content_type)

        return Starlette(routes=[Route("/{path:path}", route, methods=["GET", "POST"])])

    def start(self, port: int = 0) -> FakeVllm:
        """Serve on loopback (`port` 0: a free one). This process caches engine probes by URL, as
        a tapdeck process does, and a port an earlier test's engine freed comes back: its probe
        (say, a text tier from a `no_logprobs` test) must not answer for this one."""
        PROBES.forget()
        self.server = ThreadedServer(self._app(), "127.0.0.1", port, name="fake-vllm").start()
        self.port = self.server.port
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def serve_again(self) -> None:
        """Start again on the port the stopped server held, as a restarted vLLM would (this
        process's cached engine probes are kept)."""
        assert self.server is not None
        self.server = ThreadedServer(self._app(), "127.0.0.1", self.port, name="fake-vllm").start()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`, no path."""
        assert self.server is not None, "not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL an engine is given: `url` and `base_path`."""
        return f"{self.url}{self.base_path}"

    def __enter__(self) -> FakeVllm:
        return self.start() if self.server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def models_only_engine(base_path: str = "/v1") -> Iterator[str]:
    """The fake without a chat route: an engine address that settles, whose model calls fail.
    Yields its URL without a path."""
    with FakeVllm(answer=None, base_path=base_path) as engine:
        yield engine.url


def hanging_engine(hold_s: float = 600.0) -> FakeVllm:
    """The fake (not started: use it in a `with`) that probes fine and holds every other model
    call (`.held`: how many now) until its caller leaves or `hold_s` passes."""
    return FakeVllm(hold=not_a_probe, hold_s=hold_s)
