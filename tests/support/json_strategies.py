"""Hypothesis strategies for arbitrary JSON, shared by the two fuzz tests (routes and engine replies)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st


def json_values(
    keys: Sequence[str], words: Sequence[str], *, text_size: int, max_leaves: int
) -> st.SearchStrategy[Any]:
    """Any JSON value: scalars of every type (64-bit integers, finite floats, short text, and
    `words`, the values the code under test looks for), in lists and objects up to three wide
    whose keys are mostly `keys` (the fields it reads)."""
    leaf = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=text_size)
        | st.sampled_from(list(words))
    )
    key = st.sampled_from(list(keys)) | st.text(max_size=text_size // 2)
    return st.recursive(
        leaf,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(key, inner, max_size=3),
        max_leaves=max_leaves,
    )
