"""The rollout graph as a Tree: roots, forks, discarded branches and re-tokenised edges marked.

A chain of continuations is listed flat under its head (a root, or a fork's child); forks nest
(`display_parents`). Refreshing while a rollout runs adds only the new nodes (the cursor and
expansion stay put); a turn changing place (a fork appearing, a late ancestor adopting nodes)
rebuilds the tree.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from tapdeck.app.views.graph import (
    TurnNode,
    display_parents,
    turn_label,
    turn_label_width,
    worst_level,
)
from tapdeck.schema.findings import Level


class RolloutTree(Tree[int]):
    """Nodes carry the turn's seq as data."""

    HELP = (
        "The rollout graph: each node is one model call. A chain of calls, each continuing the "
        "one above, is listed flat under its first call; a fork (calls continuing the same one) "
        "nests its branches. "
        "A label reads number, findings (!warn/!fatal), link kind, finish, then role "
        "(auxiliary/discarded; an agent turn shows none); ≈retok = linked despite a "
        "re-tokenisation break; a long label ends in …. Enter/click a turn to see its tokens."
    )

    def __init__(self, **kwargs) -> None:
        super().__init__("rollout", data=None, **kwargs)
        self.show_root = False
        self.guide_depth = 2
        self._seq_nodes: dict[int, TreeNode[int]] = {}
        self._seq_parents: dict[int, int | None] = {}
        self._seq_labels: dict[int, str] = {}
        self._turns: dict[int, TurnNode] = {}
        """The turns last loaded, to draw their labels again in a new theme's colours."""
        self._widths: dict[int, int] = {}
        """Each turn's label width, by how deep its forks list it."""

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._relabel())

    def _relabel(self) -> None:
        for seq, shown in self._seq_nodes.items():
            if seq in self._turns:
                shown.set_label(self._label(self._turns[seq]))

    def _plain(self, node: TurnNode) -> str:
        return turn_label(node, self._widths.get(node.seq, turn_label_width(0)))

    def _label(self, node: TurnNode) -> Text:
        plain = self._plain(node)
        theme = self.app.current_theme
        style = ""
        if node.discarded or node.role == "discarded":
            style = "dim strike"
        elif node.kind == "retokenized":
            style = theme.warning or "yellow"
        elif node.role not in ("agent",):
            style = "italic"
        text = Text(plain, style=style)
        if worst_level(node.findings) is Level.FATAL:
            text.stylize(theme.error or "red")
        return text

    def load(self, nodes: dict[int, TurnNode]) -> None:
        """Show `nodes`; incremental when every shown turn keeps its place."""
        self._turns = dict(nodes)
        places = display_parents(nodes)
        depths: dict[int, int] = {}

        def depth(seq: int) -> int:
            if seq not in depths:  # a chain is listed flat, so few levels ever nest
                place = places.get(seq)
                depths[seq] = 0 if place is None else depth(place) + 1
            return depths[seq]

        self._widths = {seq: turn_label_width(depth(seq)) for seq in nodes}
        structure_changed = any(
            self._seq_parents.get(seq, place) != place
            for seq, place in places.items()
            if seq in self._seq_parents
        )
        structure_changed |= any(seq not in nodes for seq in self._seq_nodes)
        if structure_changed:
            self.clear()
            self._seq_nodes.clear()
            self._seq_parents.clear()
            self._seq_labels.clear()
        pending = [seq for seq in sorted(nodes) if seq not in self._seq_nodes]
        while pending:
            progressed = False
            for seq in list(pending):
                node, place = nodes[seq], places[seq]
                # A fork's child or a head's first continuation goes last; a later continuation
                # right after the turn it continues.
                after: TreeNode[int] | None = None
                if place is None:
                    container = self.root
                elif place in self._seq_nodes and node.parent in self._seq_nodes:
                    container = self._seq_nodes[place]
                    container.allow_expand = True  # only turns with something under them fold
                    if place != node.parent:
                        after = self._seq_nodes[node.parent]
                else:
                    continue
                added = container.add(
                    self._label(node), data=seq, expand=True, allow_expand=False, after=after
                )
                self._seq_nodes[seq] = added
                self._seq_parents[seq] = place
                self._seq_labels[seq] = self._plain(node)
                pending.remove(seq)
                progressed = True
            if not progressed:
                break
        for seq, node in nodes.items():
            plain = self._plain(node)
            if self._seq_labels.get(seq) != plain and seq in self._seq_nodes:
                self._seq_nodes[seq].set_label(self._label(node))
                self._seq_labels[seq] = plain

    def select_seq(self, seq: int) -> None:
        """Move the cursor to turn `seq` (if shown)."""
        node = self._seq_nodes.get(seq)
        if node is not None:
            self.move_cursor(node)
