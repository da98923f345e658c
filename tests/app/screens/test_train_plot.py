"""The Train screen's plot reads evenly at any height: each y tick on its own row, the same number
of rows and the same value apart, none dropped (a fixed five ticks on four rows lost one, leaving
1.00, 0.00, -0.50, -1.00); and a run of one logged step is plotted at that step, not over -1..1.
Read off the terminal, over the recorded API."""

from __future__ import annotations

import re

import pytest

from tapdeck.app.client import TapdeckClient
from tapdeck.app.tui import TapdeckApp
from tests.support.pilot_wait import until
from tests.support.recorded_api import FROZEN_NOW, recorded_transport

Y_LABEL = re.compile(r"^\s*(-?\d+(?:\.\d+)?)┤")


def _app(api_data: dict) -> TapdeckApp:
    client = TapdeckClient("http://tapdeck.test", "test-key", transport=recorded_transport(api_data))
    return TapdeckApp(client, follow_events=False, clock=lambda: FROZEN_NOW, initial_mode="train")


def _screen_lines(app: TapdeckApp) -> list[str]:
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


async def _plot_lines(api_data: dict, size: tuple[int, int]) -> list[str]:
    """The terminal's lines once Train plots the recorded data-check's metrics."""
    app = _app(api_data)
    async with app.run_test(size=size) as pilot:
        await until(
            pilot,
            lambda: (
                "finished (exit code 0)" in str(app.screen.query_one("#train-state").render())
                and app.screen.points
            ),
            "the plotted job",
        )
        await until(
            pilot, lambda: any("step" == line.strip() for line in _screen_lines(app)), "the plot drawn"
        )
        return _screen_lines(app)


@pytest.mark.medium
@pytest.mark.parametrize("size", [(80, 24), (80, 30), (100, 40), (160, 48)])
async def test_train_y_ticks_are_evenly_spaced_with_none_dropped(api_data, size):
    lines = await _plot_lines(api_data, size)
    ticks = [(row, float(m[1])) for row, line in enumerate(lines) if (m := Y_LABEL.match(line))]
    assert len(ticks) >= 3, lines
    row_gaps = {b[0] - a[0] for a, b in zip(ticks, ticks[1:], strict=False)}
    value_gaps = {round(a[1] - b[1], 6) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert len(row_gaps) == 1 and len(value_gaps) == 1, (ticks, "\n".join(lines))
    # The recorded reward is 0 at every step: a flat series sits on a tick of its own.
    assert 0.0 in [value for _, value in ticks]


async def test_train_plot_of_one_logged_step_has_that_step_as_its_only_x_tick(api_data):
    metrics = api_data["train"]["metrics"]["train-0000"]
    metrics["points"] = [p for p in metrics["points"] if p["step"] == 0]
    lines = await _plot_lines(api_data, (80, 24))
    [bottom] = [row for row, line in enumerate(lines) if "└" in line]
    assert lines[bottom + 1].split() == ["0"], "\n".join(lines)
