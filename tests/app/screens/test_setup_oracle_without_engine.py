"""Setup starts an oracle batch when the server's default engine is down: the oracle (Harbor's
reference solution) calls no model, so the engine's state is no reason to refuse it. Driven against
a real LocalServer whose engine stopped answering after the server started."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from textual.widgets import Select, SelectionList

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tests.support.fake_vllm import models_only_engine
from tests.support.pilot_wait import until

pytestmark = pytest.mark.slow  # a real Harbor trial of the oracle


async def test_setup_starts_an_oracle_batch_while_the_default_engine_is_down(tmp_path: Path) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.config import ServerConfig

    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(contextlib.ExitStack())
        url = engine.enter_context(models_only_engine())
        server = LocalServer(ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=url)).start()
        stack.callback(server.stop)
        engine.close()  # the default engine goes down once the server runs

        app = TapdeckApp(
            TapdeckClient(server.url, server.admin_key),
            settings_path=tmp_path / "tui.json",
            initial_mode="setup",
        )
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            why_engine = screen.query_one("#why-engine")
            await until(pilot, lambda: "unreachable" in str(why_engine.render()), "the engine down")
            screen.query_one("#harness", Select).value = "oracle"
            screen.query_one("#tasks", SelectionList).select("hello-file")
            assert screen.plan().rollout.harness == "oracle"  # refused before: "engine … unreachable"
            await until(
                pilot,
                lambda: str(why_engine.render()) == "not used: oracle calls no model",
                "the engine said unused",
            )
            await pilot.press("ctrl+s")
            await until(pilot, lambda: app.current_mode == "sessions", "the batch started")
            [run] = await app.client.runs()
            for _ in range(3000):  # a bound on a loaded machine, not a speed check
                if run.state != "running":
                    break
                await pilot.pause(0.2)
                run = await app.client.run(run.id)
            assert (run.state, run.counts.ok, run.engine_used) == ("finished", 1, "none")
