"""Capture tiers: what an engine can give back, found out by probing it once.

* `tokens`   — prompt ids, sampled ids and per-token logprobs: trainable.
* `logprobs` — logprobs without ids: evaluation only.
* `text`     — neither. Also the answer for an unprobed, failed, unreachable or ambiguous engine:
  the proxy never assumes the stronger tier.

A second probe tells whether the engine's logprobs are *processed* (log-softmax of logits/T, what a
trainer recomputes) or *raw* (before temperature). Absolute values cannot tell them apart (a
data-parallel engine differs run to run), but the gap between two fixed tokens at a fixed context
halves from T=1 to T=2 when logprobs are processed and stays put when they are raw.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict

from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.schema.findings import Finding
from tapdeck.schema.sessions import Tier, is_embedded_engine

LogprobsMode = Literal["processed", "raw", "unknown"]

PROBE_MESSAGES = [{"role": "user", "content": "Name one prime number."}]
"""A prompt every chat model answers; its first token has a few clear candidates."""
RATIO_TOP_LOGPROBS = 5
RATIO_SEED = 9
MIN_T1_GAP = 0.5
"""Below this the T=1 gap is too close to bf16 rounding for a halving to be read reliably."""
RUNNER_UP_FLOOR = -100.0
"""vLLM clamps logprobs to -9999; a runner-up down there carries no information."""
RATIO_TOLERANCE = 0.2


class EngineSpec(BaseModel):
    """An OpenAI-compatible engine: base URL (ending in /v1), model name (None = the one it serves)
    and API key."""

    model_config = ConfigDict(frozen=True)

    url: str
    model: str | None = None
    api_key: str | None = None
    tool_call_parser: str | None = None
    """The parser the engine's chat route applies to tool calls (vLLM's `--tool-call-parser`;
    `proxy/upstream/toolcalls.py` holds those tapdeck knows). None: unknown, so token-in capture sends calls
    with tools as text."""
    reasoning_parser: str | None = None
    """vLLM's `--reasoning-parser` when the engine runs one: its chat route splits reasoning out of
    the reply and the completions route does not, so token-in capture sends every call as text."""

    @property
    def base_url(self) -> str:
        """The URL without a trailing slash."""
        return self.url.rstrip("/")

    def cache_key(self) -> tuple[str, str | None, str]:
        """(url, model, key hash): the key never sits in memory as a dict key or in a log."""
        digest = hashlib.sha256((self.api_key or "").encode()).hexdigest()
        return (self.base_url, self.model, digest)

    def __repr__(self) -> str:  # keys are never logged
        return (
            f"EngineSpec(url={self.url!r}, model={self.model!r}, api_key={'***' if self.api_key else None})"
        )

    __str__ = __repr__


@dataclass(frozen=True)
class ProbeResult:
    """What one engine supports."""

    tier: Tier
    served_model: str | None
    logprobs_mode: LogprobsMode
    max_model_len: int | None
    detail: str
    findings: list[Finding] = field(default_factory=list)
    measured_tier: Tier | None = None
    """The tier the capture call showed, before any demotion for raw logprobs."""
    cacheable: bool = True
    """False when the engine could not be reached: the next session probes again."""
    alternatives: int = 0
    """Top alternatives per token the engine gave the probe (0: it refused them): the most a
    session may capture for inspection."""
    system_fingerprint: str | None = None
    """What the engine's reply to the probe names it (vLLM `vllm-<version>-…`, tapdeck's embedded
    engine `tapdeck-embedded-<version>`; None: it does not say)."""


def classify_logprobs_mode(
    t1: Mapping[str, Any], t2: Mapping[str, Any], *, min_gap: float | None = None
) -> tuple[LogprobsMode, str]:
    """Compare one position's logprob entries (same context) sampled at T=1 and T=2.

    Tokens are matched by name, not list position: vLLM puts the sampled token first and may cut
    the true runner-up. The gap is between the T=1 top token and the lowest-ranked alternative
    present in both replies (with top_logprobs 2 that is the top-2 gap).
    `min_gap` defaults to MIN_T1_GAP.
    """
    min_gap = MIN_T1_GAP if min_gap is None else min_gap

    def table(entry: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or []:
            lp = alt.get("logprob")
            if isinstance(lp, (int, float)) and math.isfinite(lp):
                out.setdefault(str(alt.get("token")), float(lp))
        return out

    at1, at2 = table(t1), table(t2)
    if len(at1) < 2:
        return "unknown", "the T=1 reply has fewer than two alternatives"
    ranked = sorted(at1, key=at1.__getitem__, reverse=True)
    first = ranked[0]
    if first not in at2:
        return "unknown", f"the T=1 top token {first!r} is not among the T=2 alternatives"
    shared = [t for t in ranked[1:] if t in at2 and min(at1[t], at2[t]) >= RUNNER_UP_FLOOR]
    if not shared:
        return "unknown", (
            f"no usable runner-up to {first!r} in both replies (absent, or at a clamp sentinel)"
        )
    # The farthest usable runner-up: the widest gap reads the ratio least disturbed by rounding.
    second = shared[-1]
    gap1 = at1[first] - at1[second]
    if gap1 < min_gap:
        return "unknown", f"T=1 gap {gap1:.3f} between {first!r} and {second!r} is under {min_gap}"
    ratio = (at2[first] - at2[second]) / gap1
    detail = f"gap {first!r}-{second!r}: T=1 {gap1:.4f}, T=2 ratio {ratio:.3f}"
    if abs(ratio - 0.5) <= RATIO_TOLERANCE:
        return "processed", detail
    if abs(ratio - 1.0) <= RATIO_TOLERANCE:
        return "raw", detail
    return "unknown", detail


def apply_raw_policy(result: ProbeResult, *, allow_raw_logprobs: bool) -> ProbeResult:
    """Raw logprobs do not match what a trainer recomputes: a `tokens` engine serving them is
    demoted to `logprobs` with a FATAL finding, unless the operator explicitly allows them."""
    if result.tier is not Tier.TOKENS or result.logprobs_mode != "raw":
        return result
    if allow_raw_logprobs:
        note = Finding.warn(
            "raw_logprobs_allowed",
            "engine returns raw (pre-temperature) logprobs; kept at the tokens tier "
            "because the operator allowed it",
        )
        return dataclasses.replace(result, findings=[*result.findings, note])
    fatal = Finding.fatal(
        "raw_logprobs",
        "engine returns raw (pre-temperature) logprobs, which a trainer cannot "
        "match; demoted to the logprobs tier (start vLLM with --logprobs-mode "
        "processed_logprobs, or allow raw logprobs explicitly)",
    )
    return dataclasses.replace(result, tier=Tier.LOGPROBS, findings=[*result.findings, fatal])


class _ProbeCache:
    """One probe per (url, model, key hash); concurrent first callers await the same task.

    An answer is kept until `forget`: a call that finds the engine refusing connections drops it
    (a restart may change the engine's flags)."""

    def __init__(self) -> None:
        self._done: dict[tuple[str, str | None, str], ProbeResult] = {}
        self._running: dict[tuple[str, str | None, str], asyncio.Task[ProbeResult]] = {}

    async def get(self, spec: EngineSpec, client: EngineClient) -> ProbeResult:
        key = spec.cache_key()
        if key in self._done:
            return self._done[key]
        task = self._running.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.ensure_future(_guarded_probe(spec, client))
            self._running[key] = task
        try:
            # shield: one cancelled waiter must not cancel the probe the others are awaiting
            result = await asyncio.shield(task)
        finally:
            if task.done() and self._running.get(key) is task:
                del self._running[key]
        if result.cacheable:
            self._done[key] = result
        return result

    def forget(self, spec: EngineSpec | None = None) -> None:
        """Drop one engine's cached probe (or all of them)."""
        if spec is None:
            self._done.clear()
        else:
            self._done.pop(spec.cache_key(), None)


PROBES = _ProbeCache()


async def probe(
    spec: EngineSpec,
    client: EngineClient | httpx.AsyncClient | None = None,
    *,
    allow_raw_logprobs: bool = False,
) -> ProbeResult:
    """The engine's capture tier, probed once per (url, model, key hash) and cached.

    `client` is the engine's pooled EngineClient (or a bare httpx client to wrap). Never raises for
    an engine problem: an unreachable or misbehaving engine is the `text` tier, with the reason in
    `detail`. The raw-logprobs policy is applied per call, so sessions may differ on it.
    """
    owned = None
    if not isinstance(client, EngineClient):
        client = owned = EngineClient(spec, http=client)
    try:
        result = await PROBES.get(spec, client)
    finally:
        if owned is not None:
            await owned.aclose()
    if result.max_model_len:
        client.max_model_len = result.max_model_len
    client.embedded = is_embedded_engine(result.system_fingerprint)
    return apply_raw_policy(result, allow_raw_logprobs=allow_raw_logprobs)


def _text(
    detail: str, *, served: str | None = None, max_len: int | None = None, cacheable: bool = True
) -> ProbeResult:
    return ProbeResult(
        tier=Tier.TEXT,
        served_model=served,
        logprobs_mode="unknown",
        max_model_len=max_len,
        detail=detail,
        measured_tier=Tier.TEXT,
        cacheable=cacheable,
    )


def _pick_model(spec: EngineSpec, listing: Mapping[str, Any]) -> tuple[str | None, int | None, str]:
    """Served model name and max_model_len from a /models body; (None, None, why) if ambiguous."""
    data = [m for m in listing.get("data") or [] if isinstance(m, Mapping) and m.get("id")]
    if spec.model:
        for m in data:
            if m["id"] == spec.model:
                return spec.model, _int_or_none(m.get("max_model_len")), ""
        # Some servers list only a default name but accept aliases: let the capture call decide.
        return spec.model, None, ""
    if len(data) == 1:
        return str(data[0]["id"]), _int_or_none(data[0].get("max_model_len")), ""
    if not data:
        return None, None, "the engine lists no models and none was named"
    names = ", ".join(str(m["id"]) for m in data)
    return None, None, f"the engine serves several models ({names}) and none was named"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def _guarded_probe(spec: EngineSpec, client: EngineClient) -> ProbeResult:
    """A probe that cannot raise: an unexpected failure is the text tier, probed again next time."""
    try:
        return await _probe_engine(spec, client)
    except (EngineError, httpx.HTTPError, RuntimeError, ValueError, TypeError, KeyError) as exc:
        return _text(f"probe of {spec.base_url} failed: {type(exc).__name__}: {exc}", cacheable=False)


async def _probe_engine(spec: EngineSpec, client: EngineClient) -> ProbeResult:
    try:
        listing = await client.models()
    except EngineError as exc:
        if exc.kind in ("unreachable", "timeout") or not spec.model:
            return _text(
                f"model listing failed: {exc.message}", cacheable=exc.kind not in ("unreachable", "timeout")
            )
        listing = {"data": []}  # no /models route, but a model was named: the capture call decides
    served, max_len, why = _pick_model(spec, listing)
    if served is None:
        return _text(why)

    capture_body = {
        "model": served,
        "messages": PROBE_MESSAGES,
        "max_tokens": 1,
        "temperature": 0,
        "stream": False,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
    }
    try:
        reply = await client.complete(capture_body)
    except EngineError as exc:
        if exc.kind != "upstream_4xx":
            return _text(
                f"capture call failed: {exc.message}",
                served=served,
                max_len=max_len,
                cacheable=exc.kind not in ("unreachable", "timeout"),
            )
        # An OpenAI-compatible server that refuses the unknown `return_token_ids` field may still
        # return logprobs (the eval tier): ask once more without it.
        capture_body.pop("return_token_ids")
        try:
            reply = await client.complete(capture_body)
        except EngineError as again:
            return _text(
                f"capture call failed: {exc.message}; without return_token_ids: {again.message}",
                served=served,
                max_len=max_len,
            )
    cap = EngineClient.parse_capture(reply)
    fingerprint = reply.get("system_fingerprint")
    fingerprint = fingerprint if isinstance(fingerprint, str) else None
    has_ids = (
        cap.prompt_ids is not None
        and cap.prompt_ids.size > 0
        and cap.sampled_ids is not None
        and cap.sampled_ids.size > 0
    )
    has_logprobs = cap.logprobs is not None and cap.logprobs.size > 0
    if not has_logprobs:
        return _text("the engine returns no per-token logprobs", served=served, max_len=max_len)
    measured = Tier.TOKENS if has_ids else Tier.LOGPROBS

    mode, mode_detail, alternatives = await _ratio_probe(client, served)
    findings = list(cap.findings)
    if mode == "unknown" and measured is Tier.TOKENS:
        findings.append(
            Finding.warn(
                "logprobs_mode_unknown", f"could not tell processed from raw logprobs ({mode_detail})"
            )
        )
    what = "prompt ids, sampled ids and logprobs" if has_ids else "logprobs but no token ids"
    return ProbeResult(
        tier=measured,
        served_model=served,
        logprobs_mode=mode,
        max_model_len=max_len,
        detail=f"engine returns {what}; logprobs {mode} ({mode_detail})",
        findings=findings,
        measured_tier=measured,
        alternatives=alternatives,
        system_fingerprint=fingerprint,
    )


async def _ratio_probe(client: EngineClient, served: str) -> tuple[LogprobsMode, str, int]:
    """One generated token at T=1 and T=2 with 5 alternatives each; compare the gap between the
    top token and the farthest runner-up both replies share (see classify_logprobs_mode).

    Also returns how many alternatives the engine gave (0 when a call failed or gave none)."""
    entries: list[Mapping[str, Any]] = []
    for temperature in (1.0, 2.0):
        body = {
            "model": served,
            "messages": PROBE_MESSAGES,
            "max_tokens": 1,
            "temperature": temperature,
            "seed": RATIO_SEED,
            "stream": False,
            "logprobs": True,
            "top_logprobs": RATIO_TOP_LOGPROBS,
        }
        try:
            reply = await client.complete(body)
        except EngineError as exc:
            return "unknown", f"T={temperature} call failed: {exc.message}", 0
        content = _first_content(reply)
        if not content:
            return "unknown", f"T={temperature} reply has no logprobs", 0
        entries.append(content[0])
    given = min(len(e.get("top_logprobs") or []) for e in entries)
    return (*classify_logprobs_mode(entries[0], entries[1]), min(given, RATIO_TOP_LOGPROBS))


def _first_content(reply: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    try:
        return reply["choices"][0]["logprobs"]["content"] or []
    except (KeyError, IndexError, TypeError):
        return []
