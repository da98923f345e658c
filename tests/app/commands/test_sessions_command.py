"""`tapdeck sessions`: a data dir's capture sessions read headless from its store, as the server's
admin API and the Sessions and Rollout screens show them; nothing started, nothing written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tests.support.recorded_turns import turn_from_fixture
from tests.support.vllm_recordings import vllm_fixture

RUN = "run-20261201-100000-aaaa"
FORKED = "s-00000000000000f1"
OTHER = "s-00000000000000e2"
EVAL = "s-00000000000000d3"


def _session(
    store: Any, sid: str, created: float, fixtures: list[str], *, rollout_type: str = "train", **metadata: Any
) -> None:
    """A closed session holding recorded vLLM turns, linked as a server links them."""
    from tapdeck.proxy.capture.graph import RolloutGraph

    store.create_session(
        {
            "id": sid,
            "state": "closed",
            "tier": "tokens",
            "rollout_type": rollout_type,
            "engine": {"url": "http://gpu:8000/v1", "model": "qwen"},
            "metadata": metadata,
            "created_at": created,
        }
    )
    graph = RolloutGraph()
    for seq, name in enumerate(fixtures):
        turn = turn_from_fixture(name, seq, sid)
        store.append_turn(turn, graph.add(turn))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Three sessions: one of RUN whose first turn was answered twice (a fork: the retry that was
    never continued is discarded) and whose last call the harness's trajectory never recorded
    (demoted to auxiliary); one of no run, a plain chain, newer; the newest an eval rollout."""
    from tapdeck.proxy.store.database import Store

    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "capture.db")
    _session(
        store,
        FORKED,
        1.0,
        ["chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3", "chat_multiturn_2"],
        run_id=RUN,
        task="hello-file",
        harness="codex",
        reward=0.5,
        auxiliary_seqs=[2],
        auxiliary_reason="not in the harness's ATIF trajectory",
    )
    _session(store, OTHER, 2.0, ["chat_multiturn_1", "chat_multiturn_2"], task="sum-numbers")
    _session(store, EVAL, 3.0, ["chat_multiturn_1"], rollout_type="eval", task="sum-numbers")
    store.close()
    return data


def _sessions(data: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["sessions", *args, "--data-dir", str(data)])


def _sampled(*turns: int) -> list[int]:
    return [len(vllm_fixture(f"chat_multiturn_{n}")["response"]["choices"][0]["token_ids"]) for n in turns]


def _files(data: Path) -> dict[str, str]:
    """Each file's digest, but SQLite's own -wal and -shm files (a reader in WAL mode opens them)."""
    return {
        str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_sessions_lists_each_session_newest_first_with_its_graph_counts_and_reward(data: Path) -> None:
    before = _files(data)
    result = _sessions(data)
    assert result.exit_code == 0, result.output
    assert [line.split() for line in result.output.splitlines()] == [
        ["session", "state", "task", "turn", "root", "fork", "!", "tokens", "reward"],
        [EVAL, "finished", "sum-numbers", "1", "1", "0", "-", "0", "–"],  # never trained on
        [OTHER, "finished", "sum-numbers", "2", "1", "0", "-", str(sum(_sampled(1, 2))), "–"],
        # the demoted and the discarded calls are not trained on
        [FORKED, "finished", "hello-file", "4", "1", "1", "-", str(sum(_sampled(1, 2))), "0.50"],
    ]
    assert all(len(line) <= 80 for line in result.output.splitlines())
    assert _files(data) == before  # read-only: not a byte of the store changed


def test_sessions_json_list_is_what_the_server_answers_for_its_store(data: Path) -> None:
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store

    listed = json.loads(_sessions(data, "--json").output)["sessions"]
    store = Store(data / "capture.db")
    try:
        service = CaptureService(store, default_engine=None, public_url="http://x")
        served = [s.model_dump(mode="json") for s in service.queries.list()]
    finally:
        store.close()
    keys = (
        "id",
        "state",
        "tier",
        "turns",
        "roots",
        "forks",
        "discarded",
        "trainable_tokens",
        "fragmentation",
        "metadata",
        "fatal",
        "warn",
    )
    assert [{k: s[k] for k in keys} for s in listed] == [{k: s[k] for k in keys} for s in served]


def test_sessions_json_says_how_long_since_each_sessions_last_call_as_the_server_does(data: Path) -> None:
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store

    listed = json.loads(_sessions(data, "--json").output)["sessions"]
    store = Store(data / "capture.db")
    try:
        served = CaptureService(store, default_engine=None, public_url="http://x").queries.list()
    finally:
        store.close()
    assert [(s["id"], s["last_call_at"]) for s in listed] == [(s.id, s.last_call_at) for s in served]
    assert [s["seconds_since_last_call"] is None for s in listed] == [False, False, False]
    assert [s.seconds_since_last_call is None for s in served] == [False, False, False]


def test_sessions_lists_only_the_runs_sessions_with_run(data: Path) -> None:
    result = _sessions(data, "--run", RUN)
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.output.splitlines()[1:]] == [FORKED]
    assert _sessions(data, "--run", RUN, "--json").exit_code == 0


def test_sessions_run_naming_no_run_exits_1_saying_so(data: Path) -> None:
    typo = _sessions(data, "--run", "run-20261201-100000-aaab")
    assert typo.exit_code == 1
    assert f"no run run-20261201-100000-aaab in {data / 'runs'}" in typo.output
    # A run that exists but made no capture session (an oracle run) is listed as empty, exit 0.
    (data / "runs" / "run-20261201-110000-cccc").mkdir(parents=True)
    sessionless = _sessions(data, "--run", "run-20261201-110000-cccc")
    assert sessionless.exit_code == 0 and "no capture sessions of run" in sessionless.output


def test_the_list_shows_the_newest_twenty_and_counts_the_rest(tmp_path: Path) -> None:
    from tapdeck.proxy.store.database import Store

    store = Store(tmp_path / "capture.db")
    for i in range(23):
        store.create_session(
            {
                "id": f"s-{i:016x}",
                "state": "closed",
                "tier": "tokens",
                "rollout_type": "train",
                "created_at": float(i + 1),
                "metadata": {},
            }
        )
    store.close()
    lines = _sessions(tmp_path).output.splitlines()
    assert [line.split()[0] for line in lines[1:21]] == [f"s-{i:016x}" for i in range(22, 2, -1)]
    assert lines[21] == "… and 3 older session(s): --all lists them, --run RUN one run's"
    assert len(_sessions(tmp_path, "--all").output.splitlines()) == 24


def test_a_sessions_graph_nests_its_fork_and_shows_the_demoted_and_discarded_calls(data: Path) -> None:
    result = _sessions(data, FORKED)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = " ".join(lines[: lines.index("")])
    for phrase in (
        "session s-00000000000000f1",
        "finished",
        "tokens tier",
        "train rollout",
        "task hello-file",
        "harness codex",
        "reward 0.50",
        "engine qwen at http://gpu:8000/v1",
        "4 turn(s)",
        "1 fork(s)",
        "1 discarded",
    ):
        assert phrase in head
    tree = lines[lines.index("") + 1 :]
    prompts = [
        len(vllm_fixture(name)["response"]["prompt_token_ids"])
        for name in ("chat_multiturn_1", "chat_multiturn_2", "chat_multiturn_3")
    ]
    # #0 forks into the continued #1 (its chain goes on under it: #2) and the retry #3.
    assert [(len(line) - len(line.lstrip()), line.split()[0], line.split()[-1]) for line in tree[:4]] == [
        (0, "#0", str(prompts[0])),
        (2, "#1", str(prompts[1])),
        (4, "#2", str(prompts[2])),
        (2, "#3", str(prompts[1])),
    ]
    assert all(len(line) <= 80 for line in lines[: lines.index("") + 5])
    assert "auxiliary" in tree[2] and "discarded" in tree[3]
    assert "[WARN] discarded_turns: 1 discarded turns" in tree[5]
    assert f"a turn's tokens: tapdeck sessions {FORKED} --turn N" == lines[-1]


def test_a_sessions_json_is_its_rollout_document_as_the_server_answers(data: Path) -> None:
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store

    doc = json.loads(_sessions(data, FORKED, "--json").output)
    store = Store(data / "capture.db")
    try:
        served = CaptureService(store, default_engine=None, public_url="http://x").rollout_document(FORKED)
    finally:
        store.close()
    assert doc["turns"] == json.loads(json.dumps(served["turns"]))
    assert doc["sequences"] == json.loads(json.dumps(served["sequences"]))
    assert [t["role"] for t in doc["turns"]] == ["agent", "agent", "auxiliary", "discarded"]


def test_a_turns_tokens_come_one_a_line_with_the_engines_ids_and_logprobs(data: Path) -> None:
    result = _sessions(data, OTHER, "--turn", "1")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"session {OTHER} turn #1 · prefix link to #0 · prompt ")
    choice = vllm_fixture("chat_multiturn_2")["response"]["choices"][0]
    table = lines[lines.index(next(line for line in lines if line.split()[:2] == ["#", "id"])) + 1 :]
    assert [(int(row.split()[1]), float(row.split()[2])) for row in table] == [
        (token_id, round(c["logprob"], 3))
        for token_id, c in zip(choice["token_ids"], choice["logprobs"]["content"], strict=True)
    ]
    detail = json.loads(_sessions(data, OTHER, "--turn", "1", "--json").output)
    assert detail["sampled_ids"] == choice["token_ids"] and detail["parent"] == 0


def test_sessions_names_what_is_missing_and_refuses_bad_usage(data: Path) -> None:
    missing = _sessions(data, "s-0000000000000bad")
    assert missing.exit_code == 1 and "no session s-0000000000000bad in" in missing.output
    turn = _sessions(data, OTHER, "--turn", "7")
    assert turn.exit_code == 1 and f"session {OTHER} has no turn 7 (it has turns 0-1)" in turn.output
    assert _sessions(data, "../capture.db").exit_code == 2
    assert _sessions(data, "--turn", "1").exit_code == 2
    assert _sessions(data, OTHER, "--run", RUN).exit_code == 2
    nowhere = _sessions(data / "empty")
    assert nowhere.exit_code == 1 and "no capture store at" in nowhere.output
