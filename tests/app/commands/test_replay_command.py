"""`tapdeck replay` on a data dir's store against a vLLM-shaped reference: a session's drift per
turn and overall, a run's, the JSON the server's route answers, refusals in one line, `--delete`."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.proxy.store.database import Store
from tapdeck.schema.replay import ReplayResult, RunReplay
from tests.support.fake_vllm import FakeVllm
from tests.support.recorded_turns import turn_from_fixture
from tests.support.replay_sessions import SPIKE, chain_turns, reference_scores, store_session


def _data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Store(data / "capture.db") as store:
        store_session(store, "s-a", chain_turns())
        store_session(store, "s-t", [turn_from_fixture("chat_basic", 0, "s-t", ids=False)], tier="text")
    run = data / "runs" / "run-1"
    run.mkdir(parents=True)
    results = [
        {"rollout_id": f"r{i}", "run_id": "run-1", "task": "t", "index": i, "session_id": sid, "ok": True}
        for i, sid in enumerate(["s-a", "s-t"])
    ]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return data


def test_replay_prints_each_turns_drift_and_the_largest_tokens(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    turns = chain_turns()
    with FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine:
        res = CliRunner().invoke(app, ["replay", "s-a", "--engine", engine.url, "--data-dir", str(data)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["  turn 0", "  turn 1", "  turn 2"]
    # turn 1: 12 tokens off by 0.1, one by 2.0
    k3 = (12 * (math.exp(0.1) - 1.1) + math.exp(2.0) - 3.0) / 13
    assert lines[1] == (
        f"  turn 1: 13 tokens  mean|Δ| {3.2 / 13:.4f}  max|Δ| 2.0000  k3 KL {k3:.5f}  "
        "ratio outside [0.5, 2] 7.7%"
    )
    assert lines[3].startswith("session s-a: 41 tokens  mean|Δ| 0.1463  max|Δ| 2.0000")
    assert lines[3].endswith(", 1 request(s))")
    text = turns[SPIKE[0]].token_texts[SPIKE[1]]
    assert lines[4].startswith(f"  Δ +2.0000  turn {SPIKE[0]} token {SPIKE[1]} {text!r}")


def test_replay_of_a_run_skips_what_has_no_ids_and_answers_json(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    with FakeVllm(answer=None, prompt_scores=reference_scores(chain_turns())) as engine:
        res = CliRunner().invoke(
            app, ["replay", "run-1", "--engine", engine.url, "--json", "--data-dir", str(data)]
        )
    assert res.exit_code == 0, res.output
    run = RunReplay.model_validate_json(res.stdout)
    assert [r.session_id for r in run.replays] == ["s-a"] and run.run is not None and run.run.tokens == 41
    assert run.skipped == [
        "s-t: session s-t holds no token ids (tier text, 1 turn(s)): only a capture at the tokens tier "
        "can be replayed; capture through an engine that returns token ids (vLLM, or the embedded engine)"
    ]


def test_refusals_are_one_line_and_delete_leaves_no_replay(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    runner = CliRunner()
    with FakeVllm(answer=None, prompt_scores=lambda ids: None) as engine:
        res = runner.invoke(app, ["replay", "s-t", "--engine", engine.url, "--data-dir", str(data)])
        assert res.exit_code == 1
        assert res.stderr.strip().splitlines() == [res.stderr.strip()]
        assert res.stderr.startswith("tapdeck replay: session s-t holds no token ids")
        res = runner.invoke(app, ["replay", "s-a", "--engine", engine.url, "--data-dir", str(data)])
        assert res.exit_code == 1 and "returned no prompt_logprobs" in res.stderr
    with FakeVllm(answer=None, prompt_scores=reference_scores(chain_turns())) as engine:
        res = runner.invoke(app, ["replay", "s-a", "--engine", engine.url, "--json", "--data-dir", str(data)])
    replay_id = ReplayResult.model_validate_json(res.stdout).id
    res = runner.invoke(app, ["replay", replay_id, "--delete", "--data-dir", str(data)])
    assert res.exit_code == 0 and "capture is unchanged" in res.output
    with Store(data / "capture.db", read_only=True) as store:
        assert store.list_replays("s-a") == []
    res = runner.invoke(app, ["replay", replay_id, "--delete", "--data-dir", str(data)])
    assert res.exit_code == 1 and f"no replay {replay_id}" in res.stderr


def test_a_data_dir_holding_another_programs_database_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "capture.db"
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE notes (body TEXT)")
    before = db.read_bytes()
    res = CliRunner().invoke(
        app, ["replay", "s-a", "--engine", "http://127.0.0.1:9", "--data-dir", str(tmp_path)]
    )
    assert res.exit_code == 1, res.output
    assert res.stderr.startswith("tapdeck replay: ") and len(res.stderr.strip().splitlines()) == 1
    assert db.read_bytes() == before  # no tapdeck table was added to it
