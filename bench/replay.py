"""Prompt-logprob throughput of the embedded engine against its plain prefill, on the same ids, in
one run (issue 38's target: within 1.5x).

    .venv/bin/python bench/replay.py [--tokens 2048] [--repeat 2] [--rollout 200]

A replay scores a chain with one `prompt_logprobs` request: `LlamaModel.score` evaluates the ids in
the engine's batches of 512 with every position's logits kept, and takes each position's
log-softmax. Plain prefill (`LlamaModel.prefill`) evaluates the same ids in the same batches and
keeps only the last position's logits. Both start from an empty cache (each round changes the first
id, so no prefix is reused) and alternate within each repeat, so that load from other processes
spreads over both; the ratio of their wall times is the figure, the tokens per second beside it
follow the machine's load.

`--rollout 200` then replays the benchmark rollout (bench/graph.py's: 200 turns, one chain reaching
~100k tokens) through the real path: stored in a SQLite store, `replay_session` against the embedded
engine served over HTTP, its `prompt_logprobs` request, drift and the stored result. The engine's
context (32,768 tokens, or `--n-ctx`) cuts the chain: the replay scores the turns inside it in one
request and reports the rest as not fitting. The same ids then go to the same engine as a plain completion
(`max_tokens: 1`, no prompt logprobs) after a two-token call has emptied its prefix cache: the plain
prefill of those tokens. The figure is the ratio of the two wall times, side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from graph import make_turns  # bench/ is on sys.path when this runs as a script

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.store.database import Store
from tapdeck.runner.engine.embedded import EmbeddedEngine
from tapdeck.runner.engine.model import DEFAULT_N_CTX, LlamaModel
from tapdeck.runner.engine.model_file import default_model_path
from tapdeck.runner.replay.reference import ReferenceEngine
from tapdeck.runner.replay.session import replay_session


def _text_ids(model: LlamaModel, n: int) -> list[int]:
    from pydoc_data.topics import topics

    ids: list[int] = []
    for text in topics.values():
        ids += model.tokenize(text)
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"pydoc's topics hold fewer than {n} tokens")


def replay_rollout(turns: int, n_ctx: int) -> None:
    """Replay the `turns`-turn benchmark rollout against the embedded engine serving `n_ctx`
    tokens of context, then prefill the same ids plainly on it, and print both."""
    rollout = make_turns(turns, 500)
    total = int(rollout[-1].prompt_ids.size + rollout[-1].sampled_ids.size)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "capture.db") as store:
        store.create_session({"id": "bench", "tier": "tokens", "rollout_type": "train"})
        graph = RolloutGraph()
        for turn in rollout:
            store.append_turn(turn, graph.add(turn))
        engine = EmbeddedEngine(n_ctx=n_ctx).start()
        try:
            reference = ReferenceEngine.at(engine.base_url, name="embedded")
            start = time.perf_counter()
            result, pairs = replay_session(store, "bench", reference)
            replay_s = time.perf_counter() - start
            reference.close()
            scored = [t for t in result.turns if t.scored]
            last = rollout[len(scored) - 1]
            ids = np.concatenate([last.prompt_ids, last.sampled_ids]).tolist()
            body = {"model": engine.served_name, "max_tokens": 1, "temperature": 0}
            with httpx.Client(base_url=engine.base_url, timeout=None) as http:
                http.post("/completions", json={**body, "prompt": [1, 2]}).raise_for_status()
                start = time.perf_counter()
                http.post("/completions", json={**body, "prompt": ids}).raise_for_status()
                prefill_s = time.perf_counter() - start
        finally:
            engine.stop()
    print(
        f"the {turns}-turn benchmark rollout: {total:,} tokens in one chain; the engine's context "
        f"of {engine.n_ctx:,} holds turns 0-{len(scored) - 1} ({len(ids):,} tokens, {len(pairs):,} "
        f"sampled), {len(rollout) - len(scored)} turn(s) reported as not fitting"
    )
    print(
        f"  replay           {replay_s:7.2f} s  {len(ids) / replay_s:7.1f} tokens/s  "
        f"({result.requests} request(s))"
    )
    print(f"  plain prefill    {prefill_s:7.2f} s  {len(ids) / prefill_s:7.1f} tokens/s")
    print(f"  replay / prefill {replay_s / prefill_s:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--rollout", type=int, default=0, metavar="TURNS", help="also replay the TURNS-turn benchmark rollout"
    )
    parser.add_argument(
        "--n-ctx",
        type=int,
        default=DEFAULT_N_CTX,
        help="the engine's context for --rollout: where the chain is cut (32,768 takes over 14 min a side)",
    )
    args = parser.parse_args()
    if args.tokens:
        score_against_prefill(args.tokens, args.repeat)
    if args.rollout:
        replay_rollout(args.rollout, args.n_ctx)


def score_against_prefill(tokens: int, repeat: int) -> None:
    """Prompt logprobs against plain prefill of the same `tokens` ids, in-process."""
    model = LlamaModel(default_model_path())
    ids = _text_ids(model, tokens)
    times: dict[str, list[float]] = {"prefill": [], "prompt logprobs": []}
    first = 0
    for _ in range(repeat):
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
    print(f"{default_model_path().name}, {tokens} tokens, {repeat} repeat(s), median wall time")
    for name, secs in times.items():
        wall = statistics.median(secs)
        print(f"  {name:16} {wall:7.2f} s  {tokens / wall:7.1f} tokens/s  {wall / base:5.2f}x prefill")
    model.close()


if __name__ == "__main__":
    main()
