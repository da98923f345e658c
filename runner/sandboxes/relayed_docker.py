"""Harbor's docker environment, with the capture proxy carried into a container that has no network.

A CLI agent inside a container must reach the capture proxy, which listens on the host's
loopback. Putting the container on the host's network would also let it reach every other
address the host has. Instead (`network: none`, the default for agent CLIs), the container gets
no network at all (`network_mode: none`: its own loopback only), and each proxy port comes in
through a Unix socket, as the host sandbox does it (`loopback_relay`): this process serves the
socket in the trial's own `relay/` folder, which is bind-mounted into the container, and a relay
started inside (the same module, run by the image's `python3`) listens on the container's
`127.0.0.1:PORT`. The agent sees the proxy at the same URL, and no other address.

Everything else (build, start, exec, stop) is Harbor's own `DockerEnvironment`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from pathlib import Path
from typing import Any

from tapdeck.runner.harbor_api import DockerEnvironment
from tapdeck.runner.sandboxes import loopback_relay
from tapdeck.runner.sandboxes.loopback_relay import LoopbackRelay

RELAY_DIR = "/run/tapdeck"
"""Where the trial's `relay/` folder (sockets, the inner relays' logs) is in the container."""
RELAY_SCRIPT = "/opt/tapdeck/loopback_relay.py"
"""Where `loopback_relay.py` (standard library only) is mounted read-only in the container."""
RELAY_READY_TIMEOUT_S = 30.0
"""How long the inner relay gets to say it listens: Python's start in a container, seconds."""


def _relay_failed(port: int, why: str) -> RuntimeError:
    return RuntimeError(f"docker sandbox could not relay the proxy's port {port} into the container: {why}")


class RelayedDockerEnvironment(DockerEnvironment):
    """Harbor's `DockerEnvironment`; with `loopback_ports`, each of those host loopback ports is
    relayed into the container (whose compose overlay gives it no network)."""

    def __init__(self, *args: Any, loopback_ports: list[int] | None = None, **kwargs: Any) -> None:
        self._loopback_ports = [int(p) for p in loopback_ports or ()]
        self._relays: list[LoopbackRelay] = []
        self._relay_dir: Path | None = None
        if self._loopback_ports:
            self._relay_dir = Path(kwargs["trial_paths"].trial_dir) / "relay"
            self._relay_dir.mkdir(parents=True, exist_ok=True)
            kwargs["mounts"] = [
                *(kwargs.get("mounts") or []),
                {"type": "bind", "source": str(self._relay_dir), "target": RELAY_DIR},
                {
                    "type": "bind",
                    "source": str(Path(loopback_relay.__file__).resolve()),
                    "target": RELAY_SCRIPT,
                    "read_only": True,
                },
            ]
        super().__init__(*args, **kwargs)

    async def start(self, force_build: bool) -> None:
        await super().start(force_build)
        if self._relay_dir is not None:
            await self._start_relays(self._relay_dir)

    async def _start_relays(self, folder: Path) -> None:
        for port in self._loopback_ports:
            relay = LoopbackRelay(port, folder / f"relay-{port}.sock")
            await relay.start()
            self._relays.append(relay)
            log = folder / f"relay-{port}.log"
            inner = f"{RELAY_DIR}/relay-{port}"
            # Started in the background as root, so that it outlives this exec and any agent user.
            started = await self.exec(
                "command -v python3 >/dev/null 2>&1 || { echo 'no python3 on PATH' >&2; exit 127; }; "
                f"nohup python3 {RELAY_SCRIPT} {port} {shlex.quote(inner + '.sock')} "
                f"> {shlex.quote(inner + '.log')} 2>&1 &",
                user="root",
                timeout_sec=int(RELAY_READY_TIMEOUT_S),
            )
            if started.return_code != 0:
                said = (started.stderr or started.stdout or "").strip() or f"exit {started.return_code}"
                raise _relay_failed(
                    port,
                    f"{said} (the relay runs on the image's python3; give the image one, or pass the "
                    "sandbox option network=host)",
                )
            await self._until_ready(port, log)

    @staticmethod
    async def _until_ready(port: int, log: Path) -> None:
        deadline = time.monotonic() + RELAY_READY_TIMEOUT_S
        text = ""
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace")
            if text.startswith("ready"):
                return
            await asyncio.sleep(0.1)
        silent = f"its relay said nothing in {RELAY_READY_TIMEOUT_S:g} s"
        raise _relay_failed(port, text.strip()[-500:] or silent)

    async def stop(self, delete: bool) -> Any:
        try:
            return await super().stop(delete)
        finally:
            for relay in self._relays:
                await relay.stop()
            self._relays.clear()


__all__ = ["RELAY_DIR", "RELAY_SCRIPT", "RelayedDockerEnvironment"]
