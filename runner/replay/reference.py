"""The reference engine of a replay, asked for prompt logprobs the way vLLM serves them.

`POST /v1/completions` with the token ids as the prompt, `prompt_logprobs: 0` and `max_tokens: 1`
(vLLM samples at least one token): each choice's `prompt_logprobs` is a list with None for the
first token, then per token a dict keyed by token id (as a JSON string) of
`{logprob, rank, decoded_token}` holding at least the prompt's own token. vLLM computes them from the
raw logits, before any temperature; tapdeck's embedded engine answers the same request in the same
shape (runner/engine/server.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from tapdeck.proxy.upstream.address import EngineAddressError, settle_blocking, shown_url
from tapdeck.runner.errors import ReferenceUnreachable, ReplayRefused

REPLAY_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
"""A long chain on a CPU engine takes minutes to score."""
SLOWEST_SCORING = 20.0
"""Tokens a second below which a reference is taken for dead: the embedded engine took 1,188 s
(27.6 tokens a second) for a 32,750-token chain on two idle cores, its attention growing with the
context, so a chain's request waits ids / SLOWEST_SCORING seconds where that is past 600."""


@dataclass
class Scored:
    """Per position of the ids sent: the reference's logprob of that token (NaN where it gave
    none, always at position 0) and the token's text as the reference decodes it."""

    logprobs: np.ndarray
    texts: list[str | None]


class ReferenceEngine:
    """One engine and model to score ids with; `name` is how results name it."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: str,
        max_model_len: int | None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name
        self.max_model_len = max_model_len
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=REPLAY_TIMEOUT, headers=headers)

    @classmethod
    def at(
        cls, address: str, *, model: str | None = None, api_key: str | None = None, name: str | None = None
    ) -> ReferenceEngine:
        """The engine an address leads to (any form: HOST:PORT, http://…, …/v1), and its model:
        `model`, else the first it serves. ReplayRefused for a model it does not serve,
        ReferenceUnreachable when no address form answers."""
        try:
            settled = settle_blocking(address, api_key=api_key)
        except EngineAddressError as exc:
            error = ReplayRefused if exc.status == 400 else ReferenceUnreachable
            raise error(f"reference engine: {exc}") from None
        served = settled.model_ids()
        chosen = model or (served[0] if served else None)
        if chosen is None or chosen not in served:
            raise ReplayRefused(
                f"reference engine {shown_url(settled.base_url)} serves {', '.join(served) or 'no model'}, "
                f"not {chosen!r}: give one of those with --engine-model"
            )
        entry = next(m for m in settled.listing["data"] if isinstance(m, dict) and m.get("id") == chosen)
        limit = entry.get("max_model_len")
        return cls(
            settled.base_url,
            chosen,
            name=name or shown_url(settled.base_url),
            max_model_len=int(limit) if isinstance(limit, int) else None,
            api_key=api_key,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def fits(self, n: int) -> bool:
        """Whether `n` prompt ids fit the reference's context with the one token it must sample."""
        return self.max_model_len is None or n + 1 <= self.max_model_len

    def score(self, ids: np.ndarray) -> Scored:
        """The reference's logprob of every token of `ids` given the ones before it. ReplayRefused
        for ids its vocabulary does not have or an engine that gives no prompt logprobs."""
        body = {"model": self.model, "prompt": ids.tolist(), "max_tokens": 1, "prompt_logprobs": 0}
        try:
            wait = max(REPLAY_TIMEOUT.read or 0.0, ids.size / SLOWEST_SCORING)
            reply = self._http.post(
                f"{self.base_url}/completions", json=body, timeout=httpx.Timeout(wait, connect=10.0)
            )
        except httpx.HTTPError as exc:
            raise ReferenceUnreachable(
                f"reference engine {self.name} did not answer ({type(exc).__name__}: {exc})"
            ) from None
        if reply.status_code != 200:
            text = reply.text[:300].replace("\n", " ")
            if reply.status_code == 400 and "vocabulary" in text.lower():
                raise ReplayRefused(
                    f"reference engine {self.name}'s tokenizer differs from the sampler's (it refused "
                    f"the captured ids: {text}): replay against an engine serving the same tokenizer"
                )
            raise ReferenceUnreachable(
                f"reference engine {self.name} answered HTTP {reply.status_code} to /completions: {text}"
            )
        try:
            scored = reply.json()["choices"][0].get("prompt_logprobs")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise ReferenceUnreachable(
                f"reference engine {self.name} answered /completions with no choice: {reply.text[:200]}"
            ) from None
        if not isinstance(scored, list) or len(scored) != ids.size:
            raise ReplayRefused(
                f"reference engine {self.name} returned no prompt_logprobs for its /v1/completions "
                "(vLLM's `prompt_logprobs`): replay against vLLM or --engine embedded"
            )
        return _parse(ids, scored)


def _parse(ids: np.ndarray, scored: list[Any]) -> Scored:
    logprobs = np.full(ids.size, np.nan)
    texts: list[str | None] = [None] * ids.size
    for pos, (token, entry) in enumerate(zip(ids.tolist(), scored, strict=True)):
        got = entry.get(str(token)) if isinstance(entry, dict) else None
        if isinstance(got, dict) and isinstance(got.get("logprob"), (int, float)):
            logprobs[pos] = float(got["logprob"])
            decoded = got.get("decoded_token")
            texts[pos] = decoded if isinstance(decoded, str) else None
    return Scored(logprobs, texts)
