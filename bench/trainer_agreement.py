"""Which model file's llama.cpp logprobs agree with what the trainer computes, and how closely.

    .venv/bin/python bench/trainer_agreement.py [--tokens 384] [--train-python PATH]

The CPU recipe trains the model that transformers dequantises from the GGUF (float32, no
activation quantisation). llama.cpp's Q4_1 kernels quantise each activation row to 8 bits before
the dot product; its F16 kernels do not. This evaluates the same ids of fixed English text (one
batch, trained context, no YaRN, as the trainer sees them) with llama.cpp on the shipped Q4_1 file
and on the served F16 file, and with transformers (in the training environment) on both files, and
prints the top-1 agreement and the absolute logprob difference over each position's top-20
tokens for each pair. It also says whether transformers loads the F16 file to the same weights.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from tapdeck.runner.engine.model import _CHUNK
from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path
from tapdeck.runner.train_env import env_dir

TRAINER = """
import sys, numpy as np, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
ids = np.load(sys.argv[1])
out = {}
params = {}
for name, path in (("q4_1", Path(sys.argv[2])), ("f16", Path(sys.argv[3]))):
    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                             dtype=torch.float32).eval()
    with torch.no_grad():
        out[name] = torch.log_softmax(m(torch.tensor(ids)[None]).logits[0].double(), -1).numpy()
    params[name] = {k: v.detach().clone() for k, v in m.named_parameters()}
diff = max(float((params["q4_1"][k] - params["f16"][k]).abs().max()) for k in params["q4_1"])
rel = max(float(((params["q4_1"][k] - params["f16"][k]).abs()
                 / params["q4_1"][k].abs().clamp_min(1e-30)).max()) for k in params["q4_1"])
print(f"transformers: F16 file's weights vs Q4_1 file's: max abs diff {diff:.3g}, max rel {rel:.3g}")
np.savez(sys.argv[4], **out)
"""


def _llama_cpp(path: Path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path),
        n_threads=1,
        n_threads_batch=1,
        n_batch=_CHUNK,
        n_ctx=2048,
        logits_all=True,
        verbose=False,
    )
    try:
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def _compare(name: str, ref: np.ndarray, other: np.ndarray) -> None:
    top = np.argsort(-ref, axis=1)[:, :20]
    diff = np.abs(np.take_along_axis(other, top, axis=1) - np.take_along_axis(ref, top, axis=1))
    agree = float((other.argmax(axis=1) == top[:, 0]).mean())
    print(
        f"  {name:40s} top-1 agreement {agree:6.1%}  |dlogprob| top-20 "
        f"max {diff.max():.4f} mean {diff.mean():.5f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--train-python", default=None)
    args = ap.parse_args()
    from pydoc_data.topics import topics

    import llama_cpp

    q4, f16 = shipped_model_path(), default_model_path()
    vocab = llama_cpp.Llama(model_path=str(q4), vocab_only=True, verbose=False)
    ids = vocab.tokenize(topics["class"].encode(), add_bos=False)[: args.tokens]
    cpp = {"q4_1": _llama_cpp(q4, ids), "f16": _llama_cpp(f16, ids)}
    train_python = args.train_python or str(env_dir() / "bin" / "python")
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "ids.npy", np.array(ids, dtype=np.int64))
        subprocess.run(
            [
                train_python,
                "-c",
                TRAINER,
                str(Path(tmp) / "ids.npy"),
                str(q4),
                str(f16),
                str(Path(tmp) / "hf.npz"),
            ],
            check=True,
        )
        hf = dict(np.load(Path(tmp) / "hf.npz"))
    print(f"{len(ids)} positions of English text, trained context, one batch")
    _compare("llama.cpp Q4_1 vs transformers (Q4_1 file)", hf["q4_1"], cpp["q4_1"])
    _compare("llama.cpp F16  vs transformers (Q4_1 file)", hf["q4_1"], cpp["f16"])
    _compare("transformers F16 file vs Q4_1 file", hf["q4_1"], hf["f16"])
    _compare("llama.cpp F16 vs llama.cpp Q4_1", cpp["q4_1"], cpp["f16"])


if __name__ == "__main__":
    main()
