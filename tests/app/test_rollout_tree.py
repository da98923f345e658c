"""The rollout tree widget: chains listed flat, forks nested, growth without rebuilding."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tapdeck.app.views import rollout_nodes
from tapdeck.app.widgets.rollout_tree import RolloutTree
from tests.app.rollout_docs import graph_turns


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
        tree.load(rollout_nodes(graph_turns([{"seq": 0, "parent": None},
                                             {"seq": 1, "parent": 0, "link_kind": "retokenized"}])))
        assert str(tree._seq_nodes[1].label.style) == app.current_theme.warning
        app.theme = next(name for name in ("textual-light", "nord")
                         if app.get_theme(name).warning != app.current_theme.warning)
        await pilot.pause()
        assert str(tree._seq_nodes[1].label.style) == app.current_theme.warning
