"""Token and logprob arrays: the one in-memory form (numpy) and the one stored form (bytes).

Ids are int32 (every real vocabulary fits), logprobs float64. The stored form is raw
little-endian bytes: compact, exact, and decoded with a single `np.frombuffer` call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import orjson

ID_DTYPE = np.dtype("<i4")
LOGPROB_DTYPE = np.dtype("<f8")
_INT32 = np.iinfo(np.int32)


def as_ids(seq: Iterable[int] | np.ndarray | None) -> np.ndarray:
    """Return `seq` as a contiguous int32 array (no copy when it already is one).

    Raises ValueError when a value is not an integer or does not fit int32, so a bad id
    from the wire is reported instead of silently wrapping.
    """
    if seq is None:
        return np.zeros(0, dtype=ID_DTYPE)
    if isinstance(seq, np.ndarray):
        arr = seq
    else:
        seq = list(seq)
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in seq):
            bad = next(v for v in seq if isinstance(v, bool) or not isinstance(v, (int, np.integer)))
            raise ValueError(f"token id {bad!r} is not an integer")
        try:
            arr = np.asarray(seq, dtype=np.int64) if seq else np.zeros(0, dtype=np.int64)
        except OverflowError:  # past 64 bits, so past int32 too
            raise ValueError("token id out of int32 range") from None
    if arr.dtype == ID_DTYPE and arr.flags.c_contiguous and arr.ndim == 1:
        return arr
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
        raise ValueError("token id out of int32 range")
    return np.ascontiguousarray(arr, dtype=ID_DTYPE)


_PROMPT_IDS_KEY = re.compile(rb'"prompt_token_ids"\s*:\s*\[')
_SENTINEL = b'"\\u0000tapdeck-prompt-ids"'
_ID_CHARS = b"0123456789-, \t\r\n"


class PromptIdsMemo:
    """The last prompt-id list one session's engine replied with: its JSON text and its ids.

    An agent's next prompt starts with its last one, and the engine writes the same ids as the
    same text, so a reply whose list starts with the remembered text (ending at an id) is parsed
    from there on only: on a 107k-token prompt the whole list cost ~5.7 ms of CPU per call here
    (numpy's text parser, the character check and the comma count, each over ~600 kB), the new
    tail ~0.1 ms. Anything else is parsed whole; the result is the same either way.

    Nothing of the size of the prompt is copied on the way: the text is a view of the reply it
    was read from, and the ids are the start of a buffer with room after them, where the next
    reply's new ids are written (a prompt's ids were ~1 MB of copies per call at 107k tokens).
    """

    __slots__ = ("_filled", "_room", "ids", "text")

    def __init__(self) -> None:
        self.text: bytes | memoryview = b""
        self.ids: np.ndarray = np.zeros(0, dtype=ID_DTYPE)
        self._room: np.ndarray | None = None
        """The buffer `ids` starts when it is one of this memo's own (`extended`)."""
        self._filled = 0
        """How much of `_room` holds ids: where the next ones go."""

    def keep(self, text: bytes | memoryview, ids: np.ndarray) -> None:
        """Remember `ids` (read-only from now on: the reply shares the array) as parsed from `text`."""
        ids.setflags(write=False)
        if self._room is not None and ids.base is not self._room:
            self._room = None
        self.text, self.ids = text, ids

    def extended(self, new: np.ndarray) -> np.ndarray:
        """The remembered ids followed by `new`, written into the room after them.

        Arrays handed out before are never written to: they end where the room begins, and the
        memo only grows (a reply that does not extend it is parsed whole and replaces it)."""
        n, k = self.ids.size, new.size
        room = self._room
        # `keep` drops the room when it is handed ids from elsewhere. `_filled` catches ids that
        # stop short of what the room holds (a second call before `keep`): writing after them
        # would change an array already handed out.
        if room is None or n != self._filled or room.size < n + k:
            room = np.empty(max(2 * (n + k), 1024), dtype=ID_DTYPE)
            room[:n] = self.ids
            self._room = room
        room[n : n + k] = new
        self._filled = n + k
        return room[: n + k]


def loads_with_prompt_ids(body: bytes, memo: PromptIdsMemo | None = None) -> object:
    """`orjson.loads(body)`, with a top-level `prompt_token_ids` list decoded straight into an
    int32 array (`as_ids`'s form) instead of a Python list of ints.

    On a 110k-token prompt building that list and then an array from it was about half the
    proxy's CPU per call. The list's bytes are parsed by numpy and replaced by a sentinel before
    the rest is parsed; anything unexpected (the key nested elsewhere, non-integer items) takes
    the plain path, so the result is the same as `orjson.loads` except for that one field's type.
    An id int32 cannot hold also takes the plain path, where the caller's check reports it.
    With a `memo` (the session's last list) only the part after the remembered ids is parsed and
    range-checked, and the memo then holds this list.
    """
    found = _PROMPT_IDS_KEY.search(body)
    if found is None:
        return orjson.loads(body)
    start = found.end()
    end = body.find(b"]", start)
    if end < 0:
        return orjson.loads(body)
    known, tail = _after_known(body, start, end, memo)
    if tail.translate(None, _ID_CHARS):
        return orjson.loads(body)
    payload = orjson.loads(body[: start - 1] + _SENTINEL + body[end + 1 :])
    if not isinstance(payload, dict) or payload.get("prompt_token_ids") != _SENTINEL_TEXT:
        return orjson.loads(body)  # the key was not the top-level one
    if tail.strip():
        try:
            new = np.fromstring(tail, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):  # an empty item, with warnings as errors
            return orjson.loads(body)
        if new.size != tail.count(b",") + 1:  # numpy stops at an empty item (",,")
            return orjson.loads(body)
        # Narrowed here, over the new ids only: the array as a whole then needs no range pass or
        # copy in `as_ids` (a 107k-id prompt's cost every call, not just its new tail's).
        try:
            new = as_ids(new)
        except ValueError:  # an id int32 cannot hold
            return orjson.loads(body)
    else:
        new = np.zeros(0, dtype=ID_DTYPE)
    if known is None:
        ids = new
    elif new.size:
        assert memo is not None  # `known` is the memo's
        ids = memo.extended(new)
    else:
        ids = known
    if memo is not None:
        memo.keep(memoryview(body)[start:end], ids)
    payload["prompt_token_ids"] = ids
    return payload


def _after_known(
    body: bytes, start: int, end: int, memo: PromptIdsMemo | None
) -> tuple[np.ndarray | None, bytes]:
    """`(ids already known, the list's text still to parse)`: the memo's ids and the text after
    them and their comma when the list starts with the memo's text ending at an id; else
    `(None, the whole list)`."""
    if memo is not None and memo.text and body.startswith(memo.text, start, end):
        rest = body[start + len(memo.text) : end].lstrip()
        if not rest:
            return memo.ids, b""
        if rest[:1] == b",":
            return memo.ids, rest[1:]
    return None, body[start:end]


_SENTINEL_TEXT = orjson.loads(_SENTINEL)


def as_logprobs(seq: Iterable[float | None] | np.ndarray | None) -> np.ndarray:
    """Return `seq` as a contiguous float64 array; `None` entries become NaN (not trainable)."""
    if seq is None:
        return np.zeros(0, dtype=LOGPROB_DTYPE)
    if isinstance(seq, np.ndarray):
        return np.ascontiguousarray(seq, dtype=LOGPROB_DTYPE).reshape(-1)
    return np.asarray([np.nan if v is None else float(v) for v in seq], dtype=LOGPROB_DTYPE)


def ids_to_bytes(ids: np.ndarray | None) -> bytes:
    """Compact binary form of a token id array (little-endian int32)."""
    return as_ids(ids).tobytes()


def ids_from_bytes(blob: bytes | None) -> np.ndarray:
    """Inverse of `ids_to_bytes` (a read-only view is copied so callers may mutate it)."""
    if not blob:
        return np.zeros(0, dtype=ID_DTYPE)
    return np.frombuffer(blob, dtype=ID_DTYPE).copy()


def logprobs_to_bytes(logprobs: np.ndarray | None) -> bytes:
    """Compact binary form of a logprob array (little-endian float64)."""
    return as_logprobs(logprobs).tobytes()


def logprobs_from_bytes(blob: bytes | None) -> np.ndarray:
    """Inverse of `logprobs_to_bytes`."""
    if not blob:
        return np.zeros(0, dtype=LOGPROB_DTYPE)
    return np.frombuffer(blob, dtype=LOGPROB_DTYPE).copy()
