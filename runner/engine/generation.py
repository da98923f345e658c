"""The decode loop: prefill, sample token by token, detokenise incrementally, stop like vLLM.

Stop conditions, checked after each sampled token (the token that triggers a stop is kept in the
ids and logprobs, as vLLM does):
* the EOS id (`<|im_end|>` for SmolLM2), or the token the chat template ends a turn with where
  that is another (Gemma's `<end_of_turn>`), unless `ignore_eos` → "stop", `stop_reason` None;
* an id from `stop_token_ids` → "stop", `stop_reason` = that id;
* a `stop` string in the decoded text → "stop", `stop_reason` = the string; the text is cut
  before it (kept when `include_stop_str_in_output`);
* `max_tokens` reached, or the context is full → "length";
* the caller's `cancelled()` (client gone) → "abort".
Text is decoded with control tokens skipped (`skip_special_tokens`); a token ending mid UTF-8
character emits nothing until the character completes. While a stop string could still be forming,
up to len(stop)-1 characters are held back from the stream deltas.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from tapdeck.runner.engine.model import LlamaModel
from tapdeck.runner.engine.sampling import Sampler, top_candidates

LOGPROB_FLOOR = -9999.0  # vLLM clamps reported logprobs to this


@dataclass
class TokenStep:
    """One generated token as reported on the wire."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # the sampled token first, then the k best others (k+1 at most)
    delta: str  # text released to a streaming client by this token (may be "")
    last: bool = False  # the choice ends with this token


@dataclass
class Choice:
    """The outcome of one completed choice."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class StopRules:
    """When a choice ends."""

    max_tokens: int
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


def _clamp(x: float) -> float:
    return max(float(x), LOGPROB_FLOOR)


class Generation:
    """One choice being generated; iterate `steps()`, then read `.choice`."""

    def __init__(
        self,
        model: LlamaModel,
        prompt_ids: list[int],
        sampler: Sampler,
        rules: StopRules,
        *,
        top_logprobs: int | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        end_ids: frozenset[int] | None = None,
    ) -> None:
        self.model = model
        self.end_ids = end_ids if end_ids is not None else frozenset({model.eos_id})
        self.prompt_ids = prompt_ids
        self.sampler = sampler
        self.rules = rules
        self.top_logprobs = top_logprobs
        self.cancelled = cancelled
        self.choice = Choice()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # all decoded text so far
        self._sent = 0  # characters released to the stream
        self._holdback = max((len(s) for s in rules.stop), default=1) - 1

    def _report(self, token: int, logprobs: np.ndarray) -> tuple[float, list[tuple[int, float]]]:
        sampled = _clamp(logprobs[token])
        if self.top_logprobs is None:
            return sampled, []
        # vLLM 0.32 keeps the sampled token first, then the k best (chat later cuts this to k).
        k = self.top_logprobs
        ranked = [token] + [t for t in top_candidates(logprobs, k) if t != token]
        return sampled, [(t, _clamp(logprobs[t])) for t in ranked[: k + 1]]

    def _check_stop_string(self, before: int) -> bool:
        for s in self.rules.stop:
            pos = self._text.find(s, max(0, before - len(s) + 1))
            if pos >= 0:
                end = pos + len(s) if self.rules.include_stop_str_in_output else pos
                self._text = self._text[:end]
                self.choice.finish_reason, self.choice.stop_reason = "stop", s
                return True
        return False

    def steps(self) -> Iterator[TokenStep]:
        """Generate, yielding each token as soon as it is sampled."""
        model, rules, ch = self.model, self.rules, self.choice
        budget = min(rules.max_tokens, model.n_ctx - len(self.prompt_ids))
        if budget <= 0:
            ch.finish_reason = "length"
            return
        logits = model.prefill(self.prompt_ids)
        while True:
            token, logprobs = self.sampler.sample(logits)
            lp, top = self._report(token, logprobs)
            ch.token_ids.append(token)
            ch.logprobs.append(lp)
            ch.tops.append(top)
            before = len(self._text)
            # A stop token's own text is left out unless asked for, as vLLM's detokenizer does
            # (with special tokens kept, the end token would otherwise end every reply's text).
            stop_token = (token in self.end_ids and not rules.ignore_eos) or token in rules.stop_token_ids
            if not (rules.skip_special_tokens and model.special[token]) and not (
                stop_token and not rules.include_stop_str_in_output
            ):
                self._text += self._decoder.decode(model.pieces[token])
            if token in self.end_ids and not rules.ignore_eos:
                ch.finish_reason = "stop"
            elif token in rules.stop_token_ids:
                ch.finish_reason, ch.stop_reason = "stop", token
            elif rules.stop and self._check_stop_string(before):
                pass
            elif len(ch.token_ids) >= budget:
                ch.finish_reason = "length"
            elif self.cancelled():
                ch.finish_reason = "abort"
            if ch.finish_reason is not None:
                if not isinstance(ch.stop_reason, str):  # a cut at a stop string needs no flush
                    self._text += self._decoder.decode(b"", final=True)
                ch.text = self._text
                yield TokenStep(token, lp, top, self._release(final=True), last=True)
                return
            yield TokenStep(token, lp, top, self._release(final=False))
            logits = model.step(token)

    def _release(self, *, final: bool) -> str:
        upto = len(self._text) if final else max(self._sent, len(self._text) - self._holdback)
        delta = self._text[self._sent : upto]
        self._sent = upto
        return delta

    def run(self) -> Choice:
        """Generate to the end and return the choice."""
        for _ in self.steps():
            pass
        return self.choice
