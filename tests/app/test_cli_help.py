"""`--help` of every command at 80 columns: each option's name whole (rich's option table cut the
long ones with an ellipsis) and no `<bool>` placeholder after a flag."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tapdeck.app.cli import app


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the CLI (typer's own click) with the words that invoke it, root included."""
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "tapdeck" for p, _ in ALL])
def test_help_at_80_columns_shows_every_option_name_whole(path: tuple[str, ...], command: Any) -> None:
    result = CliRunner().invoke(
        app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80
    )
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    names = [
        name
        for param in command.params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    ]
    assert "--help" in result.output
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output), (name, result.output)
    assert "<bool>" not in result.output
