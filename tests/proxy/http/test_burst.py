"""No dropped calls: a burst of concurrent sessions through a real tapdeck server all get their
replies, and every session comes out as one chain with every turn captured."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import socket
import time
from typing import Any

import httpx
import pytest

from tapdeck.proxy.config import DEFAULT_KEEP_ALIVE_S
from tests.support.fake_vllm import FakeVllm
from tests.support.tapdeck_process import serve_process, wait_health
from tests.support.vllm_recordings import vllm_fixture as recorded

SESSIONS, TURNS = 64, 3
IM_START, IM_END = 1, 2


class ChainReplies:
    """Replies whose prompt ids extend call by call as a chat template's would: each message
    renders to ids fixed by its text, an assistant message to the ids it was sampled as. Bodies
    are the recorded chat reply with these ids put in."""

    def __init__(self) -> None:
        self.template = recorded("chat_basic")["response"]
        self.sampled: dict[str, list[int]] = {}
        self.count = 0

    def _render(self, msg: dict[str, Any]) -> list[int]:
        text = msg.get("content") or ""
        if msg.get("role") == "assistant" and text in self.sampled:
            return [IM_START, *self.sampled[text][:-1], IM_END]
        digest = hashlib.blake2b(f"{msg.get('role')}:{text}".encode(), digest_size=8).digest()
        return [IM_START, *(3 + b for b in digest), IM_END]

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.count += 1
        text = f"reply {self.count}"
        sampled = [3 + (self.count * 7 + i) % 200 for i in range(4)] + [IM_END]
        self.sampled[text] = sampled
        out = copy.deepcopy(self.template)
        out["prompt_token_ids"] = [i for m in body["messages"] for i in self._render(m)] + [IM_START]
        choice = out["choices"][0]
        choice["message"]["content"] = text
        choice["token_ids"] = sampled
        choice["logprobs"]["content"] = [
            {"token": f"t{t}", "logprob": -0.5, "bytes": [116], "top_logprobs": []} for t in sampled
        ]
        return 200, out


async def _rollout(client: httpx.AsyncClient, url: str, key: str, salt: int) -> list[str]:
    """TURNS calls, each prompt extending the last; the failures, as text."""
    messages = [{"role": "user", "content": f"task {salt}"}]
    failures = []
    for turn in range(TURNS):
        try:
            resp = await client.post(
                f"{url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "m", "messages": messages, "max_tokens": 8},
            )
        except httpx.HTTPError as exc:
            failures.append(f"turn {turn}: {type(exc).__name__}: {exc}")
            break
        if resp.status_code != 200:
            failures.append(f"turn {turn}: HTTP {resp.status_code}: {resp.text[:200]}")
            break
        content = resp.json()["choices"][0]["message"]["content"]
        messages = [
            *messages,
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"next {salt}.{turn}"},
        ]
    return failures


@pytest.mark.medium
def test_burst_of_concurrent_sessions_loses_no_call_and_captures_every_turn(make_server, admin_for):
    engine = FakeVllm(answer=ChainReplies()).start()
    try:
        server = make_server(engine.base_url)
        admin = admin_for(server)
        infos = [admin.post("/admin/sessions", json={}).json() for _ in range(SESSIONS)]

        async def burst() -> list[str]:
            # Fresh connections all at once, to the proxy and (through it) to the engine.
            limits = httpx.Limits(max_connections=SESSIONS, max_keepalive_connections=SESSIONS)
            async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                results = await asyncio.gather(
                    *(_rollout(client, server.url, info["api_key"], i) for i, info in enumerate(infos))
                )
            return [f for failures in results for f in failures]

        assert asyncio.run(burst()) == []
        for info in infos:
            summary = admin.get(f"/admin/sessions/{info['id']}").json()
            assert (summary["turns"], summary["roots"]) == (TURNS, 1), summary
    finally:
        engine.stop()


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP response (head and a Content-Length body) read off `sock`; b"" if closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return data


@pytest.mark.medium
def test_idle_client_connection_outlives_the_clients_own_keepalive(make_server):
    """httpx (so the openai and anthropic SDKs) keeps an idle connection 5 s; a server closing at
    the same moment races a client reusing it (a reset call). The server keeps it longer."""
    engine = FakeVllm(answer=ChainReplies()).start()
    try:
        server = make_server(engine.base_url)
        host, port = server.url.removeprefix("http://").split(":")
        request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request)
            assert _response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(httpx.Limits().keepalive_expiry + 0.5)
            sock.sendall(request)
            assert _response(sock).startswith(b"HTTP/1.1 200")
        assert DEFAULT_KEEP_ALIVE_S > httpx.Limits().keepalive_expiry
    finally:
        engine.stop()


@pytest.mark.medium
def test_two_serve_processes_share_one_batch_and_capture_every_turn(tmp_path, port_factory):
    """Scale-out: each `tapdeck serve` process has its own store; a session is pinned to the
    process that opened it (its key is only valid there), and the batch's calls are spread
    over both."""
    engine = FakeVllm(answer=ChainReplies()).start()
    procs = []
    try:
        urls = []
        for n in range(2):
            port = port_factory()
            procs.append(serve_process(port, tmp_path / f"data{n}", engine.base_url))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_health(url, proc)
        admins = [
            httpx.Client(
                base_url=url,
                timeout=60,
                headers={
                    "Authorization": f"Bearer {(tmp_path / f'data{n}' / 'admin.key').read_text().strip()}"
                },
            )
            for n, url in enumerate(urls)
        ]
        opened = [(n % 2, admins[n % 2].post("/admin/sessions", json={}).json()) for n in range(16)]

        async def batch() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as client:
                results = await asyncio.gather(
                    *(_rollout(client, urls[n], info["api_key"], i) for i, (n, info) in enumerate(opened))
                )
            return [f for failures in results for f in failures]

        assert asyncio.run(batch()) == []
        for n, info in opened:
            summary = admins[n].get(f"/admin/sessions/{info['id']}").json()
            assert (summary["turns"], summary["roots"]) == (TURNS, 1), summary
            assert admins[1 - n].get(f"/admin/sessions/{info['id']}").status_code == 404
        for admin in admins:
            admin.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        engine.stop()
