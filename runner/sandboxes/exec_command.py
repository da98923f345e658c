"""One command of a host-sandbox trial run to its end: output streamed, kept to its last bytes,
and the whole process group killed on a timeout or a cancel.

`HostSandbox.exec` builds the command line (nsenter into the trial, the user, bash); this runs it.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging

from tapdeck.runner.harbor_api import ExecResult, OutputCallback
from tapdeck.runner.process_group import signal_group, wait_group_gone
from tapdeck.runner.sandboxes.output_tail import OutputTail

POLL_S = 0.05
DRAIN_AFTER_EXIT_S = 0.5


async def run_command(
    argv: list[str],
    env: dict[str, str],
    timeout_sec: int | None,
    on_output: OutputCallback | None,
    *,
    output_limit: int,
    logger: logging.Logger,
) -> ExecResult:
    """Run `argv` in a session of its own with `env`; its exit code and the last `output_limit`
    bytes of each stream (`on_output` gets all of it). On timeout the process group is killed and
    RuntimeError raised (as Harbor's docker environment does)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )

    async def pump(stream: asyncio.StreamReader, name: str, sink: OutputTail) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := await stream.read(65536):
            sink.add(chunk)
            if on_output is not None and (text := decoder.decode(chunk)):
                await on_output(text, name)
        if on_output is not None and (text := decoder.decode(b"", final=True)):
            await on_output(text, name)

    # Both are pipes (PIPE above), so asyncio gave the process a reader for each.
    assert process.stdout is not None and process.stderr is not None
    out, err = OutputTail(output_limit), OutputTail(output_limit)
    pumps = asyncio.ensure_future(
        asyncio.gather(pump(process.stdout, "stdout", out), pump(process.stderr, "stderr", err))
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_sec if timeout_sec else None
    try:
        while not pumps.done():
            if process.returncode is not None:
                # Exited, but a detached child (`cmd &`) may hold the pipes open: take what
                # is buffered, then stop reading instead of waiting for that child.
                await asyncio.wait({pumps}, timeout=DRAIN_AFTER_EXIT_S)
                break
            if deadline is not None and loop.time() >= deadline:
                signal_group(process.pid)
                await asyncio.to_thread(wait_group_gone, process.pid)  # signals land asynchronously
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
            await asyncio.wait({pumps}, timeout=POLL_S)
    except BaseException:
        signal_group(process.pid)
        raise
    finally:
        if not pumps.done():
            pumps.cancel()
            # Private (so not in the stubs), but the only handle that closes our ends of the pipes.
            process._transport.close()  # type: ignore[attr-defined]
        with contextlib.suppress(BaseException):
            await pumps
    return_code = await process.wait()
    for name, tail in (("stdout", out), ("stderr", err)):
        if tail.dropped:
            logger.warning(
                "host sandbox kept the last %d bytes of a command's %s and cut %d before them",
                tail.limit,
                name,
                tail.dropped,
            )
    return ExecResult(stdout=out.text(), stderr=err.text(), return_code=return_code)


__all__ = ["run_command"]
