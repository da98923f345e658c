"""Prefill speed of the embedded engine's model under llama.cpp settings, measured in one run.

    .venv/bin/python bench/prefill.py [--tokens 2048] [--repeat 2] [--threads 1]

An agent CLI's first call is all prefill (8-18k tokens on 2 cores), so this is what the levers
must move. Each setting loads the model as the engine does (32k context, YaRN), evaluates the same
`--tokens` ids of fixed English text from an empty cache in chunks of 512 (the engine's
`_eval_batched`), and reports tokens per CPU-second of the process (all its threads) beside the
wall time. Settings alternate within each repeat so that load from other processes spreads over
all of them. On a shared machine wall time follows the load; CPU time, and the ratios to the
engine's own setting, much less (with one thread, CPU time is what an idle core would take).
"""

from __future__ import annotations

import argparse
import statistics
import time

from tapdeck.runner.engine.model import _CHUNK, context_params, default_model_path

SETTINGS: dict[str, dict[str, object]] = {
    "engine (n_batch 512)": {"n_batch": 512},
    "flash attention": {"n_batch": 512, "flash_attn": True},
    "n_batch/n_ubatch 2048": {"n_batch": 2048, "n_ubatch": 2048},
}


def _ids(llm, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids = llm.tokenize("\n\n".join(topics[k] for k in sorted(topics)).encode(), add_bos=False)
    if len(ids) < n:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, {n} needed")
    return ids[:n]


def _prefill_seconds(kwargs: dict[str, object], n: int, threads: int | None) -> tuple[float, float]:
    """CPU and wall seconds of one prefill of `n` tokens from an empty cache."""
    import llama_cpp

    path = default_model_path()
    chunk = int(kwargs.get("n_batch", _CHUNK))
    llm = llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads,
                          verbose=False, **kwargs, **context_params(path, 32768))
    try:
        ids = _ids(llm, n)
        cpu, wall = time.process_time(), time.perf_counter()
        for pos in range(0, n, chunk):
            llm.eval(ids[pos:pos + chunk])
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: its own)")
    args = ap.parse_args()
    cpu: dict[str, list[float]] = {name: [] for name in SETTINGS}
    print(f"prefill of {args.tokens} tokens from an empty cache, threads={args.threads or 'default'}",
          flush=True)
    for _ in range(args.repeat):
        for name, kwargs in SETTINGS.items():
            used, wall = _prefill_seconds(kwargs, args.tokens, args.threads)
            cpu[name].append(used)
            print(f"  {name:24s} {args.tokens / used:7.1f} tok per CPU-s  (wall {wall:.1f} s)",
                  flush=True)
    base = statistics.median(cpu[next(iter(SETTINGS))])
    for name, runs in cpu.items():
        print(f"{name:24s} {base / statistics.median(runs):.2f}x the engine's speed per CPU-second")


if __name__ == "__main__":
    main()
