"""Record the TUI tests' API bodies from a real tapdeck server.

    python -m tests.app.record [--out tests/app/fixtures/api.json]

The server is a full LocalServer whose default engine is the embedded one (SmolLM2-135M, seeded
sampling), plus a loopback recorded-vLLM upstream that holds follow-up calls (an engine that hangs).
It is driven through every state the screens show: a chat session with a fork and a discarded root
(left running), a closed one, an oracle batch and a terminus-2 batch on the host sandbox, a
data-check training run on the terminus-2 batch, a session with no call yet and one whose second call
hangs in the engine. While that call hangs, every session's list entry, detail, activity, rollout,
graph and turns are recorded, with every admin reply the Train screen reads.

Bodies are kept as the server sent them, except that ids, ports, paths and clocks are made stable
(`normalise`: session ids become `sess0000…` in creation order, run ids `run-0000…`, times are
shifted to start at 1_700_000_000 and rounded to whole seconds) so that snapshots do not change with
each recording's random keys. The contract test validates the result against tapdeck.schema.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tests.schema.record import write_recording
from tests.support.fake_vllm import FakeVllm, continues_a_conversation
from tests.support.session_env import apply_session_env

FIXTURE = Path(__file__).parent / "fixtures" / "api.json"
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 300.0
"""A bound on each batch and training run (2 shared cores; not a speed check)."""
EPOCH = 1_700_000_000.0
SEED = 7
SYSTEM = {"role": "system", "content": "You are a shell agent. Answer with one shell command."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


@contextmanager
def recording_servers(data_dir: Path) -> Iterator[tuple[LocalServer, FakeVllm]]:
    """A LocalServer on the embedded engine, and a recorded-vLLM upstream that holds follow-ups."""
    up = FakeVllm(hold=continues_a_conversation).start()
    try:
        server = LocalServer(ServerConfig(port=0, data_dir=data_dir)).start()
        try:
            yield server, up
        finally:
            up.hold = None  # lets a held call end before the server stops
            server.stop()
    finally:
        up.stop()


class Driver:
    """Admin and model calls against the recording server."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def get(self, path: str, **kwargs: Any) -> Any:
        reply = await self.http.get(path, **kwargs)
        reply.raise_for_status()
        return reply.json()

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        reply = await self.http.post(path, json=body)
        reply.raise_for_status()
        return reply.json()

    async def session(self, task: str, engine: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.post(
            "/admin/sessions", {"metadata": {"task": task}, "engine": engine, "alternatives": 3}
        )

    async def chat(self, session: dict[str, Any], messages: list[dict[str, Any]], **extra: Any) -> dict:
        body = {
            "model": "m",
            "messages": messages,
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": SEED,
            **extra,
        }
        reply = await self.http.post(
            "/v1/chat/completions",
            json=body,
            timeout=WAIT_S,
            headers={"Authorization": f"Bearer {session['api_key']}"},
        )
        reply.raise_for_status()
        return reply.json()["choices"][0]["message"]

    async def until_ended(self, path: str) -> Any:
        async with asyncio.timeout(WAIT_S):
            while (body := await self.get(path))["state"] == "running":
                await asyncio.sleep(0.5)
        return body

    async def cancel_once_running(self, run_id: str, rollout_id: str) -> None:
        """Cancel one rollout of a run once its agent has started (a failure the Runs screen counts)."""
        async with asyncio.timeout(WAIT_S):
            while not any(
                r["rollout_id"] == rollout_id and r["phase"] == "agent"
                for r in (await self.get(f"/admin/runs/{run_id}"))["rollouts"]
            ):
                await asyncio.sleep(0.2)
        await self.post(f"/admin/runs/{run_id}/rollouts/{rollout_id}/cancel")


async def _train_events(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    events = []
    async with http.stream(
        "GET", f"/admin/train/{run_id}/events", timeout=httpx.Timeout(10.0, read=WAIT_S)
    ) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


async def record_from(server: LocalServer, up: FakeVllm) -> dict[str, Any]:
    """Drive the server through every state the screens show; the bodies they read."""
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=120.0) as http:
        api = Driver(http)
        out: dict[str, Any] = {"health": await api.get("/health"), "catalog": await api.get("/admin/catalog")}

        # A chat with a fork: #1 repeats #0's prompt (a discarded root), #2 continues #0. Left open.
        chat = await api.session("hello-file")
        first = [SYSTEM, {"role": "user", "content": "Create /app/hello.txt containing Hello."}]
        reply = await api.chat(chat, first)
        await api.chat(chat, first)
        await api.chat(chat, [*first, reply, {"role": "user", "content": "Now show the file."}])

        closed = await api.session("greet-script")
        talk = [SYSTEM, {"role": "user", "content": "Write greet.sh that prints Hi."}]
        reply = await api.chat(closed, talk)
        await api.chat(closed, [*talk, reply, {"role": "user", "content": "Make it executable."}])
        await http.delete(f"/admin/sessions/{closed['id']}")

        oracle = await api.post(
            "/admin/runs",
            {"harness": "oracle", "tasks": ["hello-file", "greet-script"], "k": 2, "concurrency": 2},
        )
        await api.until_ended(f"/admin/runs/{oracle['id']}")
        agent = await api.post(
            "/admin/runs",
            {
                "harness": "terminus-2",
                "tasks": ["hello-file", "greet-script"],
                "k": 2,
                "concurrency": 4,
                "call_budget": 2,
                "settings": {"max_turns": 2, "max_output_tokens": 48},
            },
        )
        await api.cancel_once_running(agent["id"], f"{agent['id']}.g001r01")
        await api.until_ended(f"/admin/runs/{agent['id']}")

        job = await api.post("/admin/train", {"recipe": "data-check", "run": agent["id"]})
        train_events = await _train_events(http, job["id"])
        out["train"] = {
            "recipes": await api.get("/admin/train/recipes"),
            "runs": await api.get("/admin/train"),
            "events": {job["id"]: train_events},
            "logs": {job["id"]: await api.get(f"/admin/train/{job['id']}/log")},
            "metrics": {job["id"]: await api.get(f"/admin/train/{job['id']}/metrics")},
        }

        await api.session("sum-numbers")  # opened, no call yet
        stuck = await api.session("json-config", engine={"url": up.base_url, "model": "smollm2"})
        ask = [SYSTEM, {"role": "user", "content": "Fix /app/config.json."}]
        reply = await api.chat(stuck, ask, tools=TOOLS)
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"cmd": "cat /app/config.json"})},
        }
        observation = '{"name": "demo",\n "port": 80\n "debug": true}\n'
        hung = asyncio.create_task(
            api.chat(
                stuck,
                [
                    *ask,
                    {"role": "assistant", "content": reply.get("content") or "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": observation},
                ],
                tools=TOOLS,
            )
        )
        async with asyncio.timeout(60):
            while up.held < 1:
                await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # the call's age shows on the activity pane

        sessions = (await api.get("/admin/sessions"))["sessions"]
        out["sessions"] = sessions
        out["session_details"] = {s["id"]: await api.get(f"/admin/sessions/{s['id']}") for s in sessions}
        out["activity"] = {s["id"]: await api.get(f"/admin/sessions/{s['id']}/activity") for s in sessions}
        with_turns = [s["id"] for s in sessions if s["turns"]]
        out["rollouts"] = {sid: await api.get(f"/admin/sessions/{sid}/rollout") for sid in with_turns}
        out["graphs"] = {
            sid: await api.get(f"/admin/sessions/{sid}/graph", params={"since": 0}) for sid in with_turns
        }
        out["turns"] = {
            sid: {
                str(t["seq"]): await api.get(f"/admin/sessions/{sid}/turns/{t['seq']}")
                for t in out["graphs"][sid]["turns"]
            }
            for sid in with_turns
        }
        out["runs"] = (await api.get("/admin/runs"))["runs"]
        out["run_details"] = {r["id"]: await api.get(f"/admin/runs/{r['id']}") for r in out["runs"]}

        up.hold = None
        await hung
    return out


def normalise(recording: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """Stable ids, addresses, paths and clocks (see the module's docstring); nothing else changes."""
    text = json.dumps(recording)
    sessions = sorted(recording["sessions"], key=lambda s: s["created_at"])
    names = {s["id"]: f"sess{i:04d}recorded" for i, s in enumerate(sessions)}
    runs = sorted(recording["runs"], key=lambda r: r["created_at"])
    names |= {r["id"]: f"run-{i:04d}" for i, r in enumerate(runs)}
    names |= {r["id"]: f"train-{i:04d}" for i, r in enumerate(recording["train"]["runs"]["runs"])}
    names |= {str(data_dir): "/data", str(REPO): "/tapdeck"}
    for old, new in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    text = re.sub(r"http://127\.0\.0\.1:\d+", "http://127.0.0.1:8000", text)
    data = json.loads(text)
    start = min(s["created_at"] for s in recording["sessions"])
    return _clocks(data, start)


TIME_KEYS = {
    "seconds_since_last_call",
    "total",
    "environment_setup",
    "agent_setup",
    "agent_execution",
    "verifier",
    "session_open",
}
"""Durations the server measured (they vary from one recording to the next): whole seconds."""


def _clocks(value: Any, start: float, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _clocks(v, start, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_clocks(v, start, key) for v in value]
    if isinstance(value, float) and 1.6e9 < value < 2.2e9:  # an epoch time
        return EPOCH + round(value - start)
    if isinstance(value, float) and key in TIME_KEYS:
        return float(round(value))
    return value


def record(data_dir: Path) -> dict[str, Any]:
    """A fresh, normalised recording from a server with its data in `data_dir`."""
    apply_session_env()  # run as a script, without tests/conftest.py
    with recording_servers(data_dir) as (server, up):
        raw = asyncio.run(record_from(server, up))
    return normalise(raw, data_dir)


def main() -> None:
    write_recording(
        record,
        FIXTURE,
        __doc__.splitlines()[0],
        lambda r: f"{len(r['sessions'])} sessions, {len(r['runs'])} runs",
    )


if __name__ == "__main__":
    main()
