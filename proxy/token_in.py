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
back into a chat completion, so the harness sees the same text in its own dialect. Calls with
tools stay on the text path: the engine parses tool calls only on its chat route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tapdeck.proxy.aux import tokenize_url
from tapdeck.proxy.engine_client import (
    PASSTHROUGH_STATUS,
    EngineClient,
    EngineError,
    zero_filled_usage,
)

if TYPE_CHECKING:
    from tapdeck.proxy.graph import RolloutGraph

DIFF_WINDOW = 64
"""Ids kept per side of the window where the text path and the token-in prompt differ."""
COMPLETION_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                   "presence_penalty", "repetition_penalty", "seed", "stop", "max_tokens")
"""Sampling fields that carry over from the prepared chat body to the completion request."""


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
    while (tail < len(text_ids) - start and tail < len(ids) - start
           and text_ids[-1 - tail] == ids[-1 - tail]):
        tail += 1
    return {"same": False, "text_len": len(text_ids), "ids_len": len(ids), "diverge_at": start,
            "common_tail": tail,
            "text_window": text_ids[start:len(text_ids) - tail][:DIFF_WINDOW],
            "ids_window": ids[start:len(ids) - tail][:DIFF_WINDOW]}


def _strip_prefix(longer: list[int], shorter: list[int], what: str) -> list[int]:
    if longer[:len(shorter)] != shorter:
        raise BoundaryError(f"{what}: the shorter render is not a prefix of the longer")
    return longer[len(shorter):]


def assistant_close(history_gen: list[int], history_empty: list[int]) -> list[int]:
    """What the template puts after an assistant message's content (`<|im_end|>\\n` in ChatML):
    the render of history + an empty assistant message beyond the render of history with the
    generation prompt."""
    close = _strip_prefix(history_empty, history_gen, "assistant close")
    if not close:
        raise BoundaryError("assistant close: the template closes an assistant message with nothing")
    return close


def continuation_ids(stored: list[int], sampled: list[int], finish_reason: str | None,
                     close: list[int], held_render: list[int], full_render: list[int]) -> list[int]:
    """The token-in prompt: the held turn's ids (`stored` = its prompt + sampled ids), the
    template's close of its reply (without an end token the model sampled itself), then the new
    messages' ids with the generation prompt."""
    if held_render[-len(close):] != close:
        raise BoundaryError("the held conversation's render does not end with the assistant close")
    new = _strip_prefix(full_render, held_render, "new messages")
    if not new:
        raise BoundaryError("no new messages after the held reply")
    glue = close
    if finish_reason != "length" and sampled and sampled[-1] == close[0]:
        glue = close[1:]
    return [*stored, *glue, *new]


def completion_as_chat(reply: Mapping[str, Any], top_k: int) -> dict[str, Any]:
    """A `/v1/completions` reply (token-id prompt) shaped as the chat completion the text path
    would have returned: message content, chat logprobs, top-level `prompt_token_ids`."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise EngineError("bad_reply", 502, "engine answered a token-id completion without choices",
                          "")
    c = choices[0]
    legacy = c.get("logprobs") if isinstance(c.get("logprobs"), Mapping) else None
    content = None
    if legacy is not None:
        tops = legacy.get("top_logprobs") or []
        content = []
        for i, (tok, lp) in enumerate(zip(legacy.get("tokens") or [], legacy.get("token_logprobs") or [])):
            alts = tops[i] if i < len(tops) and isinstance(tops[i], Mapping) else {}
            content.append({"token": tok, "logprob": lp, "bytes": list(str(tok).encode()),
                            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(str(t).encode())}
                                             for t, v in list(alts.items())[:top_k]]})
    return {
        "id": str(reply.get("id", "")).replace("cmpl-", "chatcmpl-", 1),
        "object": "chat.completion", "created": reply.get("created", int(time.time())),
        "model": reply.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.get("text") or ""},
                     "logprobs": None if content is None else {"content": content},
                     "finish_reason": c.get("finish_reason"), "stop_reason": c.get("stop_reason"),
                     "token_ids": c.get("token_ids")}],
        "prompt_token_ids": c.get("prompt_token_ids") or reply.get("prompt_token_ids"),
        "usage": reply.get("usage"),
    }


class TokenIn:
    """A session's token-in mode: plans each call, and sends the token-in ones."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self._close: list[int] | None = None
        self.unsupported: str | None = None
        """Set when the engine could not tokenize chat messages: every later call takes text."""

    async def _tokenize(self, upstream: Mapping[str, Any], messages: list[Any], gen: bool) -> list[int]:
        body: dict[str, Any] = {"model": upstream.get("model"), "messages": messages,
                                "add_generation_prompt": gen}
        if upstream.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = upstream["chat_template_kwargs"]
        reply = await self.client.post(tokenize_url(self.client.url), body)
        tokens = reply.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise EngineError("bad_reply", 502, "/tokenize answered without a `tokens` list",
                              self.client.url)
        return tokens

    async def plan(self, graph: RolloutGraph, request: Mapping[str, Any],
                   upstream: Mapping[str, Any],
                   lock: AbstractContextManager[Any] = nullcontext(),
                   offload: Callable[..., Awaitable[Any]] = asyncio.to_thread) -> Plan:
        """Token-in when `request` (the harness's messages) extends a held turn, else text.

        `graph` is read under `lock` by `offload` (a thread: the service passes the store's own
        executor, whose threads commit under that lock and are never held by slow readers)."""
        if self.unsupported:
            return Plan.text("engine_unsupported", detail=self.unsupported)
        if upstream.get("tools") or upstream.get("functions"):
            return Plan.text("tools")
        found = await offload(_held_read, graph, dict(request), lock)
        if found is None:
            return Plan.text("not_held")
        seq, new_count, stored, sampled, finish = found
        messages = list(upstream.get("messages") or [])
        cut = len(messages) - new_count
        try:
            full, held_render = await asyncio.gather(
                self._tokenize(upstream, messages, True),
                self._tokenize(upstream, messages[:cut], False))
            if self._close is None:
                history = messages[:cut - 1]
                self._close = assistant_close(
                    await self._tokenize(upstream, history, True),
                    await self._tokenize(upstream, [*history, {"role": "assistant", "content": ""}],
                                         False))
            ids = continuation_ids(stored, sampled, finish, self._close, held_render, full)
        except EngineError as exc:
            # No such route (a 404 comes back as a 502 `upstream_4xx`) or no token list: the
            # engine cannot tokenize messages. A 400 is about these messages only.
            if exc.kind == "bad_reply" or (exc.kind == "upstream_4xx"
                                           and exc.status not in PASSTHROUGH_STATUS):
                self.unsupported = f"/tokenize: {exc.message}"
                return Plan.text("engine_unsupported", detail=self.unsupported)
            return Plan.text("tokenize_failed", detail=exc.message, extends=seq)
        except BoundaryError as exc:
            return Plan.text("template_boundary", detail=str(exc), extends=seq)
        return Plan(ids, {"mode": "ids", "extends": seq, **difference(full, ids)})

    async def send(self, upstream: Mapping[str, Any], plan: Plan) -> tuple[dict[str, Any], Plan]:
        """The engine's reply to `plan` (as a chat completion) and the plan it followed: an engine
        that refuses token-id prompts gets this call, and every later one, as text."""
        if plan.prompt_ids is None:
            return await self.client.complete(upstream), plan
        try:
            return await self.complete(upstream, plan), plan
        except EngineError as exc:
            if exc.kind != "upstream_4xx":
                raise
            self.unsupported = f"token-id completion refused: {exc.message}"
            fallback = Plan.text("engine_refused_ids", detail=exc.message,
                                 extends=plan.record.get("extends"))
            return await self.client.complete(upstream), fallback

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
        reply = await self.client.post("/completions", body)
        chat = completion_as_chat(reply, top_k)
        chat["usage"] = zero_filled_usage(reply.get("usage"))
        return chat


def _held_read(graph: RolloutGraph, request: dict[str, Any],
               lock: AbstractContextManager[Any]) -> tuple[int, int, list[int], list[int], str | None] | None:
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
