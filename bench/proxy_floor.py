"""The floor: the least a durable capturing proxy on tapdeck's stack does per call.

    .venv/bin/python bench/proxy_floor.py PORT ENGINE_URL DB_PATH

`bench/proxy.py` runs this beside `tapdeck serve` and sends it the same rollouts, so its rows show
what any capture proxy written this way costs on the machine at hand: uvicorn with httptools on
uvloop, a raw ASGI app, tapdeck's lean upstream client and prompt-id parser, and one SQLite row per
call (WAL, `synchronous=FULL`) group-committed on a writer thread before the reply goes out
(each session's prompt ids parsed past its last prompt's, as tapdeck does). It
checks no key, links nothing, keeps no message store, no findings, events or access log, and
answers chat-completions only. The distance between its row and tapdeck's is what tapdeck's
features cost; the floor's own numbers are what this stack and this disk cost.
"""

from __future__ import annotations

import asyncio
import queue
import secrets
import sqlite3
import sys
import threading
from typing import Any

import numpy as np
import orjson
import uvicorn

from tapdeck.proxy.capture.tokens import PromptIdsMemo, loads_with_prompt_ids
from tapdeck.proxy.upstream.transport import UpstreamHTTP

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS calls (session TEXT, seq INTEGER, request BLOB, prompt_ids BLOB, "
    "sampled_ids BLOB, logprobs BLOB, reply BLOB)"
)
Row = tuple[str, int, bytes, bytes, bytes, bytes, bytes]


class GroupCommit:
    """One writer thread: every row queued while a commit runs goes into the next transaction."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(SCHEMA)
        self.jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None], Row]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._work, daemon=True).start()

    async def write(self, row: Row) -> None:
        """Return once `row` is committed and fsync'd."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.jobs.put((loop, done, row))
        await done

    def _work(self) -> None:
        while True:
            batch = [self.jobs.get()]
            while not self.jobs.empty():
                batch.append(self.jobs.get())
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany(
                "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?)", [row for _, _, row in batch]
            )
            self.db.execute("COMMIT")
            for loop, done, _ in batch:
                loop.call_soon_threadsafe(done.set_result, None)


async def read_body(receive: Any) -> bytes:
    """A request's whole body from its ASGI `http.request` messages."""
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


def floor_app(default_engine: str, db_path: str) -> Any:
    """The floor proxy as a raw ASGI app (sessions only so the bench can drive it like tapdeck)."""
    store: GroupCommit | None = None
    engines: dict[str, UpstreamHTTP] = {}
    sessions: dict[str, dict[str, Any]] = {}  # api key -> {"id", "engine", "turns"}

    async def reply(send: Any, status: int, body: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def model_call(session: dict[str, Any], body: bytes, send: Any) -> None:
        request = orjson.loads(body)
        upstream = {**request, "stream": False, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
        engine = engines.get(session["engine"])
        if engine is None:
            engine = engines[session["engine"]] = UpstreamHTTP(
                session["engine"], connect_timeout=10, read_timeout=300
            )
        got = await engine.request(
            "POST", "/chat/completions", orjson.dumps(upstream), {"Content-Type": "application/json"}
        )
        out = loads_with_prompt_ids(got.body, session["memo"])
        choice = out["choices"][0]
        logprobs = np.array([e["logprob"] for e in choice["logprobs"]["content"]], dtype=np.float64)
        row = (
            session["id"],
            session["turns"],
            orjson.dumps(request["messages"]),
            out["prompt_token_ids"].astype(np.int32).tobytes(),
            np.asarray(choice["token_ids"], dtype=np.int32).tobytes(),
            logprobs.tobytes(),
            orjson.dumps(choice["message"]),
        )
        session["turns"] += 1
        assert store is not None
        await store.write(row)
        await reply(
            send,
            200,
            orjson.dumps(
                {
                    "id": out["id"],
                    "object": "chat.completion",
                    "created": out["created"],
                    "model": out["model"],
                    "choices": [
                        {"index": 0, "message": choice["message"], "finish_reason": choice["finish_reason"]}
                    ],
                    "usage": out["usage"],
                }
            ),
        )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal store
        if scope["type"] == "lifespan":
            await receive()  # startup
            store = GroupCommit(db_path)
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, path = await read_body(receive), scope["path"]
        if path == "/admin/sessions" and scope["method"] == "POST":
            engine = ((orjson.loads(body) if body else {}).get("engine") or {}).get("url", default_engine)
            key = secrets.token_hex(16)
            sessions[key] = {
                "id": secrets.token_hex(8),
                "engine": engine,
                "turns": 0,
                "memo": PromptIdsMemo(),
            }
            await reply(send, 200, orjson.dumps({"id": sessions[key]["id"], "api_key": key}))
        elif path.startswith("/admin/sessions/"):
            found = next((s for s in sessions.values() if s["id"] == path.rsplit("/", 1)[1]), None)
            await reply(send, 200 if found else 404, orjson.dumps({"turns": found["turns"] if found else 0}))
        elif path.endswith("/chat/completions"):
            auth = dict(scope["headers"]).get(b"authorization", b"").decode()
            session = sessions.get(auth.removeprefix("Bearer "))
            if session is None:
                await reply(send, 401, b'{"error":{"message":"unknown session key"}}')
            else:
                await model_call(session, body, send)
        else:
            await reply(send, 200, b"{}")

    return app


def main() -> None:
    port, engine, db_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    uvicorn.run(
        floor_app(engine, db_path),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
