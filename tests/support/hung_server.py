"""A real server whose engine never answers a model call, with the TUI on it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapdeck.app.client import TapdeckClient


@dataclass
class HungServer:
    """A real LocalServer whose engine probes fine and never answers a model call (`engine.held`:
    the calls it holds now), so a rollout stays in its first model call until it is cancelled."""

    engine: Any
    server: Any
    settings_path: Path

    @contextlib.asynccontextmanager
    async def one_rollout_run(self, mode: str) -> AsyncIterator[tuple[Any, Any, Any]]:
        """The TUI on this server at 80×24, opening on `mode`, with a run of one terminus-2 rollout
        of hello-file started: yields (app, pilot, the run's summary)."""
        from tapdeck.app.tui import TapdeckApp
        from tapdeck.schema.runs import RunPlan

        app = TapdeckApp(
            TapdeckClient(self.server.url, self.server.admin_key),
            settings_path=self.settings_path,
            initial_mode=mode,
        )
        async with app.run_test(size=(80, 24)) as pilot:
            run = await app.client.start_run(RunPlan(tasks=["hello-file"], k=1, timeout_s=600))
            yield app, pilot, run
