"""A plot of training metrics by step whose axes read evenly at any height.

plotext places each y tick on the canvas row nearest its value, so a fixed tick count on a few rows
puts two ticks on one row and one label is dropped (1.00, 0.00, -0.50, -1.00 on four rows); and it
spreads a single x value over -1..1. Here the tick count and the axis top follow the rows the plot
has, so every tick lands on its own row, evenly spaced, and the x ticks are whole steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from textual.app import RenderResult
from textual_plotext import PlotextPlot

Y_TICKS = 5
"""The most y ticks drawn (fewer when the plot has fewer rows, or another count fits it better)."""
X_TICKS = 5
"""The most x ticks drawn."""
FRAME_ROWS = 5
"""Rows of the plot that are not canvas: title, the frame's top and bottom lines, the x tick labels
and the x label (as plotext lays them out with a title and an x label)."""


def even_ticks(values: list[float], count: int = Y_TICKS) -> list[float]:
    """`count` evenly spaced y ticks over `values` (plotext's own land unevenly on a flat series)."""
    low, high = min(values), max(values)
    if high == low:
        pad = abs(low) / 2 or 1.0
        low, high = low - pad, high + pad
    step = (high - low) / (count - 1)
    return [low + i * step for i in range(count)]


def y_tick_count(rows: int) -> int:
    """How many y ticks a canvas of `rows` rows shows: an odd count (a flat series sits on the
    middle one) that leaves the fewest rows over, the larger on a tie."""
    fits = [count for count in (Y_TICKS, 3) if count <= rows] or [2]
    return min(fits, key=lambda count: ((rows - 1) % (count - 1), -count))


def y_axis(values: list[float], rows: int) -> tuple[list[float], float]:
    """The y ticks over `values` for a canvas of `rows` rows, and the axis top that puts each tick
    on its own row, the same number of rows apart (rows left over stay above the last tick)."""
    count = y_tick_count(rows)
    ticks = even_ticks(values, count)
    if rows < count:  # one row holds one tick at most: there is no spacing to keep
        return ticks, ticks[-1]
    gap = (rows - 1) // (count - 1)
    return ticks, ticks[0] + (ticks[1] - ticks[0]) * (rows - 1) / gap


def x_axis(steps: list[int]) -> tuple[list[int], float, float]:
    """Whole-step x ticks over `steps` and the axis limits; a single step is centred, its own tick."""
    first, last = min(steps), max(steps)
    if first == last:
        return [first], first - 1, last + 1
    stride = math.ceil((last - first) / (X_TICKS - 1))
    return list(range(first, last + 1, stride)), first, last


POINT_MARKER = "●"
INTERVAL_MARKER = "│"
POINT_COLOR = "orange"
"""Marked points and their intervals: apart from the lines' braille dots and their colours
(plotext's cycle starts blue, green, red)."""


@dataclass(frozen=True, slots=True)
class IntervalPoint:
    """A value at one step, drawn as a point apart from the lines, with its interval when known."""

    step: int
    value: float
    low: float | None = None
    high: float | None = None


class MetricPlot(PlotextPlot):
    """Metric series (label → (step, value) points) as braille lines under a title, and marked
    points (label → points with intervals, e.g. an eval's) drawn over them."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series: dict[str, list[tuple[int, float]]] = {}
        self.marks: dict[str, list[IntervalPoint]] = {}
        self.heading = ""

    def show(
        self,
        series: dict[str, list[tuple[int, float]]],
        title: str,
        marks: dict[str, list[IntervalPoint]] | None = None,
    ) -> None:
        """Plot `series` and `marks` (none: just the title) and redraw."""
        self.series, self.heading = series, title
        self.marks = {label: points for label, points in (marks or {}).items() if points}
        self.refresh()

    def render(self) -> RenderResult:
        # Drawn again at each render: the ticks depend on the height, which a resize changes.
        self.draw(max(self.size.height - FRAME_ROWS, 0))
        return super().render()

    def draw(self, rows: int) -> None:
        """Lay the series and marks out on plotext's figure for a canvas of `rows` rows."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        for label, points in self.series.items():
            xs, values = zip(*points, strict=True)
            plt.plot(list(xs), list(values), marker="braille", label=label)
        ys = [y for points in self.series.values() for _, y in points]
        steps = [x for points in self.series.values() for x, _ in points]
        for label, marked in self.marks.items():
            for p in marked:
                if p.low is not None and p.high is not None:
                    plt.plot([p.step, p.step], [p.low, p.high], marker=INTERVAL_MARKER, color=POINT_COLOR)
                    ys += [p.low, p.high]
            # After the intervals: each point is drawn over its own.
            plt.scatter(
                [p.step for p in marked],
                [p.value for p in marked],
                marker=POINT_MARKER,
                color=POINT_COLOR,
                label=label,
            )
            ys += [p.value for p in marked]
            steps += [p.step for p in marked]
        if ys:
            ticks, top = y_axis(ys, rows)
            plt.ylim(ticks[0], top)
            plt.yticks(ticks)
            steps, left, right = x_axis(steps)
            plt.xlim(left, right)
            positions: list[float] = list(steps)  # plotext is typed for float positions
            plt.xticks(positions, [str(step) for step in steps])
        plt.title(self.heading)
        plt.xlabel("step")
