"""The TUI at 1,000 sessions: key-to-paint latency and the TUI's CPU while 256 sessions call.

    .venv/bin/python bench/tui.py [--sessions 1000] [--live 256] [--long-turns 500] [--rate 40]
                                  [--size 80x24] [--rounds 3] [--cpu-s 10] [--profile FILE]

Processes: two vLLM-shaped upstreams (bench/proxy.py `--upstream`: one answering at once, the
default engine that fills the server; one answering after `--engine-s`, the live sessions'
engine), a real `tapdeck serve` (SQLite store, fsync per commit), a driver process making the
live sessions' calls, and this one, which runs the real `TapdeckApp` attached to the server under
Textual's pilot (headless: every frame is composited as in a terminal, only the bytes are not
written out).

The server is filled first (`populate`): `--sessions` sessions, of which `--live` stay open and
keep calling (each waits a random tool time between calls, so that together they make about
`--rate` calls a second, each held `--engine-s` by its engine), one closed session holds a
`--long-turns`-turn rollout, and the others are closed after 0-2 calls, with a task, harness, run
and reward each.

What is measured, for each key: from the moment the key is handed to the app (as the terminal
driver hands it over) to the first frame the app composites in which the key's effect is in the
widgets drawn:

- filter keystroke: `/`, then each character of a filter, then Esc; the frame's table holds the
  rows of the filter typed so far;
- sort: `s` (the next sort key) and `!` (stuck first, on and off); the table is in the new order;
- screen switch: Sessions → Runs → Sessions → Rollout → Sessions; the new screen is current and,
  back on Sessions, its table was laid out again;
- open rollout: Enter on the `--long-turns` rollout's row; the Rollout screen shows its tree with
  every turn, fetched after the key.

Then the TUI process's CPU seconds per wall second (`time.process_time`: this process runs only
the app and its HTTP client) over `--cpu-s` seconds of live updates on Sessions, in the table's
own order and stuck first, with the events and frames seen meanwhile. Prints p50/p95 per action
and the load average; no thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
ADMIN_KEY = "bench-tui-admin-key-0123456789abcdef"
LONG_TASK = "long-rollout"
HARNESSES = ("terminus-2", "claude-code", "mini-swe-agent")
TASKS = 60
"""Distinct task names (`task-000`…): a filter on one keeps a few dozen rows of the 1,000."""


# ----------------------------------------------------------------------------- filling the server


def text(n_words: int, salt: str) -> str:
    """A message of about `n_words` words, distinct per `salt`."""
    return " ".join(f"{salt}w{i}" for i in range(n_words))


async def call(client: httpx.AsyncClient, url: str, key: str, messages: list[dict[str, Any]]) -> str:
    """One chat call through the proxy; the reply's text."""
    resp = await client.post(
        f"{url}/v1/chat/completions",
        json={"model": "smollm2", "messages": messages, "max_tokens": 32},
        headers={"Authorization": f"Bearer {key}"},
    )
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"])


async def converse(
    client: httpx.AsyncClient, url: str, key: str, turns: int, salt: str, messages: list | None = None
) -> list[dict[str, Any]]:
    """`turns` calls of one conversation, each extending the last; the messages after them."""
    messages = messages or [
        {"role": "system", "content": "You are a shell agent."},
        {"role": "user", "content": text(40, salt)},
    ]
    for i in range(turns):
        reply = await call(client, url, key, messages)
        messages = [
            *messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": text(8, f"{salt}-{i}")},
        ]
    return messages


def metadata(i: int, *, live: bool) -> dict[str, Any]:
    """What a runner would have annotated session `i` with (its phase says whether it ended)."""
    meta: dict[str, Any] = {
        "task": f"task-{i % TASKS:03d}",
        "harness": HARNESSES[i % len(HARNESSES)],
        "run_id": f"run-{i % 4}",
        "phase": "agent" if live else "done",
    }
    if not live:
        meta["reward"] = (i % 5) / 4
    return meta


async def populate(
    url: str,
    admin_key: str,
    *,
    sessions: int,
    live: int,
    long_turns: int,
    closed_calls: int = 2,
    live_calls: int = 1,
    live_engine: str | None = None,
    concurrency: int = 32,
) -> dict[str, Any]:
    """Fill the server at `url`: `sessions` sessions, the last `live` of them left open (each with
    `live_calls` calls made; on `live_engine` when given, an engine URL), one closed with
    `long_turns` calls when that is > 0 (task LONG_TASK), the others closed after 0 to
    `closed_calls` calls. Returns {"ids": every session's id by its index, "live": [(id, api key,
    messages)], "long": its id or None}."""
    admin = {"Authorization": f"Bearer {admin_key}"}
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, keepalive_expiry=2.0)
    out: dict[str, Any] = {"ids": [""] * sessions, "live": [], "long": None}
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def open_session(meta: dict[str, Any], engine: str | None = None) -> dict[str, Any]:
            body: dict[str, Any] = {"metadata": meta}
            if engine:
                body["engine"] = {"url": engine}
            resp = await client.post(f"{url}/admin/sessions", json=body, headers=admin)
            resp.raise_for_status()
            return dict(resp.json())

        async def one(i: int) -> None:
            is_live = i >= sessions - live
            async with gate:
                if i == 0 and long_turns > 0:
                    info = await open_session({**metadata(i, live=False), "task": LONG_TASK})
                    out["ids"][i] = info["id"]
                    await converse(client, url, info["api_key"], long_turns, f"long{i}")
                    out["long"] = info["id"]
                elif is_live:
                    info = await open_session(metadata(i, live=True), live_engine)
                    out["ids"][i] = info["id"]
                    messages = await converse(client, url, info["api_key"], live_calls, f"s{i}")
                    out["live"].append((info["id"], info["api_key"], messages))
                    return
                else:
                    info = await open_session(metadata(i, live=False))
                    out["ids"][i] = info["id"]
                    await converse(client, url, info["api_key"], i % (closed_calls + 1), f"s{i}")
                (await client.delete(f"{url}/admin/sessions/{info['id']}", headers=admin)).raise_for_status()

        await asyncio.gather(*(one(i) for i in range(sessions)))
    return out


# ----------------------------------------------------------------------------- the live sessions


async def drive(url: str, live: list[tuple[str, str, list]], rate: float, stop: asyncio.Event) -> int:
    """Every live session calls, waits a tool time, calls again, until `stop`: about `rate` calls
    a second together (the engine's own time comes on top). Returns the calls made."""
    made = 0
    period = len(live) / max(rate, 0.01)

    async def session(key: str, messages: list[dict[str, Any]], salt: str) -> None:
        nonlocal made
        await asyncio.sleep(random.uniform(0, period))
        turn = 0
        while not stop.is_set():
            try:
                messages = await converse(client, url, key, 1, f"{salt}-{turn}", messages)
                made += 1
            except httpx.HTTPError:
                pass  # counted out; the session tries again after its tool time
            turn += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), random.uniform(0.5, 1.5) * period)

    limits = httpx.Limits(max_connections=len(live) + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(session(key, list(m), sid) for sid, key, m in live))
    return made


def driver_main(spec_path: Path) -> None:
    """The driver process: `drive` until SIGTERM, then print the calls it made."""
    spec = json.loads(spec_path.read_text())

    async def run() -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        return await drive(spec["url"], [tuple(x) for x in spec["live"]], spec["rate"], stop)

    print(json.dumps({"calls": asyncio.run(run())}), flush=True)


# ----------------------------------------------------------------------------- key to paint

KEY_CHARS = {
    "slash": "/",
    "exclamation_mark": "!",
    "enter": "\r",
    "escape": "\x1b",
    "minus": "-",
    "colon": ":",
}
"""The character a terminal sends with each named key used here (a letter's or digit's is itself)."""


class FrameProbe:
    """Wraps the app's display step: each composited frame checks the predicate waited on, and the
    first frame at which it holds settles the wait with that frame's time."""

    def __init__(self, app: Any) -> None:
        self.frames = 0
        self._waiting: tuple[Callable[[], bool], asyncio.Future[float]] | None = None
        shown = app._display

        def display(screen: Any, renderable: Any) -> None:
            shown(screen, renderable)
            self.frames += 1
            if self._waiting is not None:
                predicate, done = self._waiting
                if not done.done() and predicate():
                    done.set_result(time.perf_counter())

        app._display = display

    async def press(self, app: Any, key: str, effect: Callable[[], bool], timeout: float = 30.0) -> float:
        """Hand `key` to the app as its driver does; ms to the first frame showing `effect`."""
        from textual import events

        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting = (effect, done)
        char = KEY_CHARS.get(key, key)
        start = time.perf_counter()
        app._driver.send_message(events.Key(key, char if len(char) == 1 else None))
        try:
            return (await asyncio.wait_for(done, timeout) - start) * 1000
        except TimeoutError:
            raise RuntimeError(f"no frame showed the effect of {key!r} in {timeout:g} s") from None
        finally:
            self._waiting = None


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def measure(
    url: str,
    *,
    long_id: str,
    long_turns: int,
    total: int,
    size: tuple[int, int],
    rounds: int,
    cpu_s: float,
    gap_s: float,
) -> dict[str, Any]:
    from tapdeck.app.client import TapdeckClient
    from tapdeck.app.screens.rollout import RolloutScreen
    from tapdeck.app.screens.sessions import SessionsScreen
    from tapdeck.app.tui import TapdeckApp
    from tapdeck.app.views.row_view import SORT_KEYS, STUCK
    from tapdeck.app.widgets.session_table import SessionTable

    settings = Path(tempfile.mkdtemp(prefix="tapdeck-bench-tui-")) / "tui.json"
    app = TapdeckApp(TapdeckClient(url, ADMIN_KEY), settings_path=settings, initial_mode="sessions")
    out: dict[str, list[float]] = {"filter keystroke": [], "sort (s)": [], "stuck first (!)": []}
    out |= {"screen switch": [], "open rollout": []}
    cpu: dict[str, dict[str, float]] = {}
    async with app.run_test(size=size) as pilot:
        probe = FrameProbe(app)
        sessions = app.screens_by_mode["sessions"]
        rollout = app.screens_by_mode["rollout"]
        assert isinstance(sessions, SessionsScreen) and isinstance(rollout, RolloutScreen)
        table = sessions.query_one(SessionTable)
        deadline = time.monotonic() + 120
        while table.row_count < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the table holds {table.row_count} rows of {total}")
            await pilot.pause(0.2)
        # Counts of the screens' own steps, so that an effect is known to come after the key.
        laid = {"sessions": 0, "rollout": 0}
        refresh, apply_graph = sessions.refresh_table, rollout.apply_graph

        def counted_refresh(force: bool = False) -> None:
            refresh(force)
            if force:
                laid["sessions"] += 1

        def counted_apply(tree_changed: bool = True) -> None:
            apply_graph(tree_changed)
            laid["rollout"] += 1

        sessions.refresh_table = counted_refresh  # type: ignore[method-assign]
        rollout.apply_graph = counted_apply  # type: ignore[method-assign]

        async def press(what: str, key: str, effect: Callable[[], bool]) -> None:
            try:
                out[what].append(await probe.press(app, key, effect))
            except RuntimeError:
                print("at the timeout:", sessions.view, app.focused, app.current_mode, probe.frames, "frames")
                raise
            await asyncio.sleep(gap_s)  # a person's pace between keys

        def shown() -> int:
            return table.row_count

        def filter_open() -> bool:
            return type(app.focused).__name__ == "FilterInput"

        for r in range(rounds):
            # Filter: `/`, each character, Esc.
            await press("filter keystroke", "slash", filter_open)
            typed = ""
            for ch in (f"task-{(7 * r) % TASKS:03d}", "run", "harness:cl")[r % 3]:
                typed += ch
                key = {":": "colon", "-": "minus"}.get(ch, ch)
                await press("filter keystroke", key, lambda t=typed: sessions.view.filter == t)
            await press("filter keystroke", "escape", lambda: sessions.view.filter == "" and shown() == total)
            # Sort: every key in turn and back to none; stuck first on and off.
            for expected in (*SORT_KEYS, None):
                await press("sort (s)", "s", lambda e=expected: sessions.view.sort == e)
            for expected in (STUCK, None):
                await press("stuck first (!)", "exclamation_mark", lambda e=expected: sessions.view.sort == e)
            # Screens.
            for key, mode in (("4", "runs"), ("2", "sessions"), ("3", "rollout"), ("2", "sessions")):
                before = laid["sessions"]
                await press(
                    "screen switch",
                    key,
                    lambda m=mode, b=before: (
                        app.current_mode == m and (m != "sessions" or laid["sessions"] > b)
                    ),
                )
            # Open the long rollout: its row alone under a filter, then Enter.
            await probe.press(app, "slash", filter_open)
            for ch in "task:long":
                await probe.press(
                    app, {":": "colon"}.get(ch, ch), lambda: True
                )  # not measured: only reaches the row
            await probe.press(app, "enter", lambda: table.has_focus and table.row_count == 1)
            before = laid["rollout"]
            await press(
                "open rollout",
                "enter",
                lambda b=before: (
                    app.current_mode == "rollout"
                    and rollout.session_id == long_id
                    and laid["rollout"] > b
                    and len(rollout.graph.turns) == long_turns
                ),
            )
            await probe.press(app, "2", lambda: app.current_mode == "sessions")
            await probe.press(app, "escape", lambda: sessions.view.filter == "")
            # The TUI's CPU while the live sessions call: the table's own order, then stuck first.
        for label, sort_key in (("table order", None), ("stuck first", "exclamation_mark")):
            if sort_key:
                await probe.press(app, sort_key, lambda: sessions.view.sort == STUCK)
            calls0, frames0 = sum(len(link.board.call_times) for link in app.links), probe.frames
            wall0, cpu0 = time.perf_counter(), time.process_time()
            await asyncio.sleep(cpu_s)
            wall, used = time.perf_counter() - wall0, time.process_time() - cpu0
            calls = sum(len(link.board.call_times) for link in app.links) - calls0
            cpu[label] = {
                "cpu": used / wall,
                "calls": calls / wall,
                "frames": (probe.frames - frames0) / wall,
            }
        await probe.press(app, "exclamation_mark", lambda: sessions.view.sort is None)
    return {"latency": out, "cpu": cpu}


# ----------------------------------------------------------------------------- the run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--live", type=int, default=256, help="sessions left open, calling")
    parser.add_argument("--long-turns", type=int, default=500, help="turns of the rollout opened")
    parser.add_argument("--rate", type=float, default=40, help="calls a second, the live sessions together")
    parser.add_argument("--engine-s", type=float, default=1.0, help="seconds the live sessions' engine takes")
    parser.add_argument("--size", default="80x24", help="terminal columns x rows")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every key")
    parser.add_argument("--cpu-s", type=float, default=10, help="seconds of each CPU window")
    parser.add_argument("--gap-s", type=float, default=0.15, help="seconds between keys")
    parser.add_argument("--profile", type=Path, help="cProfile the TUI's measurement; stats to this file")
    args = parser.parse_args()
    if args.drive:
        driver_main(args.drive)
        return
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    data = Path(tempfile.mkdtemp(prefix="tapdeck-bench-tui-"))
    fast_port, slow_port, port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(cmd: list[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, env=env, **kw)
        procs.append(proc)
        return proc

    try:
        for p, latency in ((fast_port, 0.0), (slow_port, args.engine_s)):
            up = [sys.executable, str(BENCH / "proxy.py"), "--upstream", str(p), "--latency", str(latency)]
            start(up, stdout=subprocess.DEVNULL)
            wait_ready(f"http://127.0.0.1:{p}/v1/models")
        serve = [str(Path(sys.executable).with_name("tapdeck")), "serve", "--port", str(port)]
        serve += ["--engine", f"http://127.0.0.1:{fast_port}/v1", "--admin-key", ADMIN_KEY]
        server = start(
            [*serve, "--data-dir", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_ready(f"{url}/health")
        t0 = time.perf_counter()
        filled = asyncio.run(
            populate(
                url,
                ADMIN_KEY,
                sessions=args.sessions,
                live=args.live,
                long_turns=args.long_turns,
                live_engine=f"http://127.0.0.1:{slow_port}/v1",
            )
        )
        print(
            f"filled in {time.perf_counter() - t0:.0f} s: {args.sessions} sessions, {args.live} live, "
            f"one of {args.long_turns} turns"
        )
        spec = data / "drive.json"
        spec.write_text(json.dumps({"url": url, "live": filled["live"], "rate": args.rate}))
        driver = start([sys.executable, __file__, "--drive", str(spec)], stdout=subprocess.PIPE, text=True)
        time.sleep(3)  # the live sessions under way
        load0 = os.getloadavg()
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        result = asyncio.run(
            measure(
                url,
                long_id=filled["long"],
                long_turns=args.long_turns,
                total=args.sessions,
                size=(cols, rows),
                rounds=args.rounds,
                cpu_s=args.cpu_s,
                gap_s=args.gap_s,
            )
        )
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
        load1 = os.getloadavg()
        driver.send_signal(signal.SIGTERM)
        made = json.loads((driver.communicate(timeout=60)[0] or "{}").strip().splitlines()[-1]).get("calls")
        server_cpu = time.clock_gettime(((~server.pid) << 3) | 2)
        print(
            f"TUI at {cols}x{rows}, {args.sessions} sessions ({args.live} live, about {args.rate:g} calls/s "
            f"held {args.engine_s:g} s each; the driver made {made} calls); {os.cpu_count()} cores, "
            f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; server CPU "
            f"{server_cpu:.0f} s in all"
        )
        print(f"{'key to paint (ms)':<22}{'n':>4}{'p50':>8}{'p95':>8}{'max':>8}")
        for what, values in result["latency"].items():
            print(
                f"{what:<22}{len(values):>4}{pct(values, 50):>8.0f}{pct(values, 95):>8.0f}{max(values):>8.0f}"
            )
        for label, c in result["cpu"].items():
            print(
                f"TUI CPU, live updates, {label}: {c['cpu']:.2f} s per s "
                f"({c['calls']:.0f} calls/s seen, {c['frames']:.0f} frames/s)"
            )
        if profiler:
            pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(30)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)


if __name__ == "__main__":
    main()
