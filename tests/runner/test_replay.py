"""Replay against a reference engine shaped exactly like vLLM (tests/support/fake_vllm.py serves
`prompt_logprobs` in vLLM's body), over sessions stored from recorded vLLM turns: one request per
chain, drift figures by TRL's and verl's names, refusals in one line, the replay stored beside the
capture and exported as extra columns."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from tapdeck.app.commands.export import session_rows
from tapdeck.proxy.capture.export import training_trace, write_parquet
from tapdeck.proxy.store.database import Store
from tapdeck.runner.errors import ReferenceUnreachable, ReplayRefused, SessionNotReplayable
from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.replay.drift import K3_KL
from tapdeck.runner.replay.reference import SLOWEST_SCORING, ReferenceEngine
from tapdeck.runner.replay.session import replay_logprobs, replay_session
from tests.support.fake_vllm import FakeVllm, vllm_listing
from tests.support.recorded_turns import turn_from_fixture
from tests.support.replay_sessions import OFF, SPIKE, chain_turns, reference_scores, store_session


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "capture.db") as s:
        store_session(s, "s-a", chain_turns())
        yield s


def _reference(engine: FakeVllm) -> ReferenceEngine:
    return ReferenceEngine.at(engine.url)


def test_a_chain_is_scored_in_one_request_with_trls_and_verls_figures(store: Store) -> None:
    turns = chain_turns()
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine:
        result, _ = replay_session(store, "s-a", _reference(engine))
    sent = [s for s in engine.sent if s.path == "/v1/completions"]
    assert len(sent) == 1 and result.requests == 1 and not result.chunked
    last = turns[-1]
    assert sent[0].body == {
        "model": "smollm2",
        "prompt": np.concatenate([last.prompt_ids, last.sampled_ids]).tolist(),
        "max_tokens": 1,
        "prompt_logprobs": 0,
    }
    assert [t.scored for t in result.turns] == [True, True, True]
    n = sum(t.sampled_ids.size for t in turns)
    figures = result.session
    assert figures is not None and figures.tokens == n
    deltas = [OFF] * (n - 1) + [SPIKE[2]]
    assert figures.metrics[MEAN] == pytest.approx(sum(deltas) / n)
    assert figures.metrics[MAX] == pytest.approx(SPIKE[2])
    assert figures.metrics[OUTSIDE] == pytest.approx(1 / n)  # exp(2) > 2; exp(0.1) inside
    assert figures.metrics[K3_KL] == pytest.approx(sum(math.exp(d) - d - 1 for d in deltas) / n)
    top = figures.largest[0]
    spiked = turns[SPIKE[0]]
    assert (top.seq, top.index, top.text) == (SPIKE[0], SPIKE[1], spiked.token_texts[SPIKE[1]])
    assert top.delta == pytest.approx(SPIKE[2])
    assert top.sampler_logprob == pytest.approx(spiked.logprobs[SPIKE[1]])
    assert result.turns[0].figures.metrics[MAX] == pytest.approx(OFF)


def test_a_chain_past_the_references_context_is_scored_up_to_it_in_one_request(store: Store) -> None:
    turns = chain_turns()
    second = turns[1].prompt_ids.size + turns[1].sampled_ids.size
    listing = vllm_listing(max_model_len=second + 1)  # room for turns 0 and 1, not the whole chain
    with FakeVllm(answer=None, listing=listing, prompt_scores=reference_scores(turns)) as engine:
        result, _ = replay_session(store, "s-a", _reference(engine))
    sizes = [len(s.body["prompt"]) for s in engine.sent if s.path == "/v1/completions"]
    assert result.chunked and result.requests == 1 and sizes == [second]
    assert [t.scored for t in result.turns] == [True, True, False]
    assert "do not fit the reference's context" in result.turns[2].reason
    assert result.session.tokens == turns[0].sampled_ids.size + turns[1].sampled_ids.size


def test_a_turn_without_logprobs_is_reported_unscored_never_as_zero(tmp_path: Path) -> None:
    turns = chain_turns("s-b")
    turns[1].logprobs = None
    with Store(tmp_path / "capture.db") as store:
        store_session(store, "s-b", turns)
        with FakeVllm(answer=None, prompt_scores=reference_scores(chain_turns())) as engine:
            result, _ = replay_session(store, "s-b", _reference(engine))
    assert [(t.scored, t.figures is None) for t in result.turns] == [
        (True, False),
        (False, True),
        (True, False),
    ]
    assert result.turns[1].reason == "no sampler logprobs to compare with"
    assert result.session.tokens == turns[0].sampled_ids.size + turns[2].sampled_ids.size
    assert result.session.metrics[MAX] == pytest.approx(OFF)  # the spike was in the unscored turn


def test_a_session_without_token_ids_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "capture.db") as store:
        store_session(store, "s-text", [turn_from_fixture("chat_basic", 0, "s-text", ids=False)], tier="text")
        with FakeVllm(answer=None, prompt_scores=lambda ids: None) as engine:
            with pytest.raises(SessionNotReplayable) as refused:
                replay_session(store, "s-text", _reference(engine))
    assert refused.value.message.startswith("session s-text holds no token ids (tier text")
    assert "\n" not in refused.value.message and engine.sent[-1].path == "/v1/models"


def test_a_reference_whose_tokenizer_differs_is_refused(store: Store) -> None:
    turns = chain_turns()
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns, text_of=lambda t: t + "#")) as engine:
        with pytest.raises(ReplayRefused) as refused:
            replay_session(store, "s-a", _reference(engine))
    token = int(turns[0].sampled_ids[0])
    assert refused.value.message.startswith(
        f"reference engine {engine.base_url}'s tokenizer differs from the sampler's: "
        f"token id {token} (turn 0)"
    )
    assert store.list_replays("s-a") == []


def test_an_engine_without_prompt_logprobs_is_refused(store: Store) -> None:
    with FakeVllm(answer=None, prompt_scores=lambda ids: None) as engine:
        with pytest.raises(ReplayRefused) as refused:
            replay_session(store, "s-a", _reference(engine))
    assert "returned no prompt_logprobs" in refused.value.message
    assert "\n" not in refused.value.message


def test_a_reference_that_refuses_the_captured_ids_is_refused_as_another_tokenizer(store: Store) -> None:
    error = {
        "error": {"message": "Token id 60000 is out of vocabulary", "type": "BadRequestError", "code": 400}
    }
    with FakeVllm(answer=None) as engine:
        engine.add("/v1/completions", None, 400, error)
        with pytest.raises(ReplayRefused) as refused:
            replay_session(store, "s-a", _reference(engine))
    assert refused.value.message.startswith(
        f"reference engine {engine.base_url}'s tokenizer differs from the sampler's "
        "(it refused the captured ids"
    )


def test_tokens_an_engine_gave_no_logprob_for_are_left_out_and_counted(tmp_path: Path) -> None:
    turns = chain_turns("s-n")
    turns[0].logprobs[[2, 5]] = np.nan
    with Store(tmp_path / "capture.db") as store:
        store_session(store, "s-n", turns)
        with FakeVllm(answer=None, prompt_scores=reference_scores(chain_turns())) as engine:
            result, _ = replay_session(store, "s-n", _reference(engine))
    first = result.turns[0]
    assert first.scored and first.figures.tokens == turns[0].sampled_ids.size - 2
    assert first.reason == "2 of 16 tokens left out: an engine gave no logprob for them"


def _capture_rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as db:
        return {
            table: db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("sessions", "turns", "messages")
        }


def test_a_replay_is_stored_beside_the_capture_and_deleting_it_leaves_the_capture(store: Store) -> None:
    before = _capture_rows(store.path)
    turns = chain_turns()
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine:
        result, _ = replay_session(store, "s-a", _reference(engine))
    [doc] = store.list_replays("s-a")
    assert doc["id"] == result.id and doc["model"] == "smollm2" and doc["engine"] == engine.base_url
    stored = store.replay_logprobs(result.id)
    for turn in turns:
        off = np.full(turn.sampled_ids.size, OFF)
        if turn.seq == SPIKE[0]:
            off[SPIKE[1]] = SPIKE[2]
        assert stored[turn.seq] == pytest.approx(turn.logprobs + off)
    assert _capture_rows(store.path) == before
    assert store.delete_replay(result.id) is True
    assert store.list_replays("s-a") == [] and store.replay_logprobs(result.id) == {}
    assert _capture_rows(store.path) == before


def test_a_replays_logprobs_pair_both_engines_token_by_token(store: Store) -> None:
    turns = chain_turns()
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine:
        result, _ = replay_session(store, "s-a", _reference(engine))
    got = replay_logprobs(store, "s-a", result.id)
    assert got.replay_id == result.id and [t.seq for t in got.turns] == [t.seq for t in turns]
    for pair, turn in zip(got.turns, turns, strict=True):
        assert pair.sampler == pytest.approx(turn.logprobs.tolist())
        off = [OFF] * turn.sampled_ids.size
        if turn.seq == SPIKE[0]:
            off[SPIKE[1]] = SPIKE[2]
        assert [r - s for r, s in zip(pair.reference, pair.sampler, strict=True)] == pytest.approx(off)


def test_the_replay_is_exported_as_extra_columns(store: Store, tmp_path: Path) -> None:
    turns = chain_turns()
    plain = session_rows(store, "s-a")
    assert all("ref_logprobs" not in row and "reference" not in row for row in plain)
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine:
        result, _ = replay_session(store, "s-a", _reference(engine))
    rows = session_rows(store, "s-a")
    name = f"smollm2@{engine.base_url}"
    assert [row["reference"] for row in rows] == [name] * 3
    for row, turn in zip(rows, turns, strict=True):
        assert row["ref_logprobs"] == pytest.approx(store.replay_logprobs(result.id)[turn.seq])
        assert "ref_logprobs" not in row["metadata"]
    table = pq.read_table(write_parquet(tmp_path / "rows.parquet", rows))
    assert table.column("reference").to_pylist() == [name] * 3
    assert table.column("ref_logprobs").to_pylist()[2] == pytest.approx(list(rows[2]["ref_logprobs"]))
    record, graph = store.load_graph("s-a")
    trace = training_trace(record, graph, "tokens", reference=store.latest_reference("s-a"))
    assert [e["metadata"]["reference"] for e in trace["turns"]] == [name] * 3
    assert trace["turns"][0]["metadata"]["ref_logprobs"] == pytest.approx(rows[0]["ref_logprobs"].tolist())


def test_a_long_chains_request_waits_by_its_length_not_600_s_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded engine scored 32,750 tokens in 1,188 s: past a flat 600 s reply timeout.
    reference = ReferenceEngine("http://127.0.0.1:9/v1", "m", name="r", max_model_len=None)
    waits: list[float | None] = []

    def post(url: str, **kwargs: object) -> None:
        waits.append(kwargs["timeout"].read)  # type: ignore[attr-defined]
        raise httpx.ConnectError("not listening")

    monkeypatch.setattr(reference._http, "post", post)
    for size in (2_000, 32_750):
        with pytest.raises(ReferenceUnreachable):
            reference.score(np.arange(size))
    assert waits == [600.0, 32_750 / SLOWEST_SCORING]
    reference.close()
