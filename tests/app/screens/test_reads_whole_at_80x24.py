"""At 80×24 (an SSH terminal) what a screen says reads whole where it is drawn: the Rollout headers
break between phrases, the turn list's labels fit or end in "…", Setup's public-URL hint and task
preview are not cut. Checked on the terminal's drawn lines, over the recorded API."""

from __future__ import annotations

import re

import pytest
from textual.widget import Widget
from textual.widgets import Input, SelectionList

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tapdeck.app.widgets.session_table import SessionTable
from tapdeck.app.widgets.token_view import TokenView
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport


def _drawn(app: TapdeckApp, widget: Widget) -> list[str]:
    """The lines the terminal shows now inside `widget` (its content, not its scrollbars)."""
    region = widget.scrollable_content_region
    lines = ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]
    return [line[region.x : region.right] for line in lines[region.y : region.bottom]]


def _words(lines: list[str]) -> str:
    """Drawn lines as one text, a wrapped line's break read as a space."""
    return " ".join(" ".join(lines).split())


async def _rollout_open(api_data: dict, pilot) -> None:
    """Sessions' first row (a chat of three turns, each with a warning) opened on Rollout."""
    app = pilot.app
    await until(
        pilot,
        lambda: app.screen.query_one(SessionTable).row_count == len(api_data["sessions"]),
        "the recorded sessions",
    )
    await pilot.press("enter")
    await until(
        pilot,
        lambda: app.current_mode == "rollout" and app.screen.query_one(TokenView).turn is not None,
        "the rollout's first turn",
    )
    await until(
        pilot,
        lambda: "frag. " in _words(_drawn(app, app.screen.query_one("#rollout-header"))),
        "the drawn header",
    )


def _app(api_data: dict, mode: str = "sessions") -> TapdeckApp:
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(
        client,
        server_label="http://tapdeck.test",
        follow_events=False,
        clock=lambda: FROZEN_NOW,
        initial_mode=mode,
    )


async def test_rollout_header_wraps_between_phrases_at_80_columns(api_data):
    # A 12-character task name puts the end of the header's first line inside "roots 2".
    session = next(s for s in api_data["sessions"] if s["id"] == "sess0000recorded")
    session["metadata"]["task"] = "greet-script"
    app = _app(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        await _rollout_open(api_data, pilot)
        for selector in ("#rollout-header", "#turn-header"):
            header = app.screen.query_one(selector)
            await until(pilot, lambda header=header: _drawn(app, header)[0].strip(), f"{selector} drawn")
            lines = _drawn(app, header)
            width = header.content_region.width
            for phrase in str(header.render()).split(" · "):
                if len(phrase) <= width:  # a longer one cannot be whole on a line
                    assert any(phrase in line for line in lines), (selector, phrase, lines)
            assert _words(lines).endswith(str(header.render()).split(" · ")[-1])  # none cut off


async def test_rollout_turn_labels_show_whole_or_end_in_an_ellipsis_at_80_columns(api_data):
    app = _app(api_data)
    async with app.run_test(size=(80, 24)) as pilot:
        await _rollout_open(api_data, pilot)
        tree = app.screen.query_one("#graph")
        labels = [str(node.label) for node in tree.root.children]
        labels += [str(child.label) for node in tree.root.children for child in node.children]
        assert len(labels) == 3
        lines = _drawn(app, tree)
        for label in labels:
            assert any(label in line for line in lines), (label, lines)
        # The number, link kind and finish come first: "#2 !warn length ⇢ids 24 tok".
        assert all(re.match(r"#\d+ !warn length", label) for label in labels), labels


@pytest.mark.medium
async def test_setup_public_url_hint_and_task_preview_read_whole_at_80x24(api_data):
    task = api_data["catalog"]["datasets"][0]["tasks"][0]
    # The whole instruction, paragraphs and all, longer than the pane holds at 80×24: the rest is
    # read by scrolling the preview, not cut to the first paragraph the info table shows.
    task["instruction_text"] = (
        " ".join(f"Step {i}: write the function, then test it on input {i}." for i in range(1, 16))
        + "\n\n## Checks\n\nThe end."
    )
    app = _app(api_data, "setup")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await until(
            pilot,
            lambda: screen.catalog is not None and screen.query_one("#tasks", SelectionList).option_count > 0,
            "the catalog",
        )
        url = screen.query_one("#public-url", Input)
        url.scroll_visible(animate=False)
        await until(
            pilot,
            lambda: url.placeholder in _words(_drawn(app, url)),
            "the public URL's placeholder drawn whole",
            10,
        )
        hint = screen.query_one("#why-public-url")  # what the field is for, wrapped below it
        hint.scroll_visible(animate=False)
        await until(pilot, lambda: _words(_drawn(app, hint)) == str(hint.render()), "the hint drawn whole")

        preview = screen.query_one("#setup-right")
        await until(
            pilot, lambda: f"{task['name']} Step 1:" in _words(_drawn(app, preview)), "the task preview", 10
        )
        assert "The end." not in _words(_drawn(app, preview))
        screen.query_one("#instruction-scroll").scroll_end(animate=False)
        await until(
            pilot,
            lambda: "## Checks The end." in _words(_drawn(app, preview)),
            "the preview's end, scrolled to",
            10,
        )
