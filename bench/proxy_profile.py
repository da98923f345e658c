"""Where the proxy's CPU goes: shares of a `bench/proxy.py --profile FILE` run, by part of the call.

    .venv/bin/python bench/proxy.py --calls 60 --concurrency 16 --slow "" --turns 0 --profile /tmp/p.txt
    .venv/bin/python bench/proxy_profile.py /tmp/p.txt [--top PART]

FILE holds py-spy's collapsed stacks (`--gil`: samples of the thread holding the GIL, i.e. Python
CPU). Each sample is charged to the innermost frame that belongs to a known part (so `orjson.loads`
called from the token-id parser counts as token ids, not as the service that called it); start-up
frames are left out. `--top PART` lists the heaviest frames charged to one part.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

STARTUP = re.compile(r"importlib|_find_and_load|app/host.py|LocalServer.start|settle_blocking")
PARTS = [
    ("store: SQLite commit", r"_commit_group|sqlite"),
    ("store: turn encoding", r"proxy/store/database.py"),
    ("linking (rollout graph)", r"proxy/capture/graph.py"),
    ("token ids / capture parse", r"proxy/capture/tokens.py|parse_capture|^_ids \("),
    ("upstream client", r"upstream_http.py|engine_client.py"),
    ("events + session summary", r"proxy/http/events.py|_summary|_publish|pydantic"),
    ("access log", r"access_log.py|logging/"),
    ("store hand-off (threads)", r"store_writes.py|concurrent/futures|threading.py|queue.py"),
    ("dialect parse/render", r"proxy/dialects/"),
    ("request nesting check", r"request_limits.py"),
    ("validation, interning, json mode", r"validation.py|interning.py|json_mode.py"),
    ("service (call flow, request JSON)", r"proxy/service.py"),
    ("server routes", r"proxy/http/model_route.py|proxy/http/server.py"),
    ("FastAPI/Starlette", r"starlette/|fastapi/"),
    ("uvicorn HTTP server", r"uvicorn/|httptools"),
    ("asyncio event loop", r"asyncio/|selectors.py"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in PARTS]


def charge(frames: list[str]) -> tuple[str, int]:
    """The part a stack is charged to, and the index of the frame that decided it."""
    for i in range(len(frames) - 1, -1, -1):
        for name, pattern in COMPILED:
            if pattern.search(frames[i]):
                return name, i
    return "other", len(frames) - 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", help="list the heaviest frames charged to this part")
    args = parser.parse_args()
    shares: collections.Counter[str] = collections.Counter()
    frames_of: collections.Counter[str] = collections.Counter()
    for line in args.file.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or STARTUP.search(stack):
            continue
        frames = stack.split(";")
        part, at = charge(frames)
        shares[part] += int(count)
        if part == args.top:
            frames_of[" < ".join(f.split(" (")[0] for f in frames[max(0, at - 2) : at + 1][::-1])] += int(
                count
            )
    total = sum(shares.values()) or 1
    print(f"{total} samples (start-up left out)")
    for part, n in shares.most_common():
        print(f"{100 * n / total:5.1f} %  {part}")
    for frames, n in frames_of.most_common(12):
        print(f"  {n:6d}  {frames}")


if __name__ == "__main__":
    main()
