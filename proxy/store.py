"""Durable capture store: SQLite in WAL mode with `synchronous=FULL`, one file per data dir.

`append_turn` commits before it returns, so a turn whose append returned survives a crash
(kill -9, power loss as far as fsync goes). Token arrays are compact little-endian blobs. A turn's
prompt is stored as a delta: the id of a base turn, how many ids of that base's prompt+sampled
sequence it starts with, and the tail beyond them. The base is always a turn stored earlier and its
sequence never changes, so reconstruction stays exact even after the graph re-parents a node.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tapdeck.proxy.findings import Finding
from tapdeck.proxy.graph import Link, RolloutGraph
from tapdeck.proxy.tokens import (
    as_ids,
    ids_from_bytes,
    ids_to_bytes,
    logprobs_from_bytes,
    logprobs_to_bytes,
)
from tapdeck.proxy.turn import Turn

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    record BLOB NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    base_seq INTEGER,
    base_len INTEGER NOT NULL DEFAULT 0,
    prompt_len INTEGER,
    prompt_tail BLOB,
    sampled BLOB,
    logprobs BLOB,
    finish_reason TEXT,
    link_parent INTEGER,
    link_kind TEXT,
    link_offset INTEGER,
    doc BLOB NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


class Store:
    """Sessions and their captured turns. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection (committed data is already on disk)."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions --------------------------------------------------------------------------

    def create_session(self, record: dict[str, Any]) -> None:
        """Persist a new session record (must carry `id`)."""
        if not record.get("id"):
            raise ValueError("session record needs an 'id'")
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions (id, record, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (record["id"], _dumps(record), float(record.get("created_at") or now), now))

    def update_session(self, session_id: str, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into the stored record; returns the new record."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT record FROM sessions WHERE id = ?",
                                       (session_id,)).fetchone()
                if row is None:
                    raise KeyError(f"no session {session_id!r} in {self.path}")
                record = orjson.loads(row[0]) | fields
                self._db.execute("UPDATE sessions SET record = ?, updated_at = ? WHERE id = ?",
                                 (_dumps(record), time.time(), session_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return record

    def list_sessions(self) -> list[dict[str, Any]]:
        """All session records, oldest first, each with `turns` (stored turn count)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT s.record, (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id) "
                "FROM sessions s ORDER BY s.created_at, s.id").fetchall()
        return [orjson.loads(rec) | {"stored_turns": n} for rec, n in rows]

    def get_session(self, session_id: str) -> dict[str, Any]:
        """One session record; KeyError when unknown."""
        with self._lock:
            row = self._db.execute("SELECT record FROM sessions WHERE id = ?",
                                   (session_id,)).fetchone()
        if row is None:
            raise KeyError(f"no session {session_id!r} in {self.path}")
        return orjson.loads(row[0])

    # -- turns -----------------------------------------------------------------------------

    def append_turn(self, turn: Turn, link: Link) -> None:
        """Persist one captured call; committed (fsync'd) before this returns.

        The prompt is stored relative to `link.parent` when the link says the prompt starts
        with `link.offset` ids of the parent's sequence (prefix / retokenized edges) and the
        parent is already stored; otherwise whole.
        """
        prompt = as_ids(turn.prompt_ids) if turn.prompt_ids is not None else None
        sampled = as_ids(turn.sampled_ids) if turn.sampled_ids is not None else None
        doc = {
            "request": turn.request, "response": turn.response, "sampling": turn.sampling,
            "token_texts": turn.token_texts,
            "top_logprobs": turn.top_logprobs,
            "findings": [f.model_dump(mode="json") for f in turn.findings],
            "link_findings": [f.model_dump(mode="json") for f in link.findings],
            "meta": turn.meta, "has_logprobs": turn.logprobs is not None,
        }
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                base_seq, base_len = None, 0
                if (prompt is not None and link.parent is not None and link.offset
                        and link.kind in ("prefix", "retokenized")):
                    row = self._db.execute(
                        "SELECT prompt_len, length(sampled) FROM turns "
                        "WHERE session_id = ? AND seq = ?", (turn.session_id, link.parent)).fetchone()
                    if row is not None and row[0] is not None:
                        base_full = row[0] + (row[1] or 0) // 4
                        if link.offset <= min(base_full, prompt.size):
                            base_seq, base_len = link.parent, int(link.offset)
                self._db.execute(
                    "INSERT INTO turns (session_id, seq, base_seq, base_len, prompt_len, "
                    "prompt_tail, sampled, logprobs, finish_reason, link_parent, link_kind, "
                    "link_offset, doc, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (turn.session_id, turn.seq, base_seq, base_len,
                     None if prompt is None else int(prompt.size),
                     None if prompt is None else ids_to_bytes(prompt[base_len:]),
                     None if sampled is None else ids_to_bytes(sampled),
                     None if turn.logprobs is None else logprobs_to_bytes(turn.logprobs),
                     turn.finish_reason, link.parent, link.kind, link.offset, _dumps(doc),
                     float(turn.created_at)))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load_session(self, session_id: str) -> tuple[dict[str, Any], list[Turn]]:
        """The session record and its turns in arrival order, prompts rebuilt exactly."""
        record = self.get_session(session_id)
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, base_seq, base_len, prompt_len, prompt_tail, sampled, logprobs, "
                "finish_reason, doc, created_at FROM turns WHERE session_id = ? ORDER BY seq",
                (session_id,)).fetchall()
        # Keep a rebuilt sequence only until the last turn stored against it has been rebuilt.
        last_use = {row[1]: row[0] for row in rows if row[1] is not None}
        sequences: dict[int, np.ndarray] = {}
        turns: list[Turn] = []
        for (seq, base_seq, base_len, prompt_len, tail, sampled_b, lp_b, finish, doc_b,
             created) in rows:
            doc = orjson.loads(doc_b)
            prompt = None
            sampled = None if sampled_b is None else ids_from_bytes(sampled_b)
            if prompt_len is not None:
                tail_ids = ids_from_bytes(tail)
                if base_seq is not None:
                    if base_seq not in sequences:
                        raise ValueError(f"{self.path}: turn {session_id}/{seq} is stored against "
                                         f"turn {base_seq}, which is missing")
                    prompt = np.concatenate([sequences[base_seq][:base_len], tail_ids])
                else:
                    prompt = tail_ids
                if prompt.size != prompt_len:
                    raise ValueError(f"{self.path}: turn {session_id}/{seq} rebuilt to "
                                     f"{prompt.size} prompt ids, {prompt_len} were stored")
                if seq in last_use:
                    sequences[seq] = prompt if sampled is None else np.concatenate([prompt, sampled])
            if base_seq is not None and last_use.get(base_seq) == seq:
                del sequences[base_seq]
            turns.append(Turn(
                session_id=session_id, seq=seq, prompt_ids=prompt, sampled_ids=sampled,
                logprobs=None if lp_b is None else logprobs_from_bytes(lp_b),
                finish_reason=finish, request=doc["request"], response=doc["response"],
                sampling=doc["sampling"], token_texts=doc["token_texts"],
                top_logprobs=None if doc["top_logprobs"] is None else
                [[(t, lp) for t, lp in pos] for pos in doc["top_logprobs"]],
                findings=[Finding.model_validate(f) for f in doc["findings"]],
                meta=doc["meta"], created_at=created))
        return record, turns

    def load_graph(self, session_id: str) -> tuple[dict[str, Any], RolloutGraph]:
        """The session record and its rollout graph, rebuilt by re-adding turns in arrival order."""
        record, turns = self.load_session(session_id)
        graph = RolloutGraph()
        for t in turns:
            graph.add(t)
        return record, graph
