"""Proxy overhead: per-call latency through tapdeck vs straight to a fast vLLM-shaped upstream.

    .venv/bin/python bench/proxy.py [--calls 20] [--prompt 1000] [--turns 200] [--turn-tokens 500]

Three processes: a zero-latency upstream (this file with `--upstream PORT`; its replies have the
shape of the recorded vLLM bodies in tests/fixtures/vllm, with real prompt_token_ids of the
requested length that extend call by call exactly as a chat template would), a real `tapdeck serve`
on it (SQLite store, fsync per turn), and the client here. Prints, from one run:

1. p50/p99 per call, direct vs proxied, and their ratio, at 1, 16 and 64 concurrent sessions;
2. flatness as turns grow: one 200-turn rollout whose prompts reach ~100k tokens, early vs late
   turns (direct and proxied), plus the rollout export time.

No thresholds: it reports what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import os
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
        prompt = np.concatenate([*(self._render(m) for m in body["messages"]),
                                 np.array([IM_START, 520, 9531, NL], dtype=np.int32)])
        self.counter += 1
        text = f"reply {self.counter}"
        rng = np.random.default_rng(self.counter)
        sampled = np.concatenate([rng.integers(3, 49152, REPLY_TOKENS - 1, dtype=np.int32),
                                  np.array([IM_END], dtype=np.int32)])
        self.replies[text] = sampled
        out = copy.copy(self.template)
        lps = (-rng.random(REPLY_TOKENS)).round(4).tolist()
        out["prompt_token_ids"] = prompt
        out["choices"] = [{
            "index": 0, "finish_reason": "stop", "stop_reason": None, "token_ids": sampled,
            "message": {**self.template["choices"][0]["message"], "content": text},
            "logprobs": {"content": [{"token": f"t{int(t)}", "logprob": lp, "bytes": [116],
                                      "top_logprobs": []} for t, lp in zip(sampled, lps, strict=True)]},
        }]
        out["usage"] = {"prompt_tokens": int(prompt.size), "completion_tokens": REPLY_TOKENS,
                        "total_tokens": int(prompt.size) + REPLY_TOKENS,
                        "prompt_tokens_details": None, "completion_tokens_details": None}
        return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY)


def upstream_app(up: Upstream) -> Any:
    """A raw ASGI app (no framework) so the upstream itself costs as little as possible."""
    models = orjson.dumps({"object": "list", "data": [{"id": "smollm2", "object": "model",
                                                       "max_model_len": 1 << 20}]})

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        path = scope["path"]
        if path.endswith("/models"):
            payload, status = models, 200
        elif path.endswith("/chat/completions"):
            payload, status = up.reply(orjson.loads(b"".join(chunks))), 200
        else:
            payload, status = b'{"error":{"message":"not found"}}', 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    return app


def serve_upstream(port: int) -> None:
    """Run the upstream in this process until killed."""
    from tapdeck.proxy.serving import ThreadedServer

    server = ThreadedServer(upstream_app(Upstream()), "127.0.0.1", port, name="bench-upstream").start()
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


async def conversation(client: httpx.AsyncClient, url: str, headers: dict[str, str], *, turns: int,
                       first_tokens: int, turn_tokens: int, salt: str, direct: bool) -> list[float]:
    """One rollout, call after call, each prompt extending the previous one; per-call ms."""
    messages = [{"role": "system", "content": "You are a shell agent."},
                {"role": "user", "content": words(first_tokens, salt)}]
    latencies = []
    for i in range(turns):
        body: dict[str, Any] = {"model": "smollm2", "messages": messages, "max_tokens": 64,
                                "temperature": 1.0}
        if direct:  # what the proxy itself would send upstream
            body |= {"stream": False, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
        start = time.perf_counter()
        resp = await client.post(url, content=orjson.dumps(body),
                                 headers={**headers, "content-type": "application/json"})
        reply = orjson.loads(resp.content)
        latencies.append((time.perf_counter() - start) * 1000)
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
        messages = [*messages, {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                    {"role": "user", "content": words(turn_tokens, f"{salt}-{i}")}]
    return latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def warm_up(client: httpx.AsyncClient, upstream_url: str, proxy_url: str, admin_key: str) -> None:
    """Open connections and take first-call costs (imports, probe) outside the measurements."""
    info = (await client.post(f"{proxy_url}/admin/sessions", json={},
                              headers={"Authorization": f"Bearer {admin_key}"})).json()
    await conversation(client, f"{upstream_url}/v1/chat/completions", {}, turns=3, first_tokens=100,
                       turn_tokens=10, salt="warm-d", direct=True)
    await conversation(client, f"{proxy_url}/v1/chat/completions",
                       {"Authorization": f"Bearer {info['api_key']}"}, turns=3, first_tokens=100,
                       turn_tokens=10, salt="warm-p", direct=False)


async def concurrency_round(upstream_url: str, proxy_url: str, admin_key: str, sessions: int,
                            calls: int, prompt: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await warm_up(client, upstream_url, proxy_url, admin_key)
        direct = await asyncio.gather(*(conversation(
            client, f"{upstream_url}/v1/chat/completions", {}, turns=calls, first_tokens=prompt,
            turn_tokens=200, salt=f"d{sessions}-{i}", direct=True) for i in range(sessions)))
        infos = [(await client.post(f"{proxy_url}/admin/sessions", json={},
                                    headers={"Authorization": f"Bearer {admin_key}"})).json()
                 for _ in range(sessions)]
        proxied = await asyncio.gather(*(conversation(
            client, f"{proxy_url}/v1/chat/completions", {"Authorization": f"Bearer {info['api_key']}"},
            turns=calls, first_tokens=prompt, turn_tokens=200, salt=f"p{sessions}-{i}", direct=False)
            for i, info in enumerate(infos)))
        # What the graph made of it: one root per session expected.
        summary = (await client.get(f"{proxy_url}/admin/sessions/{infos[0]['id']}",
                                    headers={"Authorization": f"Bearer {admin_key}"})).json()
    d = [x for lat in direct for x in lat]
    p = [x for lat in proxied for x in lat]
    return {"sessions": sessions, "calls": len(p), "direct_p50": pct(d, 50), "direct_p99": pct(d, 99),
            "proxy_p50": pct(p, 50), "proxy_p99": pct(p, 99), "turns": summary["turns"],
            "roots": summary["roots"]}


async def flatness_round(upstream_url: str, proxy_url: str, admin_key: str, turns: int,
                         turn_tokens: int) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {admin_key}"}
    async with httpx.AsyncClient(timeout=600) as client:
        await warm_up(client, upstream_url, proxy_url, admin_key)
        direct = await conversation(client, f"{upstream_url}/v1/chat/completions", {}, turns=turns,
                                    first_tokens=1000, turn_tokens=turn_tokens, salt="flat-d", direct=True)
        info = (await client.post(f"{proxy_url}/admin/sessions", json={}, headers=admin)).json()
        proxied = await conversation(client, f"{proxy_url}/v1/chat/completions",
                                     {"Authorization": f"Bearer {info['api_key']}"}, turns=turns,
                                     first_tokens=1000, turn_tokens=turn_tokens, salt="flat-p", direct=False)
        summary = (await client.get(f"{proxy_url}/admin/sessions/{info['id']}", headers=admin)).json()
        last = (await client.get(f"{proxy_url}/admin/sessions/{info['id']}/turns/{turns - 1}",
                                 headers=admin)).json()
        start = time.perf_counter()
        trace = await client.get(f"{proxy_url}/admin/sessions/{info['id']}/trace", headers=admin)
        export_ms = (time.perf_counter() - start) * 1000
    window = max(1, min(10, turns // 10))
    return {"turns": turns, "last_prompt_tokens": last["prompt_len"], "roots": summary["roots"],
            "direct_first": statistics.median(direct[:window]), "direct_last": statistics.median(direct[-window:]),
            "proxy_first": statistics.median(proxied[:window]), "proxy_last": statistics.median(proxied[-window:]),
            "window": window, "export_ms": export_ms, "trace_bytes": len(trace.content)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=20, help="calls per session in the concurrency rounds")
    parser.add_argument("--prompt", type=int, default=1000, help="first prompt length (tokens), concurrency rounds")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--turns", type=int, default=200, help="turns of the flatness rollout")
    parser.add_argument("--turn-tokens", type=int, default=500, help="tokens each turn adds (flatness)")
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    up_port, proxy_port = free_port(), free_port()
    upstream_url, proxy_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{proxy_port}"
    data = Path(tempfile.mkdtemp(prefix="tapdeck-bench-"))
    up = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)], env=env,
                          stdout=subprocess.DEVNULL)
    proxy = None
    try:
        wait_ready(f"{upstream_url}/v1/models")
        admin_key = "bench-admin-key"
        proxy = subprocess.Popen([str(Path(sys.executable).with_name("tapdeck")), "serve", "--port",
                                  str(proxy_port), "--engine", f"{upstream_url}/v1", "--admin-key",
                                  admin_key, "--data-dir", str(data)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(f"{proxy_url}/health")
        print(f"proxy overhead, one run ({os.cpu_count()} cores; upstream, proxy and client are "
              "separate processes; store = SQLite WAL, synchronous=FULL)")
        print(f"\n1) {args.calls} calls/session, first prompt {args.prompt} tokens (+~225/turn), ms per call")
        print(f"{'sessions':>8} {'calls':>6} {'direct p50':>11} {'proxy p50':>10} {'ratio':>6} "
              f"{'direct p99':>11} {'proxy p99':>10} {'ratio':>6}  graph")
        for n in (int(x) for x in args.concurrency.split(",")):
            r = asyncio.run(concurrency_round(upstream_url, proxy_url, admin_key, n, args.calls, args.prompt))
            print(f"{r['sessions']:>8} {r['calls']:>6} {r['direct_p50']:>11.2f} {r['proxy_p50']:>10.2f} "
                  f"{r['proxy_p50'] / r['direct_p50']:>6.2f} {r['direct_p99']:>11.2f} {r['proxy_p99']:>10.2f} "
                  f"{r['proxy_p99'] / r['direct_p99']:>6.2f}  {r['turns']} turns/{r['roots']} root")
        f = asyncio.run(flatness_round(upstream_url, proxy_url, admin_key, args.turns, args.turn_tokens))
        print(f"\n2) one rollout of {f['turns']} turns, last prompt {f['last_prompt_tokens']} tokens, "
              f"{f['roots']} root; median ms of the first vs last {f['window']} turns")
        print(f"   direct: {f['direct_first']:.2f} -> {f['direct_last']:.2f}")
        print(f"   proxy:  {f['proxy_first']:.2f} -> {f['proxy_last']:.2f}   ratio first "
              f"{f['proxy_first'] / f['direct_first']:.2f}, last {f['proxy_last'] / f['direct_last']:.2f}")
        print(f"   proxy overhead per call: first {f['proxy_first'] - f['direct_first']:.2f} ms, last "
              f"{f['proxy_last'] - f['direct_last']:.2f} ms")
        print(f"   training-trace export over HTTP: {f['export_ms']:.0f} ms ({f['trace_bytes'] / 1e6:.1f} MB)")
    finally:
        for p in (proxy, up):
            if p is not None:
                p.terminate()
                p.wait(30)


if __name__ == "__main__":
    main()
