"""`tapdeck harness install NAME` / `tapdeck harness list`: the pinned agent CLIs tapdeck runs.

Installs go into `~/.cache/tapdeck/agents/` (or `$TAPDECK_AGENTS_DIR`) from the npm registry or
PyPI, once; afterwards the agents run offline from there.
"""

from __future__ import annotations

import typer

from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError


def install_with_progress(names: list[str]) -> list:
    """Install each agent (skipping installed ones) with a live status line; returns the records.

    Raises typer.Exit(1) after printing the reason when an install fails.
    """
    from rich.console import Console

    from tapdeck.runner import agent_install

    console = Console(stderr=True)
    records = []
    for name in names:
        if (record := agent_install.installed(name)) is not None:
            records.append(record)
            continue
        package = agent_install.get_package(name)
        with console.status(f"installing {package.spec} ...") as status:

            def progress(line: str, status=status, spec=package.spec) -> None:
                status.update(f"installing {spec}: {line[:100]}")

            try:
                record = agent_install.install(name, on_progress=progress)
            except agent_install.InstallError as exc:
                why = "the registry is unreachable" if exc.network else "the install failed"
                console.print(f"[red]{name}: {why}[/]\n{exc}")
                raise typer.Exit(EXIT_COULD_NOT_RUN) from None
        console.print(
            f"{name} {record.version}: {record.size_bytes / 1e6:.0f} MB in "
            f"{record.install_seconds:.0f} s → {record.path}"
        )
        records.append(record)
    return records


def register(app: typer.Typer) -> None:
    """Add the `harness` command group."""
    group = typer.Typer(
        help="Install and list the agent CLIs tapdeck runs (pinned versions).",
        no_args_is_help=True,
        rich_markup_mode=None,
    )
    app.add_typer(group, name="harness")

    @group.command("install")
    def install(
        names: list[str] = typer.Argument(None, help="Agents to install (default: all of them)."),
    ) -> None:
        """Install the pinned version of each agent CLI (idempotent)."""
        from tapdeck.runner import agent_install

        wanted = names or list(agent_install.PACKAGES)
        unknown = [n for n in wanted if n not in agent_install.PACKAGES]
        if unknown:
            raise CommandError(
                EXIT_USAGE,
                f"no pinned install for {', '.join(unknown)}; "
                f"installable: {', '.join(agent_install.PACKAGES)}",
            )
        for record in install_with_progress(wanted):
            typer.echo(f"{record.name} {record.version} installed at {record.path}")

    @group.command("list")
    def list_() -> None:
        """The installable agents, their pinned versions and what is installed."""
        from tapdeck.runner import agent_install

        for name, package in agent_install.PACKAGES.items():
            record = agent_install.installed(name)
            state = (
                f"installed, {record.size_bytes / 1e6:.0f} MB, {record.path}" if record else "not installed"
            )
            typer.echo(f"{name:<15} {package.registry:<5} {package.spec:<32} {state}")
