"""Response bodies in vLLM 0.32's exact shape (see tests/fixtures/vllm/README.md).

Chat: top-level `prompt_token_ids`, per-choice `token_ids` (null unless `return_token_ids`),
`logprobs.content[]` entries `{token, logprob, bytes, top_logprobs}` with one entry per generated id
(the EOS included). Streaming: a role chunk carrying `prompt_token_ids`, one chunk per token, the
last one with `finish_reason`/`stop_reason`, an optional usage chunk, then `[DONE]`.
Legacy completions: per-choice `prompt_token_ids` and the legacy logprobs shape.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from tapdeck import __version__
from tapdeck.runner.engine.generation import Choice, TokenStep
from tapdeck.runner.engine.model import PromptScores
from tapdeck.schema.sessions import EMBEDDED_FINGERPRINT

FINGERPRINT = f"{EMBEDDED_FINGERPRINT}{__version__}"


def new_id(prefix: str) -> str:
    """A response id shaped like vLLM's (`chatcmpl-<16 hex>`)."""
    return f"{prefix}-{secrets.token_hex(8)}"


class TokenNamer:
    """Token strings for logprobs: the token's text, or `token_id:N` in that server mode."""

    def __init__(self, texts: list[str], *, as_ids: bool) -> None:
        self.texts = texts
        self.as_ids = as_ids

    def name(self, token: int) -> str:
        """The string reported for `token`."""
        return f"token_id:{token}" if self.as_ids else self.texts[token]

    def entry(self, token: int, logprob: float, top: list[tuple[int, float]], k: int) -> dict[str, Any]:
        """One `logprobs.content[]` entry with the first k of `top` (sampled token first).

        vLLM quirk kept: the sampled entry's `bytes` are the token's text bytes even in token-id
        mode, while each top entry's `bytes` encode its reported string.
        """
        return {
            "token": self.name(token),
            "logprob": logprob,
            "bytes": list(self.texts[token].encode("utf-8")),
            "top_logprobs": [
                {"token": self.name(t), "logprob": lp, "bytes": list(self.name(t).encode("utf-8"))}
                for t, lp in top[:k]
            ],
        }


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool = True) -> dict[str, Any]:
    """The usage object (the streamed one has no `*_details` keys)."""
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        u["prompt_tokens_details"] = None
        u["completion_tokens_details"] = None
    return u


def chat_message(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The assistant message; `tool_calls` appears only when the reply made calls (vLLM 0.32)."""
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls is not None:
        msg["tool_calls"] = tool_calls
    msg["reasoning"] = None
    return msg


def chat_choice(
    index: int,
    choice: Choice,
    namer: TokenNamer,
    *,
    logprobs: bool,
    top_k: int,
    return_ids: bool,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str | None,
) -> dict[str, Any]:
    """One non-streaming chat choice."""
    return {
        "index": index,
        "message": chat_message(content, tool_calls),
        "logprobs": {
            "content": [
                namer.entry(t, lp, top, top_k)
                for t, lp, top in zip(choice.token_ids, choice.logprobs, choice.tops, strict=True)
            ]
        }
        if logprobs
        else None,
        "finish_reason": finish_reason,
        "stop_reason": choice.stop_reason,
        "token_ids": list(choice.token_ids) if return_ids else None,
        "routed_experts": None,
    }


def chat_completion(
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    prompt_ids: list[int],
    completion_tokens: int,
    *,
    return_ids: bool,
) -> dict[str, Any]:
    """The non-streaming chat completion body."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(len(prompt_ids), completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt_ids) if return_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


class ChunkWriter:
    """Builds the streamed chat chunks of one response."""

    def __init__(
        self, model: str, namer: TokenNamer, *, logprobs: bool, top_k: int, return_ids: bool
    ) -> None:
        self.id = new_id("chatcmpl")
        self.top_k = top_k
        self.created = int(time.time())
        self.model = model
        self.namer = namer
        self.logprobs = logprobs
        self.return_ids = return_ids

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role(self, index: int, prompt_ids: list[int]) -> dict[str, Any]:
        """The first chunk of a choice: the role, and the prompt ids (once, with choice 0)."""
        c = self._chunk(
            [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
        if self.return_ids and index == 0:
            c["prompt_token_ids"] = list(prompt_ids)
            c["prompt_text"] = None
        return c

    def token(
        self,
        index: int,
        step: TokenStep,
        *,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        final: bool = False,
    ) -> dict[str, Any]:
        """The chunk carrying one generated token (and the finish reason on the last one)."""
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": [self.namer.entry(step.token, step.logprob, step.top, self.top_k)]}
            if self.logprobs
            else None,
            "finish_reason": finish_reason,
        }
        if final:
            choice["stop_reason"] = stop_reason
        if self.return_ids:
            choice["token_ids"] = [step.token]
        return self._chunk([choice])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The closing usage chunk (`stream_options.include_usage`)."""
        c = self._chunk([])
        c["usage"] = usage(prompt_tokens, completion_tokens, details=False)
        c["system_fingerprint"] = FINGERPRINT
        return c


def legacy_logprobs(choice: Choice, namer: TokenNamer, k: int) -> dict[str, Any]:
    """The legacy completions logprobs object.

    vLLM lists per position the sampled token then the best others, k+1 entries at most, as a dict
    keyed by token string (equal strings collapse).
    """
    offsets, tokens, tops = [], [], []
    pos = 0
    for t, top in zip(choice.token_ids, choice.tops, strict=True):
        offsets.append(pos)
        pos += len(namer.texts[t])
        tokens.append(namer.name(t))
        tops.append({namer.name(tt): lp for tt, lp in top[: k + 1]})
    return {
        "text_offset": offsets,
        "token_logprobs": list(choice.logprobs),
        "tokens": tokens,
        "top_logprobs": tops,
    }


def prompt_logprobs(ids: list[int], scores: PromptScores, namer: TokenNamer) -> list[Any]:
    """vLLM's per-choice `prompt_logprobs`: None for the first token, then per token a dict keyed by
    token id (the prompt's own token first, then the top ones) of `{logprob, rank, decoded_token}`."""
    out: list[Any] = [None]
    for pos, token in enumerate(ids[1:]):
        entry = {
            str(token): {
                "logprob": float(scores.logprobs[pos]),
                "rank": int(scores.ranks[pos]),
                "decoded_token": namer.name(token),
            }
        }
        for rank, (t, lp) in enumerate(scores.tops[pos], start=1):
            entry.setdefault(str(t), {"logprob": lp, "rank": rank, "decoded_token": namer.name(t)})
        out.append(entry)
    return out


def completion(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], prompt_len: int, completion_tokens: int
) -> dict[str, Any]:
    """The legacy `/v1/completions` body."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(prompt_len, completion_tokens),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
