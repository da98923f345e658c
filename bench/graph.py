"""Cost of linking and storing one turn of a long rollout, and of exporting it.

Builds a synthetic 200-turn rollout shaped like an agent loop (first prompt ~1k tokens; each turn
samples ~250 tokens and the next prompt adds a ~250-token observation, so ~500 new tokens per turn
and prompts reaching ~100k tokens), then prints, for selected turns k: the time to `add` turn k to
the graph, the memory tracemalloc sees retained by the graph for it and the transient peak, and the
time to `append_turn` it to a real SQLite store. A second table links one extra turn at the longest
prompt with a varying number of new tokens. Ratios, no thresholds.

Run: `.venv/bin/python bench/graph.py [--turns 200] [--new 500]`
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import orjson

from tapdeck.proxy.capture.export import rollout_document, training_trace
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.store.database import Store


def make_turns(n_turns: int, new: int, first: int = 1000, seed: int = 0) -> list[Turn]:
    rng = np.random.default_rng(seed)
    turns = []
    prompt = rng.integers(3, 49152, first, dtype=np.int32)
    for k in range(n_turns):
        sampled = rng.integers(3, 49152, new // 2, dtype=np.int32)
        logprobs = -rng.random(sampled.size)
        msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
        for j in range(k):
            msgs += [{"role": "assistant", "content": f"reply {j}"}, {"role": "user", "content": f"obs {j}"}]
        turns.append(
            Turn(
                session_id="bench",
                seq=k,
                prompt_ids=prompt,
                sampled_ids=sampled,
                logprobs=logprobs,
                finish_reason="stop",
                request={"messages": msgs},
                response={"role": "assistant", "content": f"reply {k}"},
            )
        )
        obs = rng.integers(3, 49152, new - new // 2, dtype=np.int32)
        prompt = np.concatenate([prompt, sampled, obs])
    return turns


def measure_add(graph: RolloutGraph, turn: Turn) -> tuple[float, int, int]:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    graph.add(turn)
    dt = time.perf_counter() - t0
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dt, current - before, peak - before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--new", type=int, default=500)
    args = ap.parse_args()
    turns = make_turns(args.turns, args.new)
    marks = sorted({1, 10, 50, 100, 150, args.turns} & set(range(1, args.turns + 1)))
    graph = RolloutGraph()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "capture.db")
        store.create_session({"id": "bench"})
        for k, t in enumerate(turns, start=1):
            # Marked turns are added under tracemalloc for memory; times come from the untraced
            # second pass below (tracemalloc slows allocation).
            dt, kept, peak = measure_add(graph, t) if k in marks else (None, None, None)
            if dt is None:
                t0 = time.perf_counter()
                link = graph.add(t)
                dt = time.perf_counter() - t0
            link = graph.link(t.seq)
            t0 = time.perf_counter()
            store.append_turn(t, link)
            st = time.perf_counter() - t0
            if k in marks:
                rows.append((k, len(t.prompt_ids), dt, kept, peak, st))
        db_size = sum(p.stat().st_size for p in Path(tmp).iterdir())
        store.close()

    # Untraced add times, measured separately (tracemalloc inflates them).
    fresh = RolloutGraph()
    untraced = {}
    for k, t in enumerate(turns, start=1):
        t0 = time.perf_counter()
        fresh.add(t)
        untraced[k] = time.perf_counter() - t0

    print(f"linking turn k of a {args.turns}-turn rollout, ~{args.new} new tokens per turn")
    print(
        f"{'k':>4} {'prompt':>8} {'add ms':>8} {'ns/prompt tok':>14} {'kept KB':>8} "
        f"{'B/new tok':>10} {'peak KB':>8} {'store ms':>9}"
    )
    base = None
    for k, plen, _dt, kept, peak, st in rows:
        dt = untraced[k]
        base = base or dt
        print(
            f"{k:>4} {plen:>8} {dt * 1e3:>8.3f} {dt * 1e9 / plen:>14.1f} {kept / 1024:>8.1f} "
            f"{kept / args.new:>10.1f} {peak / 1024:>8.1f} {st * 1e3:>9.3f}"
        )
    first, last = rows[0], rows[-1]
    print(
        f"ratio add(k={last[0]}) / add(k={first[0]}): {untraced[last[0]] / untraced[first[0]]:.2f} "
        f"for a prompt {last[1] / first[1]:.0f}x longer; retained memory ratio "
        f"{last[3] / max(first[3], 1):.2f}"
    )
    added = (
        len(t.prompt_ids) - len(p.prompt_ids) - len(p.sampled_ids)
        for p, t in zip(turns, turns[1:], strict=False)
    )
    unique = sum(len(t.sampled_ids) for t in turns) + len(turns[0].prompt_ids) + sum(added)
    print(
        f"median add over all turns: {statistics.median(untraced.values()) * 1e3:.3f} ms; "
        f"store file {db_size / 1e6:.2f} MB for {unique} unique tokens"
    )

    # Same longest prompt, varying new tokens.
    print("\none extra turn after the longest prompt, varying new tokens")
    print(f"{'new':>6} {'add ms':>8} {'kept KB':>8}")
    last_t = turns[-1]
    full = np.concatenate([last_t.prompt_ids, last_t.sampled_ids])
    rng = np.random.default_rng(1)
    res = []
    for i, extra in enumerate((50, 500, 5000, 50000)):
        t = Turn(
            session_id="bench",
            seq=10_000 + i,
            prompt_ids=np.concatenate([full, rng.integers(3, 49152, extra, dtype=np.int32)]),
            sampled_ids=rng.integers(3, 49152, 16, dtype=np.int32),
            logprobs=-np.ones(16),
            request=last_t.request,
            response={"content": "x"},
        )
        g2 = fresh
        t0 = time.perf_counter()
        g2.add(t)
        dt = time.perf_counter() - t0
        kept = g2.nodes[t.seq].prompt_tail.nbytes + g2.nodes[t.seq].sampled.nbytes
        res.append((extra, dt))
        print(f"{extra:>6} {dt * 1e3:>8.3f} {kept / 1024:>8.1f}")
    print(f"ratio add(50000 new) / add(50 new): {res[-1][1] / res[0][1]:.2f}")

    session = {"id": "bench", "rollout_type": "train", "metadata": {}}
    g = RolloutGraph()
    for t in turns:
        g.add(t)
    for name, fn in (
        ("rollout_document (lists) + orjson", lambda: orjson.dumps(rollout_document(session, g, "tokens"))),
        (
            "rollout_document (numpy) + orjson",
            lambda: orjson.dumps(
                rollout_document(session, g, "tokens", lists=False), option=orjson.OPT_SERIALIZE_NUMPY
            ),
        ),
        ("training_trace (lists) + orjson", lambda: orjson.dumps(training_trace(session, g, "tokens"))),
        (
            "training_trace (numpy) + orjson",
            lambda: orjson.dumps(
                training_trace(session, g, "tokens", lists=False), option=orjson.OPT_SERIALIZE_NUMPY
            ),
        ),
    ):
        t0 = time.perf_counter()
        out = fn()
        print(f"export {name}: {(time.perf_counter() - t0) * 1e3:.1f} ms, {len(out) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
