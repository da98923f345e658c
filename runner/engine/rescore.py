"""Re-scoring a training row: the logprobs a trainer would recompute on the exported ids.

A captured row's logprobs came from the engine token by token (prefill, then one decode step per
sampled token). `rescore` evaluates a row with the same GGUF and RoPE settings as the embedded
engine and returns log_softmax(logits / T) of each token given the ids before it, either:

* `one_pass`: the whole row as one batch, the way a trainer evaluates it. llama.cpp's CPU kernels
  compute a batch differently from a single token, so these differ from the engine's by float
  rounding of the quantised model (measured: up to ~0.25 nats on SmolLM2 Q4_1, on plain text-path
  calls as much as on token-in ones);
* `decode`: the context as one batch, then each scored token alone, as the engine decodes: equal
  to the engine's logprobs exactly when the row holds exactly the ids the engine conditioned on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from tapdeck.runner.engine.model import DEFAULT_N_CTX, context_params
from tapdeck.runner.engine.model_file import default_model_path
from tapdeck.runner.engine.sampling import GREEDY_EPS, log_softmax


def rescore(
    ids: Sequence[int],
    start: int,
    *,
    temperature: float = 1.0,
    mode: Literal["one_pass", "decode"] = "one_pass",
    model_path: Path | None = None,
    engine_n_ctx: int = DEFAULT_N_CTX,
) -> np.ndarray:
    """Logprobs of `ids[start:]`, each given `ids[:i]`.

    `engine_n_ctx` is the serving engine's context: its RoPE scaling is kept, while the context
    allocated here is only as long as the row (logits for every position are kept)."""
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    if not 0 < start < len(ids):
        raise ValueError(f"start {start} must be inside the row (1..{len(ids) - 1})")
    path = model_path or default_model_path()
    params = context_params(path, engine_n_ctx)
    size = len(ids) + 8
    params["n_ctx"] = size
    with suppress_stdout_stderr(disable=False):
        llm = llama_cpp.Llama(
            model_path=str(path), n_batch=size, n_ubatch=size, logits_all=True, verbose=False, **params
        )
    try:
        if mode == "one_pass":
            llm.eval(list(ids))
        else:
            if start > 1:
                llm.eval(list(ids[: start - 1]))
            for token in ids[start - 1 :]:
                llm.eval([token])
        logits = np.asarray(llm.scores[start - 1 : len(ids) - 1], dtype=np.float64)
    finally:
        llm.close()
    scale = temperature if temperature >= GREEDY_EPS else 1.0  # greedy logprobs are unscaled
    rows = np.stack([log_softmax(row / scale) for row in logits])
    return rows[np.arange(len(ids) - start), np.asarray(ids[start:])]
