"""`tapdeck info`: what this machine can run right now (sandboxes, datasets, harnesses, engines).

Nothing is started: sandbox backends are checked by import + preflight, the embedded engine by its
package and model file, an `--engine URL` by a short `GET …/models` at the base URL its address
settles on, which is shown (plus the proxy's tier probe unless `--no-probe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tapdeck.app.commands.options import engine_api_key_option, engine_option
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE, CommandError

# Sandboxes listed even when unavailable (the usual choices), so their reason is visible.
ALWAYS_SHOWN = ("host", "docker")

CHECK_ENGINE = (
    "check that the engine is running at that host and port, and that --engine-api-key "
    "is its key if it wants one"
)
"""What to check when an `--engine` did not answer, after the row's list of what was tried."""


def _yes(value: bool) -> str:
    return "[green]yes[/]" if value else "[red]no[/]"


def render(catalog, *, show_all: bool = False, width: int = 80):
    """The catalog as rich renderables that fit `width` columns (80 by default)."""
    from rich.markup import escape
    from rich.table import Table

    def table(title: str, *columns: tuple[str, dict]) -> Table:
        t = Table(title=title, title_justify="left", expand=False, show_lines=False, pad_edge=False)
        for name, opts in columns:
            t.add_column(name, **opts)
        return t

    wrap = {"overflow": "fold"}
    out: list[Table | str] = []

    sandboxes = table(
        "Sandboxes", ("name", {"no_wrap": True}), ("ok", {"no_wrap": True}), ("why", {"ratio": 1, **wrap})
    )
    hidden = 0
    for s in catalog.sandboxes:
        if not show_all and not s.available and s.name not in ALWAYS_SHOWN:
            hidden += 1
            continue
        sandboxes.add_row(s.name, _yes(s.available), escape(s.why))
    if hidden:
        sandboxes.caption = f"{hidden} more Harbor backends unavailable here (--all lists them)"
    out.append(sandboxes)

    for d in catalog.datasets:
        count = f"{len(d.tasks)} task{'s' if len(d.tasks) != 1 else ''}"
        width_used = min(24, max((len(t.name) for t in d.tasks), default=5))
        datasets = table(
            f"Dataset {escape(d.name)} ({count})",
            ("task", {"no_wrap": True, "min_width": width_used}),
            (
                "instruction",
                {"overflow": "ellipsis", "no_wrap": True, "max_width": max(10, width - width_used - 7)},
            ),
        )
        if d.error:
            datasets.add_row("[red]error[/]", escape(d.error))
        for t in d.tasks:
            datasets.add_row(escape(t.name), escape(t.instruction))
        out.append(datasets)

    harnesses = table(
        "Harnesses",
        ("name", {"no_wrap": True}),
        ("dialect", {"no_wrap": True}),
        ("runs", {"no_wrap": True}),
        ("valid.", {"no_wrap": True}),
        ("ok", {"no_wrap": True}),
        ("installed", {"overflow": "fold"}),
    )
    for h in catalog.harnesses:
        validated = _yes(h.validated) + (f" {h.version}" if h.validated and h.version else "")
        installed = h.installed or ("[red]no[/]" if h.version else "-")
        harnesses.add_row(h.name, h.dialect, h.placement, validated, _yes(h.available), installed)
    harnesses.caption = (
        "validated = run end to end here (at that version); host-install = a "
        "pinned CLI tapdeck installs (`tapdeck harness install`) and runs on the "
        "host sandbox; installed = Harbor installs it inside a container sandbox"
    )
    out.append(harnesses)

    engines = table(
        "Engines",
        ("name", {"max_width": 28, **wrap}),
        ("tier", {"no_wrap": True}),
        ("ctx", {"no_wrap": True}),
        ("ok", {"no_wrap": True}),
        ("why", {"ratio": 1, **wrap}),
    )
    for e in catalog.engines:
        context = f"{e.context_tokens}" if e.context_tokens else "-"
        engines.add_row(escape(e.name), e.tier or "-", context, _yes(e.reachable), escape(e.why))
    engines.caption = (
        "ctx = the context the engine lists (max_model_len); rollouts on the "
        "embedded engine get the harness defaults below, on any other the "
        "harness's own requests"
    )
    out.append(engines)

    settings = table(
        "Rollout settings (defaults)", ("setting", {"no_wrap": True}), ("default", {"ratio": 1, **wrap})
    )
    for name, default in catalog.settings_defaults.items():
        settings.add_row(name, escape(default))
    out.append(settings)

    per_harness = table(
        "Harness defaults on the embedded engine",
        ("harness", {"no_wrap": True}),
        ("tools", {"no_wrap": True}),
        ("1st prompt", {"no_wrap": True}),
        ("cut reply", {"no_wrap": True}),
        ("output", {"no_wrap": True}),
        ("agent timeout", {"no_wrap": True}),
    )
    for h in catalog.harness_defaults:
        per_harness.add_row(
            h.harness,
            h.tool_profile or "-",
            f"{h.first_prompt_tokens}",
            h.on_cut_reply,
            f"{h.output_tokens}",
            f"≥ {h.agent_timeout_s:g} s",
        )
    per_harness.caption = (
        "measured here: each first prompt, and what the agent does with a "
        "reply cut at its output limit (fatal, retries, ends, re-asks); the "
        "agent timeout at the default turns"
    )
    out.append(per_harness)

    d = catalog.defaults
    out.append(
        f"defaults: dataset={d['dataset']} harness={d['harness']} sandbox={d['sandbox']} engine={d['engine']}"
    )
    return out


def running_embedded_engine(*, probe: bool) -> Any | None:
    """The embedded engine another tapdeck process runs and announced (the one a server started
    now would reuse), as a catalog row with its tier; None when none runs."""
    import asyncio
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from tapdeck.runner.catalog import url_engine_info
    from tapdeck.runner.engine.model import DEFAULT_N_CTX
    from tapdeck.runner.engine.model_file import default_model_path
    from tapdeck.runner.engine.registry import find_running

    try:
        announced = find_running(Path(default_model_path()).resolve(), DEFAULT_N_CTX)
    except OSError:  # no model file: the catalog's own row says why
        return None
    if announced is None:
        return None
    row = asyncio.run(url_engine_info(announced.base_url, probe=probe))
    row.name = "embedded"
    row.why = f"running (process {announced.pid}, shared by every tapdeck here); {row.why}"
    return row


def register(app: typer.Typer) -> None:
    """Add the `info` command."""

    @app.command("info")
    def info(
        engine: Annotated[
            list[str], engine_option("Engine to check: HOST:PORT, http://HOST:PORT or …/v1 (repeatable).")
        ] = [],  # noqa: B006 - typer passes a new list
        engine_api_key: Annotated[
            str | None, engine_api_key_option("API key for --engine (never printed).")
        ] = None,
        dataset: list[str] = typer.Option(
            [], "--dataset", help="Extra dataset to list (folder, name@version, org/name, git URL)."
        ),
        probe: bool = typer.Option(
            True, "--probe/--no-probe", help="Ask the engine's capture tier (a few 1-token calls)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the catalog as JSON."),
        show_all: bool = typer.Option(False, "--all", help="List every Harbor sandbox backend."),
    ) -> None:
        """Show what this machine can run now: sandboxes, datasets, harnesses, engines."""
        from tapdeck.proxy.upstream.address import EngineAddressError, normalize_address
        from tapdeck.runner.catalog import build_catalog, list_datasets

        try:
            for address in engine:
                normalize_address(address)
        except EngineAddressError as exc:
            raise CommandError(EXIT_USAGE, f"tapdeck info: {exc}") from None

        # Datasets first: a --dataset that names none is bad usage, refused before the slow part.
        listings = list_datasets(dataset)
        for listing in listings:
            for line in listing.unlisted:
                typer.echo(f"tapdeck info: warning: {line}; task left out", err=True)
        named = listings[1:]  # the sample dataset is always listed; the others were asked for
        wrong = [d.problem.message for d in named if d.problem and not d.problem.unreachable]
        for message in wrong:
            typer.echo(f"tapdeck info: {message}", err=True)
        if wrong:
            raise typer.Exit(EXIT_USAGE)
        catalog = build_catalog(
            engine_urls=engine or None, engine_api_key=engine_api_key, datasets=listings, probe=probe
        )
        if (running := running_embedded_engine(probe=probe)) is not None:
            catalog.engines = [running, *(e for e in catalog.engines if e.name != "embedded")]
        if as_json:
            typer.echo(catalog.model_dump_json(indent=2))
        else:
            from rich.console import Console

            console = Console(width=min(Console().width, 100))
            for part in render(catalog, show_all=show_all, width=console.width):
                console.print(part)
                console.print()
        # An engine or a dataset's source the user named that does not answer is work not done
        # (README's exit codes); the catalog above says why.
        silent = [e for e in catalog.engines if e.name != "embedded" and not e.reachable]
        for row in silent if engine else []:
            typer.echo(f"tapdeck info: {row.why}; {CHECK_ENGINE}", err=True)
        for listing in named:
            if listing.problem is not None:
                typer.echo(f"tapdeck info: {listing.problem.message}", err=True)
        if (engine and silent) or any(d.problem for d in named):
            raise typer.Exit(EXIT_COULD_NOT_RUN)
