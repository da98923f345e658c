"""Loopback ports carried into a network namespace that has only its own loopback.

A trial cut off from the network (a private network namespace, loopback only) cannot reach the
capture proxy listening on the host's loopback. A Unix socket can cross that line, because it is
a file: for each port, this process serves a Unix socket in a per-trial directory and connects
each client to `127.0.0.1:PORT` on the host; inside the namespace a small relay (this module, run
with `-m`) listens on its own `127.0.0.1:PORT` and connects each client to that socket. The agent
sees the proxy at the same URL, and nothing else is reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


class LoopbackRelay:
    """The host half for one port: a Unix socket whose clients reach `127.0.0.1:port` here."""

    def __init__(self, port: int, socket_path: Path) -> None:
        self.port = port
        self.socket_path = socket_path
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Serve the Unix socket (world-connectable: the trial may run as another user)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Socket paths are limited to 107 bytes; a per-trial folder can be deeper than that, so
        # the socket is bound through a descriptor of its folder.
        folder = os.open(self.socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            sock.bind(f"/proc/self/fd/{folder}/{self.socket_path.name}")
        except OSError:
            sock.close()
            raise
        finally:
            os.close(folder)
        self.socket_path.chmod(0o777)
        self._server = await asyncio.start_unix_server(self._handle, sock=sock)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
            self._server = None
        with contextlib.suppress(OSError):
            self.socket_path.unlink()

    def inner_command(self, socket_path_inside: str) -> list[str]:
        """The argv of the relay to run inside the namespace (prints `ready` once listening)."""
        return [sys.executable, "-m", __name__, str(self.port), socket_path_inside]


async def serve_inside(port: int, socket_path: str) -> None:
    """The namespace half: listen on 127.0.0.1:`port`, connect each client to `socket_path`."""
    # Socket paths are limited to 107 bytes: connect relative to the socket's folder.
    os.chdir(os.path.dirname(socket_path))
    name = os.path.basename(socket_path)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_unix_connection(name)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve_inside(int(sys.argv[1]), sys.argv[2]))
