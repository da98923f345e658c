"""A session an older tapdeck stored with a malformed engine reply still exports and reads.

Before the engine's reply was checked at the boundary, a 200 whose `message.tool_calls` was a
string (or whose message was not an object at all) was stored as
it came; from then on the session's `/rollout` and `/trace` answered a plain-text 500 and `tapdeck
export` died with a traceback. Such turns are written here straight into a store, and must read
back through the admin API and `tapdeck export` with a finding that says what was left out.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import httpx
import orjson

from tapdeck.proxy.config import CAPTURE_DB, ServerConfig
from tapdeck.schema.sessions import (
    GraphView,
    RolloutDocument,
    SessionDetail,
    TrainingTrace,
    TurnDetail,
)
from tests.support.local_server import running
from tests.support.tapdeck_process import TAPDECK

CHAT = {
    "model": "m",
    "max_tokens": 24,
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
}


def _store_as_an_older_tapdeck_did(db: Path, session_id: str) -> None:
    """Turn 0 as stored from a reply whose tool calls were a string; turn 1 (a copy of it) from one
    whose message was a string."""
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT * FROM turns WHERE session_id = ? AND seq = 0", (session_id,)).fetchone()
        names = [d[0] for d in conn.execute("SELECT * FROM turns LIMIT 0").description]
        turn = dict(zip(names, row, strict=True))
        doc = orjson.loads(turn["doc"])
        doc["response"] = {
            **doc["response"],
            "content": None,
            "tool_calls": '[{"function": {"name": "run_shell", "arguments": "{}"}}]',
        }
        conn.execute(
            "UPDATE turns SET doc = ? WHERE session_id = ? AND seq = 0", (orjson.dumps(doc), session_id)
        )
        doc["response"] = "The capital of France is Paris."
        copy = {**turn, "seq": 1, "doc": orjson.dumps(doc)}
        conn.execute(
            f"INSERT INTO turns ({', '.join(copy)}) VALUES ({', '.join('?' * len(copy))})",
            tuple(copy.values()),
        )


def test_a_stored_reply_tapdeck_cannot_read_as_is_still_exports_with_a_finding(upstream, tmp_path: Path):
    config = ServerConfig(port=0, data_dir=tmp_path / "data", engine_url=upstream.base_url)
    with running(config) as (server, admin):
        info = admin.post("/admin/sessions", json={}).json()
        answer = httpx.post(
            f"{server.url}/v1/chat/completions",
            json=CHAT,
            timeout=60,
            headers={"Authorization": f"Bearer {info['api_key']}"},
        )
        assert answer.status_code == 200, answer.text
    session = info["id"]
    _store_as_an_older_tapdeck_did(tmp_path / "data" / CAPTURE_DB, session)

    with running(config) as (server, admin):
        base = f"/admin/sessions/{session}"
        reads = {
            path: admin.get(base + path)
            for path in ("", "/rollout", "/trace", "/graph", "/turns/0", "/turns/1")
        }
        for path, resp in reads.items():
            assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        SessionDetail.model_validate(reads[""].json())
        GraphView.model_validate(reads["/graph"].json())
        doc = RolloutDocument.model_validate(reads["/rollout"].json())
        trace = TrainingTrace.model_validate(reads["/trace"].json())
        first, second = (TurnDetail.model_validate(reads[f"/turns/{i}"].json()) for i in (0, 1))

    # What could not be read is left out, and said so on the turn; the rest is as stored.
    assert "tool_calls" not in first.response and first.finish_reason == "stop"
    assert second.response == {}
    for turn, words in (
        (doc.turns[0], ["`response.tool_calls` is a string"]),
        (doc.turns[1], ["`response` is a string"]),
    ):
        found = [f for f in turn.findings if f.code == "stored_reply_malformed"]
        assert len(found) == 1 and found[0].level == "WARN" and found[0].turn == turn.seq, turn.findings
        assert all(w in found[0].detail for w in words), found[0].detail
    assert doc.turns[0].sampled_len
    assert trace.turns, trace
    for entry in trace.turns:
        assert "tool_calls" not in entry.response["choices"][0]["message"]
        assert any(f["code"] == "stored_reply_malformed" for f in entry.metadata["findings"])

    out = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [TAPDECK, "export", session, "--out", str(out), "--data-dir", str(tmp_path / "data")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("tool_calls" not in r["response"]["choices"][0]["message"] for r in rows)
    assert all(any(f["code"] == "stored_reply_malformed" for f in r["metadata"]["findings"]) for r in rows)
