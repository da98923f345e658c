"""Rollout document, training trace and run files (capture-cases I)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tapdeck.proxy.capture.export import (
    ExportRefused,
    rollout_document,
    trace_rows,
    training_trace,
    write_jsonl,
    write_parquet,
)
from tapdeck.proxy.capture.graph import RolloutGraph
from tests.support.recorded_turns import turn_from_fixture

MULTI = ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3"]
TOOL = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}
SESSION = {"id": "s1", "rollout_type": "train", "metadata": {}}


def graph_of(turns, order=None):
    g = RolloutGraph()
    for i in order if order is not None else range(len(turns)):
        g.add(turns[i])
    return g


def multi():
    return [turn_from_fixture(n, i) for i, n in enumerate(MULTI)]


def forked():
    """0 → 1 → 2 → 5, plus a resample of turn 2 (3) continued by turn 4: two live agent paths."""
    base = multi()
    fork = dataclasses.replace(
        base[2], seq=3, sampled_ids=np.array([504, 2], np.int32), logprobs=np.array([-0.25, -0.5])
    )
    cont_prompt = np.concatenate([base[2].prompt_ids, [504, 2, 198, 1, 4093, 198, 77]])
    cont = dataclasses.replace(base[2], seq=4, prompt_ids=cont_prompt.astype(np.int32))
    full2 = np.concatenate([base[2].prompt_ids, base[2].sampled_ids, [198, 1, 4093, 198, 78]])
    cont2 = dataclasses.replace(base[2], seq=5, prompt_ids=full2.astype(np.int32))
    return base + [fork, cont, cont2]


def test_every_trace_turn_carries_its_own_prompt_ids():
    turns = multi()
    trace = training_trace(SESSION, graph_of(turns), "tokens")
    assert trace["schema_version"] == 1
    assert [e["node_id"] for e in trace["turns"]] == ["0", "1", "2"]
    for e, t in zip(trace["turns"], turns, strict=True):
        assert e["prompt_token_ids"] == t.prompt_ids.tolist()
        assert e["completion_token_ids"] == t.sampled_ids.tolist()
        assert e["per_token_logps"] == t.logprobs.tolist()
        assert len(e["loss_mask"]) == len(t.prompt_ids) + len(t.sampled_ids)
        assert sum(e["loss_mask"][: len(t.prompt_ids)]) == 0
        assert all(e["loss_mask"][len(t.prompt_ids) :])
        assert e["request"] == t.request


def test_shared_turns_are_exported_once_and_all_agent_paths_in_arrival_order():
    turns = forked()
    g = graph_of(turns)
    assert len(g.paths()) == 2
    trace = training_trace(SESSION, g, "tokens")
    assert [e["node_id"] for e in trace["turns"]] == ["0", "1", "2", "3", "4", "5"]
    doc = rollout_document(SESSION, g, "tokens")
    assert [p["nodes"] for p in doc["paths"]] == [[0, 1, 3, 4], [0, 1, 2, 5]]
    assert [p["role"] for p in doc["paths"]] == ["agent", "agent"]


def test_trainable_tokens_are_counted_over_unique_turns():
    turns = forked()
    doc = rollout_document(SESSION, graph_of(turns), "tokens")
    unique = sum(len(t.sampled_ids) for t in turns)
    assert doc["stats"]["trainable_tokens"] == unique
    assert sum(sum(s["loss_mask"]) for s in doc["sequences"]) > unique


def test_rollout_document_sequences_mask_context_and_carry_findings():
    turns = [
        turn_from_fixture(n, i) for i, n in enumerate(["chat_multiturn_trunc_1", "chat_multiturn_trunc_2"])
    ]
    doc = rollout_document(SESSION, graph_of(turns), "tokens")
    [s] = doc["sequences"]
    assert s["input_ids"] == turns[1].prompt_ids.tolist() + turns[1].sampled_ids.tolist()
    assert len(s["input_ids"]) == len(s["loss_mask"]) == len(s["logprobs"])
    for i, (m, lp) in enumerate(zip(s["loss_mask"], s["logprobs"], strict=True)):
        assert m == 1 or lp == 0.0, i
    injected = len(turns[0].prompt_ids) + len(turns[0].sampled_ids)  # the unsampled <|im_end|>
    assert s["input_ids"][injected] == 2 and s["loss_mask"][injected] == 0
    assert doc["tier"] == "tokens" and doc["ok"] is True and doc["reward"] is None
    assert any(f["level"] == "INFO" and f["code"].startswith("truncated_parent") for f in doc["findings"])
    assert (
        any(f["level"] == "WARN" and f["code"].startswith("truncated") for f in doc["turns"][1]["findings"])
        is False
    )
    orjson.dumps(doc)


def test_auxiliary_node_inside_agent_path_zeroes_exactly_its_sampled_span():
    turns = multi()
    turns = [
        dataclasses.replace(t, request=copy.deepcopy(t.request) | {"tools": [TOOL]}) if t.seq != 1 else t
        for t in turns
    ]
    doc = rollout_document(SESSION, graph_of(turns), "tokens")
    [s] = doc["sequences"]
    spans = {sp["seq"]: (sp["start"], sp["end"]) for sp in s["spans"]}
    mask = np.array(s["loss_mask"])
    ones = np.flatnonzero(mask)
    expected = np.r_[spans[0][0] : spans[0][1], spans[2][0] : spans[2][1]]
    assert np.array_equal(ones, expected)
    assert doc["turns"][1]["role"] == "auxiliary"
    assert [e["node_id"] for e in training_trace(SESSION, graph_of(turns), "tokens")["turns"]] == ["0", "2"]


def test_tool_calls_are_exported_nested():
    t = multi()[0]
    t.response = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "name": "shell", "arguments": {"cmd": "ls"}}],
    }
    [e] = training_trace(SESSION, graph_of([t]), "tokens")["turns"]
    assert e["response"]["choices"][0]["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd":"ls"}'}}
    ]


def test_eval_rollouts_have_no_trainable_rows_and_refuse_a_trace():
    turns = multi()
    g = graph_of(turns)
    for session, tier in (
        ({"id": "e", "rollout_type": "eval"}, "tokens"),
        ({"id": "e", "rollout_type": "auto"}, "logprobs"),
    ):
        doc = rollout_document(session, g, tier)
        assert doc["rollout_type"] == "eval" and doc["stats"]["trainable_tokens"] == 0
        assert all(not any(s["loss_mask"]) for s in doc["sequences"])
        with pytest.raises(ExportRefused):
            training_trace(session, g, tier)
        assert trace_rows(session, g, tier, group_id="g") == []


def test_null_logprob_is_exported_as_zero_masked_and_counted():
    t = multi()[0]
    lp = t.logprobs.copy()
    lp[2] = np.nan
    t.logprobs = lp
    [e] = training_trace(SESSION, graph_of([t]), "tokens")["turns"]
    assert e["per_token_logps"][2] == 0.0 and sum(e["loss_mask"]) == 0
    assert e["metadata"]["logprobs_filled"] == 1
    orjson.dumps(e)


def test_run_files_carry_group_and_reward_with_null_meaning_never_graded(tmp_path):
    graded = {"id": "r1", "rollout_type": "train", "metadata": {"reward": 0.0}}
    ungraded = {"id": "r2", "rollout_type": "train", "metadata": {}}
    rows = trace_rows(graded, graph_of(multi()), "tokens", group_id="task-a") + trace_rows(
        ungraded, graph_of(multi()), "tokens", group_id="task-a"
    )
    lines = write_jsonl(tmp_path / "run.jsonl", rows).read_text().splitlines()
    first, last = orjson.loads(lines[0]), orjson.loads(lines[-1])
    assert first["reward"] == 0.0 and last["reward"] is None and first["group_id"] == "task-a"
    assert first["prompt_token_ids"] == multi()[0].prompt_ids.tolist()
    table = pq.read_table(write_parquet(tmp_path / "run.parquet", rows))
    assert table.num_rows == 6
    col = table.column("reward").to_pylist()
    assert col[:3] == [0.0] * 3 and col[3:] == [None] * 3
    assert table.column("prompt_token_ids").to_pylist()[1] == multi()[1].prompt_ids.tolist()
    assert table.schema.field("prompt_token_ids").type.value_type == pa.int32()
    assert orjson.loads(table.column("request").to_pylist()[0]) == multi()[0].request


def test_a_row_that_cannot_be_written_leaves_the_previous_jsonl_whole_and_no_temporary_file(tmp_path):
    """The rows after the first good ones hold a value JSON cannot hold: the write fails part-way
    (the good rows already written), and the file a trainer may be reading is the previous export,
    byte for byte. (Parquet builds its table before writing; a failure inside its write is
    tests/app/commands/test_export.py's.)"""

    def rows(reward: float) -> list[dict]:
        session = {"id": "r1", "rollout_type": "train", "metadata": {"reward": reward}}
        return trace_rows(session, graph_of(multi()), "tokens", group_id="task-a")

    path = write_jsonl(tmp_path / "run.jsonl", rows(0.0))
    before = path.read_bytes()
    regraded = rows(1.0)
    with pytest.raises(TypeError):
        write_jsonl(path, [*regraded, {**regraded[-1], "request": {"messages": object()}}])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]


@pytest.mark.parametrize(
    "stamps, column_type",
    [
        ([("trainer", 0, 0), ("trainer", 0, 1), None], pa.int64()),
        ([("engine", "v7", "v7"), ("engine", "v7", 8), ("reply", 8, 8)], pa.string()),
    ],
    ids=["step-numbers", "engine-labels"],
)
def test_run_files_say_which_policy_sampled_each_turn_and_which_straddled(tmp_path, stamps, column_type):
    from tapdeck.proxy.capture.policy_stamp import PolicyStamp

    turns = [
        dataclasses.replace(t, policy=None if s is None else PolicyStamp(*s))
        for t, s in zip(multi(), stamps, strict=True)
    ]
    rows = trace_rows(SESSION, graph_of(turns), "tokens", group_id="g")
    want = [None if s is None or s[1] != s[2] else s[1] for s in stamps]
    straddled = [None if s is None or s[1] == s[2] else [s[1], s[2]] for s in stamps]
    lines = [orjson.loads(x) for x in write_jsonl(tmp_path / "run.jsonl", rows).read_text().splitlines()]
    assert [x["policy_version"] for x in lines] == want
    assert [x.get("policy_version_straddled") for x in lines] == straddled
    table = pq.read_table(write_parquet(tmp_path / "run.parquet", rows))
    assert table.schema.field("policy_version").type == column_type
    as_type = (lambda v: v) if column_type == pa.int64() else (lambda v: None if v is None else str(v))
    assert table.column("policy_version").to_pylist() == [as_type(v) for v in want]
    pairs = table.column("policy_version_straddled").to_pylist()
    assert [None if p is None else [as_type(v) for v in p] for p in straddled] == pairs
