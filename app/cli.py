"""The `tapdeck` command line. With no command it opens the TUI on an embedded server, taking
`tapdeck tui`'s options.

Command modules import their heavy dependencies inside the command, so `tapdeck --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer import _click  # typer's own copy of click, whose Context its groups are invoked with
from typer.core import TyperGroup

from tapdeck import __version__
from tapdeck.app.commands import tui
from tapdeck.app.commands.options import (
    DataDirOption,
    EngineApiKeyOption,
    EngineModelOption,
    EngineWaitOption,
    PublicUrlOption,
    TlsKeyOption,
)
from tapdeck.app.exit_codes import EXIT_USAGE, CommandError
from tapdeck.proxy.config import DEFAULT_ENGINE_WAIT_S


class _CommandGroup(TyperGroup):
    """The root of the command line: where a CommandError raised below it (the root's callback, a
    command, a command of a group such as `harness`) becomes its line on stderr and its exit code,
    whichever way the app is invoked (the console script, typer's CliRunner)."""

    def invoke(self, ctx: _click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CommandError as exc:
            typer.echo(exc.line, err=True)
            raise typer.Exit(exc.code) from None


app = typer.Typer(
    name="tapdeck",
    cls=_CommandGroup,
    help="An operator's terminal for agentic RL: capture proxy, Harbor runner and TUI.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's option table cut long flag names at 80 columns.
    rich_markup_mode=None,
)

# Each module under tapdeck.app.commands registers its own command(s).
COMMAND_MODULES = [
    "engine",
    "tui",
    "attach",
    "info",
    "serve",
    "export",
    "replay",
    "train",
    "rollout",
    "runs",
    "sandbox_exec",
    "sessions",
    "harness",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tapdeck {__version__}")
        raise typer.Exit()


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"  # typer's own click: by name


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    data_dir: DataDirOption = None,
    port: tui.PortOption = 0,
    engine: tui.EngineOption = None,
    engine_model: EngineModelOption = None,
    engine_api_key: EngineApiKeyOption = None,
    engine_wait: EngineWaitOption = DEFAULT_ENGINE_WAIT_S,
    public_url: PublicUrlOption = None,
    tls_cert: tui.TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Open the TUI when no command is given (it takes `tapdeck tui`'s options)."""
    if ctx.invoked_subcommand is None:
        tui.run_embedded(
            data_dir,
            port=port,
            engine_url=engine,
            engine_model=engine_model,
            engine_api_key=engine_api_key,
            engine_wait_s=engine_wait,
            public_url=public_url,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        return
    # Before a command they would be silently dropped: that command has its own (or none).
    given = [
        p.opts[0]
        for p in ctx.command.params
        if p.name not in (None, "version") and _on_command_line(ctx, p.name)
    ]
    if given:
        command = ctx.invoked_subcommand
        raise CommandError(
            EXIT_USAGE,
            f"tapdeck: {', '.join(given)} before a command is the TUI's; "
            f"{command} takes its own options after it (tapdeck {command} --help "
            "lists them)",
        )


for _name in COMMAND_MODULES:
    importlib.import_module(f"tapdeck.app.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry point: a known failure of the world is one line and exit 1."""
    try:
        app()
    except Exception as exc:
        from tapdeck.app.failures import describe

        line = describe(exc)
        if line is None:
            raise
        command = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else None
        print(f"tapdeck{' ' + command if command else ''}: {line}", file=sys.stderr)
        raise SystemExit(1) from None
