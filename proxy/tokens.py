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
        arr = np.asarray(seq, dtype=np.int64) if seq else np.zeros(0, dtype=np.int64)
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


def loads_with_prompt_ids(body: bytes) -> object:
    """`orjson.loads(body)`, with a top-level `prompt_token_ids` list decoded straight into an
    int64 array instead of a Python list of ints.

    On a 110k-token prompt building that list and then an array from it was about half the
    proxy's CPU per call. The list's bytes are parsed by numpy and replaced by a sentinel before
    the rest is parsed; anything unexpected (the key nested elsewhere, non-integer items) takes
    the plain path, so the result is the same as `orjson.loads` except for that one field's type.
    """
    found = _PROMPT_IDS_KEY.search(body)
    if found is None:
        return orjson.loads(body)
    start = found.end()
    end = body.find(b"]", start)
    span = body[start:end]
    if end < 0 or span.translate(None, _ID_CHARS):
        return orjson.loads(body)
    payload = orjson.loads(body[:start - 1] + _SENTINEL + body[end + 1:])
    if not isinstance(payload, dict) or payload.get("prompt_token_ids") != _SENTINEL_TEXT:
        return orjson.loads(body)  # the key was not the top-level one
    if span.strip():
        try:
            ids = np.fromstring(span, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):  # an empty item, with warnings as errors
            return orjson.loads(body)
        if ids.size != span.count(b",") + 1:  # numpy stops at an empty item (",,")
            return orjson.loads(body)
    else:
        ids = np.zeros(0, dtype=np.int64)
    payload["prompt_token_ids"] = ids
    return payload


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
