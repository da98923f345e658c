"""A real tapdeck server (proxy + store + runner routes) in this process, driven as the CLI and
the TUI drive it: runs execute on the server's runner loop (an asyncio loop on a thread of its own),
so tests reach them only through the HTTP admin API."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.local_server import local_server_on

SAMPLE = Path(__file__).resolve().parents[2] / "runner" / "sample_dataset"


class RunnerServer:
    """A LocalServer plus a small admin client for the runner routes."""

    def __init__(self, local: Any, data_dir: Path) -> None:
        self.local = local
        self.data_dir = data_dir
        self.http = httpx.Client(
            base_url=local.url, timeout=30.0, headers={"Authorization": f"Bearer {local.admin_key}"}
        )

    def start(self, **plan: Any) -> dict[str, Any]:
        resp = self.http.post("/admin/runs", json=plan)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def wait(self, run_id: str, timeout_s: float = 900.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                doc = self.http.get(f"/admin/runs/{run_id}").json()
            except httpx.TimeoutException:
                # A loaded 2-core machine can starve the server's loop past the client's timeout
                # (a trial's first lazy Harbor imports run on it); the run's own deadline decides.
                assert time.monotonic() < deadline, f"run {run_id}: the server stopped answering"
                continue
            if doc["state"] != "running":
                return doc
            assert time.monotonic() < deadline, f"run {run_id} still running: {doc['counts']}"
            time.sleep(0.2)

    def run(self, **plan: Any) -> dict[str, Any]:
        return self.wait(self.start(**plan)["id"])


@contextlib.contextmanager
def runner_server_on(engine: Any, data_dir: Path) -> Iterator[RunnerServer]:
    """A RunnerServer whose default engine is `engine`."""
    with local_server_on(engine, data_dir) as local:
        server = RunnerServer(local, data_dir)
        try:
            yield server
        finally:
            server.http.close()


def make_task(root: Path, name: str, test_sh: str, *, agent_timeout_s: float = 180.0) -> Path:
    """A copy of the sample `hello-file` task named `name` with its own verifier script."""
    task = root / name
    shutil.copytree(SAMPLE / "hello-file", task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nmkdir -p /logs/verifier\n" + test_sh)
    toml = (task / "task.toml").read_text().replace("timeout_sec = 180.0", f"timeout_sec = {agent_timeout_s}")
    (task / "task.toml").write_text(toml)
    return task
