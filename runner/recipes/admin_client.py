"""A recipe's way to a tapdeck server: the admin API over HTTP, and nothing else of tapdeck.

Recipes that train run in the training environment (Python 3.11, `tapdeck.runner.train_env`), where
tapdeck's own dependencies are not installed; this module needs only httpx and the standard library,
so it imports there (tests/runner/test_train_env.py checks). Every route it uses is listed in the
README's server API table. Its one tapdeck import, `schema.tls`, is standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from tapdeck.schema.tls import CA_FILE_ENV, server_trust, untrusted_certificate

TERMINAL_RUN_STATES = frozenset({"finished", "cancelled", "failed", "interrupted"})


class AdminError(RuntimeError):
    """The server refused a call or could not be reached (status 0 = no HTTP reply)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def read_admin_key(explicit: str | None = None, data_dir: Path | None = None) -> str:
    """`explicit`, else `$TAPDECK_ADMIN_KEY`, else `<data_dir>/admin.key` (data dir as the server's)."""
    if explicit:
        return explicit
    if os.environ.get("TAPDECK_ADMIN_KEY"):
        return os.environ["TAPDECK_ADMIN_KEY"]
    root = data_dir or Path(os.environ.get("TAPDECK_DATA_DIR") or Path.home() / ".tapdeck")
    path = root / "admin.key"
    if not path.is_file():
        raise FileNotFoundError(
            f"no admin key: pass --admin-key, set TAPDECK_ADMIN_KEY, or start the "
            f"server with --data-dir {root} (it writes {path})"
        )
    return path.read_text().strip()


class AdminClient:
    """One HTTP client for a tapdeck server's admin routes (not thread-safe: one per thread).
    An https server's certificate is checked against `ca_file` (PEM: a private CA, or a self-signed
    server's own certificate), else the public CAs; never skipped."""

    def __init__(
        self, server: str, admin_key: str, *, timeout_s: float = 60.0, ca_file: str | None = None
    ) -> None:
        self.server = server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.server,
            timeout=timeout_s,
            verify=server_trust(ca_file),
            headers={"Authorization": f"Bearer {admin_key}"},
        )

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            if (why := untrusted_certificate(exc)) is not None:
                raise AdminError(
                    0,
                    f"tapdeck server {self.server} presented a certificate this client "
                    f"does not trust ({why}); pass --ca-file (or ${CA_FILE_ENV})",
                ) from exc
            raise AdminError(0, f"tapdeck server {self.server} unreachable: {exc}") from exc
        if resp.status_code >= 400:
            raise AdminError(resp.status_code, f"{method} {path}: {resp.text[:300]}")
        return resp.json()

    def catalog(self) -> dict[str, Any]:
        """`GET /admin/catalog`: datasets with tasks, harnesses, sandboxes, engines."""
        return self._call("GET", "/admin/catalog")

    def start_run(self, plan: dict[str, Any]) -> str:
        """`POST /admin/runs`; the new run's id."""
        return str(self._call("POST", "/admin/runs", plan)["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        """`GET /admin/runs/{id}`: state, plan and rollout results."""
        return self._call("GET", f"/admin/runs/{run_id}")

    def wait_run(self, run_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0) -> dict[str, Any]:
        """Poll until the run reaches a terminal state; TimeoutError past `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            doc = self.run(run_id)
            if doc["state"] in TERMINAL_RUN_STATES:
                return doc
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"tapdeck run {run_id} still {doc['state']} after {timeout_s} s")
            time.sleep(poll_s)

    def cancel_run(self, run_id: str) -> None:
        """`POST /admin/runs/{id}/cancel`."""
        self._call("POST", f"/admin/runs/{run_id}/cancel")

    def trace(self, session_id: str) -> dict[str, Any]:
        """`GET /admin/sessions/{id}/trace`: the per-call training trace (409 for an eval session)."""
        return self._call("GET", f"/admin/sessions/{session_id}/trace")

    def post_engine_version(self, version: int | str, engine: str | None = None) -> dict[str, Any]:
        """`POST /admin/engines/version`: `engine` (every engine when None) serves `version` from now
        on; turns of engines that do not report their own are stamped with it."""
        return self._call("POST", "/admin/engines/version", {"version": version, "engine": engine})

    def close(self) -> None:
        """Release the connection pool (idempotent)."""
        self._http.close()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._http.is_closed
