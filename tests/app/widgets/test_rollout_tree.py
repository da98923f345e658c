"""The rollout tree widget: chains listed flat, forks nested, growth without rebuilding."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

import tapdeck
from tapdeck.app.views.graph import rollout_nodes
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tests.support.graph_turns import graph_turns


class TreeApp(App):
    def compose(self) -> ComposeResult:
        yield RolloutTree()


def _nodes(parents: dict[int, int | None]) -> dict:
    return rollout_nodes(graph_turns([{"seq": s, "parent": p} for s, p in parents.items()]))


def _shape(tree_node) -> list:
    return [(child.data, _shape(child)) if child.children else child.data for child in tree_node.children]


async def test_a_growing_chain_is_listed_flat_and_a_fork_nests_its_branches() -> None:
    app = TreeApp()
    async with app.run_test(size=(80, 24)) as pilot:
        tree = app.query_one(RolloutTree)
        chain = {0: None, 1: 0, 2: 1, 3: 2}
        tree.load(_nodes(chain))
        assert _shape(tree.root) == [(0, [1, 2, 3])]
        shown = dict(tree._seq_nodes)
        tree.load(_nodes({**chain, 4: 3}))  # the agent continues: one node added, none rebuilt
        assert _shape(tree.root) == [(0, [1, 2, 3, 4])]
        assert all(tree._seq_nodes[seq] is node for seq, node in shown.items())
        # A retry of turn 3 (another child of 2) turns 2 into a fork: both branches nest under it.
        tree.load(_nodes({**chain, 4: 3, 5: 2, 6: 5, 7: None}))
        assert _shape(tree.root) == [(0, [1, (2, [(3, [4]), (5, [6])])]), 7]
        await pilot.pause()
        assert all(tree._seq_nodes[seq].data == seq for seq in range(8))


async def test_a_theme_change_draws_the_turns_again_in_its_colours() -> None:
    app = TreeApp()
    async with app.run_test(size=(80, 24)) as pilot:
        tree = app.query_one(RolloutTree)
        tree.load(
            rollout_nodes(
                graph_turns([{"seq": 0, "parent": None}, {"seq": 1, "parent": 0, "link_kind": "retokenized"}])
            )
        )
        assert str(tree._seq_nodes[1].label.style) == app.current_theme.warning
        app.theme = next(
            name
            for name in ("textual-light", "nord")
            if app.get_theme(name).warning != app.current_theme.warning
        )
        await pilot.pause()
        assert str(tree._seq_nodes[1].label.style) == app.current_theme.warning


class GraphColumnApp(App):
    """The tree in the Rollout screen's graph column, styled by the app's own stylesheet."""

    CSS_PATH = Path(tapdeck.__file__).parent / "themes" / "tapdeck.tcss"

    def compose(self) -> ComposeResult:
        yield RolloutTree(id="graph")


async def test_labels_three_forks_deep_end_in_an_ellipsis_inside_the_graph_column() -> None:
    # Each turn a fork: every level nests one deeper. Long labels: re-tokenised auxiliary turns
    # cut at their length, token-in, a four-digit token count.
    parents = {0: None, 1: 0, 2: 0, 3: 2, 4: 2, 5: 4, 6: 4, 7: 6, 8: 6}
    turns = [
        {
            "seq": s,
            "parent": p,
            "link_kind": "retokenized" if p is not None else "root",
            "role": "auxiliary" if s % 2 else "agent",
            "finish_reason": "length",
            "sampled_len": 1234,
            "token_in": "ids",
        }
        for s, p in parents.items()
    ]
    app = GraphColumnApp()
    async with app.run_test(size=(80, 24)) as pilot:
        tree = app.query_one(RolloutTree)
        tree.load(rollout_nodes(graph_turns(turns)))
        await pilot.pause()
        region = tree.scrollable_content_region
        drawn = [
            "".join(segment.text for segment in strip)[region.x : region.right]
            for strip in app.screen._compositor.render_strips()
        ][region.y : region.y + len(parents)]
        labels = {seq: str(node.label) for seq, node in tree._seq_nodes.items()}
        for seq, label in labels.items():
            line = next(line for line in drawn if f"#{seq} " in line)
            assert label in line, (label, drawn)  # drawn whole, not cut at the column's edge
        assert labels[7].endswith("…") and labels[8].endswith("…")
