"""Sampling in numpy from raw logits, reporting *processed* logprobs like vLLM's
`--logprobs-mode processed_logprobs`.

Order (as vLLM's sampler): penalties on the logits; then, when greedy (temperature < 1e-5), the
argmax with logprobs = log_softmax(logits) (no temperature scaling); otherwise divide by the
temperature, apply min_p, then top-k and top-p as -inf masks, and sample from
softmax(masked logits). The reported logprobs are log_softmax of those final logits, i.e. of the
distribution actually sampled from: a trainer recomputing log pi(token) at the same temperature
gets the same numbers (masked tokens are -inf, reported clamped to -9999 on the wire).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GREEDY_EPS = 1e-5  # vLLM treats temperatures below this as greedy


@dataclass(frozen=True)
class SamplingParams:
    """The knobs a request may set; defaults are the no-op values."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax."""
        return self.temperature < GREEDY_EPS


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax of a 1-D array (-inf entries stay -inf)."""
    m = np.max(x)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted)))


class Sampler:
    """Turns one logits vector into (token id, processed logprobs over the vocabulary)."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int] | np.ndarray, n_vocab: int) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self._n_vocab = n_vocab
        self._prompt_mask = np.zeros(n_vocab, dtype=bool)
        if len(prompt_ids):
            self._prompt_mask[np.asarray(prompt_ids)] = True
        self._counts = np.zeros(n_vocab, dtype=np.int64)

    def reset_output(self) -> None:
        """Forget the output tokens (a new choice of the same request starts)."""
        self._counts[:] = 0

    def _penalise(self, logits: np.ndarray) -> np.ndarray:
        p = self.params
        if p.repetition_penalty != 1.0:
            seen = self._prompt_mask | (self._counts > 0)
            logits = logits.copy()
            pos = seen & (logits > 0)
            neg = seen & ~(logits > 0)
            logits[pos] /= p.repetition_penalty
            logits[neg] *= p.repetition_penalty
        if p.frequency_penalty or p.presence_penalty:
            seen = self._counts > 0
            logits = logits - p.frequency_penalty * self._counts - p.presence_penalty * seen
        return logits

    def process(self, logits: np.ndarray) -> np.ndarray:
        """The processed logprobs of the distribution to sample from."""
        p = self.params
        x = self._penalise(logits)
        if p.greedy:
            return log_softmax(x)
        x = x / p.temperature
        if p.min_p > 0.0:
            probs = np.exp(log_softmax(x))
            x = np.where(probs < p.min_p * probs.max(), -np.inf, x)
        if 0 < p.top_k < self._n_vocab:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            x = np.where(x < kth, -np.inf, x)
        if p.top_p < 1.0:
            order = np.argsort(x, kind="stable")  # ascending
            probs = np.exp(log_softmax(x[order]))
            drop = np.cumsum(probs) <= 1.0 - p.top_p
            drop[-1] = False  # always keep the most likely token
            x = x.copy()
            x[order[drop]] = -np.inf
        return log_softmax(x)

    def sample(self, logits: np.ndarray) -> tuple[int, np.ndarray]:
        """Pick the next token; returns it with the processed logprobs it was drawn from."""
        logprobs = self.process(logits)
        if self.params.greedy:
            token = int(np.argmax(logprobs))
        else:
            cdf = np.cumsum(np.exp(logprobs))
            token = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
            token = min(token, self._n_vocab - 1)
        self._counts[token] += 1
        return token, logprobs


def top_candidates(logprobs: np.ndarray, k: int) -> list[int]:
    """Ids of the k most likely tokens, best first."""
    if k <= 0:
        return []
    idx = np.argpartition(-logprobs, k - 1)[:k]
    return [int(i) for i in idx[np.argsort(-logprobs[idx], kind="stable")]]
