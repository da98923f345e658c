"""A header line of phrases ("turns 3", "prefix link to #2") for a screen's Static, wrapped only
between phrases at whatever width the Static has: Textual's own wrap breaks at any space, which
at 80 columns split "turns" from its number."""

from __future__ import annotations

from collections.abc import Iterable

from textual.content import Content
from textual.css.styles import RulesMap
from textual.strip import Strip
from textual.style import Style
from textual.visual import RenderOptions, Visual

from tapdeck.app.views.text import PHRASE_SEP, phrase_lines


class Phrases(Visual):
    """`Static.update(Phrases([...]))`: the phrases joined by " · ", laid out for each width."""

    def __init__(self, phrases: Iterable[str]) -> None:
        self.phrases = [p for p in phrases if p]

    def __str__(self) -> str:
        return PHRASE_SEP.join(self.phrases)

    def _content(self, width: int) -> Content:
        return Content("\n".join(phrase_lines(self.phrases, width)))

    def render_strips(
        self, width: int, height: int | None, style: Style, options: RenderOptions
    ) -> list[Strip]:
        return self._content(width).render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return self._content(container_width).get_optimal_width(rules, container_width)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return self._content(width).get_height(rules, width)
