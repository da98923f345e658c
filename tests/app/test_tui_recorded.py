"""Pilot tests of the App over recorded API bodies (deterministic; the live server tests are separate)."""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import httpx
import pytest
from rich.color import Color
from rich.text import Text
from textual.command import CommandList, CommandPalette
from textual.selection import Selection
from textual.widgets import Collapsible, DataTable, Input, Select, SelectionList, Sparkline, Static

from tapdeck.app.client import TapdeckClient
from tapdeck.app.messages import RunsChanged
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tapdeck.schema.events import parse_event
from tests.support.pilot_wait import click_until, until
from tests.support.recorded_api import recorded_transport


def _event(kind: str, session: dict):
    return parse_event({"type": kind, "session": session})


def _app_choosing_its_first_screen(api_data: dict) -> TapdeckApp:
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, server_label="http://tapdeck.test", follow_events=False)


async def test_tui_opens_on_setup_when_the_server_has_no_sessions_yet(api_data):
    api_data["sessions"] = []
    app = _app_choosing_its_first_screen(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.current_mode == "setup"
        await until(pilot, lambda: app.screen.catalog is not None, "the catalog")


async def test_tui_opens_on_sessions_when_the_server_has_sessions(api_data):
    app = _app_choosing_its_first_screen(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.current_mode == "sessions"
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == len(api_data["sessions"]), "the recorded sessions")


async def test_sessions_table_shows_states_and_updates_only_changed_cells(make_app, api_data):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        states = {row.value: str(table.get_cell(row, "state")) for row in table.rows}
        # Which of the batch's sessions was cancelled depends on the order its two trials started.
        cancelled = next(
            r["session_id"]
            for run in api_data["run_details"].values()
            for r in run["rollouts"]
            if r["error_kind"] == "cancelled"
        )
        batch = {f"sess000{i}recorded": "finished" for i in range(2, 6)}
        assert states == {
            "sess0000recorded": "running",
            "sess0001recorded": "finished",
            **batch,
            cancelled: "cancelled",
            "sess0006recorded": "no call yet",
            "sess0007recorded": "running",
        }
        idle = next(s for s in api_data["sessions"] if s["id"] == "sess0000recorded")[
            "seconds_since_last_call"
        ]
        assert str(table.get_cell("sess0000recorded", "idle")) == str(int(idle))  # the clock is frozen
        assert str(table.get_cell("sess0002recorded", "idle")) == "–"  # closed: not idle
        running = next(s for s in api_data["sessions"] if s["id"] == "sess0000recorded")
        app.take_event(_event("session_updated", dict(running, turns=4)))
        touched = table.apply(app.board.rows(app.clock()))
        assert touched == 1  # one cell (turns) changed: no rebuild
        assert str(table.get_cell("sess0000recorded", "turns")) == "4"


@pytest.mark.medium
async def test_many_sessions_refresh_by_diff_without_rebuilding(make_app, api_data):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        template = api_data["sessions"][0]
        for i in range(300):
            app.take_event(_event("session_opened", dict(template, id=f"bulk{i:05d}", created_at=2e9 + i)))
        await until(pilot, lambda: table.row_count == 308, "300 more sessions")
        for i in range(0, 300, 3):
            app.take_event(
                _event("session_updated", dict(template, id=f"bulk{i:05d}", turns=9, created_at=2e9 + i))
            )
        assert table.apply(app.board.rows(app.clock())) == 100


@pytest.mark.medium
async def test_open_rollout_and_click_a_token_shows_its_logprob(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("enter")  # first row: sess0000recorded
        await until(
            pilot,
            lambda: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
            "turn 0 on Rollout",
        )
        tree = app.screen.query_one("#graph")
        labels = [str(node.label) for node in tree.root.children]
        assert labels[0].startswith("#0 !warn length") and labels[1].startswith("#1 !warn length discarded")
        assert str(tree.root.children[0].children[0].label).startswith("#2 !warn length")
        view = app.screen.query_one(TokenView)
        assert view.turn is not None and view.turn.seq == 0
        await click_until(
            pilot,
            TokenView,
            (2, 0),
            lambda: view.selected == 1,  # " SET" (token 1)
            "the clicked token picked",
        )
        detail = str(app.screen.query_one("#token-detail").render())
        picked = f"token 1: {view.turn.token_texts[1]!r}"
        assert f"logprob {view.turn.logprobs[1]:.3f}" in detail and picked in detail
        await pilot.press("full_stop")
        assert view.selected == 2
        tree.focus()  # where focus sits after opening a rollout: stepping must still work
        await pilot.press("comma")
        assert view.selected == 1
        # A refresh showing the same turn keeps the picked token and its detail; another turn clears it.
        app.screen.show_turn(view.turn.model_copy())
        assert view.selected == 1 and picked in str(app.screen.query_one("#token-detail").render())
        app.screen.show_turn(view.turn.model_copy(update={"seq": 2}))
        assert view.selected is None
        app.screen.show_turn(view.turn.model_copy(update={"seq": 0}))
        await pilot.press("m")
        await pilot.pause(0.1)
        assert "Create /app/hello.txt containing Hello." in str(
            app.screen.query_one("#messages-text").render()
        )
        # The picked token's line is the Tokens tab's: not shown under Messages, back with Tokens.
        detail = app.screen.query_one("#token-detail")
        await until(pilot, lambda: not detail.display, "the token line hidden under Messages")
        await pilot.press("t")
        await until(pilot, lambda: detail.display, "the token line back under Tokens")


async def _catalog_loaded(pilot) -> None:
    await until(
        pilot,
        lambda: (
            pilot.app.screen.catalog is not None
            and pilot.app.screen.query_one("#tasks", SelectionList).option_count > 0
        ),
        "the catalog",
    )


@pytest.mark.medium
async def test_setup_refuses_an_unavailable_sandbox_with_the_reason(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        screen.query_one("#sandbox").value = "docker"
        await until(
            pilot,
            lambda: "Docker daemon is not running" in str(screen.query_one("#why-sandbox").render()),
            "docker's reason",
        )
        screen.action_start()
        await pilot.pause(0.1)
        notes = [n.message for n in app._notifications]
        assert any("Docker daemon is not running" in n for n in notes)


@pytest.mark.medium
async def test_ticked_tasks_survive_a_catalog_reload(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        tasks = app.screen.query_one("#tasks", SelectionList)
        names = [option.value for option in tasks.options]
        assert len(names) > 1
        tasks.select(names[1])
        before = app.screen.catalog
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.screen.catalog is not before, "the reloaded catalog")
        await pilot.pause(0.3)  # the dataset change events it caused
        assert [option.value for option in tasks.options] == names
        assert tasks.selected == [names[1]]


@pytest.mark.medium
async def test_setup_plan_captures_five_alternatives_unless_told_otherwise(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        assert screen.plan().rollout.alternatives == 5
        screen.query_one("#alternatives", Input).value = "21"
        with pytest.raises(ValueError, match="alternatives must be a whole number from 0 to 20"):
            screen.plan()
        screen.query_one("#alternatives", Input).value = "0"
        assert screen.plan().rollout.alternatives == 0
        # K and concurrency have the plan's own bounds, said in one line (not pydantic's dump).
        screen.query_one("#k", Input).value = "1025"
        with pytest.raises(ValueError, match="^K must be a whole number from 1 to 1024$"):
            screen.plan()


async def test_setup_plan_carries_the_public_url_sandboxes_use(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        assert screen.plan().rollout.public_url is None
        screen.query_one("#public-url", Input).value = "gpu-box:18300"
        with pytest.raises(ValueError, match="public URL 'gpu-box:18300' must be http"):
            screen.plan()
        screen.query_one("#public-url", Input).value = "http://gpu-box:18300/"
        assert screen.plan().rollout.public_url == "http://gpu-box:18300"


def _app_on_a_dead_server(mode: str) -> TapdeckApp:
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return TapdeckApp(TapdeckClient(f"http://127.0.0.1:{port}", "k"), follow_events=False, initial_mode=mode)


async def test_server_gone_becomes_a_notification_and_status_line_not_a_traceback():
    app = _app_on_a_dead_server("info")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: (
                "not reachable" in app.status
                and any("is it running?" in n.message for n in app._notifications)
            ),
            "the failed load on the status line and as a notification",
        )
        assert "not reachable" in app.status and app.status_level == "error"
        assert any("is it running?" in n.message for n in app._notifications)
        assert app.is_running


async def test_an_unreachable_server_is_one_plain_sentence_without_transport_details():
    app = _app_on_a_dead_server("info")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app._notifications, "the failed load as a notification")
        sentence = "the tapdeck server is not reachable; is it running?"
        assert {n.message for n in app._notifications} == {sentence}  # no URL, no httpx text
        assert app.status == sentence


async def test_setup_without_a_catalog_says_so_and_how_to_retry():
    app = _app_on_a_dead_server("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        dataset = app.screen.query_one("#dataset", Select)
        label = dataset.query_one("SelectCurrent #label")
        await until(
            pilot,
            lambda: (
                "catalog not loaded" in str(label.render())
                and any("is it running?" in n.message for n in app._notifications)
            ),
            "the failed catalog load in the picker and as a notification",
        )
        assert dataset.prompt == "catalog not loaded: ctrl+r retries"
        assert "catalog not loaded" in str(dataset.query_one("SelectCurrent #label").render())
        assert any("is it running?" in n.message for n in app._notifications)


@pytest.mark.medium
async def test_theme_switch_is_remembered(make_app, tmp_path):
    settings = tmp_path / "tui.json"
    app = make_app("sessions", settings_path=settings)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.theme == "tapdeck-dark"
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        assert app.theme == "tapdeck-light"
    assert json.loads(settings.read_text())["theme"] == "tapdeck-light"
    again = make_app("sessions", settings_path=settings)
    async with again.run_test(size=(80, 24)):
        assert again.theme == "tapdeck-light"


async def test_keymap_from_settings_rebinds_by_binding_id(make_app, tmp_path):
    settings = tmp_path / "tui.json"
    settings.write_text(json.dumps({"keymap": {"app.help": "f2"}}))
    app = make_app("sessions", settings_path=settings)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "HelpScreen"


async def test_a_keymap_id_no_binding_has_is_named_not_ignored_silently(make_app, tmp_path):
    settings = tmp_path / "tui.json"
    settings.write_text(json.dumps({"keymap": {"bogus.id": "y", "sessions.details": "i"}}))
    app = make_app("sessions", settings_path=settings)
    async with app.run_test(size=(80, 24)) as pilot:
        said = f"keymap in {settings}: no binding has the id bogus.id (ignored); F1 lists the keys bound now"
        await until(
            pilot,
            lambda: [n.message for n in app._notifications if "keymap" in n.message] == [said],
            "the one warning, naming only the unknown id",
        )


@pytest.mark.medium
async def test_help_opens_with_f1_and_question_mark_and_closes_with_escape(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        for key in ("f1", "question_mark"):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert type(app.screen).__name__ == "HelpScreen"
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert type(app.screen).__name__ == "SessionsScreen"


@pytest.mark.medium
async def test_command_palette_offers_tapdeck_actions(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        await pilot.press(*"go to runs")
        await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0, "a match")
        await pilot.press("enter")
        await until(pilot, lambda: app.current_mode == "runs", "the Runs screen")


@pytest.mark.medium
async def test_number_keys_switch_screens_and_resize_does_not_crash(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        for key, mode in (("1", "setup"), ("3", "rollout"), ("4", "runs"), ("5", "info"), ("2", "sessions")):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert app.current_mode == mode
            await pilot.resize_terminal(40, 12)
            await pilot.pause(0.1)
            await pilot.resize_terminal(160, 48)
            await pilot.pause(0.1)
        assert app.is_running


async def test_runs_screen_shows_groups_and_failures_by_cause(make_app):
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        groups = app.screen.query_one("#groups-table", DataTable)
        await until(pilot, lambda: groups.row_count == 2, "the newest run's groups (terminus-2)")
        assert "cancelled 1" in str(app.screen.query_one("#failures").render())
        assert str(groups.get_row("hello-file")[4]) == "0%"
        assert str(groups.get_row("hello-file")[5]) == "█    "  # both rewards 0.0: the bottom bin
        assert "rewards █" + " " * 9 + " 0–1 · 3 graded" in str(app.screen.query_one("#failures").render())


async def test_runs_counts_cancelled_rollouts_apart_from_failed_ones(make_app, api_data):
    cancelled = next(
        r for r in api_data["run_details"]["run-0001"]["rollouts"] if r["error_kind"] == "cancelled"
    )
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        rollouts = screen.query_one("#rollouts-table", DataTable)
        await until(pilot, lambda: cancelled["rollout_id"] in rollouts.rows, "the run's rollouts")
        runs = screen.query_one("#runs-table", DataTable)
        # The server counts the cancelled rollout among the failed (not ok); a cancel is no failure.
        assert (str(runs.get_cell("run-0001", "failed")), str(runs.get_cell("run-0001", "cancelled"))) == (
            "0",
            "1",
        )
        assert str(screen.query_one("#failures").render()).endswith("failures: none · cancelled 1")
        assert str(rollouts.get_cell(cancelled["rollout_id"], "phase")) == "cancelled"


def _set(screen, **values: str) -> None:
    for name, value in values.items():
        screen.query_one(f"#set-{name}", Input).value = value


@pytest.mark.medium
async def test_setup_rollout_settings_are_sent_and_remembered_per_harness(make_app, tmp_path):
    path = tmp_path / "tui.json"
    app = make_app("setup", settings_path=path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        template = screen.plan().rollout
        assert template.settings.model_dump(exclude_unset=True) == {} and template.timeout_s is None
        _set(
            screen,
            max_turns="5",
            agent_timeout_s="60",
            timeout_s="400",
            harness_kwargs='{"parser_name": "xml"}',
        )
        template = screen.plan().rollout
        assert template.settings.model_dump(exclude_unset=True) == {
            "max_turns": 5,
            "agent_timeout_s": 60.0,
            "harness_kwargs": {"parser_name": "xml"},
        }
        assert template.timeout_s == 400.0
        screen.action_start()
        await until(pilot, lambda: path.is_file(), "the settings file")
        assert json.loads(path.read_text())["rollout"]["terminus-2"]["max_turns"] == 5

        screen.query_one("#harness", Select).value = "oracle"
        await until(
            pilot, lambda: screen.query_one("#set-max_turns", Input).value == "", "oracle's (unset) settings"
        )
        screen.query_one("#harness", Select).value = "terminus-2"
        await until(
            pilot,
            lambda: screen.query_one("#set-max_turns", Input).value == "5",
            "terminus-2's remembered settings",
        )

    again = make_app("setup", settings_path=path)
    async with again.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        assert again.screen.query_one("#set-timeout_s", Input).value == "400.0"
        assert again.screen.plan().rollout.settings.harness_kwargs == {"parser_name": "xml"}


@pytest.mark.medium
async def test_setup_settings_title_counts_what_is_typed_and_a_blank_pick_says_nothing_is_chosen(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        settings = screen.query_one("#rollout-settings", Collapsible)
        assert settings.title == "Rollout settings (defaults)"
        screen.query_one("#set-max_turns", Input).value = "1"
        await until(
            pilot,
            lambda: settings.title == "Rollout settings (1 set for terminus-2)",
            "the title counting the typed setting",
        )
        screen.query_one("#set-max_turns", Input).value = ""
        await until(pilot, lambda: settings.title == "Rollout settings (defaults)", "defaults again")
        # A loaded catalog with nothing picked is the user's choice, not a catalog that is missing.
        screen.query_one("#harness", Select).clear()
        await until(
            pilot,
            lambda: str(screen.query_one("#why-harness").render()) == "nothing chosen: pick one",
            "the blank pick's hint",
        )


@pytest.mark.medium
async def test_setup_refuses_a_bad_setting_naming_the_field(make_app):
    cases = [
        ({"max_turns": "0"}, "max_turns: Input should be greater than or equal to 1"),
        ({"top_p": "2"}, "top_p: Input should be less than or equal to 1"),
        ({"harness_kwargs": "{"}, "harness_kwargs (kwargs): '{' is not JSON"),
        ({"timeout_s": "-3"}, "timeout_s (Hard s): must be greater than 0"),
    ]
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        for values, message in cases:
            _set(app.screen, **values)
            with pytest.raises(ValueError, match=re.escape(message)):
                app.screen.plan()
            _set(app.screen, **dict.fromkeys(values, ""))
        assert app.screen.plan().rollout.settings.model_dump(exclude_unset=True) == {}


@pytest.mark.medium
async def test_setup_settings_show_the_engines_defaults_and_keep_tab_order_short(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        defaults = screen.query_one("#settings-defaults")
        assert "terminus-2 on embedded: context 32768, output 128" in str(defaults.render())
        # Per harness on the embedded engine: codex's lean tools, its output limit and the agent
        # timeout its first prompt needs, in the line and in the inputs' placeholders.
        codex = next(h for h in app.screen.catalog.harness_defaults if h.harness == "codex")
        screen.query_one("#harness", Select).value = "codex"
        await until(pilot, lambda: "codex on embedded" in str(defaults.render()), "codex's defaults")
        assert f"tools lean, output {codex.output_tokens}, agent ≥ {codex.agent_timeout_s:g} s" in str(
            defaults.render()
        )
        assert screen.query_one("#set-max_output_tokens", Input).placeholder == str(codex.output_tokens)
        assert screen.query_one("#set-agent_timeout_s", Input).placeholder == f"≥ {codex.agent_timeout_s:g}"
        assert screen.query_one("#set-timeout_s", Input).placeholder == f"{codex.agent_timeout_s + 120:g}"
        # Collapsed, after the task list: Tab from the Start button still lands on the tasks.
        screen.set_focus(screen.query_one("#start"))
        await pilot.press("tab")
        assert app.focused is screen.query_one("#tasks")


async def test_setup_starts_each_harness_on_the_same_defaults_as_the_cli(make_app):
    """Setup's `ctrl+s` with any harness picked and nothing typed posts what `tapdeck rollout
    --harness NAME` posts: the harness and no setting of its own, so the server resolves the same
    per-harness defaults for both (tests/runner/test_rollout_settings.py checks that resolution)."""
    from tapdeck.schema.runs import RolloutSettings, RolloutTemplate

    # What Setup's selects name, as the CLI's flags do; and the top alternatives kept for the token
    # view (Setup's field starts at 5): capture-only, asked of the engine beside the agent's own ask.
    picked = {"harness", "sandbox", "engine", "alternatives"}

    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        harnesses = [h.harness for h in screen.catalog.harness_defaults]
        assert {"terminus-2", "codex", "claude-code", "gemini-cli", "opencode", "qwen-code"} <= set(harnesses)
        for name in harnesses:
            screen.query_one("#harness", Select).value = name
            await until(pilot, lambda name=name: screen.plan().rollout.harness == name, f"{name} picked")
            template = screen.plan().rollout
            assert template.settings == RolloutSettings(), (name, template.settings)
            assert (template.timeout_s, template.call_budget) == (None, None), name
            # Every other field as a plan with no flag given leaves it.
            assert template.model_dump(exclude=picked) == RolloutTemplate().model_dump(exclude=picked), name


async def test_runs_screen_states_each_rollouts_timeouts_and_their_sources(make_app):
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        line = app.screen.query_one("#run-settings")
        await until(pilot, lambda: "ran with" in str(line.render()), "the rollout's settings")
        assert "agent 180 s (task) · hard limit 300 s (default)" in str(line.render())


@pytest.mark.medium
async def test_runs_screen_says_an_oracle_run_made_no_model_calls_as_the_cli_does(make_app, api_data):
    """An oracle run's rollouts resolved a context, output and turn limit that no model call was
    ever held to: the Runs screen shows their timeouts and `(no model calls)`, as `tapdeck runs`."""
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        line = app.screen.query_one("#run-settings")
        await until(pilot, lambda: "ran with" in str(line.render()), "the terminus-2 run's settings")
        app.screen.query_one("#runs-table", DataTable).move_cursor(row=1)  # run-0000: oracle
        header = app.screen.query_one("#run-header")
        await until(pilot, lambda: "run-0000 · sample · oracle" in str(header.render()), "the oracle run")
        assert str(line.render()).endswith(
            " ran with: agent 180 s (task) · hard limit 300 s (default) (no model calls)"
        )


async def test_sessions_board_charts_every_sessions_calls_per_second(api_data):
    """Each `turn_captured` event, whatever its session, counts in the board's calls/s line: the
    last two minutes in 3 s buckets on the TUI's clock."""
    now = [1000.0]
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(
        client,
        server_label="http://tapdeck.test",
        follow_events=False,
        clock=lambda: now[0],
        initial_mode="sessions",
    )
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == len(api_data["sessions"]), "the recorded sessions")
        rate = app.screen.query_one("#board-rate", Sparkline)
        assert rate.data == [0.0] * 40  # nothing captured since the TUI connected

        def captured(session_id: str) -> None:
            session = next(s for s in api_data["sessions"] if s["id"] == session_id)
            header = api_data["graphs"][session_id]["turns"][0]
            app.take_event(parse_event({"type": "turn_captured", "session": session, "turn": header}))

        for sid in ("sess0000recorded", "sess0000recorded", "sess0007recorded"):
            captured(sid)
        now[0] = 1030.0
        captured("sess0001recorded")
        now[0] = 1031.0
        await until(pilot, lambda: rate.data[-1] > 0, "the newest bucket")
        assert (
            rate.data[29] == 1.0
            and rate.data[-1] == pytest.approx(1 / 3)
            and sum(rate.data) == pytest.approx(4 / 3)
        )
        assert "now 0.3 · peak 1.0" in str(app.screen.query_one("#board-rate-span").render())


async def test_sessions_table_keeps_its_highlighted_session_across_a_resize_and_a_theme_change(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("down", "down", "down")
        chosen = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        narrow = len(table.columns)
        await pilot.resize_terminal(140, 30)  # past WIDE_AT: the table is rebuilt with more columns
        await until(pilot, lambda: len(table.columns) > narrow, "the wide columns")
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == chosen
        state = table.get_cell(chosen, "state")
        assert isinstance(state, Text)  # a toned cell, drawn in the theme's colour
        app.theme = next(name for name in app.available_themes if name != app.theme)
        # A theme change re-renders every cell (its tones take the new theme's colours).
        await until(pilot, lambda: table.get_cell(chosen, "state") is not state, "the cells re-rendered")
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == chosen
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: len(table.columns) == narrow, "the narrow columns")
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == chosen


async def test_info_draws_its_marks_again_in_a_new_themes_colours(make_app):
    def tick_colours(app) -> set:
        static = app.screen.query_one("#catalog-info")
        return {
            seg.style.color
            for y in range(static.size.height)
            for seg in static.render_line(y)
            if seg.text.strip() == "✓" and seg.style
        }

    app = make_app("info")
    async with app.run_test(size=(100, 40)) as pilot:
        await until(
            pilot, lambda: app.screen.catalog is not None and tick_colours(app), "the catalog's marks"
        )
        assert tick_colours(app) == {Color.parse(app.current_theme.success)}
        app.theme = next(
            name for name in app.available_themes if app.get_theme(name).success != app.current_theme.success
        )
        await until(
            pilot,
            lambda: tick_colours(app) == {Color.parse(app.current_theme.success)},
            "the marks in the new theme's colour",
        )


async def test_sessions_detail_indents_continuation_lines_of_a_multi_line_field(api_data):
    """The detail pane's labels stand alone in their column: a text's own line breaks and the lines
    it wraps into (at any width) start under its first line, never at a label's place."""
    long_line = (
        "FAILED tests/test_config.py::test_port - AssertionError: expected 8080, got 80 "
        "(the config file names the port twice)"
    )
    api_data["activity"]["sess0007recorded"]["last_observation"]["text"] = f"{long_line}\n1 failed"
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, server_label="http://tapdeck.test", follow_events=False, initial_mode="sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: app.screen.query_one(SessionTable).row_count == len(api_data["sessions"]),
            "the recorded sessions",
        )
        await pilot.press("ctrl+end", "d")
        text = app.screen.query_one("#activity-text")
        await until(pilot, lambda: "1 failed" in str(text.render()), "the observation in the pane")

        observation_rows = {}
        for width in (80, 110):  # (from 120 columns the pane sits beside a wider table)
            await pilot.resize_terminal(width, 24)
            await until(
                pilot, lambda width=width: text.size.width == width - 4, f"the pane at {width} columns"
            )
            rows = [text.render_line(y).text.rstrip() for y in range(text.size.height)]
            assert [row[:14].strip() for row in rows if row[:14].strip()] == [
                "rollout",
                "in flight",
                "calls",
                "assistant",
                "observation",
                "finding",
                "finding",
            ], rows
            start = next(i for i, row in enumerate(rows) if row.startswith("observation"))
            end = next(i for i in range(start + 1, len(rows)) if rows[i][:14].strip())
            observation = rows[start:end]
            observation_rows[width] = len(observation)
            assert len(observation) > 2, observation  # its long line wraps
            assert " ".join(row[14:].strip() for row in observation) == f"(tool) {long_line} 1 failed"
            selected, _ = text.get_selection(Selection(None, None))
            assert selected.splitlines() == rows  # copied as drawn
        assert observation_rows[80] > observation_rows[110]  # wrapped again at the new width


async def test_runs_table_shows_whole_run_ids_when_they_fit_and_their_distinct_ends_when_not(api_data):
    # Real run ids share their date prefix: only the end tells two runs of a day apart.
    ids = ["run-20261202-213112-ab12", "run-20261202-213112-cd34"]
    for run, new_id in zip(api_data["runs"], ids, strict=True):
        api_data["run_details"][new_id] = {**api_data["run_details"].pop(run["id"]), "id": new_id}
        run["id"] = new_id
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, initial_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#runs-table", DataTable)
        await until(pilot, lambda: table.row_count == 2, "the runs")
        assert sorted(str(table.get_cell(i, "run")) for i in ids) == ids
        await pilot.resize_terminal(60, 20)
        await until(pilot, lambda: str(table.get_cell(ids[0], "run")) != ids[0], "the narrower cut")
        cells = [str(table.get_cell(i, "run")) for i in ids]
        assert cells[0].endswith("ab12") and cells[1].endswith("cd34") and cells[0] != cells[1]


async def test_runs_turns_column_follows_captured_turns_live_like_sessions(make_app, api_data):
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one("#rollouts-table", DataTable)
        rollout = next(
            r
            for r in api_data["run_details"]["run-0001"]["rollouts"]
            if r["session_id"] == "sess0002recorded"
        )
        await until(pilot, lambda: rollout["rollout_id"] in table.rows, "the run's rollouts")
        assert str(table.get_cell(rollout["rollout_id"], "turns")) == str(rollout["turns"])
        session = next(s for s in api_data["sessions"] if s["id"] == "sess0002recorded")
        turn = {
            k: v
            for k, v in api_data["graphs"]["sess0002recorded"]["turns"][0].items()
            if k not in ("role", "token_in")
        }
        # A turn captured mid-rollout: the run's own result still says 2 until the rollout ends.
        app.take_event(
            parse_event({"type": "turn_captured", "turn": turn, "session": dict(session, turns=7)})
        )
        await until(
            pilot, lambda: str(table.get_cell(rollout["rollout_id"], "turns")) == "7", "the live turn count"
        )


async def test_a_turn_reaching_runs_while_its_tables_are_torn_down_is_ignored(make_app, api_data):
    # At exit Textual removes a screen's widgets while server events still arrive.
    app = make_app("runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.detail is not None, "the run's detail")
        await app.screen.query_one("#run-detail").remove()
        session = next(s for s in api_data["sessions"] if s["id"] == "sess0002recorded")
        turn = {
            k: v
            for k, v in api_data["graphs"]["sess0002recorded"]["turns"][0].items()
            if k not in ("role", "token_in")
        }
        app.take_event(
            parse_event({"type": "turn_captured", "turn": turn, "session": dict(session, turns=7)})
        )
        await pilot.pause()
        assert app.is_running and app.return_code is None


@pytest.mark.medium
async def test_train_run_picker_follows_new_runs_without_a_reload(api_data):
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, initial_mode="train")
    async with app.run_test(size=(80, 24)) as pilot:
        picker = app.screen.query_one("#train-run", Select)

        def offered() -> list[str]:
            return [value for _, value in picker._options if value is not Select.NULL]

        await until(pilot, lambda: len(offered()) == 2, "the recorded runs")
        api_data["runs"].append(dict(api_data["runs"][0], id="run-0002", created_at=9e9))
        app.post_message(RunsChanged())  # what a run_started event becomes
        await until(pilot, lambda: "run-0002" in offered(), "the new run on a run event")
        api_data["runs"].append(dict(api_data["runs"][0], id="run-0003", created_at=9e9 + 1))
        await pilot.press("2")
        await pilot.press("6")
        await until(pilot, lambda: "run-0003" in offered(), "the newer run on showing Train again")


async def test_train_plots_tokens_per_step_under_its_own_name_not_tokens_per_second(make_app):
    # The recorded data-check logs trained_tokens_per_step and no per-second rate.
    app = make_app("train")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.points, "the recorded metrics")
        while screen.panel != "tokens/s":
            await pilot.press("p")
        assert screen.shown_metrics() == []
        await pilot.press("p")
        assert screen.panel == "tokens/step"
        assert screen.shown_metrics() == ["train/batch/trained_tokens_per_step"]


def _screen_lines(app) -> list[str]:
    """What the terminal shows now, line by line."""
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


async def test_rollout_at_80x24_shows_its_whole_header_and_every_turns_badge(make_app, api_data):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("enter")
        await until(
            pilot,
            lambda: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
            "the rollout",
        )
        await until(pilot, lambda: "frag. " in " ".join(_screen_lines(app)[1:3]), "the drawn header")
        lines = _screen_lines(app)
        header = " ".join(lines[1:3])
        modes = [t["token_in"] for t in api_data["graphs"]["sess0000recorded"]["turns"]]
        assert f"token-in {modes.count('ids')}/{len(modes)}" in header
        assert "frag. " in header
        warned = [line for line in lines if "!warn" in line]
        assert len(warned) == 3  # every turn of this rollout has a warning


@pytest.mark.medium
@pytest.mark.parametrize("key", ["1", "2", "3", "4", "5", "6"])
async def test_every_screens_footer_keeps_reload_help_and_quit_at_80x24(make_app, key):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(key)

        def drawn() -> bool:
            footer = _screen_lines(app)[-1]
            return (
                "f1 Help" in footer
                and "q Quit" in footer
                and (key not in ("3", "4", "5", "6") or "r Reload" in footer)
            )

        await until(pilot, drawn, f"the footer of screen {key}")
        footer = _screen_lines(app)[-1]
        assert "f1 Help" in footer and "q Quit" in footer, footer
        if key in ("3", "4", "5", "6"):
            assert "r Reload" in footer, footer


async def test_train_log_lines_wrap_at_80_columns_instead_of_being_cut(make_app, api_data):
    last = api_data["train"]["logs"]["train-0000"]["lines"][-1]
    assert len(last) > 80  # the recorded data-check summary
    app = make_app("train")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(
            pilot,
            lambda: "finished (exit code 0)" in str(app.screen.query_one("#train-state").render()),
            "the last training run",
        )
        # Cut at 80 columns, the line's end never shows; wrapped, it does once the log is drawn.
        await until(
            pilot,
            lambda: last.split()[-1] in " ".join(_screen_lines(app)),
            "the end of the long log line",
            20,
        )


def test_train_y_ticks_are_evenly_spaced_even_for_a_flat_series():
    from tapdeck.app.widgets.metric_plot import even_ticks

    assert even_ticks([0.0, 0.0]) == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert even_ticks([2.0, 4.0]) == [2.0, 2.5, 3.0, 3.5, 4.0]


@pytest.mark.medium
async def test_setup_escape_leaves_a_text_field_so_screen_keys_work_again(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.catalog is not None, "the catalog")
        k = screen.query_one("#k", Input)
        screen.set_focus(k)
        await until(pilot, lambda: "esc Leave field" in _screen_lines(app)[-1], "the field's footer")
        assert "f1 Help" in _screen_lines(app)[-1]
        await pilot.press("2")
        assert app.current_mode == "setup" and k.value.endswith("2")  # typed, as in any field
        await pilot.press("escape", "2")
        await until(pilot, lambda: app.current_mode == "sessions", "the screen key after esc", 10)


@pytest.mark.medium
async def test_setup_catalog_reload_leaves_focus_where_it_was(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.catalog is not None, "the catalog")
        concurrency = screen.query_one("#concurrency", Input)
        screen.set_focus(concurrency)
        catalog = screen.catalog
        await pilot.press("ctrl+r")
        await until(pilot, lambda: screen.catalog is not catalog, "the reloaded catalog")
        await pilot.pause(0.1)
        assert app.focused is concurrency


@pytest.mark.medium
async def test_messages_of_another_session_open_at_their_top(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 16)) as pilot:  # short, so that the messages scroll
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("enter")
        await until(
            pilot,
            lambda: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
            "the first rollout",
        )
        screen = app.screen
        await pilot.press("m")
        scroll = screen.query_one("#messages-scroll")
        await until(pilot, lambda: scroll.max_scroll_y > 0, "messages longer than the pane")
        scroll.scroll_end(animate=False)
        await until(pilot, lambda: scroll.scroll_y > 0, "the scrolled messages")
        first = screen.session_id
        await pilot.press("2", "down", "enter")
        await until(
            pilot, lambda: app.current_mode == "rollout" and screen.session_id != first, "another rollout"
        )
        # The scroll home is applied after the next refresh of the screen.
        await until(pilot, lambda: scroll.scroll_y == 0, "the new session's messages at their top")


async def test_sessions_at_60x20_keeps_idle_and_reward_and_says_what_it_hides(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(60, 20)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await until(
            pilot, lambda: "root/fork/tokens hidden" in " ".join(_screen_lines(app)[1:3]), "the drawn summary"
        )
        lines = _screen_lines(app)
        header = next(line for line in lines if line.lstrip().startswith("session"))
        assert "idle" in header and "reward" in header
        summary = " ".join(lines[1:3])
        assert "root/fork/tokens hidden" in summary
        assert lines[0].rstrip().endswith("6 Train")  # the last screen keeps its title


async def test_nav_bar_never_cuts_a_screen_title(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(50, 20)) as pilot:
        await until(pilot, lambda: "2 Sessions" in _screen_lines(app)[0], "the drawn nav bar")
        nav = _screen_lines(app)[0]
        assert "2 Sessions" in nav and "Train" not in nav and " 6 " in nav
        await pilot.resize_terminal(60, 20)
        await until(pilot, lambda: "6 Train" in _screen_lines(app)[0], "the titles back at 60")


async def test_runs_failures_line_agrees_with_the_failed_count_after_a_resume(api_data):
    # Resumed: the cancelled rollout runs again, so the server counts no failure, though the
    # rollout still carries its old result until it ends.
    run = api_data["run_details"]["run-0001"]
    summary = next(r for r in api_data["runs"] if r["id"] == "run-0001")
    for body in (run, summary):
        body.update(
            state="running", failures={}, counts={"done": 3, "failed": 0, "ok": 3, "running": 1, "total": 4}
        )
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, initial_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        failures = app.screen.query_one("#failures")
        await until(pilot, lambda: "failures:" in str(failures.render()), "the run's failures")
        runs = app.screen.query_one("#runs-table", DataTable)
        assert str(runs.get_cell("run-0001", "failed")) == "0"
        assert "failures: none" in str(failures.render())


async def test_runs_shows_how_many_rollouts_of_a_run_are_degenerate(api_data):
    run = api_data["run_details"]["run-0001"]
    summary = next(r for r in api_data["runs"] if r["id"] == "run-0001")
    for body in (run, summary):
        body["counts"]["degenerate"] = 2
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, initial_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        failures = app.screen.query_one("#failures")
        await until(pilot, lambda: "failures:" in str(failures.render()), "the run's failures")
        phrase = "failures: none · cancelled 1 · 2 degenerate (skipped by trainers)"
        assert str(failures.render()).endswith(phrase)
        assert any(line.strip() == phrase for line in _screen_lines(app)), "cut at 80 columns"


async def test_turn_header_of_a_token_in_turn_is_whole_at_80x24(make_app):
    app = make_app("sessions")
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(SessionTable)
        await until(pilot, lambda: table.row_count == 8, "the recorded sessions")
        await pilot.press("enter")
        screen = app.screen
        await until(
            pilot,
            lambda: app.current_mode == "rollout" and screen.query_one(TokenView).turn is not None,
            "the rollout",
        )
        screen.load_turn(screen.session_id, 2)  # a continuation with the longest capture line
        await until(pilot, lambda: screen.turn is not None and screen.turn.seq == 2, "turn #2")

        def shown() -> str:
            return " ".join(line.split("▕")[-1].strip() for line in _screen_lines(app))

        await until(pilot, lambda: "prefix link to #0" in shown(), "turn #2's capture line drawn")
        assert "offset 48)" in shown()


def _train_app(api_data: dict) -> TapdeckApp:
    """The TUI on Train over the recorded API as `api_data` has it."""
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, follow_events=False, initial_mode="train")


async def _data_check_picked(pilot) -> Any:
    """Train's screen once the recipes are listed, with data-check picked."""
    screen = pilot.app.screen
    await until(pilot, lambda: "data-check" in screen.recipes, "the recipes")
    screen.query_one("#train-recipe", Select).value = "data-check"
    return screen


@pytest.mark.medium
async def test_train_without_a_rollout_run_points_to_setup_unless_its_args_name_the_rows(api_data):
    api_data["runs"] = []
    app = _train_app(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _data_check_picked(pilot)
        await pilot.press("l")
        assert any(
            n.message
            == ("pick a rollout run first (Setup starts one): data-check needs --run RUN (or --rows PATH)")
            for n in app._notifications
        )
        # The CLI's rule, as the server lists it: `--rows=PATH` names the rows too, so the launch
        # is asked of the server (the recording has no launch to answer it with).
        screen.query_one("#train-args", Input).value = "--rows=rows.jsonl"
        await pilot.press("l")
        state = screen.query_one("#train-state", Static)
        await until(
            pilot,
            lambda: str(state.render()).startswith("data-check did not start"),
            "the launch asked of the server",
        )


@pytest.mark.medium
async def test_setup_shows_which_picker_has_focus_and_a_task_row_from_the_start(make_app):
    app = make_app("setup")
    async with app.run_test(size=(80, 24)) as pilot:
        await _catalog_loaded(pilot)
        screen = app.screen
        harness = screen.query_one("#harness", Select).query_one("SelectCurrent")
        blurred = harness.styles.background
        screen.query_one("#harness", Select).focus()
        await until(pilot, lambda: harness.styles.background != blurred, "the focused look")
        # Textual's own focus mark on a compact picker is a 5% tint; the cursor's colour is not.
        assert abs(harness.styles.background.brightness - blurred.brightness) > 0.2
        assert screen.query_one("#tasks", SelectionList).highlighted == 0


async def test_train_on_a_run_still_going_warns_that_it_reads_what_is_done(api_data):
    run = api_data["runs"][0]
    run["state"] = "running"
    app = _train_app(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _data_check_picked(pilot)
        screen.query_one("#train-run", Select).value = run["id"]
        await pilot.press("l")
        warned = (
            f"run {run['id']} is still going: data-check reads the {run['counts']['done']} of "
            f"{run['counts']['total']} rollouts done so far"
        )
        await until(pilot, lambda: any(n.message == warned for n in app._notifications), "the warning")


async def test_train_says_why_stop_and_launch_did_nothing(make_app):
    app = make_app("train")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(
            pilot,
            lambda: "data-check" in screen.recipes and not screen.running,
            "the recipes, with no run going",
        )
        await pilot.press("s")
        await until(
            pilot,
            lambda: any(
                n.message == "no training run is running here: nothing to stop" for n in app._notifications
            ),
            "stop's answer",
        )
        screen.query_one("#train-recipe", Select).clear()
        await pilot.press("l")
        await until(
            pilot,
            lambda: any(n.message == "no recipe chosen: pick one" for n in app._notifications),
            "launch's answer",
        )


async def test_train_refuses_a_recipe_the_server_cannot_start_saying_why(api_data):
    recipe = next(r for r in api_data["train"]["recipes"]["recipes"] if r["name"] == "grpo-trl")
    why = (
        "grpo-trl needs 2 GPUs (1 for vLLM, 1 for the trainer, not shared); the server has 0 usable "
        "(no GPU; device nodes in /dev: none)"
    )
    recipe.update(available=False, why=why)  # as a CPU box lists it
    recorded = recorded_transport(api_data)
    asked: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path))
        return recorded.handler(request)

    client = TapdeckClient("http://tapdeck.test", "test-key", transport=httpx.MockTransport(handler))
    app = TapdeckApp(client, follow_events=False, initial_mode="train")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: "grpo-trl" in screen.recipes, "the recipes")
        screen.query_one("#train-recipe", Select).value = "grpo-trl"
        await pilot.press("l")
        await until(pilot, lambda: app._notifications, "launch's answer", 10)
        assert [n.message for n in app._notifications] == [
            f"grpo-trl cannot start on the server's machine: {why} (r checks again)"
        ]
        assert str(screen.query_one("#train-state", Static).render()) == f"grpo-trl did not start: {why}"
        assert ("POST", "/admin/train") not in asked  # refused here, not after a round trip


@pytest.mark.medium
async def test_train_passes_the_picked_run_to_a_recipe_that_reads_runs_itself(api_data):
    recipe = next(r for r in api_data["train"]["recipes"]["recipes"] if r["name"] == "grpo-trl")
    split = "vLLM on GPU 0, trainer on GPU 1 (--vllm-gpus/--trainer-gpus choose others)"
    recipe.update(available=True, why=f"runs in /env/bin/python; {split}")  # as a GPU box lists it
    assert recipe["run_option"] and not recipe["takes_run"]  # its own --run, not exported rows
    recorded = recorded_transport(api_data)
    launches: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if (request.method, request.url.path) == ("POST", "/admin/train"):
            launches.append(json.loads(request.content))
            return httpx.Response(400, json={"detail": "recorded: no launch"})
        return recorded.handler(request)

    client = TapdeckClient("http://tapdeck.test", "test-key", transport=httpx.MockTransport(handler))
    app = TapdeckApp(client, follow_events=False, initial_mode="train")
    run = api_data["runs"][0]["id"]
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(pilot, lambda: "grpo-trl" in screen.recipes, "the recipes")
        # Once the last job's line is shown, picking the recipe says what the server gives it.
        line = lambda: str(screen.query_one("#train-state", Static).render())  # noqa: E731
        await until(pilot, lambda: "exit code" in line(), "the last job's line")
        screen.query_one("#train-recipe", Select).value = "grpo-trl"
        await until(
            pilot,
            lambda: any(o[1] == run for o in screen.query_one("#train-run", Select)._options),
            "the rollout runs",
        )
        # The status line gives the server's GPU split for the picked GPU recipe.
        await until(pilot, lambda: line().startswith("grpo-trl"), "the recipe's line")
        assert line() == f"grpo-trl: updates weights; can start on the server: {split}"
        screen.query_one("#train-run", Select).value = run
        await pilot.press("l")
        await until(pilot, lambda: launches, "the launch", 10)
    assert launches[0]["recipe"] == "grpo-trl" and launches[0]["run"] == run


async def test_train_reward_plot_says_nothing_is_logged_before_any_run(api_data):
    api_data["train"]["runs"] = {"runs": []}
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    app = TapdeckApp(client, follow_events=False, initial_mode="train")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.screen.recipes, "the recipes")
        await until(
            pilot,
            lambda: "reward: nothing logged yet" in " ".join(_screen_lines(app)),
            "the empty plot's label",
            10,
        )
