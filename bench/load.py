"""Load: many concurrent multi-turn sessions through one `tapdeck serve`, every turn checked.

    .venv/bin/python bench/load.py [--sessions 256] [--turns 8] [--deadline 300]
    .venv/bin/python bench/load.py --soak 2000 [--turns 3]

Three processes, as in bench/proxy.py (whose vLLM-shaped upstream this reuses: replies shaped
like tests/fixtures/vllm, prompt ids that extend call by call as a chat template would): the
upstream, a real `tapdeck serve` (SQLite WAL, fsync per commit), and this client.

Load (default): `--sessions` conversations at once through the proxy, each `--turns` calls long,
then the same straight to the upstream (direct). Prints calls/s, p50/p99 per call direct and
proxied with their ratio, the server's RSS before and after and per session, and checks that
every session is one chain (one root, no break) holding every turn it was answered.

Soak (`--soak N`): N short sessions opened, run and closed, 32 at a time; the server's RSS is
sampled after each tenth of them. Flat RSS means closed sessions release their state.

Bounded: `--deadline` seconds for the whole run (the run stops and says so when it is reached).
No thresholds: it reports what it measured, and exits non-zero only if a turn was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

_spec = importlib.util.spec_from_file_location("bench_proxy", Path(__file__).with_name("proxy.py"))
assert _spec is not None and _spec.loader is not None
bench_proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_proxy)

ADMIN_KEY = "bench-load-admin-key-0123456789abcdef"
KEEPALIVE_S = 2.0
FAILED: dict[int | str, int] = {}
"""Calls answered with an error, by status (or that got no answer, by transport error)."""


def rss_kb(pid: int) -> int:
    """Resident set size of a process, in kB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def session(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    turns: int,
    salt: str,
    direct: bool,
    deadline: float,
) -> tuple[list[float], list[str]]:
    """One multi-turn conversation; per-call ms and the replies it was answered. A refused call
    ends the conversation (its status is counted in FAILED)."""
    messages = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": bench_proxy.words(200, salt)},
    ]
    latencies: list[float] = []
    replies: list[str] = []
    for i in range(turns):
        if time.monotonic() > deadline:
            break
        body: dict[str, Any] = {"model": "smollm2", "messages": messages, "max_tokens": 64}
        if direct:
            body |= {"stream": False, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
        start = time.perf_counter()
        try:
            resp = await client.post(
                url, content=orjson.dumps(body), headers={**headers, "content-type": "application/json"}
            )
        except httpx.TransportError as exc:
            FAILED[type(exc).__name__] = FAILED.get(type(exc).__name__, 0) + 1
            break
        latencies.append((time.perf_counter() - start) * 1000)
        if resp.status_code != 200:
            FAILED[resp.status_code] = FAILED.get(resp.status_code, 0) + 1
            break
        text = orjson.loads(resp.content)["choices"][0]["message"]["content"]
        replies.append(text)
        messages = [
            *messages,
            {"role": "assistant", "content": text},
            {"role": "user", "content": bench_proxy.words(40, f"{salt}-{i}")},
        ]
    return latencies, replies


async def load_round(
    upstream_url: str, proxy_url: str, server_pid: int, sessions: int, turns: int, deadline: float
) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    # Idle connections are dropped before uvicorn's 5 s keep-alive ends them under a request.
    limits = httpx.Limits(
        max_connections=sessions + 8, max_keepalive_connections=sessions + 8, keepalive_expiry=KEEPALIVE_S
    )
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await bench_proxy.warm_up(client, upstream_url, proxy_url, ADMIN_KEY)
        rss_before = rss_kb(server_pid)
        infos = await asyncio.gather(
            *(client.post(f"{proxy_url}/admin/sessions", json={}, headers=admin) for _ in range(sessions))
        )
        infos = [r.json() for r in infos]
        start = time.perf_counter()
        proxied = await asyncio.gather(
            *(
                session(
                    client,
                    f"{proxy_url}/v1/chat/completions",
                    {"Authorization": f"Bearer {info['api_key']}"},
                    turns,
                    f"p{i}",
                    False,
                    deadline,
                )
                for i, info in enumerate(infos)
            )
        )
        elapsed = time.perf_counter() - start
        rss_after = rss_kb(server_pid)
        direct = await asyncio.gather(
            *(
                session(client, f"{upstream_url}/v1/chat/completions", {}, turns, f"d{i}", True, deadline)
                for i in range(sessions)
            )
        )
        lost = broken = 0
        for info, (_lat, replies) in zip(infos, proxied, strict=True):
            summary = (await client.get(f"{proxy_url}/admin/sessions/{info['id']}", headers=admin)).json()
            doc = (await client.get(f"{proxy_url}/admin/sessions/{info['id']}/rollout", headers=admin)).json()
            stored = [t["response"]["content"] for t in doc["turns"]]
            lost += sum(1 for text in replies if text not in stored)
            broken += int(summary["roots"] != 1 or summary["breaks"] != 0 or summary["turns"] != len(replies))
    d = [x for lat, _ in direct for x in lat]
    p = [x for lat, _ in proxied for x in lat]
    return {
        "sessions": sessions,
        "calls": len(p),
        "elapsed": elapsed,
        "direct_p50": pct(d, 50),
        "direct_p99": pct(d, 99),
        "proxy_p50": pct(p, 50),
        "proxy_p99": pct(p, 99),
        "rss_before": rss_before,
        "rss_after": rss_after,
        "lost": lost,
        "broken": broken,
        "cut": time.monotonic() > deadline,
    }


async def soak(proxy_url: str, server_pid: int, sessions: int, turns: int, deadline: float) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    samples: list[tuple[int, int]] = []
    lost = done = 0
    gate = asyncio.Semaphore(32)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal lost, done
        async with gate:
            if time.monotonic() > deadline:
                return
            info = (await client.post(f"{proxy_url}/admin/sessions", json={}, headers=admin)).json()
            _lat, replies = await session(
                client,
                f"{proxy_url}/v1/chat/completions",
                {"Authorization": f"Bearer {info['api_key']}"},
                turns,
                f"s{i}",
                False,
                deadline,
            )
            closed = (await client.delete(f"{proxy_url}/admin/sessions/{info['id']}", headers=admin)).json()
            lost += len(replies) - min(len(replies), closed["turns"])
            done += 1
            if done % max(1, sessions // 10) == 0:
                samples.append((done, rss_kb(server_pid)))

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S)) as client:
        await asyncio.gather(*(one(client, i) for i in range(sessions)))
    return {"samples": samples, "lost": lost, "done": done, "cut": time.monotonic() > deadline}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=256, help="concurrent sessions (at most 256)")
    parser.add_argument("--turns", type=int, default=8, help="calls per session")
    parser.add_argument("--soak", type=int, default=0, help="run N short sessions instead, sampling RSS")
    parser.add_argument("--deadline", type=float, default=300, help="seconds for the whole run")
    args = parser.parse_args()
    sessions = max(1, min(256, args.sessions))
    deadline = time.monotonic() + args.deadline

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    up_port, proxy_port = bench_proxy.free_port(), bench_proxy.free_port()
    upstream_url, proxy_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{proxy_port}"
    data = Path(tempfile.mkdtemp(prefix="tapdeck-load-"))
    up = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("proxy.py")), "--upstream", str(up_port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    server = None
    lost = 0
    try:
        bench_proxy.wait_ready(f"{upstream_url}/v1/models")
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("tapdeck")),
                "serve",
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
        bench_proxy.wait_ready(f"{proxy_url}/health")
        print(
            f"load, one run ({os.cpu_count()} cores; upstream, server and client are separate "
            f"processes; store = SQLite WAL, synchronous=FULL)"
        )
        if args.soak:
            s = asyncio.run(soak(proxy_url, server.pid, args.soak, args.turns, deadline))
            lost = s["lost"]
            print(
                f"soak: {s['done']} sessions of {args.turns} turns, opened, run, closed, 32 at a time"
                + (" (cut by --deadline)" if s["cut"] else "")
            )
            print(
                "  server RSS (MB) after n sessions: "
                + ", ".join(f"{n}: {kb / 1024:.1f}" for n, kb in s["samples"])
            )
            if len(s["samples"]) >= 2:
                (n0, r0), (n1, r1) = s["samples"][0], s["samples"][-1]
                print(f"  growth from {n0} to {n1} sessions: {(r1 - r0) / max(1, n1 - n0):.2f} kB/session")
            print(f"  turns lost: {lost}")
        else:
            r = asyncio.run(load_round(upstream_url, proxy_url, server.pid, sessions, args.turns, deadline))
            lost = r["lost"]
            print(
                f"{r['sessions']} concurrent sessions x {args.turns} turns = {r['calls']} proxied calls"
                + (" (cut by --deadline)" if r["cut"] else "")
            )
            print(f"  calls/s through the proxy: {r['calls'] / r['elapsed']:.0f}")
            print(f"  ms per call   direct p50 {r['direct_p50']:.1f}  p99 {r['direct_p99']:.1f}")
            print(f"                proxy  p50 {r['proxy_p50']:.1f}  p99 {r['proxy_p99']:.1f}")
            print(
                f"  ratio proxy/direct: p50 {r['proxy_p50'] / r['direct_p50']:.2f}, "
                f"p99 {r['proxy_p99'] / r['direct_p99']:.2f}"
            )
            print(
                f"  server RSS {r['rss_before'] / 1024:.1f} -> {r['rss_after'] / 1024:.1f} MB, "
                f"{(r['rss_after'] - r['rss_before']) / sessions:.0f} kB per live session"
            )
            print(f"  sessions not one whole chain: {r['broken']}; turns lost: {lost}")
        print(f"  calls refused, by status: {FAILED or 'none'}")
    finally:
        for p in (server, up):
            if p is not None:
                p.terminate()
                p.wait(30)
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
