"""The rollout graph as a Tree: roots, forks, discarded branches and re-tokenised edges marked.

Refreshing while a rollout runs adds only the new nodes (the cursor and expansion stay put); a
structural change (a late ancestor adopting nodes) rebuilds the tree.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from tapdeck.app.views import TurnNode, finding_level, rollout_roots, turn_label


class RolloutTree(Tree[int]):
    """Nodes carry the turn's seq as data."""

    HELP = ("The rollout graph: each node is one model call, children continue its token prefix. "
            "role agent/auxiliary/discarded; ≈retok = linked despite a re-tokenisation break; "
            "!warn/!fatal = findings. Enter/click a turn to see its tokens.")

    def __init__(self, **kwargs) -> None:
        super().__init__("rollout", data=None, **kwargs)
        self.show_root = False
        self.guide_depth = 2
        self._seq_nodes: dict[int, TreeNode[int]] = {}
        self._seq_parents: dict[int, int | None] = {}
        self._seq_labels: dict[int, str] = {}

    def _label(self, node: TurnNode) -> Text:
        plain = turn_label(node)
        theme = self.app.current_theme
        style = ""
        if node.discarded or node.role == "discarded":
            style = "dim strike"
        elif node.kind == "retokenized":
            style = theme.warning or "yellow"
        elif node.role not in ("agent",):
            style = "italic"
        text = Text(plain, style=style)
        if node.findings:
            worst = min((finding_level(f) for f in node.findings), key=("FATAL", "WARN", "INFO").index)
            if worst == "FATAL":
                text.stylize(theme.error or "red")
        return text

    def load(self, nodes: dict[int, TurnNode]) -> None:
        """Show `nodes`; incremental when the known structure is unchanged."""
        structure_changed = any(self._seq_parents.get(seq, n.parent) != n.parent
                                for seq, n in nodes.items() if seq in self._seq_parents)
        structure_changed |= any(seq not in nodes for seq in self._seq_nodes)
        if structure_changed:
            self.clear()
            self._seq_nodes.clear()
            self._seq_parents.clear()
            self._seq_labels.clear()
        pending = [seq for seq in sorted(nodes) if seq not in self._seq_nodes]
        roots = set(rollout_roots(nodes))
        while pending:
            progressed = False
            for seq in list(pending):
                node = nodes[seq]
                if seq in roots:
                    parent_tree = self.root
                elif node.parent in self._seq_nodes:
                    parent_tree = self._seq_nodes[node.parent]
                else:
                    continue
                self._seq_nodes[seq] = parent_tree.add(self._label(node), data=seq, expand=True)
                self._seq_parents[seq] = node.parent
                self._seq_labels[seq] = turn_label(node)
                pending.remove(seq)
                progressed = True
            if not progressed:
                break
        for seq, node in nodes.items():
            plain = turn_label(node)
            if self._seq_labels.get(seq) != plain and seq in self._seq_nodes:
                self._seq_nodes[seq].set_label(self._label(node))
                self._seq_labels[seq] = plain

    def select_seq(self, seq: int) -> None:
        """Move the cursor to turn `seq` (if shown)."""
        node = self._seq_nodes.get(seq)
        if node is not None:
            self.move_cursor(node)
