"""An agent's first call on the embedded engine: the shipped Q4_1 file against the served F16 one.

    .venv/bin/python bench/first_call.py [--tokens 8192] [--threads 1]

An agent CLI's first request is a long system prompt and tool list that the engine has never seen,
so the whole call is prefill. This starts the embedded engine on each model file in turn (32k
context, as served), sends one chat-completions request whose rendered prompt is `--tokens` long
(fixed English text as the system message, a one-line user turn), asks for 8 tokens with logprobs,
and reports the call's wall time and the engine process's CPU seconds over the call (all its
threads; with one thread, CPU time is what an idle core would take). Both run in one process, one
after the other, so load from other processes affects both.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx

from tapdeck.runner.engine.embedded import EmbeddedEngine
from tapdeck.runner.engine.model_file import default_model_path, shipped_model_path


def _system_text(eng: EmbeddedEngine, n: int) -> str:
    from pydoc_data.topics import topics

    model = eng.core.model
    ids = model.tokenize("\n\n".join(topics[k] for k in sorted(topics)))
    if len(ids) < n:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, {n} needed")
    return model.detokenize(ids[: n - 40]).decode("utf-8", errors="ignore")  # room for the template


def _first_call(path: Path, n: int, threads: int) -> tuple[int, float, float]:
    """Prompt tokens, wall seconds and CPU seconds of one first call on a freshly started engine."""
    eng = EmbeddedEngine(path, n_threads=threads).start()
    try:
        body = {
            "model": "smollm2",
            "max_tokens": 8,
            "temperature": 0,
            "logprobs": True,
            "return_token_ids": True,
            "messages": [
                {"role": "system", "content": _system_text(eng, n)},
                {"role": "user", "content": "Create hello.txt containing hello."},
            ],
        }
        cpu, wall = time.process_time(), time.perf_counter()
        reply = httpx.post(f"{eng.base_url}/chat/completions", json=body, timeout=3600)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        reply.raise_for_status()
        return len(reply.json()["prompt_token_ids"]), wall, cpu
    finally:
        eng.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    models = {"Q4_1 (shipped)": shipped_model_path(), "F16 (served)": default_model_path()}
    for n in args.tokens:
        cpu: dict[str, float] = {}
        for name, path in models.items():
            tokens, wall, cpu[name] = _first_call(path, n, args.threads)
            print(
                f"  {name:15s} {tokens:6d}-token first call: wall {wall:6.1f} s, "
                f"CPU {cpu[name]:6.1f} s ({tokens / cpu[name]:.1f} tok per CPU-s)",
                flush=True,
            )
        print(
            f"{n} tokens: F16 takes {cpu['F16 (served)'] / cpu['Q4_1 (shipped)']:.2f}x "
            "the shipped file's CPU time",
            flush=True,
        )


if __name__ == "__main__":
    main()
