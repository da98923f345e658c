"""The tapdeck TUI: one App over a `TapdeckClient`, the same for embedded and attached servers.

The App owns the live state (the session board fed by `/admin/events`), the theme and key map, and
the single place where worker errors become notifications (`on_worker_state_changed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.reactive import reactive
from textual.theme import Theme
from textual.worker import Worker, WorkerState

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.app.confirm import CONFIRM_S, TwoPress
from tapdeck.app.messages import (
    ConnectionChanged,
    RunsChanged,
    SessionsChanged,
    TurnCaptured,
)
from tapdeck.app.screen_registry import SCREENS, help_tables, key_of, screen_bindings, unknown_keymap_ids
from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.screens.help import HelpScreen
from tapdeck.app.screens.info import InfoScreen
from tapdeck.app.screens.rollout import RolloutScreen
from tapdeck.app.screens.runs import RunsScreen
from tapdeck.app.screens.setup import SetupScreen
from tapdeck.app.screens.train import TrainScreen
from tapdeck.app.server_links import SEVERAL_HELP, ServerLink, ServerLinks, host_port
from tapdeck.app.settings import Settings
from tapdeck.app.views.errors import describe_error
from tapdeck.app.views.sessions import SessionBoard
from tapdeck.app.widgets.nav_bar import TARGETED, NavBar
from tapdeck.schema import events as api
from tapdeck.schema.sessions import EngineWait
from tapdeck.themes import STYLESHEET
from tapdeck.themes.palettes import DEFAULT_THEME, THEMES, VARIABLE_DEFAULTS

RECONNECT_S = (0.5, 1.0, 2.0, 5.0)
FIRST_SCREEN_WAIT_S = 5.0
"""How long the first screen waits to learn whether the server has sessions (Setup or Sessions)."""
ENGINE_POLL_S = 2.0
"""How often `/health` is asked while the server waits for its default engine."""
QUIT_CHECK_S = 2.0
"""How long `q` waits to learn whether runs are going; a server that does not answer lets it quit."""

log = logging.getLogger("tapdeck.tui")
"""Where an error's details go (the request, status code, transport error) while the person gets
`describe_error`'s line: `tapdeck tui` sends logging to a file."""


def build_themes() -> list[Theme]:
    """tapdeck's themes (data in tapdeck.themes.palettes) as Textual Themes."""
    return [Theme(name=name, **spec) for name, spec in THEMES.items()]


class TapdeckCommands(Provider):
    """Command palette entries for tapdeck's actions."""

    def _commands(self) -> list[tuple[str, Callable[[], object], str]]:
        app: TapdeckApp = self.app  # type: ignore[assignment]
        commands: list[tuple[str, Callable[[], object], str]] = [
            (f"Go to {e.title}", partial(app.switch_mode, e.mode), e.what) for e in SCREENS
        ]
        commands += [
            ("Start batch", app.action_start_batch, "start a batch with the Setup choices"),
            ("Export run as JSONL", partial(app.action_export_run, "jsonl"), "export the run shown on Runs"),
            (
                "Export run as Parquet",
                partial(app.action_export_run, "parquet"),
                "export the run shown on Runs",
            ),
            ("Reload sessions", app.action_resync, "re-read all sessions from the server"),
            ("Help", app.action_help, "keys and screens"),
        ]
        commands += [
            (f"Theme: {name}", partial(setattr, app, "theme", name), "switch theme") for name in THEMES
        ]
        if app.links.several:
            commands += [
                (
                    f"Work on server {link.name}",
                    partial(app.use_server, link.name),
                    "Setup, Info and Train act on that server",
                )
                for link in app.links
            ]
        return commands

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


class TapdeckApp(App[None]):
    """`TapdeckApp(client, server_label=..., settings_path=...)`.

    Without `initial_mode` it opens on Setup when the server has no sessions yet, else on Sessions.
    `owns_server`: the server lives in this process (`tapdeck`, `tapdeck tui`), so quitting stops
    its runs and `q` asks once more while any is going; attached, runs go on without the TUI.

    `others`: more servers to attach to (`tapdeck attach URL URL…`): Sessions and Runs then show
    every server's rows with a server column, and each action goes to its row's server; the
    client's own server is named `server_name` (default HOST:PORT) in that column."""

    TITLE = "tapdeck"
    CSS_PATH = STYLESHEET
    COMMANDS = App.COMMANDS | {TapdeckCommands}
    DEFAULT_MODE = "sessions"

    BINDINGS = [
        *screen_bindings(),
        Binding("f1,question_mark", "help", "Help", id="app.help"),
        Binding("ctrl+t", "next_theme", "Theme", show=False, id="app.theme"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    status: reactive[str] = reactive("")
    status_level: reactive[str] = reactive("info")

    def __init__(
        self,
        client: TapdeckClient,
        *,
        server_label: str = "",
        server_name: str = "",
        others: Sequence[ServerLink] = (),
        settings_path: Path | None = None,
        follow_events: bool = True,
        clock: Callable[[], float] = time.monotonic,
        initial_mode: str | None = None,
        owns_server: bool = False,
    ) -> None:
        super().__init__()
        own = ServerLink(server_name or host_port(client.base_url), server_label or client.base_url, client)
        self.links = ServerLinks([own, *others])
        self.settings_path = settings_path
        self.settings = Settings.load(settings_path)
        self.follow_events = follow_events
        self.clock = clock
        self.initial_mode = initial_mode
        self.owns_server = owns_server
        self._quit = TwoPress()
        self.screens_by_mode = {entry.mode: entry.screen() for entry in SCREENS}
        for mode, screen in self.screens_by_mode.items():
            # One screen instance per mode, so the App can reach each screen directly.
            def base_screen(screen: TapdeckScreen = screen) -> TapdeckScreen:
                return screen

            self.add_mode(mode, base_screen)

    # -- the servers ------------------------------------------------------------------------------
    @property
    def client(self) -> TapdeckClient:
        """The client of the server Setup, Info and Train work on (the only one, attached to one)."""
        return self.links.target.client

    @property
    def server_label(self) -> str:
        """The URL (or "embedded URL") of the server Setup, Info and Train work on."""
        return self.links.target.label

    @property
    def board(self) -> SessionBoard:
        """The first server's session board (the only one, attached to one)."""
        return self.links.first.board

    @property
    def connected(self) -> bool:
        """Every attached server's event stream is up."""
        return all(link.connected for link in self.links)

    @property
    def engine_wait(self) -> EngineWait | None:
        """What the first server's `/health` last said of the engine it waits for (None: none)."""
        return self.links.first.engine_wait

    def _group(self, name: str, link: ServerLink) -> str:
        """A worker group of one server's (a worker per server, each exclusive in its group); the
        name alone with one server, as its failures are reported."""
        return f"{name} {link.name}" if self.links.several else name

    def use_server(self, name: str) -> None:
        """Make Setup, Info and Train work on the server `name` (reloading those already shown)."""
        link = self.links.named(name)
        if link is None:
            return
        self.links.target = link
        for mode in TARGETED:
            screen = self._mode_screen(mode)
            if isinstance(screen, SetupScreen | InfoScreen | TrainScreen) and screen.is_mounted:
                screen.action_reload()
                for nav in screen.query(NavBar):
                    nav.show_keys()
        self.notify(f"Setup, Info and Train now work on {link.name} ({link.label}).")

    def _show_links(self) -> None:
        """The status line with several servers: which ones answer (`ServerLinks.status`)."""
        self.status, self.status_level = self.links.status()

    # -- start-up ---------------------------------------------------------------------------------
    def get_theme_variable_defaults(self) -> dict[str, str]:
        return {**super().get_theme_variable_defaults(), **VARIABLE_DEFAULTS}

    async def on_mount(self) -> None:
        for theme in build_themes():
            self.register_theme(theme)
        wanted = self.settings.theme or DEFAULT_THEME
        try:
            self.theme = wanted
        except Exception:  # noqa: BLE001 - InvalidThemeError: an old settings file names a removed theme
            self.theme = DEFAULT_THEME
            self.notify(f"theme {wanted!r} not found; using {DEFAULT_THEME}", severity="warning")
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
            if unknown := unknown_keymap_ids(self, self.settings.keymap):
                where = f" in {self.settings_path}" if self.settings_path else ""
                self.notify(
                    f"keymap{where}: no binding has the id "
                    f"{', '.join(unknown)} (ignored); F1 lists the keys bound now",
                    severity="warning",
                )
            for nav in self.screen.query(NavBar):  # the default screen is up before the keymap
                nav.show_keys()
        if self.links.several:
            self._show_links()
        else:
            self.status = f"connecting to {self.server_label}…"
        await self.switch_mode(self.initial_mode or await self._first_mode())
        self.watch_engine()
        if self.follow_events:
            self.follow()
        else:
            self.resync()

    async def _first_mode(self) -> str:
        """Setup when no server has sessions yet (that is where one starts), else Sessions.

        A server that does not answer in time also opens on Sessions, whose status line says why."""

        async def has_sessions(link: ServerLink) -> bool:
            try:
                return bool(await asyncio.wait_for(link.client.sessions(), FIRST_SCREEN_WAIT_S))
            except (ApiError, OSError, TimeoutError):
                return True

        found = await asyncio.gather(*(has_sessions(link) for link in self.links))
        return "sessions" if any(found) else "setup"

    def _remember_theme(self, theme: Theme) -> None:
        self.settings.theme = theme.name
        self.settings.save(self.settings_path)

    async def on_unmount(self) -> None:
        for link in self.links:
            await link.client.aclose()

    # -- live state -------------------------------------------------------------------------------
    async def _load_board(self, link: ServerLink) -> None:
        """Replace a server's board with `GET /admin/sessions` plus the rollouts of running runs."""
        link.board.replace_all(await link.client.sessions(), self.clock())
        try:
            runs = await link.client.runs()
        except ApiError as exc:
            if exc.kind != "not_found":  # a server without runner routes lists sessions only
                raise
            runs = []
        # A rollout shown before a reconnect may belong to a run that stopped meanwhile: only the
        # running runs' rollouts (and ended ones) stay, or a never-run one would read `queued` forever.
        link.board.replace_rollouts(
            [
                rollout
                for run in runs
                if run.state == "running"
                for rollout in (await link.client.run(run.id)).rollouts
            ]
        )
        self.post_message(SessionsChanged())

    def resync(self) -> None:
        """Re-read all sessions from every server."""
        for link in self.links:
            self.run_worker(
                self._resync(link), group=self._group("resync", link), exclusive=True, exit_on_error=False
            )

    async def _resync(self, link: ServerLink) -> None:
        if not self.links.several:
            await self._load_board(link)
            if not self.follow_events:
                self._show_answering(link.label)
            return
        try:
            await self._load_board(link)
        except ApiError as exc:
            # One server that stops answering must not stop the others' rows: it is shown as such
            # (the event worker says so itself, and retries).
            if exc.kind != "unreachable":
                raise
            if not self.follow_events:
                self.post_message(ConnectionChanged(link.name, False, describe_error(exc)))
            return
        if not self.follow_events:
            self.post_message(ConnectionChanged(link.name, True))

    def _show_answering(self, text: str) -> None:
        """The status line of a server that answers: `text`, or while it waits for its engine, that
        (sessions on the engine are refused meanwhile: it is the first thing to know)."""
        wait = self.engine_wait
        self.status, self.status_level = (wait.line(), "warning") if wait else (text, "info")

    def watch_engine(self, link: ServerLink | None = None) -> None:
        """Watch each server's engine (or `link`'s only): `_watch_engine`."""
        for each in [link] if link is not None else self.links:
            group = self._group("engine", each)
            self.run_worker(self._watch_engine(each), group=group, exclusive=True, exit_on_error=False)

    async def _watch_engine(self, link: ServerLink) -> None:
        """Ask `/health` every ENGINE_POLL_S while the server waits for its default engine,
        saying so on the status line, until the engine answers."""
        while True:
            try:
                health = await link.client.health()
            except ApiError as exc:
                if exc.kind != "unreachable":
                    return  # it answered, not as a tapdeck server does: the other screens say so
                health = None  # the connection's own status line says why
            if health is not None:
                waited, link.engine_wait = link.engine_wait, health.engine_wait
                if self.links.several:
                    if link.engine_wait is not None or waited is not None:
                        self._show_links()
                    if link.engine_wait is None:
                        return
                elif link.engine_wait is not None:
                    self._show_answering("")
                elif waited is not None:
                    self._show_answering(f"the engine answered · connected to {link.label}")
                    return
                else:
                    return
            await asyncio.sleep(ENGINE_POLL_S)

    def follow(self) -> None:
        """Follow every server's event stream (`_follow`)."""
        for link in self.links:
            self.run_worker(
                self._follow(link), group=self._group("events", link), exclusive=True, exit_on_error=False
            )

    async def _follow(self, link: ServerLink) -> None:
        """Follow `/admin/events` forever: resync on (re)connect, back off while the server is gone."""
        attempt = 0
        while True:
            try:
                await self._load_board(link)
                self.post_message(ConnectionChanged(link.name, True))
                attempt = 0
                async for event in link.client.events():
                    self.take_event(event, link)
                raise ApiError(
                    f"the tapdeck server at {link.label} ended the connection (stopping or restarting?)",
                    kind="unreachable",
                )
            except ApiError as exc:
                log.warning("event stream: %s", exc.message)
                if exc.kind == "auth":
                    # Retrying cannot help (a server restarted with another key): say so, and stop.
                    self.post_message(
                        ConnectionChanged(
                            link.name,
                            False,
                            f"{describe_error(exc)}; this TUI stopped following the server, so "
                            "quit and attach again with that key",
                            gave_up=True,
                        )
                    )
                    return
                delay = RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)]
                attempt += 1
                self.post_message(
                    ConnectionChanged(link.name, False, f"{describe_error(exc)} · retrying in {delay:g} s")
                )
                await asyncio.sleep(delay)

    def take_event(self, event: api.Event, link: ServerLink | None = None) -> None:
        """Apply one event of `link`'s (default: the first server's) to the live state and tell
        the screens (coalesced)."""
        link = link or self.links.first
        board = link.board
        if isinstance(event, api.SessionOpened | api.SessionUpdated | api.SessionClosed | api.TurnCaptured):
            board.upsert(event.session, self.clock())
            self.post_message(SessionsChanged())
            if isinstance(event, api.TurnCaptured):
                board.note_call(self.clock())
                if event.turn.finish_reason:
                    board.finish_reasons[event.session.id] = event.turn.finish_reason
                self.post_message(TurnCaptured(event.session.id, link.name))
            if isinstance(event, api.SessionUpdated | api.SessionClosed) and event.session.metadata.get(
                "run_id"
            ):
                self.post_message(RunsChanged())
            return
        if isinstance(event, api.RolloutUpdated):
            board.upsert_rollout(event.rollout)
            self.post_message(SessionsChanged())
        elif isinstance(event, api.RunFinished):
            board.run_ended(event.run_id)
            self.post_message(SessionsChanged())
        self.post_message(RunsChanged())

    def _mode_screen(self, mode: str) -> TapdeckScreen | None:
        """The base screen of `mode` (one instance per mode for the App's life)."""
        return self.screens_by_mode.get(mode)

    def on_turn_captured(self, message: TurnCaptured) -> None:
        screen = self._mode_screen("rollout")
        if isinstance(screen, RolloutScreen):
            screen.turn_captured(message.session_id, message.server)

    def on_runs_changed(self, message: RunsChanged) -> None:
        screen = self._mode_screen(self.current_mode)
        if isinstance(screen, RunsScreen | TrainScreen):
            screen.runs_changed()

    def on_sessions_changed(self, message: SessionsChanged) -> None:
        # The Sessions screen polls `board.version` at its own rate; Runs' turns column follows here.
        screen = self._mode_screen("runs")
        if isinstance(screen, RunsScreen) and self.current_mode == "runs":
            screen.sessions_changed()

    def on_connection_changed(self, message: ConnectionChanged) -> None:
        link = self.links.named(message.server)
        if link is None:
            return
        was = link.connected
        link.connected = message.connected
        link.lost = "" if message.connected else message.error
        self.post_message(SessionsChanged())  # its rows greyed, or no longer
        if message.connected:
            if was:
                return  # a resync while connected: keep whatever the status line says (an error)
            if self.links.several:
                self._show_links()
            else:
                self._show_answering(f"connected to {link.label}")
            self.watch_engine(link)  # a server restarted meanwhile may wait for its engine now
            self.post_message(RunsChanged())  # runs moved on (or were stopped) while it was away
            rollout = self._mode_screen("rollout")
            if isinstance(rollout, RolloutScreen) and rollout.is_mounted and rollout.shows(link):
                rollout.action_reload()
        else:
            if self.links.several:
                self._show_links()
                if was:
                    self.post_message(RunsChanged())  # its runs greyed
            else:
                self.status = message.error
                self.status_level = "error"
            if was or message.gave_up:
                # The status line holds one line at 80 columns: the whole sentence goes in a toast.
                self.notify(
                    message.error,
                    title=f"Server {link.name} connection lost"
                    if self.links.several
                    else "Server connection lost",
                    severity="error",
                    timeout=30 if message.gave_up else 8,
                )

    # -- errors: the one place ----------------------------------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.report_worker_failure(event)

    def report_worker_failure(self, event: Worker.StateChanged) -> None:
        """Every worker's failure ends here: a notification and the status line, never a traceback.

        Screens forward their workers' state changes (the message does not bubble), so a failed
        action started on any screen is reported here too."""
        error = event.worker.error
        if event.state != WorkerState.ERROR or error is None:
            return
        what = event.worker.group or event.worker.name
        if isinstance(error, ApiError):
            log.warning("%s failed: %s", what, error.message)
        else:
            log.error("%s failed", what, exc_info=error)
        text = describe_error(error)
        self.status = text
        self.status_level = "error"
        self.notify(text, title=f"{what} failed", severity="error", timeout=8)

    # -- actions ---------------------------------------------------------------------------------
    def open_rollout(self, session_id: str, link: ServerLink | None = None) -> None:
        """Show a session of `link`'s (default: the first server's) on the Rollout screen."""
        self.run_worker(
            self._switch_and_show(session_id, link or self.links.first),
            group="open-rollout",
            exclusive=True,
            exit_on_error=False,
        )

    async def _switch_and_show(self, session_id: str, link: ServerLink) -> None:
        await self.switch_mode("rollout")
        screen = self.screens_by_mode["rollout"]
        if isinstance(screen, RolloutScreen):  # the registry's Rollout entry: always
            screen.show_session(session_id, link)

    def action_help(self) -> None:
        """Help for the focused widget, then the whole help."""
        if isinstance(self.screen, HelpScreen):
            return
        focused = self.focused
        parts = [getattr(self.screen, "HELP", ""), getattr(focused, "HELP", "") if focused else ""]
        if self.links.several:
            parts.insert(0, SEVERAL_HELP)
        self.push_screen(HelpScreen("\n".join(p for p in dict.fromkeys(parts) if p), *help_tables(self)))

    def nav_entries(self) -> list[tuple[str, str, str]]:
        """(key now bound, mode, title) of every screen, for the nav bar."""
        return [(key_of(self, e.binding_id), e.mode, e.title) for e in SCREENS]

    def action_next_theme(self) -> None:
        """Cycle through tapdeck's themes."""
        names = list(THEMES)
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]

    async def action_quit(self) -> None:
        """Quit; with this process's server running a batch, only on a second `q` (its runs stop
        and show as interrupted, resumable from Runs)."""
        now = self.clock()
        if not self.owns_server or self._quit.armed and self._quit.press("quit", now):
            self.exit()
            return
        try:
            runs = await asyncio.wait_for(self.client.runs(), QUIT_CHECK_S)
        except (ApiError, OSError, TimeoutError):
            runs = []
        going = [r for r in runs if r.state == "running"]
        if not going:
            self.exit()
            return
        self._quit.press("quit", now)
        left = sum(r.counts.total - r.counts.done for r in going)
        self.notify(
            f"{left} rollout(s) of {len(going)} run(s) still going: quitting stops them "
            f"(resume them from Runs with {key_of(self, 'runs.resume', self.screens_by_mode['runs'])}). "
            f"Press {key_of(self, 'app.quit')} again within {CONFIRM_S:g} s to quit.",
            title="Runs are going",
            severity="warning",
            timeout=CONFIRM_S,
        )

    def action_resync(self) -> None:
        self.resync()

    async def action_start_batch(self) -> None:
        await self.switch_mode("setup")
        screen = self._mode_screen("setup")
        if isinstance(screen, SetupScreen) and screen.catalog is not None:
            screen.action_start()

    async def action_export_run(self, fmt: str) -> None:
        await self.switch_mode("runs")
        screen = self._mode_screen("runs")
        if isinstance(screen, RunsScreen):
            screen.action_export(fmt)
