"""Proxy overhead: per-call latency and CPU through tapdeck vs straight to a vLLM-shaped upstream.

    .venv/bin/python bench/proxy.py [--calls 20] [--concurrency 1,16,64,256] [--slow 64,256] [--turns 200]
                                    [--rounds 3]

Processes: two upstreams (this file with `--upstream PORT`; one answering at once, one after
100 ms; replies have the shape of the recorded vLLM bodies in tests/fixtures/vllm, with real
prompt_token_ids of the requested length that extend call by call exactly as a chat template
would), a real `tapdeck serve` on them (SQLite store, fsync per commit), the floor proxy
(`bench/proxy_floor.py`: the least a durable capturing proxy on the same stack does; `--no-floor`
skips it), and the client here. Each round sends the same rollouts direct, through the floor, then
through tapdeck. Prints, from one run:

1. per round of N concurrent rollouts (fast upstream, then the 100 ms one): p50 direct and proxied,
   p50 and p99 ratios, the proxy's CPU ms per call (its process CPU time over the calls, with the
   kernel's part and its event-loop thread's part beside it), calls/s proxied and direct, failed
   calls, and how many sessions came out as one chain with every turn captured; under it the
   floor's row, measured the same way;
2. flatness as turns grow: one 200-turn rollout whose prompts reach ~100k tokens, early vs late
   turns, its CPU per call, RSS growth per 1,000 stored tokens, and the rollout export time.

`--rounds N` repeats each concurrency round and prints the median of each figure (on a shared
machine one round's CPU per call swings by a fifth). `--profile FILE` runs the proxy under py-spy
(GIL-holding samples, collapsed stacks; `bench/proxy_profile.py FILE` sums them by part of the
call). No thresholds: it reports what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from proxy_floor import read_body

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "fixtures" / "vllm" / "chat_basic.json"
IM_START, IM_END, NL = 1, 2, 198
ROLE_IDS = {"system": [9690], "user": [4093], "assistant": [520, 9531], "tool": [4093]}
REPLY_TOKENS = 24


# ----------------------------------------------------------------------------- the upstream


class Upstream:
    """A vLLM-shaped chat endpoint: deterministic ids per message, recorded reply shape."""

    def __init__(self) -> None:
        self.template = json.loads(RECORDED.read_text())["response"]
        self.rendered: dict[bytes, np.ndarray] = {}
        self.replies: dict[str, np.ndarray] = {}
        self.counter = 0

    def _render(self, msg: dict[str, Any]) -> np.ndarray:
        """ChatML-like ids of one message; an assistant message renders to the ids it was sampled as."""
        content = msg.get("content") or ""
        key = hashlib.blake2b(f"{msg.get('role')}\0{content}".encode(), digest_size=16).digest()
        ids = self.rendered.get(key)
        if ids is None:
            if msg.get("role") == "assistant" and content in self.replies:
                body = self.replies[content][:-1]  # sampled ids without the end token
            else:
                n = max(1, len(content) // 4)
                rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
                body = rng.integers(3, 49152, n, dtype=np.int32)
            head = np.array([IM_START, *ROLE_IDS.get(msg.get("role"), [4093]), NL], dtype=np.int32)
            ids = np.concatenate([head, body, np.array([IM_END, NL], dtype=np.int32)])
            self.rendered[key] = ids
        return ids

    def reply(self, body: dict[str, Any]) -> bytes:
        prompt = np.concatenate(
            [
                *(self._render(m) for m in body["messages"]),
                np.array([IM_START, 520, 9531, NL], dtype=np.int32),
            ]
        )
        self.counter += 1
        text = f"reply {self.counter}"
        rng = np.random.default_rng(self.counter)
        sampled = np.concatenate(
            [rng.integers(3, 49152, REPLY_TOKENS - 1, dtype=np.int32), np.array([IM_END], dtype=np.int32)]
        )
        self.replies[text] = sampled
        out = copy.copy(self.template)
        lps = (-rng.random(REPLY_TOKENS)).round(4).tolist()
        out["prompt_token_ids"] = prompt
        out["choices"] = [
            {
                "index": 0,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": sampled,
                "message": {**self.template["choices"][0]["message"], "content": text},
                "logprobs": {
                    "content": [
                        {"token": f"t{int(t)}", "logprob": lp, "bytes": [116], "top_logprobs": []}
                        for t, lp in zip(sampled, lps, strict=True)
                    ]
                },
            }
        ]
        out["usage"] = {
            "prompt_tokens": int(prompt.size),
            "completion_tokens": REPLY_TOKENS,
            "total_tokens": int(prompt.size) + REPLY_TOKENS,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def upstream_app(up: Upstream, latency_s: float = 0.0) -> Any:
    """A raw ASGI app (no framework) so the upstream itself costs as little as possible."""
    models = orjson.dumps(
        {"object": "list", "data": [{"id": "smollm2", "object": "model", "max_model_len": 1 << 20}]}
    )

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = await read_body(receive)
        path = scope["path"]
        if path.endswith("/models"):
            payload, status = models, 200
        elif path.endswith("/chat/completions"):
            if latency_s:
                await asyncio.sleep(latency_s)
            payload, status = up.reply(orjson.loads(body)), 200
        else:
            payload, status = b'{"error":{"message":"not found"}}', 404
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return app


def serve_upstream(port: int, latency_s: float) -> None:
    """Run the upstream in this process until killed."""
    from tapdeck.proxy.http.uvicorn_thread import ThreadedServer

    server = ThreadedServer(
        upstream_app(Upstream(), latency_s), "127.0.0.1", port, name="bench-upstream"
    ).start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


# ----------------------------------------------------------------------------- the client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def words(n_tokens: int, salt: str) -> str:
    """Text the upstream renders to about `n_tokens` ids (4 characters per token)."""
    return (salt + "-" + "abcd" * n_tokens)[: 4 * n_tokens]


def _stat_s(stat: Path) -> tuple[float, float]:
    """`(user, sys)` CPU seconds from a /proc `stat` file (a process's or a thread's), in 10 ms ticks."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_s(pid: int, which: str = "user+sys") -> float:
    """CPU seconds of a process (all its threads): `user+sys` to the nanosecond (Linux's CPU-time
    clock of another process, as `clock_getcpuclockid` encodes it); `user` or `sys` from /proc, in
    10 ms ticks."""
    if which == "user+sys":
        return time.clock_gettime(((~pid) << 3) | 2)
    user, sys_ = _stat_s(Path(f"/proc/{pid}/stat"))
    return user if which == "user" else sys_


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user+sys) of each of a process's threads, by thread id, from /proc in 10 ms
    ticks (Linux gives no thread's CPU-time clock to another process)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            out[int(task.name)] = sum(_stat_s(task / "stat"))
    return out


def busiest_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU seconds the busiest thread spent between two `thread_cpu_s` readings: a proxy's
    event loop (the rest is its store threads)."""
    return max((cpu - before.get(tid, 0.0) for tid, cpu in after.items()), default=0.0)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Errors(list):
    """Failed calls, as `HTTP status: message` (a session stops at its first failure)."""


async def conversation(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    *,
    turns: int,
    first_tokens: int,
    turn_tokens: int,
    salt: str,
    direct: bool,
    errors: Errors | None = None,
) -> list[float]:
    """One rollout, call after call, each prompt extending the previous one; per-call ms."""
    messages = [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": words(first_tokens, salt)},
    ]
    latencies = []
    for i in range(turns):
        body: dict[str, Any] = {
            "model": "smollm2",
            "messages": messages,
            "max_tokens": 64,
            "temperature": 1.0,
        }
        if direct:  # what the proxy itself would send upstream
            body |= {"stream": False, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
        start = time.perf_counter()
        try:
            resp = await client.post(
                url, content=orjson.dumps(body), headers={**headers, "content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            if errors is None:
                raise
            errors.append(f"{type(exc).__name__}: {exc}")
            return latencies
        latencies.append((time.perf_counter() - start) * 1000)
        if resp.status_code != 200:
            if errors is None:
                raise RuntimeError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
            errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")
            return latencies
        reply = orjson.loads(resp.content)
        messages = [
            *messages,
            {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
            {"role": "user", "content": words(turn_tokens, f"{salt}-{i}")},
        ]
    return latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def warm_up(
    client: httpx.AsyncClient,
    upstream_url: str,
    proxy_url: str,
    admin_key: str,
    engine: dict[str, str] | None = None,
) -> None:
    """Open connections and take first-call costs (imports, probe) outside the measurements."""
    info = (
        await client.post(
            f"{proxy_url}/admin/sessions",
            json={"engine": engine} if engine else {},
            headers={"Authorization": f"Bearer {admin_key}"},
        )
    ).json()
    await conversation(
        client,
        f"{upstream_url}/v1/chat/completions",
        {},
        turns=3,
        first_tokens=100,
        turn_tokens=10,
        salt="warm-d",
        direct=True,
    )
    await conversation(
        client,
        f"{proxy_url}/v1/chat/completions",
        {"Authorization": f"Bearer {info['api_key']}"},
        turns=3,
        first_tokens=100,
        turn_tokens=10,
        salt="warm-p",
        direct=False,
    )


async def through_proxy(
    client: httpx.AsyncClient,
    proxy_url: str,
    admin_key: str,
    pid: int,
    engine: dict[str, str] | None,
    sessions: int,
    calls: int,
    prompt: int,
    turn_tokens: int,
    salt: str,
) -> dict[str, Any]:
    """`sessions` rollouts at once through one proxy (tapdeck or the floor): latencies, failed
    calls, the proxy's CPU per call and calls/s, and each session's summary."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    infos = [
        (
            await client.post(
                f"{proxy_url}/admin/sessions", json={"engine": engine} if engine else {}, headers=admin
            )
        ).json()
        for _ in range(sessions)
    ]
    errors = Errors()
    cpu0, sys0, threads0, start = cpu_s(pid), cpu_s(pid, "sys"), thread_cpu_s(pid), time.perf_counter()
    latencies = await asyncio.gather(
        *(
            conversation(
                client,
                f"{proxy_url}/v1/chat/completions",
                {"Authorization": f"Bearer {info['api_key']}"},
                turns=calls,
                first_tokens=prompt,
                turn_tokens=turn_tokens,
                salt=f"{salt}-{i}",
                direct=False,
                errors=errors,
            )
            for i, info in enumerate(infos)
        )
    )
    wall, cpu, sys_cpu = time.perf_counter() - start, cpu_s(pid) - cpu0, cpu_s(pid, "sys") - sys0
    loop = busiest_delta(threads0, thread_cpu_s(pid))
    summaries = [
        (await client.get(f"{proxy_url}/admin/sessions/{info['id']}", headers=admin)).json() for info in infos
    ]
    flat = [x for lat in latencies for x in lat]
    return {
        "latencies": latencies,
        "flat": flat,
        "errors": errors,
        "summaries": summaries,
        "cpu_ms": cpu * 1000 / max(1, len(flat)),
        "sys_ms": sys_cpu * 1000 / max(1, len(flat)),
        "loop_ms": loop * 1000 / max(1, len(flat)),
        "cps": len(flat) / wall,
    }


async def concurrency_round(
    upstream_url: str,
    proxy_url: str,
    admin_key: str,
    proxy_pid: int,
    sessions: int,
    calls: int,
    prompt: int,
    tag: str,
    floor: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """`sessions` rollouts at once: direct, through the floor proxy (when given as `(url, pid)`),
    then through tapdeck; latencies, errors, CPU per call, and whether every tapdeck session is
    one chain with every turn captured."""
    engine = {"url": f"{upstream_url}/v1"}
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await warm_up(client, upstream_url, proxy_url, admin_key, engine)
        direct_errors = Errors()
        start = time.perf_counter()
        direct = await asyncio.gather(
            *(
                conversation(
                    client,
                    f"{upstream_url}/v1/chat/completions",
                    {},
                    turns=calls,
                    first_tokens=prompt,
                    turn_tokens=200,
                    salt=f"d{tag}{sessions}-{i}",
                    direct=True,
                    errors=direct_errors,
                )
                for i in range(sessions)
            )
        )
        direct_wall = time.perf_counter() - start
        bare = None
        if floor is not None:
            await warm_up(client, upstream_url, floor[0], admin_key, engine)
            bare = await through_proxy(
                client,
                floor[0],
                admin_key,
                floor[1],
                engine,
                sessions,
                calls,
                prompt,
                200,
                f"f{tag}{sessions}",
            )
        tapdeck = await through_proxy(
            client, proxy_url, admin_key, proxy_pid, engine, sessions, calls, prompt, 200, f"p{tag}{sessions}"
        )
    d = [x for lat in direct for x in lat]
    p = tapdeck["flat"]
    chains = sum(1 for s in tapdeck["summaries"] if s["turns"] == calls and s["roots"] == 1)
    out = {
        "sessions": sessions,
        "calls": len(p),
        "direct_p50": pct(d, 50),
        "direct_p99": pct(d, 99),
        "proxy_p50": pct(p, 50),
        "proxy_p99": pct(p, 99),
        "chains": chains,
        "errors": len(tapdeck["errors"]),
        "direct_errors": len(direct_errors),
        "first_error": (tapdeck["errors"] or direct_errors or [""])[0],
        "cpu_ms": tapdeck["cpu_ms"],
        "sys_ms": tapdeck["sys_ms"],
        "loop_ms": tapdeck["loop_ms"],
        "proxy_cps": tapdeck["cps"],
        "direct_cps": len(d) / direct_wall,
    }
    if bare is not None:
        out |= {
            "floor_p50": pct(bare["flat"], 50),
            "floor_p99": pct(bare["flat"], 99),
            "floor_cpu_ms": bare["cpu_ms"],
            "floor_sys_ms": bare["sys_ms"],
            "floor_loop_ms": bare["loop_ms"],
            "floor_cps": bare["cps"],
            "floor_errors": len(bare["errors"]),
            "floor_stored": sum(1 for s in bare["summaries"] if s["turns"] == calls),
        }
    return out


async def flatness_round(
    upstream_url: str,
    proxy_url: str,
    admin_key: str,
    proxy_pid: int,
    turns: int,
    turn_tokens: int,
    floor: tuple[str, int] | None = None,
) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {admin_key}"}
    bare = None
    async with httpx.AsyncClient(timeout=600) as client:
        await warm_up(client, upstream_url, proxy_url, admin_key)
        direct = await conversation(
            client,
            f"{upstream_url}/v1/chat/completions",
            {},
            turns=turns,
            first_tokens=1000,
            turn_tokens=turn_tokens,
            salt="flat-d",
            direct=True,
        )
        if floor is not None:
            await warm_up(client, upstream_url, floor[0], admin_key)
            bare = await through_proxy(
                client, floor[0], admin_key, floor[1], None, 1, turns, 1000, turn_tokens, "flat-f"
            )
        info = (await client.post(f"{proxy_url}/admin/sessions", json={}, headers=admin)).json()
        rss0, cpu0 = rss_mb(proxy_pid), cpu_s(proxy_pid)
        proxied = await conversation(
            client,
            f"{proxy_url}/v1/chat/completions",
            {"Authorization": f"Bearer {info['api_key']}"},
            turns=turns,
            first_tokens=1000,
            turn_tokens=turn_tokens,
            salt="flat-p",
            direct=False,
        )
        cpu, rss = cpu_s(proxy_pid) - cpu0, rss_mb(proxy_pid) - rss0
        summary = (await client.get(f"{proxy_url}/admin/sessions/{info['id']}", headers=admin)).json()
        last = (
            await client.get(f"{proxy_url}/admin/sessions/{info['id']}/turns/{turns - 1}", headers=admin)
        ).json()
        start = time.perf_counter()
        trace = await client.get(f"{proxy_url}/admin/sessions/{info['id']}/trace", headers=admin)
        export_ms = (time.perf_counter() - start) * 1000
    window = max(1, min(10, turns // 10))
    stored = last["prompt_len"] + REPLY_TOKENS  # unique tokens of one chain
    floor_row = (
        {}
        if bare is None
        else {
            "floor_cpu_ms": bare["cpu_ms"],
            "floor_p50_ratio": statistics.median(bare["flat"]) / statistics.median(direct),
            "floor_first": statistics.median(bare["flat"][:window]),
            "floor_last": statistics.median(bare["flat"][-window:]),
        }
    )
    return floor_row | {
        "turns": turns,
        "last_prompt_tokens": last["prompt_len"],
        "roots": summary["roots"],
        "direct_first": statistics.median(direct[:window]),
        "direct_last": statistics.median(direct[-window:]),
        "proxy_first": statistics.median(proxied[:window]),
        "proxy_last": statistics.median(proxied[-window:]),
        "p50_ratio": statistics.median(proxied) / statistics.median(direct),
        "window": window,
        "export_ms": export_ms,
        "trace_bytes": len(trace.content),
        "cpu_ms": cpu * 1000 / turns,
        "rss_mb_per_1k": rss / (stored / 1000),
    }


def start_upstream(port: int, latency_s: float, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--upstream", str(port), "--latency", str(latency_s)],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def median_round(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated rounds: the median of each figure; failures and chains summed."""
    out = dict(repeats[0])
    for key, value in out.items():
        if isinstance(value, float):
            out[key] = statistics.median(r[key] for r in repeats)
    for key in ("calls", "errors", "direct_errors", "chains", "sessions", "floor_errors", "floor_stored"):
        if key in out:
            out[key] = sum(r[key] for r in repeats)
    out["first_error"] = next((r["first_error"] for r in repeats if r["first_error"]), "")
    return out


def print_row(label: str, r: dict[str, Any]) -> None:
    print(
        f"{label:<22} {r['calls']:>6} {r['direct_p50']:>8.2f} {r['proxy_p50']:>8.2f} "
        f"{r['proxy_p50'] / r['direct_p50']:>6.2f} {r['proxy_p99'] / r['direct_p99']:>6.2f} "
        f"{r['cpu_ms']:>7.2f} {r['sys_ms']:>5.2f} {r['loop_ms']:>5.2f} "
        f"{r['proxy_cps']:>7.0f} {r['direct_cps']:>7.0f} "
        f"{r['errors']:>4} {r['chains']:>4}/{r['sessions']:<4}"
    )
    if r["errors"] or r["direct_errors"]:
        print(f"{'':<22} first error: {r['first_error']}")
    if "floor_p50" in r:
        print(
            f"{'  floor':<22} {r['calls']:>6} {r['direct_p50']:>8.2f} {r['floor_p50']:>8.2f} "
            f"{r['floor_p50'] / r['direct_p50']:>6.2f} {r['floor_p99'] / r['direct_p99']:>6.2f} "
            f"{r['floor_cpu_ms']:>7.2f} {r['floor_sys_ms']:>5.2f} {r['floor_loop_ms']:>5.2f} "
            f"{r['floor_cps']:>7.0f} {r['direct_cps']:>7.0f} "
            f"{r['floor_errors']:>4} {r['floor_stored']:>4}/{r['sessions']:<4} (stored, not linked)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=20, help="calls per session in the concurrency rounds")
    parser.add_argument(
        "--prompt", type=int, default=1000, help="first prompt length (tokens), concurrency rounds"
    )
    parser.add_argument("--concurrency", default="1,16,64,256", help="sessions per round, fast upstream")
    parser.add_argument("--slow", default="64,256", help="sessions per round, upstream answering in 100 ms")
    parser.add_argument(
        "--burst-calls", type=int, default=5, help="calls per session in rounds over 64 sessions"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat each concurrency round; each figure is the median over the repeats",
    )
    parser.add_argument("--turns", type=int, default=200, help="turns of the flatness rollout (0: skip)")
    parser.add_argument("--turn-tokens", type=int, default=500, help="tokens each turn adds (flatness)")
    parser.add_argument(
        "--profile", type=Path, help="run the proxy under py-spy; collapsed stacks to this file"
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the floor proxy (bench/proxy_floor.py) beside tapdeck"
    )
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream, args.latency)
        return

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    up_port, slow_port, proxy_port = free_port(), free_port(), free_port()
    upstream_url, slow_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{slow_port}"
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    data = Path(tempfile.mkdtemp(prefix="tapdeck-bench-"))
    procs: list[subprocess.Popen] = []
    proxy = None
    try:
        procs += [start_upstream(up_port, 0.0, env), start_upstream(slow_port, 0.1, env)]
        wait_ready(f"{upstream_url}/v1/models")
        wait_ready(f"{slow_url}/v1/models")
        admin_key = "bench-admin-key"
        spy = (
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--gil",
                "--format",
                "raw",
                "-r",
                "200",
                "-o",
                str(args.profile),
                "--",
            ]
            if args.profile
            else []
        )
        proxy = subprocess.Popen(
            [
                *spy,
                str(Path(sys.executable).with_name("tapdeck")),
                "serve",
                "--port",
                str(proxy_port),
                "--engine",
                f"{upstream_url}/v1",
                "--admin-key",
                admin_key,
                "--data-dir",
                str(data),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(f"{proxy_url}/health")
        pid = proxy.pid
        floor = None
        if not args.no_floor:
            floor_port = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("proxy_floor.py")),
                        str(floor_port),
                        f"{upstream_url}/v1",
                        str(data / "floor.sqlite"),
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            floor = (f"http://127.0.0.1:{floor_port}", procs[-1].pid)
            wait_ready(f"{floor[0]}/health")
        if args.profile:  # py-spy's child is the server
            pid = int(subprocess.check_output(["pgrep", "-P", str(proxy.pid)]).split()[0])
        print(
            f"proxy overhead, one run ({os.cpu_count()} cores, {load()}; upstream, proxy and client "
            "are separate processes; store = SQLite WAL, synchronous=FULL)"
        )
        print(
            f"\n1) concurrent rollouts, first prompt {args.prompt} tokens (+~225/turn); ms per call; "
            "cpu = proxy CPU ms per call (sys: the kernel's part;\n   loop: its busiest thread's, the "
            "event loop; the rest is its store threads); calls/s = proxied and direct throughput of\n   this "
            "client (client, proxy and upstream share the cores)"
        )
        print(
            f"{'round':<22} {'calls':>6} {'direct':>8} {'proxy':>8} {'p50 x':>6} {'p99 x':>6} "
            f"{'cpu ms':>7} {'sys':>5} {'loop':>5} {'calls/s':>7} {'direct':>7} {'err':>4} chains"
        )
        rounds = [(n, upstream_url, "fast") for n in args.concurrency.split(",") if n] + [
            (n, slow_url, "100 ms") for n in args.slow.split(",") if n
        ]
        for n, url, tag in ((int(n), url, tag) for n, url, tag in rounds):
            calls = args.calls if n <= 64 else args.burst_calls
            repeats = [
                asyncio.run(
                    concurrency_round(
                        url, proxy_url, admin_key, pid, n, calls, args.prompt, f"{tag[0]}{k}", floor
                    )
                )
                for k in range(max(1, args.rounds))
            ]
            r = median_round(repeats)
            print_row(f"{n} sessions, {tag}", r)
        if not args.turns:
            return
        f = asyncio.run(
            flatness_round(upstream_url, proxy_url, admin_key, pid, args.turns, args.turn_tokens, floor)
        )
        print(
            f"\n2) one rollout of {f['turns']} turns, last prompt {f['last_prompt_tokens']} tokens, "
            f"{f['roots']} root; median ms of the first vs last {f['window']} turns"
        )
        print(f"   direct: {f['direct_first']:.2f} -> {f['direct_last']:.2f}")
        print(
            f"   proxy:  {f['proxy_first']:.2f} -> {f['proxy_last']:.2f}   ratio first "
            f"{f['proxy_first'] / f['direct_first']:.2f}, last {f['proxy_last'] / f['direct_last']:.2f}, "
            f"p50 over all turns {f['p50_ratio']:.2f}"
        )
        if "floor_cpu_ms" in f:
            print(
                f"   floor:  {f['floor_first']:.2f} -> {f['floor_last']:.2f}   p50 over all turns "
                f"{f['floor_p50_ratio']:.2f}, CPU per call {f['floor_cpu_ms']:.2f} ms"
            )
        print(
            f"   proxy CPU per call {f['cpu_ms']:.2f} ms; proxy RSS growth "
            f"{f['rss_mb_per_1k']:.3f} MB per 1,000 stored tokens"
        )
        print(
            f"   training-trace export over HTTP: {f['export_ms']:.0f} ms ({f['trace_bytes'] / 1e6:.1f} MB)"
        )
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGINT) if args.profile else proxy.terminate()
            proxy.wait(60)
        for p in procs:
            p.terminate()
            p.wait(30)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f}/{five:.1f} at start"


if __name__ == "__main__":
    main()
