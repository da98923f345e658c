"""Info: what this machine can run (the catalog), the engine tier, and which server this is."""

from __future__ import annotations

from collections.abc import Iterable

from rich import box
from rich.table import Table
from textual import work
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.schema.catalog import Catalog


class InfoScreen(TapdeckScreen):
    """Server, engines (tier: tokens = trainable, logprobs = eval, text = neither), harnesses, sandboxes."""

    MODE = "info"
    HELP = (
        "What the server's machine can run, from /admin/catalog. Engine tier: tokens = trainable "
        "(prompt ids, sampled ids, logprobs), logprobs = eval only, text = neither."
    )

    BINDINGS = [Binding("r", "reload", "Reload", id="info.reload")]

    def __init__(self) -> None:
        super().__init__()
        self.catalog: Catalog | None = None

    def compose_body(self) -> Iterable[Widget]:
        with VerticalScroll(id="info-body"):
            yield Static("", id="server-info")
            yield Static("loading catalog…", id="catalog-info")

    def on_mount(self) -> None:
        self.action_reload()
        # The ✓ and ✗ are drawn in the theme's colours: a new theme draws the tables again.
        self.app.theme_changed_signal.subscribe(
            self, lambda _theme: self.show_catalog(self.catalog) if self.catalog is not None else None
        )

    def action_reload(self) -> None:
        self.load()

    @work(exclusive=True, group="info", exit_on_error=False)
    async def load(self) -> None:
        health = await self.client.health()
        self.query_one("#server-info", Static).update(
            f"server {self.app.server_label} · instance {health.instance[:8]} · status {health.status}"
        )
        self.show_catalog(await self.client.catalog())

    def show_catalog(self, catalog: Catalog) -> None:
        """Render the catalog as tables."""
        self.catalog = catalog
        theme = self.app.current_theme
        yes = f"[{theme.success}]✓[/]"
        no = f"[{theme.error}]✗[/]"

        def table(title: str, columns: list[str]) -> Table:
            t = Table(
                title=title,
                title_justify="left",
                expand=True,
                show_edge=False,
                pad_edge=False,
                title_style="bold",
                box=box.SIMPLE_HEAD,
            )
            for i, column in enumerate(columns):
                t.add_column(column, overflow="fold", ratio=3 if i == len(columns) - 1 else None)
            return t

        from rich.console import Group
        from rich.markup import escape

        engines = table("Engines", ["", "engine", "tier", "why / url"])
        for e in catalog.engines:
            engines.add_row(
                yes if e.reachable else no,
                escape(e.name),
                escape(e.tier or "text"),
                escape(e.why or e.url or ""),
            )
        harnesses = table("Harnesses", ["", "harness", "dialect", "why"])
        for h in catalog.harnesses:
            harnesses.add_row(
                yes if h.available else no,
                escape(h.name),
                escape(h.dialect),
                escape(h.why or ("validated" if h.validated else "")),
            )
        sandboxes = table("Sandboxes", ["", "sandbox", "why"])
        for s in catalog.sandboxes:
            sandboxes.add_row(yes if s.available else no, escape(s.name), escape(s.why))
        datasets = table("Datasets", ["", "dataset", "tasks", "source / error"])
        for d in catalog.datasets:
            datasets.add_row(
                no if d.error else yes, escape(d.name), str(len(d.tasks)), escape(d.error or d.source)
            )
        note = (
            "The embedded SmolLM2-135M engine never solves tasks (reward 0); point tapdeck at a "
            "vLLM server for learning signal."
        )
        self.query_one("#catalog-info", Static).update(
            Group(engines, "", harnesses, "", sandboxes, "", datasets, "", f"[dim]{escape(note)}[/]")
        )
