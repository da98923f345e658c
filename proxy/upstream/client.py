"""The one way the proxy talks to an inference engine (vLLM's OpenAI-compatible wire format).

`prepare` turns a harness's chat-completions request into the upstream body: capture fields forced
on, streaming off (streams are synthesised from the full reply), requests vLLM would refuse fixed,
and at the training tier the sampling knobs that truncate the distribution reset to no-ops.
`complete` sends it and classifies every failure as an `EngineError`; `parse_capture` reads the
token ids and logprobs out of the reply (once `proxy/upstream/reply_check.py` has checked it).
"""

from __future__ import annotations

import array
import copy
import re
import ssl
import urllib.request
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import urlsplit

import httpx
import numpy as np
import orjson

from tapdeck.proxy.capture.routing import read_routed_experts
from tapdeck.proxy.capture.tokens import PromptIdsMemo, as_ids, as_logprobs, loads_with_prompt_ids
from tapdeck.proxy.config import DEFAULT_MAX_REPLY_BYTES
from tapdeck.proxy.errors import DialectError, ProxyError
from tapdeck.proxy.upstream.address import shown_url
from tapdeck.proxy.upstream.transport import (
    UpstreamHTTP,
    UpstreamReply,
    UpstreamReplyTooLarge,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from tapdeck.schema.findings import Finding

if TYPE_CHECKING:
    from tapdeck.proxy.upstream.tiers import EngineSpec
    from tapdeck.schema.sessions import Tier

DEFAULT_MAX_TOKENS_CAP = 8192
"""The most output tokens asked of tapdeck's embedded engine (a small model on CPU that may ramble on
without end), and of an engine that does not say its context (8,192 is the context assumed then).
A served engine that says its context gets a harness's own request up to that context."""
ENGINE_READ_TIMEOUT_S = 2340.0
"""Silence allowed from the engine: a CPU engine prefilling an agent CLI's 12-17k-token first
prompt on a loaded machine says nothing for 20 minutes or more. A minute under the agents' own
40-minute request limit (runner/cli_agents.py), so a hung engine reaches the agent as the proxy's
502 rather than as the agent's own timeout."""
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=ENGINE_READ_TIMEOUT_S, write=60.0, pool=60.0)

NEUTRAL_SAMPLING: dict[str, float | int] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""No-op values of the knobs that reshape the distribution: with processed logprobs a truncated
or penalised distribution's logprobs no longer match what a trainer recomputes."""
SAMPLING_KEYS = (
    "temperature",
    *NEUTRAL_SAMPLING,
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "logit_bias",
    "response_format",
    "tool_choice",
)
GUIDED_KEYS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "structured_outputs",
    "allowed_token_ids",
    "bad_words",
)

ErrorKind = Literal["unreachable", "timeout", "bad_reply", "upstream_4xx", "upstream_5xx", "context_length"]
PASSTHROUGH_STATUS = (400, 413, 422)
"""Upstream refusals the harness must see as-is: a 502 would make it resend the same input."""
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|context length|context window|prompt is too long|"
    r"input tokens.*exceeds|too many (input )?tokens",
    re.IGNORECASE,
)


class EngineError(ProxyError):
    """An engine call that produced no usable reply. `status` is what the harness should get."""

    kind: ErrorKind

    def __init__(
        self,
        kind: ErrorKind,
        status: int,
        message: str,
        url: str,
        param: str | None = None,
        upstream_status: int | None = None,
    ) -> None:
        super().__init__(status, message, kind=kind, param=param)
        self.url = url
        self.upstream_status = upstream_status
        """The engine's own HTTP status, when it answered with one."""

    def __repr__(self) -> str:
        return f"EngineError({self.kind!r}, {self.status}, {self.message!r})"


class Capture(NamedTuple):
    """What one reply holds for training. Arrays are None when the reply has no such data."""

    prompt_ids: np.ndarray | None
    sampled_ids: np.ndarray | None
    logprobs: np.ndarray | None
    token_texts: list[str] | None
    top_logprobs: list[list[tuple[str, float]]] | None
    findings: list[Finding]
    routed_experts: np.ndarray | None = None
    """MoE routing over prompt and completion (`proxy/capture/routing.py`)."""


def prepare_request(
    chat: Mapping[str, Any],
    tier: Tier | str,
    served_model: str,
    training: bool,
    *,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
    alternatives: int = 0,
    policy: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The upstream body for a chat request, and the sampling record `{"submitted", "requested"}`.

    At the training tier the truncating knobs are reset to no-ops and then `policy` (the training
    session's sampling policy, e.g. the trainer's temperature) is applied, and a temperature still
    unset is sent as 1.0; "requested" keeps what the harness asked for.

    At least `alternatives` top logprobs are asked for per token when a session captures them for
    inspection; the dialects give the client only as many as it asked for.

    `chat` is never mutated. Raises DialectError(400) for what the proxy refuses: `n > 1`, and at the
    training tier logit_bias, guided decoding, non-text response formats and forced tool choice.
    """
    n = chat.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n > 1):
        raise DialectError(
            400,
            f"n={n!r} is not supported: the capture proxy records one completion "
            "per call; send n separate requests",
            param="n",
        )
    if training:
        _refuse_untrainable(chat)

    body = dict(chat)
    body.pop("stream_options", None)
    body["stream"] = False
    body["model"] = served_model
    for key in ("tools", "functions"):
        if key in body and not body[key]:
            del body[key]
    if "tools" not in body and "functions" not in body:
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
        body.pop("function_call", None)
    messages = body.get("messages")
    if isinstance(messages, list):
        body["messages"] = _reasoning_as_reasoning(messages)

    limits = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    for key in limits:
        if isinstance(body[key], int) and body[key] > max_tokens_cap:
            body[key] = max_tokens_cap
    if not limits:
        body["max_tokens"] = max_tokens_cap

    if str(tier) != "text":
        body["return_token_ids"] = True
        body["logprobs"] = True
        asked = body.get("top_logprobs")
        if asked is None or (type(asked) is int and asked < alternatives):
            body["top_logprobs"] = max(alternatives, 0)

    requested = {k: copy.deepcopy(chat[k]) for k in SAMPLING_KEYS if k in chat}
    if training:
        body.update(NEUTRAL_SAMPLING)
        body.update(policy or {})
        # Left out, vLLM applies the model's generation_config.json default (Qwen's 0.6, say):
        # logprobs processed at a temperature neither the record nor the trainer would know.
        body.setdefault("temperature", 1.0)
    submitted = {k: body[k] for k in SAMPLING_KEYS if k in body}
    return body, {"submitted": submitted, "requested": requested}


def _refuse_untrainable(chat: Mapping[str, Any]) -> None:
    """Training-tier refusals: each of these makes the sampled distribution differ from the policy."""

    def refuse(param: str, why: str) -> None:
        raise DialectError(400, f"`{param}` is not allowed in a training session: {why}", param=param)

    if chat.get("logit_bias"):
        refuse("logit_bias", "it shifts the distribution the logprobs are read from")
    for key in GUIDED_KEYS:
        if chat.get(key) is not None:
            refuse(key, "constrained decoding masks tokens the policy would sample")
    fmt = chat.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
        refuse("response_format", f"a {fmt.get('type')!r} format constrains decoding")
    choice = chat.get("tool_choice")
    if choice == "required" or isinstance(choice, Mapping):
        refuse("tool_choice", "a forced tool choice constrains decoding")


def _reasoning_as_reasoning(messages: list[Any]) -> list[Any]:
    """Earlier assistant turns' `reasoning_content` is sent as `reasoning` (the field vLLM's chat
    template renders); otherwise the thinking renders empty and the next prompt stops extending
    the last one. Messages are copied only when changed."""
    out = None
    for i, msg in enumerate(messages):
        if type(msg) is dict and "reasoning_content" not in msg:
            continue  # nearly every message: past the Mapping ABC check below
        if isinstance(msg, Mapping) and msg.get("role") == "assistant" and "reasoning_content" in msg:
            fixed = dict(msg)
            text = fixed.pop("reasoning_content")
            if fixed.get("reasoning") is None:
                fixed["reasoning"] = text
            if out is None:
                out = list(messages)
            out[i] = fixed
    return messages if out is None else out


def zero_filled_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Usage with `*_tokens_details` as objects, never null (clients read `cached_tokens` blindly)."""
    out = dict(usage or {})
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if not isinstance(out.get(key), int):
            out[key] = 0
    out["prompt_tokens_details"] = {
        "cached_tokens": 0,
        "audio_tokens": 0,
        **(out.get("prompt_tokens_details") or {}),
    }
    out["completion_tokens_details"] = {
        "reasoning_tokens": 0,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
        **(out.get("completion_tokens_details") or {}),
    }
    return out


def _ids(value: Any) -> np.ndarray:
    """Wire ids → int32 array; fast path for a plain list of ints, strict check otherwise.

    A list of ints goes through `array.array` (a C int per id, raising on anything not an int
    or out of range) and is viewed without a copy: about half the cost of `np.asarray` on a
    100k-id prompt, which first scans the list for a dtype. Whatever it refuses takes the
    numpy path, so what is accepted and what is reported are unchanged.
    """
    if isinstance(value, list):
        if value and type(value[0]) is int:
            try:
                return as_ids(np.frombuffer(array.array("i", value), dtype=np.intc))
            except (TypeError, OverflowError):
                pass
        arr = np.asarray(value) if value else np.zeros(0, dtype=np.int32)
        if arr.ndim == 1 and arr.dtype.kind == "i":
            return as_ids(arr)
    return as_ids(value)


def has_ids(value: Any) -> bool:
    """Whether a token-id field holds any (a list, or the array the fast parser makes)."""
    return value.size > 0 if isinstance(value, np.ndarray) else bool(value)


def parse_capture(reply: Mapping[str, Any]) -> Capture:
    """Token ids, logprobs and MoE routing of `choices[0]`.

    Prompt ids come from the top-level `prompt_token_ids` (vLLM chat); SGLang's per-choice field is
    used only when the top level is empty. With `--return-tokens-as-token-ids` each `token_id:N`
    is checked against `token_ids[i]`: a mismatch drops the logprobs (ids stay, as context) with a
    FATAL finding. A null logprob makes the turn untrainable rather than failing the call.
    """
    findings: list[Finding] = []
    choices = reply.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}

    raw_prompt = reply.get("prompt_token_ids")
    if not has_ids(raw_prompt):
        raw_prompt = choice.get("prompt_token_ids")
    prompt_ids = sampled_ids = None
    try:
        prompt_ids = _ids(raw_prompt) if has_ids(raw_prompt) else None
    except ValueError as exc:
        findings.append(Finding.fatal("bad_prompt_ids", str(exc)))
    try:
        raw_sampled = choice.get("token_ids")
        sampled_ids = _ids(raw_sampled) if raw_sampled is not None else None
    except ValueError as exc:
        findings.append(Finding.fatal("bad_sampled_ids", str(exc)))
    tokens = None if prompt_ids is None or sampled_ids is None else prompt_ids.size + sampled_ids.size
    routed, unread = read_routed_experts(choice.get("routed_experts"), tokens)
    findings.extend(unread)

    content = (
        (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), Mapping) else None
    )
    if not content:
        return Capture(prompt_ids, sampled_ids, None, None, None, findings, routed)

    # One pass over the entries (this runs on every call; dicts, as orjson builds them, skip the
    # slower Mapping check).
    values: list[Any] = []
    token_texts: list[str] = []
    known: dict[str, str] = {}
    id_tokens: list[tuple[int, str]] = []
    for entry in content:
        if not isinstance(entry, dict) and not isinstance(entry, Mapping):
            entry = {}
        values.append(entry.get("logprob"))
        token = entry.get("token", "")
        token = token if type(token) is str else str(token)
        if token.startswith("token_id:"):
            # vLLM's --return-tokens-as-token-ids: the sampled entry's `bytes` still hold the real
            # token text (its top_logprobs' `bytes` hold the "token_id:N" string instead).
            text = bytes(entry.get("bytes") or []).decode("utf-8", errors="replace")
            known[token] = text
            id_tokens.append((len(token_texts), token))
            token = text
        token_texts.append(token)

    logprobs: np.ndarray | None
    if all(type(v) is float for v in values):
        logprobs = np.array(values, dtype=np.float64)
    elif any(v is None or isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        first = next(
            i
            for i, v in enumerate(values)
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float))
        )
        findings.append(
            Finding.fatal(
                "logprob_missing",
                f"logprob {first} of {len(values)} is {values[first]!r}; the turn is kept as context only",
            )
        )
        logprobs = None
    else:
        logprobs = as_logprobs(values)
    for i, token in id_tokens:
        if logprobs is not None and not _token_id_matches(token, sampled_ids, i):
            have = None if sampled_ids is None or i >= sampled_ids.size else int(sampled_ids[i])
            findings.append(
                Finding.fatal(
                    "token_id_mismatch",
                    f"logprob entry {i} is {token!r} but token_ids[{i}] is {have}; logprobs dropped, "
                    "ids kept as context",
                )
            )
            logprobs = None

    top: list[list[tuple[str, float]]] = []
    for entry in content:
        alts = entry.get("top_logprobs") if isinstance(entry, dict) or isinstance(entry, Mapping) else None
        top.append(
            [
                (known.get(str(a.get("token")), str(a.get("token"))), float(a["logprob"]))
                for a in alts
                if isinstance(a, Mapping) and isinstance(a.get("logprob"), (int, float))
            ]
            if alts
            else []
        )
    return Capture(prompt_ids, sampled_ids, logprobs, token_texts, top, findings, routed)


def _token_id_matches(token: str, sampled_ids: np.ndarray | None, i: int) -> bool:
    try:
        value = int(token.removeprefix("token_id:"))
    except ValueError:
        return False
    return sampled_ids is not None and i < sampled_ids.size and int(sampled_ids[i]) == value


class EngineClient:
    """One engine, its pooled HTTP connections. Safe to share between sessions on one event loop."""

    parse_capture = staticmethod(parse_capture)

    def __init__(
        self,
        spec: EngineSpec,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
        max_model_len: int | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.spec = spec
        self.max_reply_bytes = max_reply_bytes
        """The most of one reply's body read; past it the call fails (a 502 naming the limit)."""
        self.url = spec.url.rstrip("/")
        self.shown = shown_url(self.url)
        """The URL as messages show it: credentials in it are never echoed to a harness."""
        self.max_tokens_cap = max_tokens_cap
        self.max_model_len = max_model_len
        """From the probe; when known, `max_tokens` is also kept within it (vLLM refuses more)."""
        self.embedded = False
        """From the probe: the engine's replies name it tapdeck's embedded engine."""
        self._headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        self._http = http
        """An injected httpx client (tests' in-process upstreams); otherwise the lean client."""
        self._lean: UpstreamHTTP | None = None
        self._closed = False
        self._calls_in_flight = 0
        if http is None:
            t = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
            if _behind_env_proxy(self.url):
                # HTTP(S)_PROXY covers this engine: httpx honours it, the lean client does not.
                self._http = httpx.AsyncClient(timeout=t, limits=httpx.Limits(max_connections=None))
            else:
                self._lean = UpstreamHTTP(
                    self.url,
                    connect_timeout=t.connect,
                    read_timeout=t.read,
                    max_reply_bytes=max_reply_bytes,
                    ssl_context=_shared_ssl() if self.url.startswith("https") else None,
                )
        self._owns_http = http is None

    @property
    def in_flight(self) -> int:
        """Engine calls under way right now."""
        return self._calls_in_flight

    @property
    def cap(self) -> int:
        """The largest `max_tokens` sent upstream, also what is sent when a harness asks no limit:
        a served engine's context where it says it (vLLM refuses more, and the harness's own request
        stands within it), else `max_tokens_cap`, within the context."""
        if self.max_model_len and not self.embedded:
            return self.max_model_len
        if self.max_model_len:
            return min(self.max_tokens_cap, self.max_model_len)
        return self.max_tokens_cap

    def prepare(
        self,
        chat: Mapping[str, Any],
        tier: Tier | str,
        served_model: str,
        training: bool,
        alternatives: int = 0,
        policy: Mapping[str, Any] | None = None,
        output_limit: int | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """See `prepare_request`; the cap is this engine's, lowered to a session's `output_limit`."""
        cap = min(self.cap, output_limit) if output_limit else self.cap
        return prepare_request(
            chat, tier, served_model, training, max_tokens_cap=cap, alternatives=alternatives, policy=policy
        )

    async def models(self) -> dict[str, Any]:
        """`GET {url}/models`."""
        return await self._call("GET", "/models", None)

    async def complete(self, body: Mapping[str, Any], memo: PromptIdsMemo | None = None) -> dict[str, Any]:
        """`POST {url}/chat/completions` (non-streaming); the reply, a JSON object with choices,
        with `prompt_token_ids` as an int array (see `loads_with_prompt_ids`; `memo` is the calling
        session's, so only the ids its last prompt did not have are parsed). Its fields are
        checked, and usage zero-filled, by `proxy/upstream/reply_check.py`.

        Raises EngineError: upstream 400/413/422 keep their status (`upstream_4xx`, or
        `context_length` for a prompt that does not fit); anything else is a 502 of a named kind.
        """
        reply = await self._call("POST", "/chat/completions", body, memo)
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise EngineError(
                "bad_reply", 502, f"engine at {self.shown} answered HTTP 200 without choices", self.shown
            )
        return reply

    async def get(self, path: str) -> dict[str, Any]:
        """`GET {url}{path}`, or `path` itself when it is a full URL (vLLM's `/weight_info` sits
        beside `/v1`); failures raise EngineError as in `complete`."""
        return await self._call("GET", path, None)

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """`POST {url}{path}`, or to `path` itself when it is a full URL (vLLM's `/tokenize` sits
        beside `/v1`); failures raise EngineError as in `complete`."""
        return await self._call("POST", path, body)

    async def _call(
        self, method: str, path: str, body: Mapping[str, Any] | None, memo: PromptIdsMemo | None = None
    ) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError(f"the client for engine {self.shown} is closed")
        # Encoded before the call is counted in flight: a body that cannot be encoded leaks nothing.
        data = None if body is None else orjson.dumps(body)
        headers = self._headers if data is None else {**self._headers, "Content-Type": "application/json"}
        self._calls_in_flight += 1
        try:
            if self._lean is not None:
                absolute = path.startswith(("http://", "https://"))
                resp = await self._lean.request(
                    method, urlsplit(path).path if absolute else path, data, headers, prefixed=not absolute
                )
            else:
                resp = await self._via_httpx(method, path, data, headers)
        except UpstreamReplyTooLarge as exc:
            raise EngineError(
                "bad_reply",
                502,
                f"engine at {self.shown} sent a reply larger than "
                f"{exc.limit} bytes, the most this server reads for one "
                "call (tapdeck serve --max-reply-bytes)",
                self.shown,
            ) from None
        except (httpx.TimeoutException, UpstreamTimeout) as exc:
            raise EngineError(
                "timeout", 502, f"engine at {self.shown} timed out ({shown_url(_why(exc))})", self.shown
            ) from None
        except (httpx.TransportError, OSError) as exc:
            raise EngineError(
                "unreachable",
                502,
                f"engine at {self.shown} is unreachable: {shown_url(_why(exc))}",
                self.shown,
            ) from None
        finally:
            self._calls_in_flight -= 1
        try:
            payload = (
                loads_with_prompt_ids(resp.body, memo)
                if path == "/chat/completions"
                else orjson.loads(resp.body)
            )
        except orjson.JSONDecodeError:
            payload = None
        if resp.status >= 400:
            raise self._http_error(resp, payload)
        if not isinstance(payload, dict):
            snippet = resp.body[:120].decode("utf-8", "replace").replace("\n", " ").strip()
            raise EngineError(
                "bad_reply",
                502,
                f"engine at {self.shown} answered HTTP "
                f"{resp.status} with a body that is not a JSON "
                f"object: {snippet!r}",
                self.shown,
            )
        return payload

    async def _via_httpx(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> UpstreamReply:
        assert self._http is not None
        url = path if path.startswith(("http://", "https://")) else self.url + path
        send = partial(self._read_capped, method, url, data, headers)
        try:
            return await send()
        except httpx.RemoteProtocolError:
            # A pooled keep-alive connection the engine closed just as it was reused: the
            # request never reached it, so one retry on a fresh connection is safe.
            return await send()

    async def _read_capped(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str]
    ) -> UpstreamReply:
        """One request through httpx, its reply read no further than `max_reply_bytes`."""
        assert self._http is not None
        async with self._http.stream(method, url, content=data, headers=headers) as resp:
            chunks, size = [], 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_reply_bytes:
                    raise UpstreamReplyTooLarge(self.max_reply_bytes)
                chunks.append(chunk)
            return UpstreamReply(resp.status_code, resp.reason_phrase, b"".join(chunks))

    def _http_error(self, resp: UpstreamReply, payload: Any) -> EngineError:
        status = resp.status
        # Never empty (a harness shows it to the operator), and never echoing engine credentials.
        message = shown_url(
            _error_message(payload)
            or resp.body[:200].decode("utf-8", "replace").strip()
            or resp.reason
            or f"HTTP {status} with an empty body"
        )
        if status in PASSTHROUGH_STATUS:
            param = (
                payload.get("error", {}).get("param")
                if isinstance(payload, dict) and isinstance(payload.get("error"), dict)
                else None
            )
            kind: ErrorKind = (
                "context_length"
                if (param == "input_tokens" or _CONTEXT_LENGTH.search(message))
                else "upstream_4xx"
            )
            return EngineError(
                kind,
                status,
                message,
                self.shown,
                param=param if isinstance(param, str) else None,
                upstream_status=status,
            )
        kind = "upstream_4xx" if status < 500 else "upstream_5xx"
        return EngineError(
            kind,
            502,
            f"engine at {self.shown} answered HTTP {status}: {message}",
            self.shown,
            upstream_status=status,
        )

    async def aclose(self) -> None:
        """Close the pooled connections (only if this client created them)."""
        if self._owns_http:
            self._closed = True
            if self._lean is not None:
                self._lean.close()
            if self._http is not None:
                await self._http.aclose()


def _why(exc: BaseException) -> str:
    """What went wrong, never empty (httpx's ReadError/WriteError often carry no text)."""
    text = str(exc).strip()
    return (
        text
        if isinstance(exc, (UpstreamTimeout, UpstreamUnreachable)) and text
        else f"{type(exc).__name__}: {text}"
        if text
        else type(exc).__name__
    )


_SSL: list[ssl.SSLContext] = []


def _shared_ssl() -> ssl.SSLContext:
    """One verifying context for every engine: building one costs ~15 ms."""
    if not _SSL:
        _SSL.append(httpx.create_ssl_context())
    return _SSL[0]


def _behind_env_proxy(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    proxies = urllib.request.getproxies()
    return bool(proxies.get(urlsplit(url).scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(
        host
    )


def _error_message(payload: Any) -> str | None:
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            value = payload.get(key)
            if isinstance(value, str):
                return value
    return None
