"""The bounded tail of a command's output the host sandbox returns."""

from __future__ import annotations

import pytest

from tapdeck.runner.sandboxes.output_tail import OutputTail


def test_the_tail_keeps_exactly_the_last_bytes_across_chunk_boundaries() -> None:
    tail = OutputTail(limit=10)
    for chunk in (b"abc", b"defghijk", b"lmnopq", b"r"):
        tail.add(chunk)
    assert tail.dropped == 8
    assert tail.text().splitlines() == [
        "[tapdeck host sandbox: 8 earlier bytes of this output were cut; the last 10 are kept]",
        "ijklmnopqr",
    ]


def test_output_under_the_limit_comes_back_whole_and_none_stays_none() -> None:
    tail = OutputTail(limit=10)
    assert tail.text() is None
    tail.add("né\n".encode())
    assert tail.text() == "né\n" and tail.dropped == 0


def test_a_limit_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        OutputTail(limit=0)
