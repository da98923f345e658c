"""Where a proxied call's CPU goes inside a serving tapdeck: thread CPU time of named steps.

    .venv/bin/python bench/proxy_parts.py [--sessions 16] [--calls 20] [--rounds 3]

Runs bench/proxy.py's vLLM-shaped upstream, then `tapdeck serve` with each step below wrapped in
a reading of its thread's CPU clock (`time.thread_time_ns`, which counts only time on a core, so
a wait for the GIL, the disk or the network is not charged to the step), sends `--rounds` rounds
of `--sessions` concurrent rollouts of `--calls` calls through it, and prints each step's mean µs
of CPU per call, on the event loop and on the store threads, beside the loop thread's whole CPU
per call. A step's figure includes the steps it calls, and the cyclic collector's passes that ran
inside it; those passes are also listed on their own, by generation.

Sampling profilers cannot give this on a server whose threads share the GIL: py-spy charges a
thread's wait for the GIL to the function it waits in, `perf` sees no Python frames in this
build of CPython, and a tracing profiler's cost per call outweighs the 10-100 µs steps it
measures. Timing a step alone (bench/commit.py, or `timeit` on a recorded reply) gives its cost
with warm caches, which here was 2-5× less than inside the server. No thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
import proxy as bench
from tapdeck.app.commands import serve as serve_command

P = "tapdeck.proxy."
STEPS: list[tuple[str, str]] = [
    # (module whose global or class the caller looks the step up in, attribute path)
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol.data_received"),
    (P + "sessions", "key_from_request"),
    (P + "session_registry", "SessionRegistry.for_key"),
    (P + "call_pipeline", "_payload"),
    (P + "dialects.chat", "ChatDialect.parse"),
    (P + "engine_client", "prepare_request"),
    (P + "upstream_http", "_Connection.data_received"),
    (P + "engine_client", "loads_with_prompt_ids"),
    (P + "engine_client", "zero_filled_usage"),
    (P + "call_capture", "_cap_findings"),
    (P + "engine_client", "EngineClient.parse_capture"),
    (P + "interning", "Interner.intern"),
    (P + "call_capture", "validate_turn"),
    (P + "call_capture", "CallCapture._commit_turn"),
    (P + "graph", "RolloutGraph.add"),
    (P + "store", "Store.append_turn"),
    (P + "store", "Store._commit_group"),
    (P + "graph", "RolloutGraph.stats"),
    (P + "store_writes", "_settle"),
    (P + "live_session", "LiveSession.count"),
    (P + "events", "EventBus.publish"),
    (P + "activity", "ActivityCall.replied"),
    (P + "dialects.chat", "ChatDialect.render"),
    (P + "access_log", "AccessRecord.emit"),
    (P + "server", "_reply"),
]
LOOP_THREAD = "tapdeck-server"
ADMIN_KEY = "bench-admin-key"


def _timed(
    step: str,
    fn: Callable[..., Any],
    totals: collections.Counter[tuple[str, str]],
    counts: collections.Counter[tuple[str, str]],
) -> Callable[..., Any]:
    clock = time.thread_time_ns

    def timed(*args: Any, **kwargs: Any) -> Any:
        where = "loop" if threading.current_thread().name == LOOP_THREAD else "store"
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[(where, step)] += clock() - start
            counts[(where, step)] += 1

    return timed


def serve_timed(out: Path, argv: list[str]) -> None:
    """`tapdeck serve argv` in this process with every step wrapped; totals to `out` at exit."""
    totals: collections.Counter[tuple[str, str]] = collections.Counter()
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for module, attr in STEPS:
        *path, name = attr.split(".")
        owner: Any = importlib.import_module(module)
        for part in path:
            owner = getattr(owner, part)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        static = isinstance(raw, staticmethod)
        timed = _timed(attr, raw.__func__ if static else raw, totals, counts)
        setattr(owner, name, staticmethod(timed) if static else timed)

    collecting: dict[str, int] = {}

    def collector(phase: str, info: dict[str, int]) -> None:
        """The cyclic collector's passes, by generation, on the thread that triggered them."""
        if phase == "start":
            collecting["at"] = time.thread_time_ns()
            return
        where = "loop" if threading.current_thread().name == LOOP_THREAD else "store"
        step = f"cyclic collector, generation {info['generation']} passes"
        totals[(where, step)] += time.thread_time_ns() - collecting["at"]
        counts[(where, step)] += 1

    def start_counting() -> None:
        """Once `tapdeck serve` has settled its collector: what start-up cost is not counted."""
        settle()
        totals.clear()
        counts.clear()
        gc.callbacks.append(collector)

    settle = serve_command.settle_collector
    serve_command.settle_collector = start_counting

    def dump() -> None:
        out.write_text(
            json.dumps([[where, step, ns, counts[(where, step)]] for (where, step), ns in totals.items()])
        )

    atexit.register(dump)
    from tapdeck.app.cli import main

    sys.argv = ["tapdeck", "serve", *argv]
    main()


async def drive(
    proxy_url: str,
    upstream_url: str,
    pid: int,
    sessions: int,
    calls: int,
    rounds: int,
    turns: int,
    turn_tokens: int,
) -> tuple[int, float]:
    """The rounds' calls (or the one long rollout's) and the loop thread's CPU seconds over them."""
    engine = {"url": f"{upstream_url}/v1"}
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    done, loop_s = 0, 0.0
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await bench.warm_up(client, upstream_url, proxy_url, ADMIN_KEY, engine)
        if turns:
            info = (
                await client.post(
                    f"{proxy_url}/admin/sessions",
                    json={"engine": engine},
                    headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                )
            ).json()
            threads = bench.thread_cpu_s(pid)
            await bench.conversation(
                client,
                f"{proxy_url}/v1/chat/completions",
                {"Authorization": f"Bearer {info['api_key']}"},
                turns=turns,
                first_tokens=1000,
                turn_tokens=turn_tokens,
                salt="parts-long",
                direct=False,
            )
            return turns, bench.busiest_delta(threads, bench.thread_cpu_s(pid))
        for k in range(rounds):
            r = await bench.through_proxy(
                client, proxy_url, ADMIN_KEY, pid, engine, sessions, calls, 1000, 200, f"parts{k}"
            )
            if r["errors"]:
                raise RuntimeError(f"calls failed: {r['errors'][0]}")
            done += len(r["flat"])
            loop_s += r["loop_ms"] * len(r["flat"]) / 1000
    return done, loop_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve-timed", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20, help="calls per session and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--turns",
        type=int,
        default=0,
        help="instead of the rounds, one rollout of this many turns whose prompt "
        "grows as bench/proxy.py's flatness round's does (200: ~107k tokens)",
    )
    parser.add_argument("--turn-tokens", type=int, default=500, help="tokens each turn adds (--turns)")
    args, rest = parser.parse_known_args()
    if args.serve_timed:
        serve_timed(args.serve_timed, rest)
        return

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    up_port, proxy_port = bench.free_port(), bench.free_port()
    upstream_url, proxy_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{proxy_port}"
    data = Path(tempfile.mkdtemp(prefix="tapdeck-parts-"))
    totals_file = data / "steps.json"
    upstream = bench.start_upstream(up_port, 0.0, env)
    server = None
    try:
        bench.wait_ready(f"{upstream_url}/v1/models")
        server = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve-timed",
                str(totals_file),
                "--port",
                str(proxy_port),
                "--engine",
                f"{upstream_url}/v1",
                "--admin-key",
                ADMIN_KEY,
                "--data-dir",
                str(data),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bench.wait_ready(f"{proxy_url}/health")
        calls, loop_s = asyncio.run(
            drive(
                proxy_url,
                upstream_url,
                server.pid,
                args.sessions,
                args.calls,
                args.rounds,
                args.turns,
                args.turn_tokens,
            )
        )
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            server.wait(60)
        upstream.terminate()
        upstream.wait(30)
    rows = json.loads(totals_file.read_text())
    # Every model call the server answered (the warm-up's too) reads its body once.
    answered = next(count for _where, step, _ns, count in rows if step == "_payload")
    load = (
        f"one rollout of {args.turns} turns"
        if args.turns
        else f"{args.rounds} × {args.sessions} sessions × {args.calls} calls"
    )
    print(
        f"thread CPU of each step inside `tapdeck serve` ({os.cpu_count()} cores, {bench.load()}; "
        f"{load}, {answered} answered)"
    )
    print(f"the event loop's whole CPU: {loop_s * 1e6 / calls:.0f} µs per call (/proc ticks)")
    print(f"{'thread':<7} {'µs/call':>8} {'runs/call':>9}  step")
    for where, step, ns, count in sorted(rows, key=lambda r: (r[0], -r[2])):
        print(f"{where:<7} {ns / 1000 / answered:>8.1f} {count / answered:>9.3f}  {step}")


if __name__ == "__main__":
    main()
