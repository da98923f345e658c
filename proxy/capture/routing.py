"""MoE routing an engine reports per token, kept so a trainer can replay the experts the sampler used.

vLLM started with `--enable-return-routed-experts` answers each choice with `routed_experts`: a
base64 string of `.npy` bytes holding an integer array of shape (prompt tokens + completion tokens
- 1, MoE layers, experts per token), uint8, uint16 or int32. The last sampled token was never
forwarded, so it has no row. It is null when the server does not return routing, or when the
request ended before any forward pass. The same field rides on `/v1/completions` choices, so a
token-in call (`proxy/upstream/token_in.py`) keeps it.

In memory a turn holds the decoded array; stored and exported it is `.npy` bytes (dtype and shape
kept, exact), base64 where the export is JSON, as vLLM sends it.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

from tapdeck.schema.findings import Finding


def _load(data: bytes) -> np.ndarray:
    arr = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(arr, np.ndarray):
        raise ValueError("not one array")
    return arr


def read_routed_experts(raw: Any, tokens: int | None) -> tuple[np.ndarray | None, list[Finding]]:
    """A choice's `routed_experts` decoded, and why it was left out when it was.

    `tokens` is the call's prompt plus completion length (None when the reply had no ids to check
    against). A value that is not vLLM's encoding, not a 3-dimensional integer array, or whose rows
    do not cover every token but the last is left out with a WARN `bad_routed_experts`: the turn
    still trains, without routing to replay."""
    if raw is None:
        return None, []
    if not isinstance(raw, str):
        return None, [_bad(f"a {type(raw).__name__}, not base64 .npy text")]
    try:
        arr = _load(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError, EOFError, OSError) as exc:
        return None, [_bad(f"not base64 .npy text ({exc})")]
    if arr.ndim != 3 or arr.dtype.kind not in "iu":
        return None, [_bad(f"shape {arr.shape} of {arr.dtype}, not (tokens, layers, experts) integers")]
    if tokens is not None and arr.shape[0] != tokens - 1:
        return None, [_bad(f"{arr.shape[0]} rows for {tokens} tokens (every token but the last has one)")]
    return np.ascontiguousarray(arr), []


def _bad(why: str) -> Finding:
    return Finding.warn("bad_routed_experts", f"choices[0].routed_experts left out: {why}")


def routing_to_bytes(arr: np.ndarray) -> bytes:
    """The stored form: `.npy` bytes."""
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def routing_from_bytes(data: bytes) -> np.ndarray:
    """An array from its stored form."""
    return _load(data)


def routing_text(arr: np.ndarray | None) -> str | None:
    """The exported form: base64 `.npy` text, as vLLM sends it (None stays None)."""
    return None if arr is None else base64.b64encode(routing_to_bytes(arr)).decode("ascii")
