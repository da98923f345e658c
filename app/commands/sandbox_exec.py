"""`tapdeck exec ROLLOUT --server URL -- CMD`: run a command inside a running rollout's sandbox,
through the server that runs it (`POST /admin/runs/{id}/rollouts/{rollout_id}/exec`: Harbor's
environment `exec`, so host, Docker and Podman sandboxes alike).

One argument after `--` is a bash command line as it stands (`'ls | wc -l'`); several are one
command, quoted for bash. The command's output is printed as it came back, and its exit code is
the command's. With no command, a line shell: each line read is run there in turn (each in the
sandbox's working directory: a `cd` does not carry to the next line), until `exit` or end of input.
The TUI's sandbox screen opens that shell.
"""

from __future__ import annotations

import asyncio
import shlex
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from tapdeck.app.client import ApiError, TapdeckClient, command_admin_key
from tapdeck.app.commands.options import AdminKeyOption, DataDirOption, ca_file_option, server_option
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_TIMED_OUT, EXIT_USAGE, CommandError
from tapdeck.schema.sandbox import EXEC_TIMEOUT_MAX_S, EXEC_TIMEOUT_S

SHELL_EXIT = frozenset({"exit", "logout"})
EXIT_INTERRUPTED = 130
"""The line shell's code for a command it stopped waiting for (Ctrl-C), as a shell gives 128 + SIGINT."""


def register(app: typer.Typer) -> None:
    """Add the `exec` command."""

    @app.command("exec")
    def exec_(
        rollout: str = typer.Argument(..., metavar="ROLLOUT", help="A running rollout's id (run-….g000r00)."),
        command: list[str] | None = typer.Argument(
            None, metavar="[-- CMD...]", help="The command; none: a line shell until `exit`."
        ),
        server: Annotated[str | None, server_option("The tapdeck server running the rollout.")] = None,
        admin_key: AdminKeyOption = None,
        ca_file: Annotated[Path | None, ca_file_option()] = None,
        timeout: float = typer.Option(
            EXEC_TIMEOUT_S,
            "--timeout",
            min=0.1,
            max=EXEC_TIMEOUT_MAX_S,
            help="Seconds the command may run before it is killed (exit 124).",
        ),
        data_dir: DataDirOption = None,
    ) -> None:
        """Run a command inside a running rollout's sandbox; exit with its exit code (1: refused,
        e.g. a rollout that has ended; 124: it ran past --timeout)."""
        from tapdeck.proxy.config import default_data_dir
        from tapdeck.runner.run_dir import run_id_of
        from tapdeck.schema.addresses import http_base_url
        from tapdeck.schema.tls import server_trust

        run_id = run_id_of(rollout)
        if run_id is None:
            raise CommandError(
                EXIT_USAGE,
                f"tapdeck exec: {rollout!r} is not a rollout id (run-….g000r00: see tapdeck runs RUN)",
            )
        if server is None:
            raise CommandError(
                EXIT_USAGE,
                "tapdeck exec: --server URL is needed: a rollout's sandbox is reached through the "
                "server running it",
            )
        data = (data_dir or default_data_dir()).expanduser()
        try:
            base = http_base_url(server, "--server")
            key = command_admin_key(admin_key, data)
            trust = server_trust(ca_file)
        except ValueError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck exec: {exc}") from None
        key_dir = None if admin_key else data
        line = (command[0] if len(command) == 1 else shlex.join(command)) if command else None

        def run(text: str) -> int:
            return asyncio.run(_exec(base, key, trust, run_id, rollout, text, timeout, key_dir))

        raise typer.Exit(run(line) if line is not None else _line_shell(run, rollout))


async def _exec(
    base: str,
    key: str | None,
    trust: ssl.SSLContext | bool,
    run_id: str,
    rollout: str,
    line: str,
    timeout_s: float,
    key_dir: Path | None,
) -> int:
    """Run `line` in the sandbox: its output printed, its exit code returned; a refusal raises
    CommandError."""
    client = TapdeckClient(base, key, verify=trust)
    try:
        reply = await client.exec_in_rollout(run_id, rollout, line, timeout_s)
    except ApiError as exc:
        why = exc.for_command(key_dir, key_found=bool(key))
        code = EXIT_TIMED_OUT if exc.status == 504 else EXIT_COULD_NOT_RUN
        raise CommandError(code, f"tapdeck exec: {why}") from None
    finally:
        await client.aclose()
    typer.echo(reply.stdout, nl=False)
    typer.echo(reply.stderr, nl=False, err=True)
    return reply.exit_code


def _line_shell(run: Callable[[str], int], rollout: str) -> int:
    """Read lines and `run` each until `exit` or end of input; the last command's exit code. A
    refusal ends it (the rollout has ended, say); a command that timed out is said and it goes on.
    Lines are read on the main thread, so Ctrl-C reaches the shell: at the prompt it drops the
    line, during a command it stops waiting for it."""
    typer.echo(f"[tapdeck] a shell in {rollout}'s sandbox: one command a line; `exit` ends it", err=True)
    last = 0
    while True:
        try:
            line = input(f"{rollout}$ ")
        except EOFError:
            typer.echo("", err=True)
            return last
        except KeyboardInterrupt:
            typer.echo("", err=True)
            continue
        if line.strip() in SHELL_EXIT:
            return last
        if not line.strip():
            continue
        try:
            last = run(line)
        except KeyboardInterrupt:
            typer.echo("[tapdeck] stopped waiting: the command runs on there until its --timeout", err=True)
            last = EXIT_INTERRUPTED
        except CommandError as exc:
            typer.echo(exc.line, err=True)
            if exc.code != EXIT_TIMED_OUT:
                return exc.code
            last = exc.code
