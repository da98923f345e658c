"""What the host sandbox keeps of a command's output: its last bytes, up to a bound.

Every chunk still reaches the output callback as it comes; what `exec` returns stays in the memory
of the server, which every rollout shares, so a trial printing without end must not grow it
without end. The most recent output is kept (an agent's failure message and a harness's final
summary come from there), after a line saying how much was cut.
"""

from __future__ import annotations

from collections import deque

OUTPUT_LIMIT_BYTES = 64 * 1024 * 1024
"""Per stream of one command: far above any harness's real output (Harbor's sail backend keeps
the same amount)."""


class OutputTail:
    """The last `limit` bytes of one stream, and how many came before them."""

    def __init__(self, limit: int = OUTPUT_LIMIT_BYTES) -> None:
        if limit < 1:
            raise ValueError(f"an output limit must be at least 1 byte, not {limit}")
        self.limit = limit
        self.dropped = 0
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def add(self, chunk: bytes) -> None:
        """Keep `chunk`, dropping the oldest bytes beyond the limit."""
        self._chunks.append(chunk)
        self._size += len(chunk)
        while self._size > self.limit:
            first = self._chunks[0]
            excess = self._size - self.limit
            if len(first) <= excess:
                self._chunks.popleft()
                cut = len(first)
            else:
                self._chunks[0] = first[excess:]
                cut = excess
            self._size -= cut
            self.dropped += cut

    def text(self) -> str | None:
        """The kept output as text (None when there was none), led by a note when some was cut."""
        if not self._size and not self.dropped:
            return None
        kept = b"".join(self._chunks).decode("utf-8", errors="replace")
        if not self.dropped:
            return kept
        return (
            f"[tapdeck host sandbox: {self.dropped} earlier bytes of this output were cut; "
            f"the last {self.limit} are kept]\n{kept}"
        )
