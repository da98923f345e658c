"""Embedded engine throughput and long-context quality, measured in one run over HTTP on loopback.

    .venv/bin/python bench/engine.py [--tokens 64] [--repeat 3] [--long | --long-only]

Prints decode tokens/second without logprobs, with logprobs, and with top_logprobs=20, and the
speed-up of an agent-style follow-up call when the KV cache of the previous call is reused
(the follow-up extends the previous prompt + reply, ~800 prompt tokens) against the same call on
a cache holding an unrelated conversation.

`--long` adds the long-context figures (minutes on 2 cores): prefill tokens/second at 1k, 8k and
16k prompt tokens; the first-call latency of a 12k-token prompt and of its follow-up (shared
prefix, with the tokens the follow-up evaluated); and quality: the mean negative log-likelihood
of the same 512 tokens of a fixed English text given 2k and 12k tokens of context, at the
model's trained context and stretched with YaRN (lower is better; a broken stretch shows as a
jump at 12k).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx
import numpy as np

from tapdeck.runner.engine.embedded import EmbeddedEngine
from tapdeck.runner.engine.model import context_params, trained_context
from tapdeck.runner.engine.model_file import default_model_path

SYSTEM = (
    "You are an agent that solves tasks in a Linux shell. Reply with one command per turn. "
    "Available tools: ls, cat, grep, sed, awk, find, python3, git, make. "
)
FILLER = " ".join(
    f"Rule {i}: read the file before you edit it, keep edits small, and run the tests after every change."
    for i in range(36)
)


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


def _fixed_text() -> str:
    """A long English text every Python install has: the language reference's topic help."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def _text_ids(eng: EmbeddedEngine, n: int, offset: int = 0) -> list[int]:
    ids = eng.core.model.tokenize(_fixed_text())
    if len(ids) < offset + n:
        raise SystemExit(f"the fixed text has {len(ids)} tokens, {offset + n} needed")
    return ids[offset : offset + n]


def _nll(n_ctx: int, ids: list[int], n_target: int, threads: int | None) -> float:
    """Mean NLL of the last `n_target` ids given all before them, with llama.cpp set up as the
    engine sets it up for `n_ctx` (YaRN past the trained context)."""
    import llama_cpp

    path = default_model_path()
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        **context_params(path, n_ctx),
    )

    def row(i: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)

    try:
        split = len(ids) - n_target
        llm.eval(ids[:split])
        prev = row(-1)  # predicts ids[split]
        total = 0.0
        for start in range(split, len(ids), 256):
            chunk = ids[start : start + 256]
            llm._batch.set_batch(batch=chunk, n_past=llm.n_tokens, logits_all=True)
            llm._ctx.decode(llm._batch)
            llm.n_tokens += len(chunk)
            # row i predicts chunk[i + 1]; the previous chunk's last row predicts chunk[0]
            for i, logits in enumerate([prev] + [row(j) for j in range(len(chunk) - 1)]):
                m = logits.max()
                total += m + np.log(np.exp(logits - m).sum()) - logits[chunk[i]]
            prev = row(len(chunk) - 1)
        return total / n_target
    finally:
        llm.close()


def _long_context(eng: EmbeddedEngine, client: httpx.Client, threads: int | None) -> None:
    url = f"{eng.base_url}/completions"
    model = eng.core.model
    print(f"context: served {model.n_ctx} tokens, trained {trained_context(model.path)}")
    ids = _text_ids(eng, 12288 + 512, 0)
    trained = trained_context(model.path)
    for n_ctx in (trained, model.n_ctx):
        label = "trained" if n_ctx == trained else "YaRN"
        short = _nll(n_ctx, ids[-(2048 + 512) :], 512, threads)
        long = _nll(n_ctx, ids, 512, threads) if n_ctx >= len(ids) else float("nan")
        print(
            f"NLL of 512 tokens, n_ctx {n_ctx} ({label}): {short:.3f} with 2k context, "
            f"{long:.3f} with 12k context"
        )

    chat = f"{eng.base_url}/chat/completions"
    doc = model.detokenize(_text_ids(eng, 12000)).decode("utf-8", errors="replace")
    convo = [
        {"role": "system", "content": "You are a shell agent. Reference:\n" + doc},
        {"role": "user", "content": "List the files in the current directory."},
    ]
    t0 = time.perf_counter()
    first = client.post(
        chat,
        json={
            "model": eng.served_name,
            "messages": convo,
            "max_tokens": 32,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    first.raise_for_status()
    dt_first = time.perf_counter() - t0
    body = first.json()
    n_first = body["usage"]["prompt_tokens"]
    convo += [
        {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
        {"role": "user", "content": "Output of `ls`:\nfoo.txt\nbar.py\nMakefile"},
    ]
    _idle(eng)
    t0 = time.perf_counter()
    second = client.post(
        chat, json={"model": eng.served_name, "messages": convo, "max_tokens": 1, "temperature": 0}
    )
    second.raise_for_status()
    dt_second = time.perf_counter() - t0
    n_second = second.json()["usage"]["prompt_tokens"]
    print(
        f"first call, {n_first} prompt tokens, 32 generated: {dt_first:.1f} s; follow-up "
        f"({n_second} prompt tokens, 1 generated) {dt_second:.1f} s, evaluating "
        f"{model.prefilled} tokens"
    )

    offset = 0
    for n in (1024, 8192, 16384):
        ids = _text_ids(eng, n, offset)
        offset += 97  # a different first token each time: nothing cached is reused
        t0 = time.perf_counter()
        r = client.post(
            url, json={"model": eng.served_name, "prompt": ids, "max_tokens": 1, "temperature": 0}
        )
        r.raise_for_status()
        dt = time.perf_counter() - t0
        print(f"prefill {n:6d} tokens: {dt:7.1f} s, {n / dt:6.0f} tok/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per decode call")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--long", action="store_true", help="also measure long prompts (minutes)")
    ap.add_argument("--long-only", action="store_true", help="only the long-prompt figures")
    args = ap.parse_args()

    with EmbeddedEngine(n_threads=args.threads) as eng, httpx.Client(timeout=1800) as client:
        if args.long_only:
            _long_context(eng, client, args.threads)
            return
        url = f"{eng.base_url}/chat/completions"
        short = [{"role": "user", "content": "Write a long story about a shell."}]
        _chat(client, url, short, max_tokens=4)  # warm-up
        print(f"model {eng.core.model.path.name}, threads {eng.core.model._llm.n_threads}")
        modes = {
            "no logprobs": {},
            "logprobs": {"logprobs": True, "top_logprobs": 0},
            "top_logprobs=20": {"logprobs": True, "top_logprobs": 20},
        }
        rates: dict[str, list[float]] = {name: [] for name in modes}
        for i in range(args.repeat):  # interleaved, so a noisy neighbour hits every mode alike
            for name, extra in modes.items():
                _idle(eng)
                body, dt = _chat(
                    client,
                    url,
                    short,
                    max_tokens=args.tokens,
                    ignore_eos=True,
                    temperature=1.0,
                    seed=i,
                    **extra,
                )
                rates[name].append(body["usage"]["completion_tokens"] / dt)
        for name, values in rates.items():
            print(
                f"decode {name:16s} {statistics.median(values):6.1f} tok/s (median of "
                f"{args.repeat}; min {min(values):.1f}, max {max(values):.1f}; "
                f"{args.tokens} tokens, short prompt)"
            )

        convo = [
            {"role": "system", "content": SYSTEM + FILLER},
            {"role": "user", "content": "List the files in the current directory."},
        ]
        first, _ = _chat(client, url, convo, max_tokens=48, temperature=0)
        follow = convo + [
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Output of `ls`:\nfoo.txt\nbar.py\nMakefile"},
        ]
        warm, cold = [], []
        for i in range(args.repeat):
            _chat(client, url, convo, max_tokens=48, temperature=0)  # the previous turn
            _idle(eng)
            body, dt = _chat(client, url, follow, max_tokens=16, temperature=0)
            warm.append(dt)
            _chat(client, url, [{"role": "user", "content": f"Unrelated question {i}?"}], max_tokens=2)
            _idle(eng)
            _, dt = _chat(client, url, follow, max_tokens=16, temperature=0)
            cold.append(dt)
        n_prompt = body["usage"]["prompt_tokens"]
        w, c = statistics.median(warm), statistics.median(cold)
        print(
            f"follow-up call ({n_prompt} prompt tokens, 16 generated): "
            f"cache reused {w:.2f} s, cold {c:.2f} s, speed-up {c / w:.1f}x"
        )
        if args.long:
            _long_context(eng, client, args.threads)
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
