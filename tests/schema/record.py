"""Record every admin route's reply and every event type from a real tapdeck server.

    python -m tests.schema.record [--out tests/schema/fixtures/api.json]

The server is a full LocalServer (capture proxy, admin API, runner routes) whose engine is a loopback
vLLM-shaped upstream answering with the recorded vLLM bodies (tests/fixtures/vllm): a capture
session with two model calls, then a one-rollout oracle batch on the host sandbox (no model, real
Harbor trial), then the session is closed. `tests/schema/test_contract.py` validates the recording
against the routes' declared `response_model`s and the event models, and re-records to check that
the file is not stale. Bodies are kept as the server sent them; nothing is edited by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tests.support.fake_vllm import FakeVllm
from tests.support.session_env import apply_session_env

FIXTURE = Path(__file__).parent / "fixtures" / "api.json"
RUN_WAIT_S = 240.0
NOT_RECORDED = {
    "POST /admin/train": "launches a recipe in the training environment (minutes, GBs)",
    "POST /admin/train/plan": "depends on this machine's GPUs and training environment; "
    "tests/app/commands/test_train_gpus.py validates its replies",
    "GET /admin/train/{run_id}": "needs a training run",
    "GET /admin/train/{run_id}/log": "needs a training run",
    "GET /admin/train/{run_id}/metrics": "needs a training run",
    "GET /admin/train/{run_id}/events": "needs a training run",
    "POST /admin/train/{run_id}/stop": "needs a training run",
    "POST /admin/runs/{run_id}/rollouts/{rollout_id}/cancel": "needs a rollout hung mid-run; "
    "tests/runner/test_cancel_rollout.py validates its replies",
    "POST /admin/runs/{run_id}/rollouts/{rollout_id}/exec": "needs a rollout held running; "
    "tests/runner/test_rollout_sandbox.py validates its replies",
    "GET /admin/runs/{run_id}/rollouts/{rollout_id}/processes": "needs a rollout held running; "
    "tests/runner/test_rollout_sandbox.py validates its replies",
    "GET /admin/runs/{run_id}/rollouts/{rollout_id}/agent-output": "needs a rollout held running; "
    "tests/runner/test_rollout_sandbox.py validates its replies",
    "POST /admin/sessions/{session_id}/replay": "needs a reference engine serving prompt logprobs; "
    "tests/runner/test_replay_embedded.py validates its replies",
    "GET /admin/sessions/{session_id}/replays": "needs a replay; tests/runner/test_replay_embedded.py "
    "validates its replies",
    "GET /admin/sessions/{session_id}/replays/{replay_id}/logprobs": "needs a replay; "
    "tests/app/test_client_replay.py validates its replies",
    "DELETE /admin/sessions/{session_id}/replays/{replay_id}": "needs a replay; "
    "tests/runner/test_replay_embedded.py validates its replies",
}
"""Admin routes the recording leaves out, and why (their models are checked by the training tests'
own replies only)."""


@contextmanager
def recording_server(data_dir: Path) -> Iterator[LocalServer]:
    """A LocalServer on a loopback port whose default engine is a recorded-vLLM upstream."""
    up = FakeVllm().start()
    try:
        server = LocalServer(
            ServerConfig(port=0, data_dir=data_dir, engine_url=up.base_url, engine_model="smollm2")
        ).start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        up.stop()


async def _collect_events(http: httpx.AsyncClient, into: list[dict[str, Any]], opened: asyncio.Event) -> None:
    async with http.stream("GET", "/admin/events", timeout=httpx.Timeout(10.0, read=None)) as reply:
        async for line in reply.aiter_lines():
            opened.set()  # the stream's first comment: subscribed
            if line.startswith("data: "):
                into.append(json.loads(line[len("data: ") :]))


async def record_from(server: LocalServer) -> dict[str, Any]:
    """Drive `server` through every recordable admin route; the replies and the events seen."""
    routes: dict[str, Any] = {}
    events: list[dict[str, Any]] = []
    admin = {"Authorization": f"Bearer {server.admin_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=120.0) as http:
        opened = asyncio.Event()
        follower = asyncio.create_task(_collect_events(http, events, opened))
        await asyncio.wait_for(opened.wait(), 30)

        async def call(method: str, route: str, path: str, **kwargs: Any) -> Any:
            reply = await http.request(method, path, **kwargs)
            reply.raise_for_status()
            routes[f"{method} {route}"] = body = reply.json()
            return body

        await call("GET", "/health", "/health")
        await call("GET", "/admin/catalog", "/admin/catalog")
        info = await call(
            "POST", "/admin/sessions", "/admin/sessions", json={"metadata": {"task": "contract"}}
        )
        sid = info["id"]
        # A trainer's version: the session's turns are stamped with it (the engine reports none).
        await call("POST", "/admin/engines/version", "/admin/engines/version", json={"version": 3})
        messages = [{"role": "user", "content": "Say hello."}]
        for _ in range(2):
            reply = await http.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": messages},
                headers={"Authorization": f"Bearer {info['api_key']}"},
            )
            reply.raise_for_status()
            messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": "Again."}]
        await call("GET", "/admin/engines/version", "/admin/engines/version")
        await call("GET", "/admin/sessions", "/admin/sessions")
        await call("GET", "/admin/sessions/{session_id}", f"/admin/sessions/{sid}")
        await call("GET", "/admin/sessions/{session_id}/rollout", f"/admin/sessions/{sid}/rollout")
        await call("GET", "/admin/sessions/{session_id}/trace", f"/admin/sessions/{sid}/trace")
        await call(
            "GET", "/admin/sessions/{session_id}/graph", f"/admin/sessions/{sid}/graph", params={"since": 1}
        )
        await call("GET", "/admin/sessions/{session_id}/turns/{seq}", f"/admin/sessions/{sid}/turns/1")
        await call("GET", "/admin/sessions/{session_id}/activity", f"/admin/sessions/{sid}/activity")

        run = await call(
            "POST",
            "/admin/runs",
            "/admin/runs",
            json={
                "harness": "terminus-2",
                "tasks": ["hello-file"],
                "k": 1,
                "timeout_s": 120,
                "call_budget": 2,
                "settings": {"max_turns": 1},
            },
        )
        async with asyncio.timeout(RUN_WAIT_S):
            while (await http.get(f"/admin/runs/{run['id']}")).json()["state"] == "running":
                await asyncio.sleep(0.5)
        await call("GET", "/admin/runs", "/admin/runs")
        await call("GET", "/admin/runs/{run_id}", f"/admin/runs/{run['id']}")
        await call(
            "POST", "/admin/runs/{run_id}/export", f"/admin/runs/{run['id']}/export", json={"format": "jsonl"}
        )
        await call("POST", "/admin/runs/{run_id}/cancel", f"/admin/runs/{run['id']}/cancel")
        await call("POST", "/admin/runs/{run_id}/resume", f"/admin/runs/{run['id']}/resume")
        async with asyncio.timeout(RUN_WAIT_S):
            while (await http.get(f"/admin/runs/{run['id']}")).json()["state"] == "running":
                await asyncio.sleep(0.5)
        await call("GET", "/admin/train/recipes", "/admin/train/recipes")
        await call("GET", "/admin/train", "/admin/train")
        await call("DELETE", "/admin/sessions/{session_id}", f"/admin/sessions/{sid}")
        await asyncio.sleep(0.5)  # the close's event reaches the stream
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    return {"routes": routes, "events": events}


def record(data_dir: Path) -> dict[str, Any]:
    """A fresh recording from a server with its data in `data_dir`."""
    apply_session_env()  # run as a script, without tests/conftest.py
    with recording_server(data_dir) as server:
        return asyncio.run(record_from(server))


def write_recording(
    record_into: Callable[[Path], dict[str, Any]],
    default_out: Path,
    description: str,
    summary: Callable[[dict[str, Any]], str],
) -> None:
    """A recorder's command line: record with a fresh server data dir, write `--out` as sorted JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out)
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory(prefix="tapdeck-record-") as tmp:
        recording = record_into(Path(tmp))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}: {summary(recording)}")


def main() -> None:
    write_recording(
        record,
        FIXTURE,
        __doc__.splitlines()[0],
        lambda r: f"{len(r['routes'])} routes, {len(r['events'])} events",
    )


if __name__ == "__main__":
    main()
