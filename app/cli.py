"""The `tapdeck` command line. With no command it opens the TUI on an embedded server.

Command modules import their heavy dependencies inside the command, so `tapdeck --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import typer

from tapdeck import __version__

app = typer.Typer(
    name="tapdeck",
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
    "train",
    "rollout",
    "runs",
    "sessions",
    "harness",
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tapdeck {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Open the TUI when no command is given."""
    if ctx.invoked_subcommand is None:
        tui = importlib.import_module("tapdeck.app.commands.tui")
        tui.run_embedded()


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
