"""Labelled fields as one Textual Visual: a column of labels, each field's text beside its label.

Every continuation line of a text (its own line breaks, and the lines it wraps into at the width it
is drawn at) starts under the text's first line, so none reads as a field of its own. Textual wraps
a plain Content from the left edge, hence a Visual that wraps each text to its own column.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.content import Content
from textual.css.styles import RulesMap
from textual.selection import Selection
from textual.strip import Strip
from textual.style import Style
from textual.visual import RenderOptions, Visual
from textual.widgets import Static


class LabelledFields(Visual):
    """(label, text) fields top to bottom: labels `label_width` cells wide in `label_style`."""

    def __init__(self, fields: Sequence[tuple[str, Content]], label_width: int, label_style: str) -> None:
        self.fields = list(fields)
        self.label_width = label_width
        self.label_style = label_style
        self._laid_out: dict[int | None, Content] = {}

    def laid_out(self, width: int | None) -> Content:
        """The fields as one Content `width` cells wide (None: as wide as their longest line), each
        text wrapped to the cells right of the labels, its continuation lines indented to them."""
        if width not in self._laid_out:
            indent = Content("\n" + " " * self.label_width)
            self._laid_out[width] = Content("\n").join(
                Content.styled(f"{label:<{self.label_width}}", self.label_style)
                + indent.join(self._lines(text, width))
                for label, text in self.fields
            )
        return self._laid_out[width]

    def _lines(self, text: Content, width: int | None) -> list[Content]:
        if width is None:
            return text.split(allow_blank=True)
        return text.wrap(max(1, width - self.label_width))

    def __str__(self) -> str:
        return self.laid_out(None).plain

    def render_strips(
        self, width: int, height: int | None, style: Style, options: RenderOptions
    ) -> list[Strip]:
        """Part of the Visual protocol: the fields laid out for `width`."""
        return self.laid_out(width).render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        """Part of the Visual protocol: as wide as the longest line, none wrapped."""
        return self.laid_out(None).get_optimal_width(rules, container_width)

    def get_minimal_width(self, rules: RulesMap) -> int:
        """Part of the Visual protocol: the labels and a cell of text."""
        return self.label_width + 1

    def get_height(self, rules: RulesMap, width: int) -> int:
        """Part of the Visual protocol: the lines of the fields laid out for `width`."""
        return self.laid_out(width).get_height(rules, width)


class LabelledFieldsText(Static):
    """A Static showing `LabelledFields`; text selected in it is copied as drawn."""

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The selected text: selections are made over the fields as laid out at this width."""
        if isinstance(self.visual, LabelledFields):
            return selection.extract(self.visual.laid_out(self.content_size.width).plain), "\n"
        return super().get_selection(selection)
