"""What the sandbox routes answer for the recorded API (the recording has no rollout running, so no
sandbox): a terminus-2 rollout's processes and its tmux pane, the same for every rollout of
`data`'s runs, for the TUI's sandbox screen shots."""

from __future__ import annotations

PROCESSES = [
    {"pid": 1, "elapsed_s": 95, "cpu_s": 0, "command": "sleep infinity"},
    {"pid": 14, "elapsed_s": 88, "cpu_s": 1, "command": "tmux new-session -x 160 -y 40 -d -s terminus-2"},
    {"pid": 17, "elapsed_s": 88, "cpu_s": 0, "command": "bash --login"},
    {"pid": 52, "elapsed_s": 41, "cpu_s": 37, "command": "python3 count_words.py --input /app/big.txt"},
]
PANE = (
    "root@sandbox:/app# ls\n"
    "big.txt  count_words.py\n"
    "root@sandbox:/app# python3 count_words.py --input /app/big.txt\n"
    "reading /app/big.txt (812 MB)…\n"
)


def with_sandbox(data: dict) -> dict:
    """`data` with each rollout of its runs answering the sandbox routes as a running one does."""
    sandboxes = {}
    for detail in data["run_details"].values():
        for rollout in detail["rollouts"]:
            rid = rollout["rollout_id"]
            sandboxes[rid] = {
                "processes": {"rollout_id": rid, "processes": PROCESSES},
                "agent-output": {
                    "rollout_id": rid,
                    "file": "/logs/agent/terminus_2.pane",
                    "size": 48213,
                    "text": PANE,
                },
            }
    return {**data, "sandboxes": sandboxes}
