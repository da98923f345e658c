"""How far each faster model variant moves the shipped model's next-token distribution.

    .venv/bin/python bench/model_fidelity.py [--tokens 768]

For a few fixed prompts (English prose, Python source, a chat-formatted agent turn), every position's
next-token log-softmax under each variant is compared with the shipped Q4_1 file's under llama.cpp's
default attention (the engine before F16): top-1 agreement over all positions, and the largest
and mean absolute logprob difference over each position's reference top-20 tokens (the tokens
sampling can reach). Same 32k YaRN context and n_batch as the engine; one batch evaluation each.
"""

from __future__ import annotations

import argparse
import inspect
import json
import tempfile
from pathlib import Path

import numpy as np

from tapdeck.runner.engine.model import _CHUNK, context_params
from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path


def _prompts() -> dict[str, str]:
    from pydoc_data.topics import topics

    chat = (
        "<|im_start|>system\nYou are a coding agent. Use the tools to inspect and edit files."
        "<|im_end|>\n<|im_start|>user\n"
        + json.dumps({"task": topics["assert"]})
        + "<|im_end|>\n<|im_start|>assistant\n"
    )
    return {"prose": topics["class"], "python": inspect.getsource(argparse), "chat": chat}


def _logprobs(path: Path, text: str, n: int, **attn: object) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path),
        n_threads=1,
        n_threads_batch=1,
        n_batch=_CHUNK,
        logits_all=True,
        verbose=False,
        **attn,
        **context_params(shipped_model_path(), 32768),
    )
    try:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)[:n]
        for pos in range(0, len(ids), _CHUNK):
            llm.eval(ids[pos : pos + _CHUNK])
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=768, help="tokens per prompt (at most)")
    args = ap.parse_args()
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    with tempfile.TemporaryDirectory() as tmp:
        q8 = Path(tmp) / "q8_0.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        with suppress_stdout_stderr(disable=False):  # a line per tensor otherwise
            llama_cpp.llama_model_quantize(str(shipped_model_path()).encode(), str(q8).encode(), params)
        variants = {
            "F16": (default_model_path(), {}),
            "F16, flash attn": (default_model_path(), {"flash_attn": True}),
            "F16, flash attn, KV q8_0": (
                default_model_path(),
                {"flash_attn": True, "type_k": 8, "type_v": 8},
            ),
            "Q8_0": (q8, {}),
        }
        print(f"against Q4_1 (shipped), default attention; up to {args.tokens} tokens per prompt")
        for name, text in _prompts().items():
            ref = _logprobs(shipped_model_path(), text, args.tokens)
            top = np.argsort(-ref, axis=1)[:, :20]
            ref_top = np.take_along_axis(ref, top, axis=1)
            for variant, (path, attn) in variants.items():
                lp = _logprobs(path, text, args.tokens, **attn)
                diff = np.abs(np.take_along_axis(lp, top, axis=1) - ref_top)
                agree = float((lp.argmax(axis=1) == top[:, 0]).mean())
                print(
                    f"  {name:7s} ({len(ref)} pos) {variant:25s} top-1 agreement {agree:6.1%}  "
                    f"|dlogprob| top-20 max {diff.max():.4f} mean {diff.mean():.5f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
