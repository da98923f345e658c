"""Reasoning markers: whether the engine's model thinks in a block its chat route would split out.

A reasoning model samples its thinking between markers (`<think>` … `</think>` and the other
families vLLM's reasoning parsers know). vLLM splits that block into `reasoning_content` only on
its chat route and only when it runs a reasoning parser; it does not say whether it runs one. So
with no parser named here, a continued (token-in) call would hand the harness the thinking as
content, and so does the engine's own chat route.

What is learnt comes from the engine, never from the model's name: one `/tokenize` call of every
known marker, separated by newlines, with `return_token_strs`. A tokenizer that holds a marker as
one added token splits it out before any merge, so the marker comes back as one token whose text
is the marker itself; a tokenizer without it breaks the marker into pieces (`<`, `think`, `>`).
A family counts when both of its markers are single tokens. The answer is cached per engine and
model, so a session's first token-in attempt pays one call and later sessions none.

Limits: a family that marks reasoning with plain text (granite's "Here is my thought process:")
has no token to find; an engine whose `/tokenize` gives no `token_strs` is recorded as unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tapdeck.proxy.http.token_counts import tokenize_url
from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.schema.findings import Finding

MARKER_FAMILIES: dict[str, tuple[str, str]] = {
    "think": ("<think>", "</think>"),
    "seed_think": ("<seed:think>", "</seed:think>"),
    "mm_think": ("<mm:think>", "</mm:think>"),
    "cohere_thinking": ("<|START_THINKING|>", "<|END_THINKING|>"),
    "mistral_think": ("[THINK]", "[/THINK]"),
    "gemma_channel": ("<|channel>", "<channel|>"),
    "harmony_channel": ("<|channel|>", "<|message|>"),
}
"""Open and close marker of each family vLLM 0.32's reasoning parsers split on (read from
`vllm/reasoning` and `vllm/parser`): `<think>` serves deepseek_r1, qwen3, glm45, step3, minimax_m2,
hunyuan, olmo3 and others; `<seed:think>` seed_oss; `<mm:think>` minimax_m3; the cohere pair
cohere_command3/4; `[THINK]` mistral; gemma4's channel pair; gpt-oss's harmony channels."""

PARSER_HINT: dict[str, str] = {
    "think": "deepseek_r1, qwen3 or another <think> parser",
    "seed_think": "seed_oss",
    "mm_think": "minimax_m3",
    "cohere_thinking": "cohere_command3 or cohere_command4",
    "mistral_think": "mistral",
    "gemma_channel": "gemma4",
    "harmony_channel": "openai_gptoss",
}
"""The vLLM reasoning parser names an operator chooses from, per family."""


@dataclass(frozen=True)
class Markers:
    """What the engine's tokenizer says about reasoning markers.

    `known` is False when the engine could not tell (no `/tokenize`, no `token_strs`); `found`
    maps each family whose markers are single tokens to their (open, close) ids."""

    known: bool
    found: Mapping[str, tuple[int, int]]
    detail: str = ""

    @property
    def ids(self) -> frozenset[int]:
        """Every marker id found."""
        return frozenset(i for pair in self.found.values() for i in pair)

    def describe(self) -> str:
        """The found markers as text: `<think>`=151667/`</think>`=151668."""
        return ", ".join(
            f"{MARKER_FAMILIES[f][0]}={o}/{MARKER_FAMILIES[f][1]}={c}" for f, (o, c) in self.found.items()
        )

    def finding(self) -> Finding:
        """The session finding for markers found with no reasoning parser configured."""
        families = list(self.found)
        hint = "; ".join(PARSER_HINT[f] for f in families)
        pair = MARKER_FAMILIES[families[0]]
        return Finding.warn(
            "reasoning_unparsed",
            f"this model's tokenizer has reasoning markers ({self.describe()}): it can emit "
            f"{pair[0]}…{pair[1]}, and with no reasoning parser the harness gets that thinking as "
            f"content. Start tapdeck with --engine-reasoning-parser NAME matching the engine's "
            f"--reasoning-parser (for this family: {hint}); until then every call goes by text",
        )

    def reply_finding(self, sampled: Sequence[int] | None) -> Finding | None:
        """A turn finding when `sampled` holds a marker id: the reply's thinking reached the
        harness as content."""
        if not sampled or not self.found:
            return None
        ids = self.ids
        hits = [i for i in sampled if i in ids]
        if not hits:
            return None
        return Finding.warn(
            "reasoning_in_content",
            f"the reply's sampled ids hold {len(hits)} reasoning marker(s) ({self.describe()}) and "
            f"no reasoning parser is configured: the harness got the thinking as content",
        )


def read_markers(reply: Mapping[str, Any]) -> Markers:
    """The families whose markers are single tokens in a `/tokenize` reply to `probe_body`."""
    tokens, strs = reply.get("tokens"), reply.get("token_strs")
    if not isinstance(tokens, list) or not isinstance(strs, list) or len(tokens) != len(strs):
        return Markers(False, {}, "/tokenize gave no token_strs")
    single = {s: t for t, s in zip(tokens, strs, strict=True) if isinstance(s, str) and type(t) is int}
    found = {
        family: (single[o], single[c])
        for family, (o, c) in MARKER_FAMILIES.items()
        if o in single and c in single and single[o] != single[c]
    }
    return Markers(True, found)


def probe_body(model: Any) -> dict[str, Any]:
    """The one `/tokenize` request that asks for every known marker."""
    text = "\n".join(m for pair in MARKER_FAMILIES.values() for m in pair)
    return {"model": model, "prompt": text, "add_special_tokens": False, "return_token_strs": True}


class MarkerCache:
    """Markers per engine URL and model: each engine is asked once."""

    def __init__(self, known: Mapping[tuple[str, str], Markers] | None = None) -> None:
        self._known: dict[tuple[str, str], Markers] = dict(known or {})
        """Markers by (engine URL, model); `known` holds engines already asked."""

    async def markers(self, client: EngineClient, model: Any) -> Markers:
        """The engine's markers for `model`, asked on first use. A failed ask is not cached (the
        session that asked keeps "unknown"; the next session asks again)."""
        key = (client.url, str(model))
        cached = self._known.get(key)
        if cached is not None:
            return cached
        try:
            reply = await client.post(tokenize_url(client.url), probe_body(model))
        except EngineError as exc:
            return Markers(False, {}, f"/tokenize: {exc.message}")
        self._known[key] = found = read_markers(reply)
        return found


ENGINE_MARKERS = MarkerCache()
"""The process's cache (engines outlive sessions)."""
