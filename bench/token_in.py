"""Token-in capture, side by side: prefix breaks and token segments with the mode off and on.

Runs terminus-2 on the sample dataset through a local tapdeck server and the embedded engine at
temperature 1 (the training policy), once with token-in off and once on, then prints per mode:
turn transitions (calls that continue a conversation), breaks, breaks per transition,
fragmentation (token segments per conversation), and how many calls were sent as ids or fell back
to text (with the reasons). With `--rescore`, the longest token-in row is re-scored in one forward
pass and its captured logprobs compared.

Run: `.venv/bin/python bench/token_in.py [--harness terminus-2] [--tasks hello-file] [--k 1]
[--max-turns 4] [--agent-timeout S] [--rescore]` (an agent CLI must be installed first, as
`tapdeck rollout` does; its first call can outlast a task's agent timeout on a loaded CPU).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np


def run_mode(
    base: str,
    headers: dict[str, str],
    harness: str,
    tasks: list[str],
    k: int,
    max_turns: int,
    token_in: bool,
    timeout: float,
    agent_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """One run with the mode set; the rollout documents of its sessions."""
    plan = {
        "harness": harness,
        "tasks": tasks,
        "k": k,
        "timeout_s": timeout,
        "token_in": token_in,
        "training_sampling": {"temperature": 1.0},
        "agent_kwargs": {"max_turns": max_turns},
    }
    if agent_timeout is not None:
        plan["agent_timeout_s"] = agent_timeout
    with httpx.Client(base_url=base, headers=headers, timeout=120.0) as http:
        run = http.post("/admin/runs", json=plan)
        run.raise_for_status()
        run_id = run.json()["id"]
        deadline = time.monotonic() + timeout * len(tasks) * k + 120
        while True:
            doc = http.get(f"/admin/runs/{run_id}").json()
            if doc["state"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        for r in doc.get("rollouts", []):
            if not r.get("ok"):
                print(f"  rollout failed: {r.get('error_kind')}: {str(r.get('error'))[:300]}", flush=True)
        sessions = [r["session_id"] for r in doc.get("rollouts", []) if r.get("session_id")]
        return [http.get(f"/admin/sessions/{s}/rollout").json() for s in sessions]


def figures(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Transitions, breaks, fragmentation and capture modes over a run's rollouts."""
    turns = sum(d["stats"]["turns"] for d in docs)
    conversations = sum(max(d["stats"]["conversations"], 1) for d in docs if d["stats"]["turns"])
    breaks = sum(d["stats"]["breaks"] for d in docs)
    segments = conversations + breaks
    modes: collections.Counter[str] = collections.Counter()
    differ = 0
    for d in docs:
        for t in d["turns"]:
            record = (t.get("meta") or {}).get("capture_mode") or {}
            mode = record.get("mode")
            modes["ids" if mode == "ids" else f"text:{record.get('reason', 'mode off')}"] += 1
            differ += mode == "ids" and not record.get("same")
    transitions = turns - conversations
    return {
        "rollouts": len(docs),
        "turns": turns,
        "transitions": transitions,
        "breaks": breaks,
        "breaks_per_transition": round(breaks / transitions, 3) if transitions else None,
        "segments_per_conversation": round(segments / conversations, 3) if conversations else None,
        "ids_prompts_differing_from_text": differ,
        "modes": dict(modes),
    }


def rescore_longest(docs: list[dict[str, Any]], base: str, headers: dict[str, str]) -> str:
    """Re-score the longest token-in row in one pass; the largest logprob gap over its tokens."""
    from tapdeck.runner.engine.rescore import rescore

    best = None
    for d in docs:
        trace = httpx.get(
            f"{base}/admin/sessions/{d['session_id']}/trace", headers=headers, timeout=120
        ).json()
        for row in trace.get("turns", []):
            if row["metadata"]["capture_mode"] == "ids" and (
                best is None or len(row["prompt_token_ids"]) > len(best[1]["prompt_token_ids"])
            ):
                best = (trace, row)
    if best is None:
        return "no token-in row to re-score"
    trace, last = best
    ids = last["prompt_token_ids"] + last["completion_token_ids"]
    rows = [
        r
        for r in trace["turns"]
        if ids[: len(r["prompt_token_ids"]) + len(r["completion_token_ids"])]
        == r["prompt_token_ids"] + r["completion_token_ids"]
    ]
    again = rescore(ids, 1, temperature=1.0)
    gaps = np.array(
        [
            abs(again[len(r["prompt_token_ids"]) + i - 1] - lp)
            for r in rows
            for i, lp in enumerate(r["per_token_logps"])
        ]
    )
    return (
        f"re-scored a {len(ids)}-token row ({len(rows)} calls, {gaps.size} sampled tokens) in "
        f"one pass: max |gap| {gaps.max():.4f}, mean {gaps.mean():.5f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", default="terminus-2")
    parser.add_argument("--tasks", nargs="+", default=["hello-file"])
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=None,
        help="the agent phase's limit, seconds (default: the task's)",
    )
    parser.add_argument("--rescore", action="store_true")
    args = parser.parse_args()
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalServer(ServerConfig(port=0, data_dir=Path(tmp))) as server,
    ):
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        for token_in in (False, True):
            docs = run_mode(
                server.url,
                headers,
                args.harness,
                args.tasks,
                args.k,
                args.max_turns,
                token_in,
                args.timeout,
                args.agent_timeout,
            )
            print(f"token-in {'on ' if token_in else 'off'}: {figures(docs)}", flush=True)
            if token_in and args.rescore:
                print(rescore_longest(docs, server.url, headers), flush=True)


if __name__ == "__main__":
    main()
