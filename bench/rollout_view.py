"""What one refresh of the Rollout screen costs at turn N of a long rollout: the full rollout
document (what the screen fetched on every captured turn before) against the incremental graph view
(`GET /admin/sessions/{id}/graph?since=N`, headers and stats only).

Builds a synthetic N-turn rollout shaped like an agent loop (bench/graph.py's: ~500 new tokens per
turn, prompts reaching ~100k tokens at 200 turns), stores it in a real SQLite store, serves it with
the real server app on a loopback port, and for each path measures: bytes on the wire, the time to
fetch and parse the reply in the client, and the time for a real Textual app to apply it to the
rollout tree and draw a frame. Prints both and the ratios; no thresholds.

Run: `.venv/bin/python bench/rollout_view.py [--turns 200] [--new 500] [--repeat 5]`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from textual.app import App, ComposeResult

sys.path.insert(0, str(Path(__file__).parent))
from graph import make_turns

from tapdeck.app.views.graph import LiveGraph, rollout_nodes
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.http.uvicorn_thread import ThreadedServer
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.schema.sessions import GraphTurn, GraphView

SESSION = "s-00000000000000be"
ADMIN = "bench-admin-key"


def build_store(path: Path, turns: int, new: int) -> None:
    """A closed session of `turns` calls, linked and stored as the capture path does."""
    store = Store(path)
    store.create_session(
        {
            "id": SESSION,
            "tier": "tokens",
            "rollout_type": "train",
            "state": "closed",
            "created_at": time.time(),
            "metadata": {"task": "bench"},
            "engine": {"url": "http://127.0.0.1:9/v1"},
        }
    )
    graph = RolloutGraph()
    for turn in make_turns(turns, new):
        turn.session_id = SESSION
        store.append_turn(turn, graph.add(turn))
    store.close()


def doc_turns(doc: dict[str, Any]) -> list[GraphTurn]:
    """The tree's input from a full document (what the screen drew before the graph view)."""
    return [GraphTurn.model_validate({**t, "token_in": None}) for t in doc["turns"]]


class TreeApp(App):
    def compose(self) -> ComposeResult:
        yield RolloutTree()


async def measure(base: str, turns: int, repeat: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, list[float]]] = {"full document": {}, "graph since N-1": {}}
    app = TreeApp()
    async with (
        httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120) as http,
        app.run_test(size=(160, 48)) as pilot,
    ):
        tree = app.query_one(RolloutTree)
        live = LiveGraph()
        live.apply(
            GraphView.model_validate(
                (await http.get(f"/admin/sessions/{SESSION}/graph", params={"since": 0})).json()
            )
        )
        tree.load(rollout_nodes(live.turns.values()))
        await pilot.pause()
        for _ in range(repeat):
            # Before: every captured turn refetched the whole rollout document.
            t0 = time.perf_counter()
            reply = await http.get(f"/admin/sessions/{SESSION}/rollout")
            doc = reply.json()
            t1 = time.perf_counter()
            tree.load(rollout_nodes(doc_turns(doc)))
            await pilot.pause()
            t2 = time.perf_counter()
            row = out["full document"]
            row.setdefault("bytes", []).append(len(reply.content))
            row.setdefault("fetch+parse ms", []).append((t1 - t0) * 1000)
            row.setdefault("tree+frame ms", []).append((t2 - t1) * 1000)
            # Now: the newest turn's header, every turn's (seq, parent, role), stats.
            live.turns.pop(turns - 1, None)
            t0 = time.perf_counter()
            reply = await http.get(f"/admin/sessions/{SESSION}/graph", params={"since": live.next_since()})
            view = GraphView.model_validate(reply.json())
            t1 = time.perf_counter()
            if live.apply(view):
                tree.load(rollout_nodes(live.turns.values()))
            await pilot.pause()
            t2 = time.perf_counter()
            row = out["graph since N-1"]
            row.setdefault("bytes", []).append(len(reply.content))
            row.setdefault("fetch+parse ms", []).append((t1 - t0) * 1000)
            row.setdefault("tree+frame ms", []).append((t2 - t1) * 1000)
    return {path: {k: statistics.median(v) for k, v in row.items()} for path, row in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--new", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tapdeck-bench-") as tmp:
        db = Path(tmp) / "capture.db"
        t0 = time.perf_counter()
        build_store(db, args.turns, args.new)
        print(f"stored a {args.turns}-turn rollout in {time.perf_counter() - t0:.1f} s")
        service = CaptureService(Store(db), default_engine=None, public_url="http://127.0.0.1:9")
        # As while it runs: a live session's graph is held in memory (a closed one is rebuilt from
        # the store on each read, which would cost both paths the same ~seconds here).
        live_session = service._sessions[SESSION]
        live_session.state = "open"
        with live_session.rw:
            service._graph(live_session)
        server = ThreadedServer(
            create_app(service, admin_key=ADMIN), "127.0.0.1", 0, name="bench-server"
        ).start()
        try:
            result = asyncio.run(measure(server.url, args.turns, args.repeat))
        finally:
            server.stop()
    full, graph = result["full document"], result["graph since N-1"]
    print(f"\none Rollout-screen refresh at turn {args.turns} (median of {args.repeat})")
    print(f"{'':18}{'bytes':>12}{'fetch+parse ms':>16}{'tree+frame ms':>15}{'total ms':>10}")
    for name, row in result.items():
        total = row["fetch+parse ms"] + row["tree+frame ms"]
        print(
            f"{name:18}{row['bytes']:>12,.0f}{row['fetch+parse ms']:>16.1f}"
            f"{row['tree+frame ms']:>15.1f}{total:>10.1f}"
        )
    ratio = lambda key: full[key] / max(graph[key], 1e-9)  # noqa: E731
    total = (full["fetch+parse ms"] + full["tree+frame ms"]) / (
        graph["fetch+parse ms"] + graph["tree+frame ms"]
    )
    print(
        f"\nfull / incremental: bytes ×{ratio('bytes'):.0f}, fetch+parse ×{ratio('fetch+parse ms'):.1f}, "
        f"tree+frame ×{ratio('tree+frame ms'):.1f}, total ×{total:.1f}"
    )


if __name__ == "__main__":
    main()
