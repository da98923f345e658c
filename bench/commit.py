"""Store-thread CPU per captured call: linking, rollout stats and the durable append, in process.

A captured call's store-thread side (`CallCapture._commit_turn`) is `RolloutGraph.add`, then
`Store.append_turn` (a group commit with fsync), then `RolloutGraph.stats()`. This times each on
its own, in process CPU time (user+sys of this process, so an fsync's wait is not counted but its
syscalls are), for rollouts built the way the proxy builds them: the replies come from
bench/proxy.py's vLLM-shaped upstream (ids per message that extend call by call exactly as a chat
template would, 24-token replies with logprobs), parsed by the proxy's own reply parser and
interned by a session interner, so the turns carry what a live call's turns carry.

Two shapes:
1. short rollouts: `--short-turns` calls, a ~1k-token first prompt growing ~225 tokens a turn
   (`--short-rollouts` of them, one after another, sharing one store);
2. one long rollout: `--long-turns` calls growing ~500 tokens a turn, to ~100k tokens.

Prints µs of CPU per turn for each part (mean over the turns; for the long rollout also its first
and last tenth, where a per-turn cost that grows with the rollout shows), the lowest of
`--repeat` runs (other processes on a shared machine only ever add to a run's CPU time, by up to
a half on 2 busy cores). No thresholds.

Run: `.venv/bin/python bench/commit.py [--short-turns 30] [--short-rollouts 8] [--long-turns 200]
[--repeat 5]`
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from proxy import Upstream, words
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.interning import Interner
from tapdeck.proxy.capture.tokens import PromptIdsMemo, loads_with_prompt_ids
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.capture.validation import validate_turn
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.client import EngineClient

PARTS = ("add", "stats", "append_turn")
SAMPLING = {
    "requested": {"max_tokens": 64, "temperature": 1.0},
    "submitted": {"max_tokens": 64, "temperature": 1.0, "logprobs": True},
}


def rollout(up: Upstream, session_id: str, turns: int, first_tokens: int, turn_tokens: int) -> list[Turn]:
    """The turns a proxy session records for one rollout (no timing here)."""
    interner, memo = Interner(), PromptIdsMemo()
    messages = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": words(first_tokens, session_id)},
    ]
    out = []
    for seq in range(turns):
        chat = {"model": "smollm2", "messages": messages, "max_tokens": 64, "temperature": 1.0}
        upstream = chat | {"stream": False, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
        reply = loads_with_prompt_ids(up.reply(upstream), memo)
        assert isinstance(reply, dict)
        cap = EngineClient.parse_capture(reply)
        choice = reply["choices"][0]
        interned = interner.intern(chat)
        turn = Turn(
            session_id=session_id,
            seq=seq,
            prompt_ids=cap.prompt_ids,
            sampled_ids=cap.sampled_ids,
            logprobs=cap.logprobs,
            finish_reason=choice.get("finish_reason"),
            request=interned.request,
            content_keys=interned.keys,
            response=choice.get("message") or {},
            sampling=SAMPLING,
            token_texts=cap.token_texts,
            top_logprobs=cap.top_logprobs,
            findings=list(cap.findings),
            meta={"latency_ms": 1.0, "usage": reply.get("usage"), "reply_id": f"r-{seq}"},
        )
        turn.findings.extend(validate_turn(turn, "tokens"))
        out.append(turn)
        messages = [
            *messages,
            {"role": "assistant", "content": choice["message"]["content"]},
            {"role": "user", "content": words(turn_tokens, f"{session_id}-{seq}")},
        ]
    return out


def commit(store: Store, turns: list[Turn]) -> dict[str, list[float]]:
    """Each turn through what `_commit_turn` runs, timed per part: µs of process CPU."""
    graph = RolloutGraph()
    store.create_session({"id": turns[0].session_id})
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    clock = time.process_time_ns
    for turn in turns:
        t0 = clock()
        link = graph.add(turn)
        t1 = clock()
        store.append_turn(turn, link)
        t2 = clock()
        graph.stats()
        t3 = clock()
        times["add"].append((t1 - t0) / 1000)
        times["append_turn"].append((t2 - t1) / 1000)
        times["stats"].append((t3 - t2) / 1000)
    return times


def row(label: str, runs: list[dict[str, list[float]]]) -> None:
    """Per part, the lowest over runs of the mean µs per turn."""
    means = {p: min(statistics.fmean(r[p]) for r in runs) for p in PARTS}
    cells = "".join(f"{means[p]:>13.1f}" for p in PARTS)
    print(f"{label:<34}{cells}{sum(means.values()):>13.1f}")


def measure(
    short: list[list[Turn]], long: list[Turn], tmp: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """One run: the short rollouts, then the long one, into a fresh store."""
    with Store(tmp / "capture.db") as store:
        merged: dict[str, list[float]] = {p: [] for p in PARTS}
        for turns in short:
            for part, values in commit(store, turns).items():
                merged[part].extend(values)
        return merged, commit(store, long)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--short-turns", type=int, default=30)
    ap.add_argument("--short-rollouts", type=int, default=8)
    ap.add_argument("--long-turns", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    up = Upstream()
    short = [rollout(up, f"short-{i}", args.short_turns, 1000, 200) for i in range(args.short_rollouts)]
    long = rollout(up, "long", args.long_turns, 1000, 475)
    print(
        f"CPU µs per turn ({args.short_rollouts} × {args.short_turns}-turn rollouts, ~1k tokens "
        f"+ ~225 a turn; one {args.long_turns}-turn rollout to "
        f"{long[-1].prompt_ids.size // 1000}k tokens)"
    )
    print(f"{'':<34}" + "".join(f"{p:>13}" for p in PARTS) + f"{'total':>13}")
    short_runs, long_runs = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            merged, times = measure(short, long, Path(tmp))
        short_runs.append(merged)
        long_runs.append(times)
    tenth = max(1, args.long_turns // 10)
    row(f"{args.short_turns}-turn rollouts, all turns", short_runs)
    row(f"{args.long_turns}-turn rollout, all turns", long_runs)
    row(f"  first {tenth} turns", [{p: v[:tenth] for p, v in r.items()} for r in long_runs])
    row(f"  last {tenth} turns", [{p: v[-tenth:] for p, v in r.items()} for r in long_runs])


if __name__ == "__main__":
    main()
