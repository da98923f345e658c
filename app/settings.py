"""The TUI's small remembered settings (theme, key map, rollout settings per harness, each table's
filter and sort) in one JSON
file. Free of Textual.

Embedded mode keeps it in the data dir (`<data_dir>/tui.json`); attached mode in
`~/.config/tapdeck/tui.json`. A missing or broken file means defaults, never an error.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tapdeck.proxy.store.atomic_write import atomic_write

log = logging.getLogger("tapdeck.settings")


def default_settings_path(data_dir: Path | None = None) -> Path:
    """Where settings live: the data dir when there is one, else `$XDG_CONFIG_HOME/tapdeck`."""
    if data_dir is not None:
        return data_dir / "tui.json"
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "tapdeck" / "tui.json"


@dataclass
class Settings:
    """`theme`: a theme name; `keymap`: binding id → keys (e.g. `{"app.help": "f2"}`);
    `rollout`: harness → the rollout settings Setup last started it with (`RolloutSettings` fields
    that were set); `views`: screen → its filter and sort (`RowView.to_json`)."""

    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)
    rollout: dict[str, dict[str, Any]] = field(default_factory=dict)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None) -> Settings:
        if path is None or not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(raw, dict):
            return cls()
        keymap, rollout, views = raw.get("keymap"), raw.get("rollout"), raw.get("views")
        if not isinstance(keymap, dict):
            keymap = {}
        if not isinstance(rollout, dict):
            rollout = {}
        if not isinstance(views, dict):
            views = {}
        theme = raw.get("theme") if isinstance(raw.get("theme"), str) else None
        return cls(
            theme=theme,
            keymap={str(k): str(v) for k, v in keymap.items()},
            rollout={str(h): v for h, v in rollout.items() if isinstance(v, dict)},
            views={str(m): v for m, v in views.items() if isinstance(v, dict)},
        )

    def save(self, path: Path | None) -> None:
        """Write atomically; a location that cannot be written (read-only, a symbolic link in the
        file's place) is skipped with a warning in the log (settings are a convenience)."""
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path) as f:  # two TUIs saving at once: one whole file either way
                f.write(json.dumps(asdict(self), indent=2).encode())
        except OSError as exc:
            log.warning("the TUI's settings were not saved: %s", exc)
