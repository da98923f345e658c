"""Durable capture store: SQLite in WAL mode with `synchronous=FULL`, one file per data dir.

`append_turn` commits before it returns, so a turn whose append returned survives a crash
(kill -9, power loss as far as fsync goes). Writes are group-committed: a caller queues its write
and the first caller to get the write lock runs every queued write in one transaction (one fsync),
so concurrent sessions share the commit instead of queueing one fsync each. Reads use their own
connection and see only committed data. Token arrays are compact little-endian blobs. A turn's
prompt is stored as a delta: the id of a base turn, how many ids of that base's prompt+sampled
sequence it starts with, and the tail beyond them. The base is always a turn stored earlier and its
sequence never changes, so reconstruction stays exact even after the graph re-parents a node.

A harness resends the whole conversation on every call, so a turn's `messages` and `tools` lists
are stored content-addressed: each element once in `messages` (keyed by the sha256 of its
canonical JSON, written in the turn's transaction), the turn's request keeping only the keys, and
those as a delta too: `{"base": seq, "keep": n, "add": [...]}` is the first n keys of the session's
previously stored turn plus the new ones. A late turn of a long rollout then writes its new
messages and their keys, not the conversation nor a list that grows with it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import numpy as np
import orjson

from tapdeck.proxy.capture.graph import Link, RolloutGraph
from tapdeck.proxy.capture.interning import CONTENT_ADDRESSED, common_prefix, content_key
from tapdeck.proxy.capture.policy_stamp import PolicyStamp
from tapdeck.proxy.capture.reply_shape import readable_stored_reply
from tapdeck.proxy.capture.routing import routing_from_bytes, routing_to_bytes
from tapdeck.proxy.capture.tokens import (
    as_ids,
    ids_from_bytes,
    ids_to_bytes,
    logprobs_from_bytes,
    logprobs_to_bytes,
)
from tapdeck.proxy.capture.turn import Turn
from tapdeck.proxy.store.no_follow import refuse_link
from tapdeck.schema.findings import Finding

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
CREATE TABLE IF NOT EXISTS messages (
    hash TEXT PRIMARY KEY,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS routed_experts (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""
_LATER_TABLES = frozenset({"routed_experts"})
"""Tables a store written by an older tapdeck lacks: a read-only reader takes it as holding none
(a read-write open creates them)."""

_REPLAY_SCHEMA = """
CREATE TABLE IF NOT EXISTS replays (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    engine TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at REAL NOT NULL,
    doc BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS replay_turns (
    replay_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ref_logprobs BLOB,
    PRIMARY KEY (replay_id, seq)
);
"""
"""Replays (runner/replay): a session's sampled tokens scored under a reference engine, one row
per (session, engine, model, time) and its reference logprobs per turn (NULL: not scored). A layer
beside the capture: nothing here points into `turns`, and deleting a replay touches no other table.
Not part of `_SCHEMA`: a store of an older tapdeck opened read-only simply has no replays."""

POLICY_COLUMNS = (("policy_source", "TEXT"), ("policy_before", ""), ("policy_after", ""))
"""The policy version stamp of a turn (proxy/capture/policy_stamp.py): where it was read, and the
readings before and after the call (equal unless the call straddled a weight update). The
readings have no declared type, so SQLite keeps an int as an int and a label as text. Added to
`turns` by `_add_policy_columns`, to new stores and to those of an older tapdeck alike."""


def _add_policy_columns(db: sqlite3.Connection) -> None:
    """Migration step: the policy version columns, on a store that does not have them yet."""
    have = {row[1] for row in db.execute("PRAGMA table_info(turns)")}
    for name, kind in POLICY_COLUMNS:
        if name not in have:
            db.execute(f"ALTER TABLE turns ADD COLUMN {name} {kind}".rstrip())


def _has_policy_columns(db: sqlite3.Connection) -> bool:
    have = {row[1] for row in db.execute("PRAGMA table_info(turns)")}
    return all(name in have for name, _ in POLICY_COLUMNS)


_HASH_BATCH = 500
"""Keys per `IN (...)` lookup when loading (well under SQLite's bound-parameter limit)."""
_NONE_STORED: frozenset[str] = frozenset()
"""The stored keys of a session that stored none yet (shared: the lookup allocates nothing)."""


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def _split_request(
    request: dict[str, Any], known: dict[str, list[str]] | None
) -> tuple[dict[str, Any], dict[str, list[str]], dict[str, list[Any]]]:
    """The request with its content-addressed lists replaced by their keys (`known` ones reused),
    those keys by list name, and the lists by name."""
    stored = dict(request)
    keys: dict[str, list[str]] = {}
    lists: dict[str, list[Any]] = {}
    for name in CONTENT_ADDRESSED:
        values = request.get(name)
        if not isinstance(values, list):
            continue
        names = (known or {}).get(name)
        if names is None or len(names) != len(values):
            names = [content_key(value) for value in values]
        keys[name] = stored[name] = names
        lists[name] = values
    return stored, keys, lists


def _resolve_refs(docs: dict[int, dict[str, Any]], path: Path, session_id: str) -> None:
    """Replace each doc's key deltas (`{"base", "keep", "add"}`) with full key lists, in place."""
    for seq in docs:
        for name in docs[seq].get("refs", ()):
            chain = [seq]
            while not isinstance(ref := docs[chain[-1]]["request"][name], list):
                if ref["base"] not in docs:
                    raise ValueError(
                        f"{path}: turn {session_id}/{chain[-1]}'s {name} are stored "
                        f"against turn {ref['base']}, which is missing"
                    )
                chain.append(ref["base"])
            for s in reversed(chain[:-1]):
                ref = docs[s]["request"][name]
                docs[s]["request"][name] = docs[ref["base"]]["request"][name][: ref["keep"]] + ref["add"]


class _Write:
    """One queued write: the work to run inside the group transaction, then its outcome."""

    __slots__ = ("done", "error", "op", "result")

    def __init__(self, op: Callable[[sqlite3.Connection], Any]) -> None:
        self.op = op
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class NotAStoreError(sqlite3.DatabaseError):
    """The file is an SQLite database, but not a tapdeck capture store (a table or column of
    `_SCHEMA` is missing)."""


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    """NotAStoreError unless every table and column of `_SCHEMA` is in `db`: another program's
    database is named as such, not read as an empty store."""
    model = sqlite3.connect(":memory:")
    try:
        model.executescript(_SCHEMA)
        tables = [
            name
            for (name,) in model.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")
        ]
        for table in tables:
            want = [row[1] for row in model.execute(f"PRAGMA table_info({table})")]
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if not have and table in _LATER_TABLES:
                continue
            if not have:
                raise NotAStoreError(
                    f"{path} is an SQLite database but not a tapdeck capture store: it has no {table!r} table"
                )
            if missing := [c for c in want if c not in have]:
                raise NotAStoreError(
                    f"{path} is not a tapdeck capture store: its {table!r} table "
                    f"has no column {', '.join(map(repr, missing))}"
                )
    finally:
        model.close()


class Store:
    """Sessions and their captured turns. Thread-safe; writes from many threads share commits."""

    def __init__(self, path: Path, *, busy_timeout: float = 10.0, read_only: bool = False) -> None:
        """Open (read-write: creating the file and its tables) the store at `path`.

        `read_only` is for a reader beside the server (`tapdeck export`): the file must exist and
        hold a store (NotAStoreError otherwise), and nothing is written to it, so a database that
        is not a store is left exactly as it was rather than given tapdeck's tables.

        LinkRefused when a side file (`-wal`, `-shm`) or, read-write, the file itself is a
        symbolic link: SQLite follows one at the file and refuses one at a side file (a reader
        opens those too) as "unable to open database file", naming neither."""
        self.path = Path(path)
        self._read_only = read_only
        for suffix in ("-wal", "-shm") if read_only else ("", "-wal", "-shm"):
            refuse_link(f"{self.path}{suffix}")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.commits = 0
        """Write transactions committed (one per group of writes, not one per write)."""
        self._closed = False
        self._stored_keys: dict[str, set[str]] = {}
        """Per session, content keys it committed to `messages` (rows are never deleted), so a
        turn only hands SQLite the messages it adds; dropped with the session by `forget`."""
        self._previous: dict[str, tuple[int, dict[str, list[str]]]] = {}
        """Per session, the last committed turn's seq and content keys: the base of key deltas."""
        self._queue: list[_Write] = []
        self._queue_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._db = self._connect(busy_timeout)
        try:
            if read_only:
                _check_schema(self._db, self.path)
            else:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.executescript(_SCHEMA + _REPLAY_SCHEMA)
                _add_policy_columns(self._db)
            self._policy_columns = _has_policy_columns(self._db)
            """False only for a store of an older tapdeck opened read-only: its turns are unstamped."""
        except BaseException:
            self._db.close()
            raise
        self._reader = self._connect(busy_timeout)

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        # mode=ro: SQLite itself refuses every write, so a reader cannot change the file.
        target = f"file:{quote(str(self.path))}?mode=ro" if self._read_only else self.path
        db = sqlite3.connect(target, check_same_thread=False, isolation_level=None, uri=self._read_only)
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        return db

    @property
    def queued(self) -> int:
        """Writes waiting for the next group commit."""
        with self._queue_lock:
            return len(self._queue)

    def close(self) -> None:
        """Commit the writes still queued, then close (committed data is already on disk)."""
        with self._write_lock:
            with self._queue_lock:
                self._closed = True
                batch, self._queue = self._queue, []
            self._commit_group(batch)
            self._db.close()
        with self._read_lock:
            self._reader.close()

    def _write[T](self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run `op` in a committed write transaction, shared with whatever else is queued.

        Returns once the transaction holding `op` has committed (or failed): `op`'s result, or
        its error re-raised. An error of one write fails only that write (it runs in a
        savepoint); a failed BEGIN or COMMIT fails every write of the group.
        """
        item = _Write(op)
        with self._queue_lock:
            if self._closed:
                raise RuntimeError(f"store {self.path} is closed")
            self._queue.append(item)
        with self._write_lock:
            if not item.done:  # no earlier group took it: lead a group of everything queued
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit_group(batch)
        if item.error is not None:
            raise item.error
        return cast(T, item.result)  # what `op` returned: it raised nothing

    def _commit_group(self, batch: list[_Write]) -> None:
        """One transaction for `batch` (caller holds the write lock); outcomes set on each."""
        if not batch:
            return
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for item in batch:
                    db.execute("SAVEPOINT write")
                    try:
                        item.result = item.op(db)
                    except Exception as exc:  # noqa: BLE001 - the write's own error, handed to its caller
                        db.execute("ROLLBACK TO write")
                        item.error = exc
                    db.execute("RELEASE write")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self.commits += 1
        except BaseException as exc:
            # The leader's own interrupt is re-raised below; its group-mates get a plain error.
            shared = (
                exc
                if isinstance(exc, Exception)
                else RuntimeError(
                    f"write to {self.path} interrupted ({type(exc).__name__}); nothing committed"
                )
            )
            for item in batch:
                if item.error is None:
                    item.error, item.result = shared, None
            if shared is not exc:
                raise
        finally:
            for item in batch:
                item.done = True

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
        row = (record["id"], _dumps(record), float(record.get("created_at") or now), now)

        def insert(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO sessions (id, record, created_at, updated_at) VALUES (?, ?, ?, ?)", row)

        self._write(insert)

    def update_session(self, session_id: str, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into the stored record; returns the new record."""

        def update(db: sqlite3.Connection) -> dict[str, Any]:
            row = db.execute("SELECT record FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise KeyError(f"no session {session_id!r} in {self.path}")
            record: dict[str, Any] = orjson.loads(row[0]) | fields
            db.execute(
                "UPDATE sessions SET record = ?, updated_at = ? WHERE id = ?",
                (_dumps(record), time.time(), session_id),
            )
            return record

        return self._write(update)

    def list_sessions(self) -> list[dict[str, Any]]:
        """All session records, oldest first, each with `turns` (stored turn count)."""
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT s.record, (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id) "
                "FROM sessions s ORDER BY s.created_at, s.id"
            ).fetchall()
        return [orjson.loads(rec) | {"stored_turns": n} for rec, n in rows]

    def get_session(self, session_id: str) -> dict[str, Any]:
        """One session record; KeyError when unknown."""
        with self._read_lock:
            row = self._reader.execute("SELECT record FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise KeyError(f"no session {session_id!r} in {self.path}")
        record: dict[str, Any] = orjson.loads(row[0])
        return record

    # -- turns -----------------------------------------------------------------------------

    def append_turn(self, turn: Turn, link: Link) -> None:
        """Persist one captured call; committed (fsync'd) before this returns.

        The prompt is stored relative to `link.parent` when the link says the prompt starts
        with `link.offset` ids of the parent's sequence (prefix / retokenized edges) and the
        parent is already stored; otherwise whole.
        """
        prompt = as_ids(turn.prompt_ids) if turn.prompt_ids is not None else None
        sampled = as_ids(turn.sampled_ids) if turn.sampled_ids is not None else None
        request, keys, lists = _split_request(turn.request, turn.content_keys)
        with self._queue_lock:
            previous = self._previous.get(turn.session_id)
            stored = self._stored_keys.get(turn.session_id, _NONE_STORED)
        # Bodies keep the sender's key order (only the key is canonical), so loads are exact.
        # Only elements past the previous turn's keys can be new: those were all committed.
        new_bodies: dict[str, bytes] = {}
        base, held = previous if previous is not None else (-1, {})  # none held: nothing shared
        for name, names in keys.items():
            shared = common_prefix(names, held.get(name, []))
            request[name] = {"base": base, "keep": shared, "add": names[shared:]} if shared else names
            for key, value in zip(names[shared:], lists[name][shared:], strict=True):
                if key not in stored and key not in new_bodies:
                    new_bodies[key] = _dumps(value)
        doc = {
            "request": request,
            "refs": list(keys),
            "response": turn.response,
            "sampling": turn.sampling,
            "token_texts": turn.token_texts,
            "top_logprobs": turn.top_logprobs,
            "findings": [f.model_dump(mode="json") for f in turn.findings],
            "link_findings": [f.model_dump(mode="json") for f in link.findings],
            "meta": turn.meta,
            "has_logprobs": turn.logprobs is not None,
        }
        doc_b = _dumps(doc)
        sampled_b = None if sampled is None else ids_to_bytes(sampled)
        logprobs_b = None if turn.logprobs is None else logprobs_to_bytes(turn.logprobs)
        routing_b = None if turn.routed_experts is None else routing_to_bytes(turn.routed_experts)

        def insert(db: sqlite3.Connection) -> None:
            # Same transaction as the turn: a committed turn never points at a missing message.
            db.executemany("INSERT OR IGNORE INTO messages (hash, body) VALUES (?, ?)", new_bodies.items())
            # The base is looked up inside the transaction: it may be a turn of the same group.
            base_seq, base_len = None, 0
            if (
                prompt is not None
                and link.parent is not None
                and link.offset
                and link.kind in ("prefix", "retokenized")
            ):
                row = db.execute(
                    "SELECT prompt_len, length(sampled) FROM turns WHERE session_id = ? AND seq = ?",
                    (turn.session_id, link.parent),
                ).fetchone()
                if row is not None and row[0] is not None:
                    base_full = row[0] + (row[1] or 0) // 4
                    if link.offset <= min(base_full, prompt.size):
                        base_seq, base_len = link.parent, int(link.offset)
            db.execute(
                "INSERT INTO turns (session_id, seq, base_seq, base_len, prompt_len, "
                "prompt_tail, sampled, logprobs, finish_reason, link_parent, link_kind, "
                "link_offset, doc, created_at, policy_source, policy_before, policy_after) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    turn.session_id,
                    turn.seq,
                    base_seq,
                    base_len,
                    None if prompt is None else int(prompt.size),
                    None if prompt is None else ids_to_bytes(prompt[base_len:]),
                    sampled_b,
                    logprobs_b,
                    turn.finish_reason,
                    link.parent,
                    link.kind,
                    link.offset,
                    doc_b,
                    float(turn.created_at),
                    *((None, None, None) if turn.policy is None else turn.policy),
                ),
            )
            if routing_b is not None:
                db.execute(
                    "INSERT INTO routed_experts (session_id, seq, data) VALUES (?,?,?)",
                    (turn.session_id, turn.seq, routing_b),
                )

        self._write(insert)
        with self._queue_lock:
            self._previous[turn.session_id] = (turn.seq, keys)
            if new_bodies:
                self._stored_keys.setdefault(turn.session_id, set()).update(new_bodies)

    def forget(self, session_id: str) -> None:
        """Drop what the store keeps in memory for a session that takes no more turns."""
        with self._queue_lock:
            self._previous.pop(session_id, None)
            self._stored_keys.pop(session_id, None)

    def load_session(self, session_id: str) -> tuple[dict[str, Any], list[Turn]]:
        """The session record and its turns in arrival order, prompts rebuilt exactly."""
        record = self.get_session(session_id)
        with self._read_lock:
            rows = self._reader.execute(
                "SELECT seq, base_seq, base_len, prompt_len, prompt_tail, sampled, logprobs, "
                "finish_reason, doc, created_at, "
                + (
                    "policy_source, policy_before, policy_after"
                    if self._policy_columns
                    else "NULL, NULL, NULL"
                )
                + " FROM turns WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
            docs = [orjson.loads(row[8]) for row in rows]
            routing = self._routing(session_id)
            _resolve_refs({row[0]: doc for row, doc in zip(rows, docs, strict=True)}, self.path, session_id)
            contents = self._load_contents(docs)
        # Keep a rebuilt sequence only until the last turn stored against it has been rebuilt.
        last_use = {row[1]: row[0] for row in rows if row[1] is not None}
        sequences: dict[int, np.ndarray] = {}
        turns: list[Turn] = []
        for row, doc in zip(rows, docs, strict=True):
            seq, base_seq, base_len, prompt_len, tail, sampled_b, lp_b, finish, _doc_b, created = row[:10]
            source, before, after = row[10:13]
            request = doc["request"]
            for name in doc.get("refs", ()):
                request[name] = [contents[key] for key in request[name]]
            prompt = None
            sampled = None if sampled_b is None else ids_from_bytes(sampled_b)
            if prompt_len is not None:
                tail_ids = ids_from_bytes(tail)
                if base_seq is not None:
                    if base_seq not in sequences:
                        raise ValueError(
                            f"{self.path}: turn {session_id}/{seq} is stored against "
                            f"turn {base_seq}, which is missing"
                        )
                    prompt = np.concatenate([sequences[base_seq][:base_len], tail_ids])
                else:
                    prompt = tail_ids
                if prompt.size != prompt_len:
                    raise ValueError(
                        f"{self.path}: turn {session_id}/{seq} rebuilt to "
                        f"{prompt.size} prompt ids, {prompt_len} were stored"
                    )
                if seq in last_use:
                    sequences[seq] = prompt if sampled is None else np.concatenate([prompt, sampled])
            if base_seq is not None and last_use.get(base_seq) == seq:
                del sequences[base_seq]
            # What an older tapdeck stored without checking the engine's reply is read back in
            # the shape every reader takes, with a finding saying what was left out.
            response, unread = readable_stored_reply(doc["response"], seq)
            turns.append(
                Turn(
                    session_id=session_id,
                    seq=seq,
                    prompt_ids=prompt,
                    sampled_ids=sampled,
                    logprobs=None if lp_b is None else logprobs_from_bytes(lp_b),
                    routed_experts=None if seq not in routing else routing_from_bytes(routing[seq]),
                    finish_reason=finish,
                    request=request,
                    response=response,
                    sampling=doc["sampling"],
                    token_texts=doc["token_texts"],
                    top_logprobs=None
                    if doc["top_logprobs"] is None
                    else [[(t, lp) for t, lp in pos] for pos in doc["top_logprobs"]],
                    findings=[*(Finding.model_validate(f) for f in doc["findings"]), *unread],
                    meta=doc["meta"],
                    created_at=created,
                    policy=None if source is None else PolicyStamp(source, before, after),
                )
            )
        return record, turns

    def _routing(self, session_id: str) -> dict[int, bytes]:
        """A session's stored MoE routing by turn (caller holds the read lock); none from a
        read-only store an older tapdeck wrote, which has no such table."""
        try:
            rows = self._reader.execute(
                "SELECT seq, data FROM routed_experts WHERE session_id = ?", (session_id,)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if not (self._read_only and "no such table" in str(exc)):
                raise
            return {}
        return dict(rows)

    def _load_contents(self, docs: list[dict[str, Any]]) -> dict[str, Any]:
        """The messages / tools the docs refer to, by key; each parsed once and shared between
        turns (caller holds the read lock)."""
        keys = sorted({key for doc in docs for name in doc.get("refs", ()) for key in doc["request"][name]})
        contents: dict[str, Any] = {}
        for i in range(0, len(keys), _HASH_BATCH):
            chunk = keys[i : i + _HASH_BATCH]
            marks = ",".join("?" * len(chunk))
            for key, body in self._reader.execute(
                f"SELECT hash, body FROM messages WHERE hash IN ({marks})", chunk
            ):
                contents[key] = orjson.loads(body)
        missing = [k for k in keys if k not in contents]
        if missing:
            raise ValueError(f"{self.path}: {len(missing)} stored message(s) missing, e.g. {missing[0]}")
        return contents

    # -- replays --------------------------------------------------------------------------

    def _has_replays(self) -> bool:
        row = self._reader.execute("SELECT 1 FROM sqlite_master WHERE name = 'replays'").fetchone()
        return row is not None

    def save_replay(self, doc: dict[str, Any], ref_logprobs: dict[int, np.ndarray | None]) -> None:
        """Persist one replay (`doc` carries `id`, `session_id`, `engine`, `model`, `created_at`)
        and its reference logprobs per turn seq, aligned to that turn's sampled ids."""
        row = (
            doc["id"],
            doc["session_id"],
            doc["engine"],
            doc["model"],
            float(doc["created_at"]),
            _dumps(doc),
        )
        turns = [
            (doc["id"], seq, None if lp is None else logprobs_to_bytes(lp))
            for seq, lp in ref_logprobs.items()
        ]

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO replays (id, session_id, engine, model, created_at, doc) VALUES (?,?,?,?,?,?)",
                row,
            )
            db.executemany("INSERT INTO replay_turns (replay_id, seq, ref_logprobs) VALUES (?,?,?)", turns)

        self._write(insert)

    def list_replays(self, session_id: str) -> list[dict[str, Any]]:
        """The session's replay documents, oldest first."""
        with self._read_lock:
            if not self._has_replays():
                return []
            rows = self._reader.execute(
                "SELECT doc FROM replays WHERE session_id = ? ORDER BY created_at, id", (session_id,)
            ).fetchall()
        return [orjson.loads(doc) for (doc,) in rows]

    def replay_logprobs(self, replay_id: str) -> dict[int, np.ndarray | None]:
        """A replay's reference logprobs by turn seq (None: the turn was not scored)."""
        with self._read_lock:
            if not self._has_replays():
                return {}
            rows = self._reader.execute(
                "SELECT seq, ref_logprobs FROM replay_turns WHERE replay_id = ? ORDER BY seq", (replay_id,)
            ).fetchall()
        return {seq: None if blob is None else logprobs_from_bytes(blob) for seq, blob in rows}

    def latest_reference(self, session_id: str) -> tuple[str, dict[int, np.ndarray | None]] | None:
        """The session's latest replay as export columns take it: the reference's name
        (`model@engine`) and its logprobs by turn seq; None when the session has no replay."""
        replays = self.list_replays(session_id)
        if not replays:
            return None
        last = replays[-1]
        return f"{last['model']}@{last['engine']}", self.replay_logprobs(last["id"])

    def delete_replay(self, replay_id: str) -> bool:
        """Remove one replay; the capture is left exactly as it was. False when there is none."""

        def delete(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM replay_turns WHERE replay_id = ?", (replay_id,))
            return db.execute("DELETE FROM replays WHERE id = ?", (replay_id,)).rowcount > 0

        return self._write(delete)

    def load_graph(self, session_id: str) -> tuple[dict[str, Any], RolloutGraph]:
        """The session record and its rollout graph, rebuilt by re-adding turns in arrival order,
        with the calls the record demoted (`metadata.auxiliary_seqs`, e.g. those the harness's
        own trajectory never recorded) auxiliary again: every reader trains on the same turns."""
        record, turns = self.load_session(session_id)
        graph = RolloutGraph()
        for t in turns:
            graph.add(t)
        metadata = record.get("metadata") or {}
        graph.demote(metadata.get("auxiliary_seqs") or [], metadata.get("auxiliary_reason", ""))
        return record, graph
