"""Setup: choose dataset, tasks, harness, sandbox, engine, K, concurrency, the alternatives to
capture and the public URL sandboxes reach the proxy at, and the rollout settings (a collapsible
after the task list, remembered per harness); start a batch.

Every choice shows whether this machine can run it and why not, as `/admin/catalog` reports it —
nothing is assumed available.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import ValidationError
from textual import on, work
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import (
    Button,
    Collapsible,
    Input,
    Label,
    Select,
    SelectionList,
    Static,
)

from tapdeck.app.confirm import CONFIRM_S, TwoPress
from tapdeck.app.messages import RunsChanged
from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.views.runs import instruction_preview
from tapdeck.runner.harnesses import Placement
from tapdeck.runner.rollout_settings import DEFAULT_HARD_LIMIT_S, HARD_LIMIT_MARGIN_S
from tapdeck.schema.addresses import check_public_url
from tapdeck.schema.catalog import Catalog, DatasetInfo, EngineInfo, HarnessInfo, SandboxInfo
from tapdeck.schema.runs import MAX_CONCURRENCY, MAX_K, RolloutTemplate, RunPlan
from tapdeck.schema.settings import RolloutSettings

DEFAULT_ALTERNATIVES = 5
"""Top alternatives per token captured for runs started here (the Rollout screen shows them)."""

SMALL_MODEL_NOTE = (
    "The embedded engine (SmolLM2-135M) never solves tasks: every reward is 0. It "
    "exercises capture and this UI; a bigger engine is one flag away "
    "(tapdeck tui --engine URL)."
)


SETTING_INPUTS: tuple[tuple[str, str, Literal["integer", "number", "text"], str], ...] = (
    # (RolloutSettings field or "timeout_s", label, Input type, placeholder = what unset means)
    ("agent_timeout_s", "Agent s", "number", "task's"),
    ("timeout_s", "Hard s", "number", "300"),
    ("max_turns", "Max turns", "integer", "3"),
    ("max_output_tokens", "Output", "integer", "harness's"),
    ("context_tokens", "Context", "integer", "engine's"),
    ("temperature", "Temp.", "number", "harness's"),
    ("top_p", "top_p", "number", "harness's"),
    ("top_k", "top_k", "integer", "harness's"),
    ("min_p", "min_p", "number", "harness's"),
    ("harness_kwargs", "kwargs", "text", "{} (JSON)"),
)
"""The rollout settings Setup edits; empty = the default, which the placeholder names."""


CatalogItem = DatasetInfo | HarnessInfo | SandboxInfo | EngineInfo


def _ok(item: CatalogItem) -> bool:
    """Whether the catalog says this choice can run here."""
    if isinstance(item, DatasetInfo):
        return item.error is None
    if isinstance(item, EngineInfo):
        return item.reachable
    return item.available


TASKS_NONE_TICKED = "Tasks (none ticked = all)"
PUBLIC_URL_HINT = "where sandboxes that are not on this host reach the proxy"


class SetupScreen(TapdeckScreen):
    """The rollout plan editor."""

    MODE = "setup"
    HELP = (
        "Pick what to run. ✓ = this machine can run it; ✗ = it cannot, and the line below says "
        "why. In a text field, digits and q are typed as text: esc leaves the field, then the "
        "screen numbers and q work again."
    )

    BINDINGS = [
        Binding("ctrl+s", "start", "Start batch", id="setup.start"),
        Binding("ctrl+r", "reload", "Reload catalog", id="setup.reload"),
        # A focused field takes digits and q as text: this is the way back to the screen keys.
        Binding("escape", "leave_field", "Leave field", id="setup.leave_field"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.catalog: Catalog | None = None
        self._last_start: tuple[RunPlan, str] | None = None  # (plan, the run it started)
        self._repeat = TwoPress()

    def compose_body(self) -> Iterable[Widget]:
        with Horizontal(id="setup-body"):
            with VerticalScroll(id="setup-left"):
                yield Static(SMALL_MODEL_NOTE, id="small-model-note")
                yield Label("Dataset")
                yield Select[str]([], id="dataset", prompt="loading catalog…", compact=True)
                yield Input(placeholder="…or a dataset path / registry name", id="dataset-path", compact=True)
                yield Static("", id="why-dataset", classes="why")
                yield Label("Harness")
                yield Select[str]([], id="harness", prompt="–", compact=True)
                yield Static("", id="why-harness", classes="why")
                yield Label("Sandbox")
                yield Select[str]([], id="sandbox", prompt="–", compact=True)
                yield Static("", id="why-sandbox", classes="why")
                yield Label("Engine")
                yield Select[str]([], id="engine", prompt="–", compact=True)
                yield Static("", id="why-engine", classes="why")
                yield Label("Public URL")
                # Short enough to show whole in the 36 cells the field has at 80 columns; the
                # line below says what it is for, wrapped.
                yield Input(placeholder="empty: this server's address", id="public-url", compact=True)
                yield Static(PUBLIC_URL_HINT, id="why-public-url", classes="why")
                with Horizontal(id="numbers"):
                    with Vertical():
                        yield Label("K per task")
                        yield Input("1", id="k", type="integer", compact=True)
                    with Vertical():
                        yield Label("Concurrency")
                        yield Input("1", id="concurrency", type="integer", compact=True)
                    with Vertical():
                        yield Label("Alternatives")
                        # Shown per token on the Rollout screen; an explicit choice here, as the
                        # engine client asks for none a harness did not ask for.
                        yield Input(
                            str(DEFAULT_ALTERNATIVES), id="alternatives", type="integer", compact=True
                        )
                yield Button("Start batch", id="start", variant="primary", compact=True)
            with Vertical(id="setup-right"):
                yield Label(TASKS_NONE_TICKED, id="tasks-title")
                yield SelectionList[str](id="tasks")
                # Scrolls: a long instruction is read whole here, not cut at the pane's end.
                with VerticalScroll(id="instruction-scroll"):
                    yield Static("", id="instruction")
                # After the task list, so Tab reaches the tasks as before; collapsed, one line.
                with Collapsible(title="Rollout settings", id="rollout-settings", collapsed=True):
                    yield Static("", id="settings-defaults")
                    with Grid(id="settings-grid"):
                        for name, label, kind, placeholder in SETTING_INPUTS:
                            yield Label(label)
                            yield Input(
                                id=f"set-{name}",
                                placeholder=placeholder,
                                compact=True,
                                type=kind,
                                classes="setting",
                            )

    def on_mount(self) -> None:
        self.action_reload()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Shown (and bound) only while a text field has focus.
        if action == "leave_field":
            return isinstance(self.focused, Input)
        return True

    def action_leave_field(self) -> None:
        """Take focus off the text field, so that digits and q reach the screen keys again."""
        self.set_focus(None)

    def action_reload(self) -> None:
        """Fetch `/admin/catalog` again (e.g. after installing a sandbox SDK)."""
        self.load_catalog()

    @work(exclusive=True, group="catalog", exit_on_error=False)
    async def load_catalog(self) -> None:
        body = self.query_one("#setup-body")
        body.loading = True  # probing engines and sandboxes can take a few seconds
        try:
            catalog = await self.client.catalog()
        except Exception:
            if self.catalog is None:
                dataset = self.query_one("#dataset", Select)
                dataset.prompt = "catalog not loaded: ctrl+r retries"
                dataset.set_options([])
            raise  # the app turns it into a notification and the status line
        finally:
            body.loading = False
        first = self.catalog is None
        self.apply_catalog(catalog)
        if first:
            # At once, not via call_later: keys typed as soon as the pickers show go to the
            # dataset. Only on the first load: a reload (ctrl+r) leaves focus where it is.
            self.set_focus(self.query_one("#dataset", Select), scroll_visible=False)

    def apply_catalog(self, catalog: Catalog) -> None:
        """Fill the pickers from a catalog and select its defaults."""
        self.catalog = catalog
        defaults = catalog.defaults

        def fill(select_id: str, items: Sequence[CatalogItem], extra: str = "") -> None:
            options = []
            for item in items:
                mark = "✓" if _ok(item) else "✗"
                label = f"{mark} {item.name}"
                if extra and getattr(item, extra):
                    label += f" ({getattr(item, extra)})"
                options.append((label, item.name))
            select = self.query_one(f"#{select_id}", Select)
            select.set_options(options)
            default = defaults.get(select_id)
            names = [item.name for item in items]
            if default in names:
                select.value = default
            elif names:
                select.value = names[0]

        fill("dataset", catalog.datasets)
        fill("harness", catalog.harnesses, "dialect")
        fill("sandbox", catalog.sandboxes)
        fill("engine", catalog.engines, "tier")
        self.query_one("#dataset", Select).prompt = "–"
        self._show_dataset()
        for kind in ("harness", "sandbox", "engine"):
            self._show_why(kind)
        self._show_settings_defaults()
        self._recall_settings()

    def _show_settings_defaults(self) -> None:
        """The defaults in force for the chosen harness on the chosen engine: its context, and on
        the embedded engine the harness's tool profile, output limit and least agent timeout
        (each input's placeholder says what leaving it empty gives)."""
        engine, harness = self._item("engine"), self.query_one("#harness", Select).value
        context = engine.context_tokens if isinstance(engine, EngineInfo) else None
        row = (
            next((h for h in self.catalog.harness_defaults if h.harness == harness), None)
            if self.catalog is not None and isinstance(engine, EngineInfo) and engine.embedded
            else None
        )
        output, agent, hard = "harness's", "task's", f"{DEFAULT_HARD_LIMIT_S:g}"
        parts = [f"context {context}" if context else "context: the engine's (known when its session opens)"]
        if row is not None:
            output = str(row.output_tokens)
            agent = f"≥ {row.agent_timeout_s:g}"
            hard = f"{max(DEFAULT_HARD_LIMIT_S, row.agent_timeout_s + HARD_LIMIT_MARGIN_S):g}"
            parts += [
                *([f"tools {row.tool_profile}"] if row.tool_profile else []),
                f"output {output}",
                f"agent ≥ {row.agent_timeout_s:g} s (the task's if longer)",
            ]
        elif isinstance(engine, EngineInfo) and engine.reachable:
            parts.append("output: the harness's own request")
        self.query_one("#set-max_output_tokens", Input).placeholder = output
        self.query_one("#set-agent_timeout_s", Input).placeholder = agent
        self.query_one("#set-timeout_s", Input).placeholder = hard
        where = (
            f"{harness} on {engine.name}"
            if isinstance(engine, EngineInfo) and isinstance(harness, str)
            else "on the engine"
        )
        self.query_one("#settings-defaults", Static).update(
            f"Empty = default ({where}: {', '.join(parts)}); refused if it does not fit the engine."
        )

    @on(Collapsible.Expanded, "#rollout-settings")
    @on(Collapsible.Collapsed, "#rollout-settings")
    def _settings_toggled(self) -> None:
        # At 80×24 the settings take the task preview's place while they are open.
        opened = not self.query_one("#rollout-settings", Collapsible).collapsed
        self.query_one("#setup-right").set_class(opened, "-settings-open")

    def _recall_settings(self) -> None:
        """Fill the settings with what this harness last ran with from here (empty otherwise)."""
        harness = self.query_one("#harness", Select).value
        remembered = self.app.settings.rollout.get(str(harness), {}) if hasattr(self.app, "settings") else {}
        for name, *_ in SETTING_INPUTS:
            value = remembered.get(name)
            if name == "harness_kwargs" and value is not None:
                value = json.dumps(value)
            self.query_one(f"#set-{name}", Input).value = "" if value is None else str(value)
        self._title_settings()

    @on(Input.Changed, ".setting")
    def _title_settings(self) -> None:
        """The settings' title says how many are set (for the harness picked), as typed now."""
        harness = self.query_one("#harness", Select).value
        count = sum(bool(self.query_one(f"#set-{name}", Input).value.strip()) for name, *_ in SETTING_INPUTS)
        whose = f" for {harness}" if isinstance(harness, str) else ""
        self.query_one("#rollout-settings", Collapsible).title = (
            f"Rollout settings ({count} set{whose})" if count else "Rollout settings (defaults)"
        )

    def rollout_settings(self) -> tuple[dict[str, Any], float | None]:
        """The settings typed here (only those set) and the hard limit; ValueError naming a field."""
        raw: dict[str, Any] = {}
        for name, label, kind, _ in SETTING_INPUTS:
            text = self.query_one(f"#set-{name}", Input).value.strip()
            if not text:
                continue
            try:
                raw[name] = (
                    json.loads(text) if kind == "text" else int(text) if kind == "integer" else float(text)
                )
            except ValueError:
                raise ValueError(
                    f"{name} ({label}): {text!r} is not {'JSON' if kind == 'text' else 'a ' + kind}"
                ) from None
        timeout = raw.pop("timeout_s", None)
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout_s (Hard s): must be greater than 0")
        try:
            settings = RolloutSettings.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{field}: {first['msg']}") from None
        return settings.model_dump(exclude_unset=True), timeout

    def _item(self, kind: str) -> CatalogItem | None:
        if not self.catalog:
            return None
        value = self.query_one(f"#{kind}", Select).value
        items: dict[str, Sequence[CatalogItem]] = {
            "dataset": self.catalog.datasets,
            "harness": self.catalog.harnesses,
            "sandbox": self.catalog.sandboxes,
            "engine": self.catalog.engines,
        }
        return next((i for i in items[kind] if i.name == value), None)

    def _why(self, kind: str, item: CatalogItem | None) -> tuple[bool, str]:
        """(can run, a line saying so or why not)."""
        if item is None:
            return False, (
                "nothing chosen: pick one" if self.catalog else "nothing to choose (catalog not loaded)"
            )
        if isinstance(item, DatasetInfo):
            if item.error:
                return False, f"✗ {item.error}"
            return True, f"✓ {len(item.tasks)} tasks · {item.source}"
        if isinstance(item, EngineInfo):
            tier = item.tier or "text"
            if not item.reachable:
                return False, f"✗ unreachable: {item.why or 'no answer'}"
            trainable = "trainable" if tier == "tokens" else "eval only"
            return True, f"✓ tier {tier} ({trainable}) · {item.url or ''}"
        ok = item.available
        detail = item.why
        if isinstance(item, HarnessInfo):
            extra = f"{item.placement}, {'validated' if item.validated else 'not validated'}"
            return ok, (f"✓ {extra}" if ok else f"✗ {detail or 'not available'}") + (
                f" · {detail}" if ok and detail else ""
            )
        return ok, (
            f"✓ {detail}" if ok and detail else "✓ available"
        ) if ok else f"✗ {detail or 'not available'}"

    def _engine_unused(self) -> str | None:
        """The picked harness's name when it calls no model (oracle, nop): no engine is used, so
        none need be reachable. None otherwise."""
        harness = self._item("harness")
        if isinstance(harness, HarnessInfo) and harness.placement == Placement.NO_MODEL:
            return harness.name
        return None

    def _show_why(self, kind: str) -> None:
        if kind == "engine" and (harness := self._engine_unused()) is not None:
            self.query_one("#why-engine", Static).update(
                Content.styled(f"not used: {harness} calls no model", "$text-muted")
            )
            return
        ok, text = self._why(kind, self._item(kind))
        self.query_one(f"#why-{kind}", Static).update(Content.styled(text, "$success" if ok else "$error"))

    def _show_dataset(self) -> None:
        path = self.query_one("#dataset-path", Input).value.strip()
        if path:
            # A typed path wins over the picker: the hint must not vouch for the picked dataset.
            self.query_one("#why-dataset", Static).update(
                Content.styled(f"{path}: checked by the server when the batch starts", "$text-muted")
            )
        else:
            self._show_why("dataset")
        item = self._item("dataset")
        tasks = self.query_one("#tasks", SelectionList)
        names = [task.name for task in item.tasks] if isinstance(item, DatasetInfo) else []
        # Refilled on every dataset change event, including the one a catalog (re)load causes:
        # keep what is ticked, or a tick made meanwhile would silently widen the batch to all.
        if names != [tasks.get_option_at_index(i).value for i in range(tasks.option_count)]:
            ticked = set(tasks.selected)
            tasks.clear_options()
            tasks.add_options([(name, name, name in ticked) for name in names])
            if names:  # a visible row from the start: focus shows where space will tick
                tasks.highlighted = 0
        self._preview(names[0] if names else None)

    def _preview(self, task_name: str | None) -> None:
        item = self._item("dataset")
        tasks = item.tasks if isinstance(item, DatasetInfo) else []
        task = next((t for t in tasks if t.name == task_name), None)
        preview = self.query_one("#instruction", Static)
        self.query_one("#instruction-scroll").scroll_home(animate=False)  # another task: its start
        if task is None:
            preview.update(Content.styled("No task to preview.", "$text-muted"))
        else:
            text = task.instruction_text or task.instruction  # the first line from an older server
            preview.update(Content.assemble((f"{task.name}\n", "bold"), instruction_preview(text)))

    @on(Select.Changed)
    def _select_changed(self, event: Select.Changed) -> None:
        kind = event.select.id or ""
        if kind == "dataset":
            self._show_dataset()
        elif kind in ("harness", "sandbox", "engine"):
            self._show_why(kind)
        if kind == "harness":
            self._recall_settings()
            self._show_why("engine")  # used or not, by this harness
        if kind in ("harness", "engine"):
            self._show_settings_defaults()

    @on(Input.Changed, "#dataset-path")
    def _dataset_path_changed(self) -> None:
        if self.catalog is not None:
            self._show_dataset()

    @on(SelectionList.SelectedChanged, "#tasks")
    def _ticks_changed(self, event: SelectionList.SelectedChanged) -> None:
        # The tick glyph differs only by colour, which a plain or remote terminal may not show.
        ticked, total = len(event.selection_list.selected), event.selection_list.option_count
        self.query_one("#tasks-title", Label).update(
            f"Tasks ({ticked} of {total} ticked)" if ticked else TASKS_NONE_TICKED
        )

    @on(SelectionList.SelectionHighlighted, "#tasks")
    def _task_highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        self._preview(event.selection.value)

    @on(Button.Pressed, "#start")
    def _start_pressed(self) -> None:
        self.action_start()

    def plan(self) -> RunPlan:
        """The RunPlan for `POST /admin/runs`; raises ValueError with what to fix."""
        custom = self.query_one("#dataset-path", Input).value.strip()
        dataset = custom or self.query_one("#dataset", Select).value
        if not dataset or dataset is Select.NULL:
            raise ValueError("choose a dataset (or type a path)")
        for kind in ("harness", "sandbox", "engine"):
            if kind == "engine" and self._engine_unused():
                continue  # the runner opens no session for it: an unreachable engine is no matter
            item = self._item(kind)
            ok, why = self._why(kind, item)
            if not ok:
                raise ValueError(f"{kind} {item.name if item else ''} cannot run here: {why.lstrip('✗ ')}")
        if not custom:
            ok, why = self._why("dataset", self._item("dataset"))
            if not ok:
                raise ValueError(f"dataset {dataset} cannot be used: {why.lstrip('✗ ')}")
        numbers = {}
        for name, label, low, high in (
            ("k", "K", 1, MAX_K),
            ("concurrency", "concurrency", 1, MAX_CONCURRENCY),
            ("alternatives", "alternatives", 0, 20),
        ):
            raw = self.query_one(f"#{name}", Input).value.strip()
            if not raw.isdigit() or not low <= int(raw) <= high:
                raise ValueError(f"{label} must be a whole number from {low} to {high}")
            numbers[name] = int(raw)
        public_url = self.query_one("#public-url", Input).value.strip() or None
        if public_url is not None:
            public_url = check_public_url(public_url)
        ticked = list(self.query_one("#tasks", SelectionList).selected)
        settings, timeout = self.rollout_settings()
        engine = self.query_one("#engine", Select).value
        if not isinstance(engine, str):  # no engine picked: only a harness that calls none gets here
            engine = RolloutTemplate.model_fields["engine"].default
        return RunPlan(
            dataset=str(dataset),
            tasks=ticked or None,
            k=numbers["k"],
            concurrency=numbers["concurrency"],
            rollout=RolloutTemplate(
                harness=str(self.query_one("#harness", Select).value),
                sandbox=str(self.query_one("#sandbox", Select).value),
                engine=engine,
                alternatives=numbers["alternatives"],
                public_url=public_url,
                settings=RolloutSettings.model_validate(settings),
                timeout_s=timeout,
            ),
        )

    def action_start(self) -> None:
        """Start a batch with the current choices."""
        try:
            plan = self.plan()
        except ValueError as exc:
            self.app.notify(str(exc), title="Cannot start", severity="warning")
            return
        self._remember(plan)
        self.start_run(plan)

    def _remember(self, plan: RunPlan) -> None:
        """Keep this harness's settings for next time (the TUI's settings file)."""
        settings = getattr(self.app, "settings", None)
        if settings is None:
            return
        template = plan.rollout
        remembered = template.settings.model_dump(exclude_unset=True)
        if template.timeout_s is not None:
            remembered["timeout_s"] = template.timeout_s
        settings.rollout[template.harness] = remembered
        settings.save(getattr(self.app, "settings_path", None))

    @work(exclusive=True, group="start-run", exit_on_error=False)
    async def start_run(self, plan: RunPlan) -> None:
        """Start `plan`; the same plan as a run still going starts only on a second press."""
        if self._last_start is not None and self._last_start[0] == plan:
            last = await self.client.run(self._last_start[1])
            if last.state == "running" and not self._repeat.press(last.id, self.app.clock()):
                from tapdeck.app.screen_registry import key_of  # the registry imports this screen

                self.app.notify(
                    f"run {last.id} with this same plan is still running "
                    f"({last.counts.done}/{last.counts.total} done). Press "
                    f"{key_of(self.app, 'setup.start', self)} again within "
                    f"{CONFIRM_S:g} s to start another.",
                    title="Start it twice?",
                    severity="warning",
                    timeout=CONFIRM_S,
                )
                return
        run = await self.client.start_run(plan)
        self._last_start = (plan, run.id)
        self.app.notify(
            f"run {run.id} started: {run.counts.total} rollout{'' if run.counts.total == 1 else 's'}",
            title="Batch started",
        )
        if run.left_out:
            # Harbor drops these folders without a word: say which, and why, once.
            self.app.notify(
                "\n".join(run.left_out),
                severity="warning",
                timeout=20,
                title=f"{len(run.left_out)} task folder{'' if len(run.left_out) == 1 else 's'}"
                " left out: not tasks Harbor can run",
            )
        self.app.post_message(RunsChanged())
        self.app.switch_mode("sessions")
