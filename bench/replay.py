"""Prompt-logprob throughput of the embedded engine against its plain prefill, on the same ids, in
one run (issue 38's target: within 1.5x).

    .venv/bin/python bench/replay.py [--tokens 2048] [--repeat 2]

A replay scores a chain with one `prompt_logprobs` request: `LlamaModel.score` evaluates the ids in
the engine's batches of 512 with every position's logits kept, and takes each position's
log-softmax. Plain prefill (`LlamaModel.prefill`) evaluates the same ids in the same batches and
keeps only the last position's logits. Both start from an empty cache (each round changes the first
id, so no prefix is reused) and alternate within each repeat, so that load from other processes
spreads over both; the ratio of their wall times is the figure, the tokens per second beside it
follow the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from tapdeck.runner.engine.model import LlamaModel
from tapdeck.runner.engine.model_file import default_model_path


def _text_ids(model: LlamaModel, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids: list[int] = []
    for text in topics.values():
        ids += model.tokenize(text)
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"pydoc's topics hold fewer than {n} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    model = LlamaModel(default_model_path())
    ids = _text_ids(model, args.tokens)
    times: dict[str, list[float]] = {"prefill": [], "prompt logprobs": []}
    first = 0
    for _ in range(args.repeat):
        for name in times:
            first += 1  # a new first id: nothing of the last round's cache is reused
            run = [first, *ids[1:]]
            start = time.perf_counter()
            if name == "prefill":
                model.prefill(run)
            else:
                model.score(run)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["prefill"])
    print(f"{default_model_path().name}, {args.tokens} tokens, {args.repeat} repeat(s), median wall time")
    for name, secs in times.items():
        wall = statistics.median(secs)
        print(f"  {name:16} {wall:7.2f} s  {args.tokens / wall:7.1f} tokens/s  {wall / base:5.2f}x prefill")
    model.close()


if __name__ == "__main__":
    main()
