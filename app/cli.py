"""The `tapdeck` command line. With no command it opens the TUI on an embedded server.

Command modules import their heavy dependencies inside the command, so `tapdeck --help` stays fast.
"""

from __future__ import annotations

import importlib

import typer

from tapdeck import __version__

app = typer.Typer(
    name="tapdeck",
    help="An operator's terminal for agentic RL: capture proxy, Harbor runner and TUI.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
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
    """Console-script entry point."""
    app()
