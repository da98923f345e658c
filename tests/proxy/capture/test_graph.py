"""Rollout graph behaviour (capture-cases G, H) on turns built from recorded vLLM bodies."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import random

import numpy as np
import pytest

from tapdeck.proxy.capture import graph as graph_module
from tapdeck.proxy.capture import prefix_index
from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.capture.turn import Turn
from tests.support.recorded_turns import turn_from_fixture

MULTI = ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]
TINY = ["tiny/chat_multiturn_1", "tiny/chat_multiturn_2", "tiny/chat_multiturn_3"]
TOOL = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}


def build(turns, order=None):
    g = RolloutGraph()
    links = {}
    for i in order if order is not None else range(len(turns)):
        links[turns[i].seq] = g.add(turns[i])
    return g, links


def shape(g):
    return {s: (g.link(s).parent, g.link(s).kind, g.link(s).offset) for s in sorted(g.nodes)}


def multi():
    return [turn_from_fixture(n, i) for i, n in enumerate(MULTI)]


def resample(turn, seq, new_ids):
    """The same call retried: identical prompt, other sampled ids."""
    return dataclasses.replace(
        turn,
        seq=seq,
        sampled_ids=np.asarray(new_ids, dtype=np.int32),
        logprobs=np.full(len(new_ids), -0.5),
        findings=[],
    )


def test_greedy_conversation_links_by_exact_prefix():
    g, links = build(multi())
    assert shape(g) == {0: (None, "root", None), 1: (0, "prefix", 64), 2: (1, "prefix", 100)}
    st = g.stats()
    assert (st.roots, st.breaks, st.forks, st.discarded, st.fragmentation) == (1, 0, 0, 0, 1.0)
    assert all(not lk.findings for lk in links.values())


def test_full_prompt_rebuilds_exactly_what_the_engine_returned():
    turns = multi() + [
        turn_from_fixture(
            n,
            3 + i,
        )
        for i, n in enumerate(TINY)
    ]
    g, _ = build(turns)
    for t in turns:
        assert np.array_equal(g.full_prompt(t.seq), t.prompt_ids)
        assert np.array_equal(g.full_sequence(t.seq), np.concatenate([t.prompt_ids, t.sampled_ids]))
        assert np.array_equal(g.turn(t.seq).prompt_ids, t.prompt_ids)


def test_node_holds_only_tokens_beyond_its_parent():
    turns = multi()
    g, _ = build(turns)
    n1, n0 = g.nodes[1], g.nodes[0]
    assert n1.prompt_tail.size == len(turns[1].prompt_ids) - n0.full_len
    assert n1.turn.prompt_ids is None
    stored = sum(n.prompt_tail.size + n.sampled_len for n in g.nodes.values())
    assert stored == len(turns[2].prompt_ids) + len(turns[2].sampled_ids)


def test_linking_reads_no_stored_node_tokens(monkeypatch):
    """Parent lookup goes through the hash index: no node's ids are rebuilt or scanned."""
    turns = multi()
    g = RolloutGraph()

    def forbidden(*a, **k):
        raise AssertionError("linking rebuilt a stored sequence")

    monkeypatch.setattr(RolloutGraph, "full_prompt", forbidden)
    monkeypatch.setattr(RolloutGraph, "full_sequence", forbidden)
    for t in turns:
        g.add(t)
    assert g.nodes[2].parent == 1


def _agent_loop(n_turns, first=300, new=40, seed=0):
    """Synthetic turns shaped like an agent loop: each prompt extends the previous call."""
    rng = np.random.default_rng(seed)
    prompt, turns = rng.integers(3, 49152, first, dtype=np.int32), []
    for k in range(n_turns):
        sampled = rng.integers(3, 49152, new // 2, dtype=np.int32)
        msgs = [{"role": "user", "content": "task"}]
        for j in range(k):
            msgs += [{"role": "assistant", "content": f"reply {j}"}, {"role": "user", "content": f"obs {j}"}]
        turns.append(
            Turn(
                session_id="s",
                seq=k,
                prompt_ids=prompt,
                sampled_ids=sampled,
                logprobs=np.full(sampled.size, -0.5),
                finish_reason="stop",
                request={"messages": msgs},
                response={"content": f"reply {k}"},
            )
        )
        prompt = np.concatenate([prompt, sampled, rng.integers(3, 49152, new - new // 2, dtype=np.int32)])
    return turns


def test_linking_an_extending_call_hashes_only_its_new_tokens(monkeypatch):
    hashed = []
    real = prefix_index.HASHER.prefix_hashes
    monkeypatch.setattr(
        prefix_index.HASHER,
        "prefix_hashes",
        lambda ids, *a, **k: hashed.append(ids.size) or real(ids, *a, **k),
    )
    turns = _agent_loop(20)
    g = RolloutGraph()
    for prev, t in zip([None, *turns], turns, strict=False):
        hashed.clear()
        g.add(t)
        new = t.prompt_ids.size - (prev.prompt_ids.size + prev.sampled_ids.size if prev else 0)
        assert sum(hashed) == new + t.sampled_ids.size
    assert [g.link(t.seq).parent for t in turns] == [None, *range(19)]


def test_linking_from_the_last_call_gives_the_graph_full_hashing_gives():
    """Forks, retries, edits and out-of-order arrivals: the shortcut never changes a link."""
    rng = random.Random(3)
    for trial in range(40):
        turns = _agent_loop(4, first=50, new=10, seed=trial)
        for seq in range(4, 24):
            parent = rng.choice(turns)
            full = np.concatenate([parent.prompt_ids, parent.sampled_ids])
            cut = rng.choice([full.size, full.size, parent.prompt_ids.size, rng.randrange(1, full.size)])
            prompt = np.concatenate([full[:cut], np.asarray(rng.sample(range(3, 999), 5), dtype=np.int32)])
            if rng.random() < 0.2:
                prompt = parent.prompt_ids  # a retry of the same call
            turns.append(
                dataclasses.replace(
                    parent,
                    seq=seq,
                    prompt_ids=prompt,
                    sampled_ids=np.asarray(rng.sample(range(3, 999), 4), dtype=np.int32),
                    logprobs=np.full(4, -0.5),
                )
            )
        order = list(range(len(turns)))
        rng.shuffle(order)
        fast, _ = build(turns, order)
        slow = RolloutGraph()
        slow._hot_start = lambda prompt: None
        for i in order:
            slow.add(turns[i])
        assert shape(fast) == shape(slow), trial


def test_truncated_turn_links_as_prefix_with_info_about_the_unsampled_end_token():
    turns = [
        turn_from_fixture(n, i) for i, n in enumerate(["chat_multiturn_trunc_1", "chat_multiturn_trunc_2"])
    ]
    g, links = build(turns)
    assert shape(g)[1] == (0, "prefix", 72)
    [f] = links[1].findings
    assert str(f).startswith("[INFO] truncated_parent:") and "turn 0" in f.detail
    assert "[2, 198, 1]" in f.detail


def test_retokenized_reply_links_with_warn_naming_node_and_offset():
    turns = [
        turn_from_fixture(n, i) for i, n in enumerate(["chat_multiturn_retok_1", "chat_multiturn_retok_2"])
    ]
    g, links = build(turns)
    assert shape(g)[1] == (0, "retokenized", 52)
    [f] = links[1].findings
    assert str(f).startswith("[WARN] retokenized:")
    assert "turn 0" in f.detail and "offset 52" in f.detail and "cut by length" in f.detail
    st = g.stats()
    assert (st.roots, st.breaks, st.fragmentation) == (1, 1, 2.0)


def test_special_tokens_inside_reply_are_visible_breaks():
    turns = [turn_from_fixture(n, i) for i, n in enumerate(TINY)]
    g, links = build(turns)
    assert shape(g) == {0: (None, "root", None), 1: (0, "retokenized", 66), 2: (1, "retokenized", 133)}
    assert "'<|im_start|>'" in links[1].findings[0].detail
    assert g.stats().breaks == 2 and g.stats().fragmentation == 3.0


def test_retokenized_edge_splits_sequences_without_concatenating_ids():
    turns = [turn_from_fixture(n, i) for i, n in enumerate(TINY)]
    g, _ = build(turns)
    seqs = g.sequences()
    assert [s.nodes for s in seqs] == [[0], [1], [2]]
    for s, t in zip(seqs, turns, strict=True):
        assert np.array_equal(s.input_ids, np.concatenate([t.prompt_ids, t.sampled_ids]))
        assert s.loss_mask[: len(t.prompt_ids)].sum() == 0
        assert s.loss_mask[len(t.prompt_ids) :].all()


def test_late_ancestor_adopts_descendants():
    turns = multi()
    in_order, _ = build(turns)
    g, links = build(turns, order=[0, 2, 1])
    assert shape(g) == shape(in_order)
    assert links[1].adopted == [2]


def test_arrival_order_never_changes_the_graph():
    base = multi()
    turns = base + [
        resample(base[1], 3, [504, 2]),
        dataclasses.replace(turn_from_fixture(MULTI[0], 4), findings=[]),
        turn_from_fixture(TINY[0], 5),
        turn_from_fixture(TINY[1], 6),
    ]
    expected = shape(build(turns)[0])
    orders = list(itertools.permutations(range(len(turns))))
    for order in random.Random(7).sample(orders, 400):
        g, _ = build(turns, order=list(order))
        assert shape(g) == expected, order
        for t in turns:
            assert np.array_equal(g.full_prompt(t.seq), t.prompt_ids)


def test_ties_go_to_the_earliest_arrival():
    base = multi()
    twin = dataclasses.replace(base[0], seq=3)  # same prompt, same sampled ids
    turns = base + [twin]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [3, 0, 1, 2]):
        g, _ = build(turns, order)
        assert g.nodes[1].parent == 0


def test_any_changed_token_makes_a_new_root():
    base = multi()
    t1 = base[1]
    ids = t1.prompt_ids.copy()
    ids[50] = 77  # inside turn 0's reply: the prompt no longer extends turn 0 exactly
    changed = dataclasses.replace(
        t1, prompt_ids=ids, request={"messages": [{"role": "user", "content": "x"}]}
    )
    g, _ = build([base[0], changed])
    assert g.nodes[1].parent is None and g.stats().roots == 2


def test_childless_sibling_of_a_continued_fork_is_discarded():
    base = multi()
    retry = resample(base[1], 3, [504, 2])
    g, _ = build(base + [retry])
    assert g.children(0) == [1, 3]
    assert g.discarded(3) and not g.discarded(1) and not g.discarded(2)
    assert g.stats().forks == 1 and g.stats().discarded == 1
    roles = {tuple(p): g.role(p) for p in g.paths()}
    assert roles == {(0, 1, 2): "agent", (0, 3): "discarded"}


def test_all_childless_siblings_are_kept():
    base = multi()
    g, _ = build(base[:2] + [resample(base[1], 2, [504, 2])])
    assert not g.discarded(1) and not g.discarded(2)
    assert {g.role(p) for p in g.paths()} == {"agent"}


def test_identical_prompt_roots_where_one_continued_discard_the_other():
    base = multi()
    retry = resample(base[0], 3, [504, 2])  # the first call retried
    g, _ = build(base + [retry])
    assert g.roots() == [0, 3]
    assert g.discarded(3) and not g.discarded(0)


def test_no_tool_manifest_anywhere_makes_every_live_path_agent():
    base = multi()
    aux = turn_from_fixture("chat_basic", 3)
    g, _ = build(base + [aux])
    assert [g.role(p) for p in g.paths()] == ["agent", "agent"]


def with_tools(turn):
    req = copy.deepcopy(turn.request) | {"tools": [TOOL]}
    return dataclasses.replace(turn, request=req)


def test_tool_bearing_path_is_agent_and_tool_less_root_is_auxiliary():
    base = [with_tools(t) for t in multi()]
    title = turn_from_fixture("chat_basic", 3)
    g, _ = build(base + [title])
    roles = {tuple(p): g.role(p) for p in g.paths()}
    assert roles == {(0, 1, 2): "agent", (3,): "auxiliary"}
    assert g.stats().trainable_tokens == sum(len(t.sampled_ids) for t in base)


def test_two_tool_bearing_roots_are_both_agent():
    a = [with_tools(t) for t in multi()]
    b = with_tools(turn_from_fixture("chat_basic", 3))
    g, _ = build(a + [b])
    assert [g.role(p) for p in g.paths()] == ["agent", "agent"]


def test_trainable_tokens_count_unique_turns_across_forks():
    base = multi()
    fork = resample(base[2], 3, [504, 2])
    g, _ = build(base + [fork])
    expected = sum(len(t.sampled_ids) for t in base) + 2
    assert g.stats().trainable_tokens == expected
    seq_sum = sum(int(s.loss_mask.sum()) for s in g.sequences())
    assert seq_sum > expected  # per-sequence sum double counts the shared prefix


def test_stats_agree_with_the_per_call_queries_on_a_mixed_rollout():
    # Stats are computed in one pass on every commit; they must say what the per-call queries say.
    base = [with_tools(t) for t in multi()]
    fork, retry = resample(base[2], 3, [504, 2]), resample(base[1], 4, [504, 7, 2])
    title = turn_from_fixture("chat_basic", 5)
    marked = dataclasses.replace(with_tools(turn_from_fixture(TINY[0], 6)), meta={"call_role": "auxiliary"})
    g, _ = build(base + [fork, retry, title, marked])
    st = g.stats()
    tools = g.has_tools()
    assert st.discarded == sum(g.discarded(s) for s in g.nodes) > 0
    assert st.trainable_tokens == sum(
        g.nodes[s].sampled_len for s in g.nodes if g.node_mask_on(s, tools=tools)
    )
    assert st.forks == 1 + 1 and st.roots == len(g.roots()) == 3
    assert {g.node_role(s) for s in g.nodes} == {"agent", "auxiliary", "discarded"}


def no_ids(turn, **changes):
    return dataclasses.replace(turn, prompt_ids=None, sampled_ids=None, **changes)


def test_message_prefix_links_calls_without_ids():
    turns = [no_ids(t) for t in multi()]
    g, _ = build(turns, order=[2, 0, 1])
    assert shape(g) == {0: (None, "root", None), 1: (0, "message", None), 2: (1, "message", None)}


def test_message_linking_ignores_refusal_audio_null_vs_empty_and_system_prompt():
    turns = [no_ids(t) for t in multi()]
    req1 = copy.deepcopy(turns[1].request)
    req1["messages"][0]["content"] = "a different system prompt"
    req1["messages"][2] |= {"refusal": None, "annotations": [], "audio": None}
    resp0 = dict(turns[0].response)
    resp0.pop("role")  # role-less reply = assistant
    turns[0] = dataclasses.replace(turns[0], response=resp0)
    turns[1] = dataclasses.replace(turns[1], request=req1)
    g, _ = build(turns)
    assert g.nodes[1].parent == 0


def test_message_linking_compares_tool_calls_by_name_and_canonical_arguments():
    call = {
        "id": "a",
        "type": "function",
        "function": {"name": "shell", "arguments": '{"cmd": "ls", "t": 1}'},
    }
    echoed = {
        "id": "zzz",
        "type": "function",
        "function": {"name": "shell", "arguments": '{"t":1,"cmd":"ls"}'},
    }
    first = no_ids(multi()[0], response={"role": "assistant", "content": None, "tool_calls": [call]})
    msgs = first.request["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [echoed]},
        {"role": "tool", "tool_call_id": "zzz", "content": "x"},
    ]
    second = no_ids(multi()[1], request={"messages": msgs})
    g, _ = build([first, second])
    assert g.nodes[1].parent == 0
    other = copy.deepcopy(msgs)
    other[-2]["tool_calls"][0]["function"]["arguments"] = '{"cmd": "pwd", "t": 1}'
    g2, _ = build([first, no_ids(multi()[1], request={"messages": other})])
    assert g2.nodes[1].parent is None


def test_messages_continuing_with_diverged_prompt_ids_is_a_counted_break():
    base = multi()
    ids = base[1].prompt_ids.copy()
    ids[3] = 77  # inside the system prompt: the template rendered history differently
    g, links = build([base[0], dataclasses.replace(base[1], prompt_ids=ids)])
    assert g.nodes[1].parent is None
    [f] = links[1].findings
    assert str(f).startswith("[WARN] prefix_break:") and "turn 0" in f.detail and "offset 3" in f.detail
    assert g.stats().breaks == 1 and g.stats().conversations == 1


def test_adding_the_same_seq_twice_is_refused():
    g = RolloutGraph()
    t = multi()[0]
    g.add(t)
    with pytest.raises(ValueError, match="already"):
        g.add(t)


def test_conversation_resent_under_another_system_prompt_is_a_side_call_not_a_break():
    # A summariser / memory-extraction call: turn 0's conversation under its own system prompt.
    base = multi()
    messages = copy.deepcopy(base[1].request["messages"])
    messages[0] = {"role": "system", "content": "Summarise the conversation so far."}
    ids = base[1].prompt_ids.copy()
    ids[3] = 77  # the other system prompt's tokens
    g, links = build(
        [
            base[0],
            dataclasses.replace(base[1], prompt_ids=ids, request={**base[1].request, "messages": messages}),
        ]
    )
    assert g.nodes[1].parent is None
    [f] = links[1].findings
    assert str(f).startswith("[INFO] other_system_prompt:") and "turn 0" in f.detail
    assert g.stats().breaks == 0 and g.stats().conversations == 2


def test_reply_resent_without_its_sampled_reasoning_is_named_reasoning_dropped():
    # gemini-cli leaves thought parts out of the history it resends.
    first, second = [
        turn_from_fixture(n, i) for i, n in enumerate(["chat_multiturn_retok_1", "chat_multiturn_retok_2"])
    ]
    first = dataclasses.replace(first, response={**first.response, "reasoning": "I should answer."})
    g, links = build([first, second])
    assert shape(g)[1] == (0, "retokenized", 52)
    [f] = links[1].findings
    assert str(f).startswith("[WARN] reasoning_dropped:") and "turn 0" in f.detail and "offset 52" in f.detail
    # Resent with the reasoning, the same divergence is a re-tokenisation.
    messages = copy.deepcopy(second.request["messages"])
    next(m for m in reversed(messages) if m["role"] == "assistant")["reasoning_content"] = "I should answer."
    _, links = build([first, dataclasses.replace(second, request={**second.request, "messages": messages})])
    assert str(links[1].findings[0]).startswith("[WARN] retokenized:")


@pytest.mark.parametrize(
    ("value", "trainable"),
    [
        (-0.5, True),
        (0.0, True),
        (5e-7, True),  # up to 1e-6 above 0 is rounding of log(1)
        (1e-5, False),
        (float("nan"), False),
        (float("inf"), False),
        (float("-inf"), False),
    ],
)
def test_only_finite_non_positive_logprobs_make_a_turn_trainable(value, trainable):
    t = dataclasses.replace(multi()[0], findings=[])
    lp = t.logprobs.copy()
    lp[1] = value
    assert graph_module.turn_trainable(dataclasses.replace(t, logprobs=lp)) is trainable
