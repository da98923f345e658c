"""The one list of tapdeck's screens: the App's number keys, the nav bar, the command palette and
the help's tables are all generated from it, and help shows the keys bound now (after the keymap).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from textual.app import App
from textual.binding import Binding, BindingsMap
from textual.dom import DOMNode

from tapdeck.app.screens.base import TapdeckScreen
from tapdeck.app.screens.drift import RunDriftScreen
from tapdeck.app.screens.help import HelpScreen
from tapdeck.app.screens.info import InfoScreen
from tapdeck.app.screens.rollout import RolloutScreen
from tapdeck.app.screens.runs import RunsScreen
from tapdeck.app.screens.sandbox import SandboxScreen
from tapdeck.app.screens.sessions import SessionsScreen
from tapdeck.app.screens.setup import SetupScreen
from tapdeck.app.screens.train import TrainScreen


@dataclass(frozen=True)
class ScreenEntry:
    """One screen: its default key, mode name, title, what it is for, and its class."""

    key: str
    mode: str
    title: str
    what: str
    screen: type[TapdeckScreen]

    @property
    def binding_id(self) -> str:
        """The id of the binding that switches to it (a keymap rebinds it by this id)."""
        return f"app.{self.mode}"


SCREENS: tuple[ScreenEntry, ...] = (
    ScreenEntry(
        "1",
        "setup",
        "Setup",
        "pick dataset, tasks, harness, sandbox, engine, K, concurrency and alternatives; start a batch",
        SetupScreen,
    ),
    ScreenEntry(
        "2",
        "sessions",
        "Sessions",
        "live capture sessions; Enter opens one, d shows what the "
        "highlighted rollout is doing (the call in flight, its phases), x cancels it",
        SessionsScreen,
    ),
    ScreenEntry(
        "3",
        "rollout",
        "Rollout",
        "the rollout graph (a chain listed flat, forks nested), each "
        "turn's messages and tokens coloured by logprob, or by drift after a replay",
        RolloutScreen,
    ),
    ScreenEntry(
        "4",
        "runs",
        "Runs",
        "batches: per-task groups, rewards, pass rates, failures; export; drift",
        RunsScreen,
    ),
    ScreenEntry("5", "info", "Info", "what this machine can run, engine tier, the server", InfoScreen),
    ScreenEntry(
        "6",
        "train",
        "Train",
        "launch a recipe on the server's machine, follow its log and "
        "reward/loss/KL/tokens-per-second plots, stop it",
        TrainScreen,
    ),
)


def screen_bindings() -> list[Binding]:
    """The App's bindings that switch screens (one per entry, each with its id)."""
    return [Binding(e.key, f"switch_mode('{e.mode}')", e.title, show=False, id=e.binding_id) for e in SCREENS]


def live_keys(app: App, node: DOMNode | type[DOMNode], prefix: str) -> list[tuple[Binding, list[str]]]:
    """tapdeck's bindings of `node` (an instance or a class; ids starting with `prefix`), each with
    the keys that trigger it now."""
    bindings = node._bindings.copy() if isinstance(node, DOMNode) else BindingsMap(node.BINDINGS)
    # The App's keymap, applied as Textual applies it when it builds a screen's binding chain.
    bindings.apply_keymap(app._keymap)
    keys: dict[str, tuple[Binding, list[str]]] = {}
    for key, found in bindings.key_to_bindings.items():
        for binding in found:
            if binding.id and binding.id.startswith(prefix):
                bound = keys.setdefault(binding.id, (binding, []))[1]
                if key not in bound:  # a keymap entry for a two-key binding lists its key twice
                    bound.append(key)
    return list(keys.values())


def unknown_keymap_ids(app: App, keymap: Iterable[str]) -> list[str]:
    """The ids of `keymap` that name no binding of the App, its screens or help (a typo would
    otherwise be ignored without a word)."""
    known = {b.id for found in app._bindings.key_to_bindings.values() for b in found}
    classes: list[type[DOMNode]] = [*(e.screen for e in SCREENS), HelpScreen, RunDriftScreen, SandboxScreen]
    for cls in classes:
        known |= {b.id for found in BindingsMap(cls.BINDINGS).key_to_bindings.values() for b in found}
    return sorted(set(keymap) - known)


def _shown(app: App, key: str) -> str:
    return app.get_key_display(Binding(key, ""))


def key_of(app: App, binding_id: str, node: DOMNode | type[DOMNode] | None = None) -> str:
    """The key (as shown) that triggers a binding of `node` (default: the App; a class: its
    bindings as the keymap sets them) now, e.g. a screen's number."""
    for binding, keys in live_keys(app, node or app, binding_id):
        if binding.id == binding_id:
            return _shown(app, keys[0])
    return "?"


def keys_line(app: App, pairs: Iterable[tuple[Binding, list[str]]]) -> str:
    """`` `key` what · `key` what`` for a set of bindings."""
    return " · ".join(
        f"`{' / '.join(_shown(app, k) for k in keys)}` {binding.description or binding.action}"
        for binding, keys in pairs
    )


def help_tables(app: App) -> tuple[str, str]:
    """The help's screens table and keys list, from the registry and the live bindings."""
    rows = ["| key | screen | what |", "|---|---|---|"]
    rows += [f"| {key_of(app, e.binding_id)} | {e.title} | {e.what} |" for e in SCREENS]
    screen_ids = {e.binding_id for e in SCREENS}
    general = [(b, k) for b, k in live_keys(app, app, "app.") if b.id not in screen_ids]
    keys = [f"- {keys_line(app, general)}"]
    for entry in SCREENS:
        screen = getattr(app, "screens_by_mode", {}).get(entry.mode) or entry.screen
        pairs = live_keys(app, screen, f"{entry.mode}.")
        if pairs:
            keys.append(f"- {entry.title}: {keys_line(app, pairs)}")
    return "\n".join(rows), "\n".join(keys)
