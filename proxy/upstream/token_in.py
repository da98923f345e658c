"""Token-in continuation: a call that extends a held conversation continues from its stored ids.

Sampled text does not always re-tokenise to the ids the model sampled (non-canonical merges, a
reply cut mid-character, special tokens dropped from the content, an end token added after a
`length` cut), so a text prompt built from the harness's messages can break the token prefix and
split one conversation into several training rows. When a call's messages are a held turn's
messages plus its reply plus new messages, the proxy builds the prompt ids itself:

    stored prompt ids + sampled ids (exactly as sampled) + the template's close of the assistant
    turn (less an end token the model already sampled) + the ids of the new messages

and asks the engine to continue from them (`/v1/completions` with a token-id prompt). The pieces
after the sampled ids come from the engine's own template and tokenizer (`/tokenize` with
messages), split only at message boundaries, so no sampled text is ever re-tokenised:

* new messages = render(all messages, generation prompt) minus render(messages up to and including
  the held reply, no generation prompt); the shorter must be an exact prefix of the longer;
* close = render(history + an empty assistant message) minus render(history, generation prompt);
  the held render must end with it.

Any check that fails falls back to the text path, with the reason recorded. The reply is turned
back into the chat completion the engine's chat route would have given, so the harness sees the
same reply in its own dialect.

Calls with tools: the tools block is rendered into the ids by the engine's template (`/tokenize`
gets the call's `tools`), and the reply's tool calls are parsed here with the parser the engine's
chat route runs (`EngineSpec.tool_call_parser`, one implementation shared with the embedded
engine: `proxy/upstream/toolcalls.py`), decoded the way that parser asks (special tokens kept). They stay on
the text path when the parser is unknown, when `tool_choice` forces a call (vLLM then constrains
decoding on the chat route) and for legacy `functions`. An engine running a reasoning parser sends
every call as text: its chat route splits the reasoning out of the reply, its completions route
does not, and the harness would get the reasoning as content. With no reasoning parser named, the
session's first call asks the engine's tokenizer whether the model has reasoning markers
(`proxy/upstream/reasoning.py`); if it has, every call goes by text (`reasoning_unparsed`) and the session
gets a finding naming the flag to set.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tapdeck.proxy.capture.tokens import PromptIdsMemo
from tapdeck.proxy.http.token_counts import tokenize_url
from tapdeck.proxy.upstream.client import (
    PASSTHROUGH_STATUS,
    EngineClient,
    EngineError,
)
from tapdeck.proxy.upstream.reasoning import ENGINE_MARKERS, MarkerCache, Markers
from tapdeck.proxy.upstream.toolcalls import TOOL_PARSERS, ToolParser, parses_tools
from tapdeck.schema.findings import Finding

if TYPE_CHECKING:
    from tapdeck.proxy.capture.graph import RolloutGraph

DIFF_WINDOW = 64
"""Ids kept per side of the window where the text path and the token-in prompt differ."""
COMPLETION_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "max_tokens",
    "stop_token_ids",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "min_tokens",
)
"""Sampling fields that carry over from the prepared chat body to the completion request."""
NO_LOCK = nullcontext()
"""`plan`'s lock when the caller has none (a nullcontext is reusable)."""


class BoundaryError(Exception):
    """The template's renders do not split at a message boundary the way token-in needs."""


@dataclass
class Plan:
    """How one call is sent: `prompt_ids` for token-in, None for the text path; `record` says why
    and, for token-in, how the prompt differs from the one the text path would have sent."""

    prompt_ids: list[int] | None
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def text(cls, reason: str, **extra: Any) -> Plan:
        """A text-path call, with the reason token-in was not used."""
        return cls(None, {"mode": "text", "reason": reason, **extra})


def difference(text_ids: list[int], ids: list[int]) -> dict[str, Any]:
    """Where two prompts differ: the first differing index, the common tail's length and the
    differing windows (at most DIFF_WINDOW ids each); `same` when they are equal."""
    m = min(len(text_ids), len(ids))
    a, b = np.asarray(text_ids[:m]), np.asarray(ids[:m])
    diff = np.flatnonzero(a != b)
    start = int(diff[0]) if diff.size else m
    if start == len(text_ids) == len(ids):
        return {"same": True, "text_len": len(text_ids), "ids_len": len(ids)}
    tail = 0
    while tail < len(text_ids) - start and tail < len(ids) - start and text_ids[-1 - tail] == ids[-1 - tail]:
        tail += 1
    return {
        "same": False,
        "text_len": len(text_ids),
        "ids_len": len(ids),
        "diverge_at": start,
        "common_tail": tail,
        "text_window": text_ids[start : len(text_ids) - tail][:DIFF_WINDOW],
        "ids_window": ids[start : len(ids) - tail][:DIFF_WINDOW],
    }


def _strip_prefix(longer: list[int], shorter: list[int], what: str) -> list[int]:
    if longer[: len(shorter)] != shorter:
        raise BoundaryError(f"{what}: the shorter render is not a prefix of the longer")
    return longer[len(shorter) :]


def assistant_close(history_gen: list[int], history_empty: list[int]) -> list[int]:
    """What the template puts after an assistant message's content (`<|im_end|>\\n` in ChatML):
    the render of history + an empty assistant message beyond the render of history with the
    generation prompt."""
    close = _strip_prefix(history_empty, history_gen, "assistant close")
    if not close:
        raise BoundaryError("assistant close: the template closes an assistant message with nothing")
    return close


def continuation_ids(
    stored: list[int],
    sampled: list[int],
    finish_reason: str | None,
    close: list[int],
    held_render: list[int],
    full_render: list[int],
) -> list[int]:
    """The token-in prompt: the held turn's ids (`stored` = its prompt + sampled ids), the
    template's close of its reply (without an end token the model sampled itself), then the new
    messages' ids with the generation prompt."""
    if held_render[-len(close) :] != close:
        raise BoundaryError("the held conversation's render does not end with the assistant close")
    new = _strip_prefix(full_render, held_render, "new messages")
    if not new:
        raise BoundaryError("no new messages after the held reply")
    glue = close
    if finish_reason != "length" and sampled and sampled[-1] == close[0]:
        glue = close[1:]
    return [*stored, *glue, *new]


def completion_as_chat(
    reply: Mapping[str, Any], top_k: int, parser: ToolParser | None = None
) -> dict[str, Any]:
    """A `/v1/completions` reply (token-id prompt) shaped as the chat completion the engine's chat
    route would have returned: the message (tool calls parsed by `parser` when the call offered
    tools, `finish_reason` then `tool_calls`), chat logprobs and top-level `prompt_token_ids`."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise EngineError("bad_reply", 502, "engine answered a token-id completion without choices", "")
    c = choices[0]
    legacy = c.get("logprobs") if isinstance(c.get("logprobs"), Mapping) else None
    content = None
    if legacy is not None:
        tops = legacy.get("top_logprobs") or []
        content = []
        for i, (tok, lp) in enumerate(
            zip(legacy.get("tokens") or [], legacy.get("token_logprobs") or [], strict=False)
        ):
            alts = tops[i] if i < len(tops) and isinstance(tops[i], Mapping) else {}
            # The legacy map holds the sampled token and the k best; the chat route lists the k best.
            best = sorted(alts.items(), key=lambda kv: -kv[1])[:top_k]
            content.append(
                {
                    "token": tok,
                    "logprob": lp,
                    "bytes": list(str(tok).encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": v, "bytes": list(str(t).encode())} for t, v in best
                    ],
                }
            )
    text, finish = c.get("text") or "", c.get("finish_reason")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if parser is not None:
        parsed = parser.parse(text)
        message["content"] = parsed.content
        if parsed.tool_calls:  # vLLM 0.32 leaves the key out of a reply without calls
            message["tool_calls"] = parsed.tool_calls
            finish = "tool_calls"
    message["reasoning"] = None
    return {
        "id": str(reply.get("id", "")).replace("cmpl-", "chatcmpl-", 1),
        "object": "chat.completion",
        "created": reply.get("created", int(time.time())),
        "model": reply.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None if content is None else {"content": content},
                "finish_reason": finish,
                "stop_reason": c.get("stop_reason"),
                "token_ids": c.get("token_ids"),
                "routed_experts": c.get("routed_experts"),
            }
        ],
        "service_tier": reply.get("service_tier"),
        "system_fingerprint": reply.get("system_fingerprint"),
        "usage": reply.get("usage"),
        "prompt_logprobs": None,
        "prompt_token_ids": c.get("prompt_token_ids") or reply.get("prompt_token_ids"),
        "prompt_text": None,
        **{k: reply.get(k) for k in ("kv_transfer_params", "ec_transfer_params", "metrics")},
    }


class TokenIn:
    """A session's token-in mode: plans each call, and sends the token-in ones."""

    def __init__(
        self,
        client: EngineClient,
        *,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        marker_cache: MarkerCache = ENGINE_MARKERS,
    ) -> None:
        self.client = client
        self.marker_cache = marker_cache
        self.markers: Markers | None = None
        """The engine's reasoning markers, learnt at the first call when no parser is named."""
        self._finding_due = False
        self.tool_parser = tool_parser
        """The engine's tool-call parser by name (`EngineSpec.tool_call_parser`)."""
        self.reasoning_parser = reasoning_parser
        self._close: list[int] | None = None
        self.unsupported: str | None = None
        """Set when the engine could not tokenize chat messages: every later call takes text."""

    def _tools_plan(self, upstream: Mapping[str, Any]) -> Plan | ToolParser | None:
        """For a call offering tools: the parser its reply needs (None: the chat route would not
        parse it), or the text plan when token-in cannot give what the chat route gives."""
        if upstream.get("functions"):
            return Plan.text("functions")
        choice = upstream.get("tool_choice")
        if choice not in (None, "auto", "none"):
            return Plan.text(
                "tool_choice_forced",
                detail=f"tool_choice {choice!r}: the chat route constrains decoding to a call",
            )
        if not parses_tools(upstream):
            return None
        parser = TOOL_PARSERS.get(self.tool_parser or "")
        if parser is None:
            detail = (
                f"tapdeck has no {self.tool_parser!r} parser (known: {', '.join(sorted(TOOL_PARSERS))})"
                if self.tool_parser
                else "the engine's tool-call parser is not configured"
            )
            return Plan.text("tool_parser_unknown", detail=detail)
        return parser

    async def _tokenize(self, upstream: Mapping[str, Any], messages: list[Any], gen: bool) -> list[int]:
        body: dict[str, Any] = {
            "model": upstream.get("model"),
            "messages": messages,
            "add_generation_prompt": gen,
        }
        if upstream.get("tools"):
            body["tools"] = upstream["tools"]
        if upstream.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = upstream["chat_template_kwargs"]
        reply = await self.client.post(tokenize_url(self.client.url), body)
        tokens = reply.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise EngineError("bad_reply", 502, "/tokenize answered without a `tokens` list", self.client.url)
        return tokens

    async def plan(
        self,
        graph: RolloutGraph,
        request: Mapping[str, Any],
        upstream: Mapping[str, Any],
        lock: AbstractContextManager[Any] = NO_LOCK,
        offload: Callable[..., Awaitable[Any]] = asyncio.to_thread,
    ) -> Plan:
        """Token-in when `request` (the harness's messages) extends a held turn, else text.

        `graph` is read under `lock` by `offload` (a thread: the service passes the store's own
        executor, whose threads commit under that lock and are never held by slow readers)."""
        if self.unsupported:
            return Plan.text("engine_unsupported", detail=self.unsupported)
        if self.reasoning_parser:
            return Plan.text(
                "reasoning_parser",
                detail=f"the engine runs the {self.reasoning_parser!r} "
                "reasoning parser on its chat route only",
            )
        if self.markers is None:
            markers = await self.marker_cache.markers(self.client, upstream.get("model"))
            if self.markers is None:  # a concurrent first call may have learnt them meanwhile
                self.markers, self._finding_due = markers, bool(markers.found)
        if self.markers.found:
            return Plan.text(
                "reasoning_unparsed",
                detail=f"reasoning markers {self.markers.describe()} and no reasoning parser configured",
            )
        parser = None
        if upstream.get("tools") or upstream.get("functions"):
            tools = self._tools_plan(upstream)
            if isinstance(tools, Plan):
                return tools
            parser = tools
        if upstream.get("continue_final_message"):
            # A prefill (an Anthropic last assistant text) stays open; held ids would close it.
            return Plan.text("continue_final_message")
        found = await offload(_held_read, graph, dict(request), lock)
        if found is None:
            return Plan.text("not_held")
        seq, new_count, stored, sampled, finish = found
        messages = list(upstream.get("messages") or [])
        cut = len(messages) - new_count
        try:
            full, held_render = await asyncio.gather(
                self._tokenize(upstream, messages, True), self._tokenize(upstream, messages[:cut], False)
            )
            if self._close is None:
                history = messages[: cut - 1]
                self._close = assistant_close(
                    await self._tokenize(upstream, history, True),
                    await self._tokenize(upstream, [*history, {"role": "assistant", "content": ""}], False),
                )
            ids = continuation_ids(stored, sampled, finish, self._close, held_render, full)
        except EngineError as exc:
            # No such route (a 404 comes back as a 502 `upstream_4xx`) or no token list: the
            # engine cannot tokenize messages. A 400 is about these messages only.
            if exc.kind == "bad_reply" or (
                exc.kind == "upstream_4xx" and exc.status not in PASSTHROUGH_STATUS
            ):
                self.unsupported = f"/tokenize: {exc.message}"
                return Plan.text("engine_unsupported", detail=self.unsupported)
            return Plan.text("tokenize_failed", detail=exc.message, extends=seq)
        except BoundaryError as exc:
            return Plan.text("template_boundary", detail=str(exc), extends=seq)
        record = {"mode": "ids", "extends": seq, **difference(full, ids)}
        if parser is not None:
            record["tool_parser"] = parser.name
        return Plan(ids, record)

    def take_finding(self) -> Finding | None:
        """The session finding for reasoning markers without a parser, once per session."""
        if not self._finding_due or self.markers is None:
            return None
        self._finding_due = False
        return self.markers.finding()

    def reply_finding(self, reply: Mapping[str, Any]) -> Finding | None:
        """A turn finding when the reply's sampled ids hold reasoning markers the engine's chat
        route did not split out (no reasoning parser configured)."""
        if self.markers is None or self.reasoning_parser:
            return None
        choices = reply.get("choices") or [{}]
        sampled = choices[0].get("token_ids") if isinstance(choices[0], Mapping) else None
        return self.markers.reply_finding(sampled if isinstance(sampled, list) else None)

    async def send(
        self, upstream: Mapping[str, Any], plan: Plan, memo: PromptIdsMemo | None = None
    ) -> tuple[dict[str, Any], Plan]:
        """The engine's reply to `plan` (as a chat completion) and the plan it followed: an engine
        that refuses token-id prompts gets this call, and every later one, as text (`memo`: the
        session's last prompt ids, see `EngineClient.complete`)."""
        if plan.prompt_ids is None:
            return await self.client.complete(upstream, memo), plan
        try:
            return await self.complete(upstream, plan), plan
        except EngineError as exc:
            if exc.kind != "upstream_4xx":
                raise
            self.unsupported = f"token-id completion refused: {exc.message}"
            fallback = Plan.text("engine_refused_ids", detail=exc.message, extends=plan.record.get("extends"))
            return await self.client.complete(upstream, memo), fallback

    async def complete(self, upstream: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
        """Send `plan`'s ids as a completion prompt; the reply as a chat completion."""
        assert plan.prompt_ids is not None
        body: dict[str, Any] = {k: upstream[k] for k in COMPLETION_KEYS if k in upstream}
        if "max_tokens" not in body and upstream.get("max_completion_tokens") is not None:
            body["max_tokens"] = upstream["max_completion_tokens"]
        top_k = int(upstream.get("top_logprobs") or 0)
        body.update(model=upstream.get("model"), prompt=plan.prompt_ids, stream=False)
        if upstream.get("return_token_ids"):
            body.update(return_token_ids=True, logprobs=top_k)
        parser = TOOL_PARSERS.get(plan.record.get("tool_parser") or "")
        if parser is not None and parser.keeps_special_tokens:
            body["skip_special_tokens"] = False
        reply = await self.client.post("/completions", body)
        chat = completion_as_chat(reply, top_k, parser)
        chat["usage"] = reply.get("usage")
        return chat


def _held_read(
    graph: RolloutGraph, request: dict[str, Any], lock: AbstractContextManager[Any]
) -> tuple[int, int, list[int], list[int], str | None] | None:
    """Under `lock`: the held turn `request` extends (its seq, how many messages are new, its full
    stored ids, its sampled ids, its finish reason), or None."""
    with lock:
        held = graph.held_turn(request)
        if held is None:
            return None
        seq, new_count = held
        node = graph.nodes[seq]
        sampled = node.sampled.tolist() if node.sampled is not None else []
        return seq, new_count, graph.full_sequence(seq).tolist(), sampled, node.turn.finish_reason
