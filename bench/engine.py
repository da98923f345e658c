"""Embedded engine throughput, measured in one run over HTTP on loopback.

    .venv/bin/python bench/engine.py [--tokens 64] [--repeat 3]

Prints decode tokens/second without logprobs, with logprobs, and with top_logprobs=20, and the
speed-up of an agent-style follow-up call when the KV cache of the previous call is reused
(the follow-up extends the previous prompt + reply, ~800 prompt tokens) against the same call on
a cache holding an unrelated conversation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx

from tapdeck.runner.engine.embedded import EmbeddedEngine

SYSTEM = ("You are an agent that solves tasks in a Linux shell. Reply with one command per turn. "
          "Available tools: ls, cat, grep, sed, awk, find, python3, git, make. ")
FILLER = " ".join(f"Rule {i}: read the file before you edit it, keep edits small, and run the "
                  "tests after every change." for i in range(36))


def _chat(client: httpx.Client, url: str, messages: list[dict], **kw) -> tuple[dict, float]:
    body = {"model": "smollm2", "messages": messages, "return_token_ids": True, **kw}
    t0 = time.perf_counter()
    r = client.post(url, json=body)
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return r.json(), elapsed


def _idle(engine: EmbeddedEngine) -> None:
    # the engine re-batches the finished reply into its cache after answering; an agent's tool
    # run normally hides that, so wait for it like one would
    with engine.core.lock:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per decode call")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    with EmbeddedEngine(n_threads=args.threads) as eng, httpx.Client(timeout=600) as client:
        url = f"{eng.base_url}/chat/completions"
        short = [{"role": "user", "content": "Write a long story about a shell."}]
        _chat(client, url, short, max_tokens=4)  # warm-up
        print(f"model {eng.core.model.path.name}, threads {eng.core.model._llm.n_threads}")
        modes = {"no logprobs": {}, "logprobs": {"logprobs": True, "top_logprobs": 0},
                 "top_logprobs=20": {"logprobs": True, "top_logprobs": 20}}
        rates: dict[str, list[float]] = {name: [] for name in modes}
        for i in range(args.repeat):  # interleaved, so a noisy neighbour hits every mode alike
            for name, extra in modes.items():
                _idle(eng)
                body, dt = _chat(client, url, short, max_tokens=args.tokens, ignore_eos=True,
                                 temperature=1.0, seed=i, **extra)
                rates[name].append(body["usage"]["completion_tokens"] / dt)
        for name, values in rates.items():
            print(f"decode {name:16s} {statistics.median(values):6.1f} tok/s (median of "
                  f"{args.repeat}; min {min(values):.1f}, max {max(values):.1f}; "
                  f"{args.tokens} tokens, short prompt)")

        convo = [{"role": "system", "content": SYSTEM + FILLER},
                 {"role": "user", "content": "List the files in the current directory."}]
        first, _ = _chat(client, url, convo, max_tokens=48, temperature=0)
        follow = convo + [{"role": "assistant",
                           "content": first["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "Output of `ls`:\nfoo.txt\nbar.py\nMakefile"}]
        warm, cold = [], []
        for i in range(args.repeat):
            _chat(client, url, convo, max_tokens=48, temperature=0)  # the previous turn
            _idle(eng)
            body, dt = _chat(client, url, follow, max_tokens=16, temperature=0)
            warm.append(dt)
            _chat(client, url, [{"role": "user", "content": f"Unrelated question {i}?"}],
                  max_tokens=2)
            _idle(eng)
            _, dt = _chat(client, url, follow, max_tokens=16, temperature=0)
            cold.append(dt)
        n_prompt = body["usage"]["prompt_tokens"]
        w, c = statistics.median(warm), statistics.median(cold)
        print(f"follow-up call ({n_prompt} prompt tokens, 16 generated): "
              f"cache reused {w:.2f} s, cold {c:.2f} s, speed-up {c / w:.1f}x")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
