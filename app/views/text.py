"""Values as the screens write them in a few cells: rewards, ids, names cut to a width, header
phrases broken into lines. Shared by every view."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from rich.cells import cell_len


def fmt_reward(value: Any) -> str:
    """`reward: null` means never graded: show "–", never 0."""
    if value is None or isinstance(value, bool):
        return "–"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "–"
    return f"{number:.2f}" if math.isfinite(number) else "–"


def short_id(value: str | None, width: int = 8) -> str:
    """The first characters of an id (enough to tell sessions apart on screen)."""
    return (value or "–")[:width]


def clip(value: str, width: int) -> str:
    """`value` when it fits in `width`, else its start and an ellipsis: a cut name says it is cut."""
    return value if len(value) <= width else value[: width - 1] + "…"


def id_tail(value: str, width: int) -> str:
    """The whole id when it fits in `width`, else its end: ids that share a prefix (run ids start
    with their date) differ at the end."""
    return value if len(value) <= width else "…" + value[len(value) - width + 1 :]


PHRASE_SEP = " · "
"""Between the phrases of a header line; a line it breaks starts with its dot (`phrase_lines`)."""


def phrase_lines(phrases: Iterable[str], width: int) -> list[str]:
    """Phrases such as "turns 3" or "prefix link to #2" joined by " · " into lines of at most
    `width` cells, broken only between phrases (a continued line starts with "· "), so that no
    phrase is split. A phrase wider than a line is split anyway: it follows on the line it
    reaches, for the widget to wrap at its spaces, rather than leave that line's end empty."""
    lead = PHRASE_SEP.lstrip()
    lines: list[str] = []
    for phrase in filter(None, phrases):
        if not lines:
            lines.append(phrase)
        elif cell_len(lines[-1] + PHRASE_SEP + phrase) <= width or cell_len(lead + phrase) > width:
            lines[-1] += PHRASE_SEP + phrase
        else:
            lines.append(lead + phrase)
    return lines
