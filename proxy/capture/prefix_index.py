"""The prefix index of the rollout graph: token sequences found by the hashes of their prefixes.

Prefixes are hashed vectorised (two independent 64-bit polynomial hashes over per-token random
values, numpy uint64 wrap-around arithmetic: a gather, a multiply and a cumsum per hash). A
`LengthIndex` holds sequences by (length, hash1, hash2); a prompt's longest indexed prefix is found
with one vectorised `searchsorted` over the sorted keys at the distinct lengths below the prompt's
length, with no per-sequence Python work. Two independent 64-bit hashes plus the length make a false
match negligible.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import numpy.typing as npt


class PrefixHasher:
    """Two polynomial hashes (independent random bases) of every prefix of a token array.

    Tokens are first mapped through one table of random odd 64-bit values (ids outside the table
    through splitmix64), which keeps structured id sequences from colliding. Vectorised: one
    gather, then a multiply and a cumsum per hash, all wrapping uint64.
    """

    _TABLE_BITS = 18

    def __init__(self, seed: int = 0x7A9DEC) -> None:
        rng = np.random.default_rng(seed)
        size = 1 << self._TABLE_BITS
        self._table = rng.integers(0, 2**63, size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._bases = [np.uint64(int(rng.integers(1, 2**62)) * 2 + 1) for _ in range(2)]
        self._powers = [np.ones(1, dtype=np.uint64) for _ in range(2)]

    def _power(self, which: int, start: int, stop: int) -> np.ndarray:
        pw = self._powers[which]
        if pw.size < stop:
            grow = max(stop, 2 * pw.size) - pw.size
            ext = np.cumprod(np.full(grow, self._bases[which], dtype=np.uint64)) * pw[-1]
            pw = self._powers[which] = np.concatenate([pw, ext])
        return pw[start:stop]

    def prefix_hashes(
        self, ids: np.ndarray, offset: int = 0, start: tuple[int, int] = (0, 0)
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(g1, g2)` with `g[i]` = hash of `prefix + ids[:i]` for i in 0..len(ids), where the
        prefix has length `offset` and hashes `start` (`g[0]`), so a sequence can be hashed in
        pieces."""
        mask = (1 << self._TABLE_BITS) - 1
        vals = self._table[ids & mask]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > mask):
            wide = (ids < 0) | (ids > mask)
            vals[wide] = _splitmix(ids[wide].astype(np.int64).view(np.uint64))
        out = []
        for which in range(2):
            # Ufuncs into one buffer: np.cumsum and a separate start add cost ~10 µs of call
            # overhead each on the few dozen ids a reply or an observation adds.
            g = np.empty(ids.size + 1, dtype=np.uint64)
            g[0] = start[which]
            np.multiply(vals, self._power(which, offset, offset + ids.size), out=g[1:])
            out.append(np.add.accumulate(g, out=g))
        return out[0], out[1]

    def window(
        self, ids: np.ndarray, base: int = 0, start: tuple[int, int] = (0, 0)
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(g1, g2)` with `g[i]` = hash of `ids[:base + i]` for i in 0..len(ids) - base, given
        `start`, the hashes of `ids[:base]` (only `ids[base:]` is hashed)."""
        return self.prefix_hashes(ids[base:], base, start)


def _splitmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


HASHER = PrefixHasher()
_MIX_INT = 0x9E3779B97F4A7C15
_MIX = np.uint64(_MIX_INT)
_U64 = (1 << 64) - 1


Key = tuple[int, int, int]
"""(length, hash1, hash2) of a token sequence."""


class LengthIndex:
    """Token sequences indexed by (length, hash1, hash2); queried with a prompt's prefix hashes."""

    _SCALAR_PROBES = 8
    """At most this many candidate lengths are looked up one by one; more take the vectorised
    probe. An extending call has one or two (the last call's end), where a dozen small numpy
    calls cost more than the lookups they save."""

    def __init__(self) -> None:
        self._by_key: dict[Key, list[int]] = {}
        self._lens: list[int] = []
        """Distinct lengths, sorted."""
        self._len_count: dict[int, int] = {}
        self._packed: list[int] = []
        """`_pack` of every key, sorted."""
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        """`_lens` and `_packed` as arrays for the vectorised probe, built when first needed
        after an add (an extending call never needs them)."""

    @staticmethod
    def _pack(length: np.ndarray, h1: np.ndarray) -> np.ndarray:
        return np.asarray(h1, dtype=np.uint64) ^ (np.asarray(length, dtype=np.uint64) * _MIX)

    def add(self, key: Key, seq: int) -> None:
        bisect.insort(self._by_key.setdefault(key, []), seq)
        length = key[0]
        count = self._len_count.get(length, 0)
        if count == 0:
            bisect.insort(self._lens, length)
        self._len_count[length] = count + 1
        bisect.insort(self._packed, key[1] ^ ((length * _MIX_INT) & _U64))  # `_pack`, exactly
        self._arrays = None

    def get(self, key: Key) -> list[int]:
        return self._by_key.get(key, [])

    def longest(
        self, g1: np.ndarray, g2: np.ndarray, base: int, lo: int, hi: int, accept: Any = None
    ) -> tuple[int, list[int]] | None:
        """Longest length L with lo < L <= hi whose prefix hash is indexed: `(L, seqs)`.

        `g1`, `g2` are a window from `PrefixHasher.window` starting at length `base`; lengths
        below `base` are not looked at.
        """
        lo = max(lo, base - 1)
        if not self._packed or hi <= lo:
            return None
        a, b = bisect.bisect_right(self._lens, lo), bisect.bisect_right(self._lens, hi)
        if a == b:
            return None
        if b - a <= self._SCALAR_PROBES:
            hits = self._lens[a:b]  # each is looked up by its full key below
        else:
            if self._arrays is None:
                self._arrays = (np.array(self._lens, dtype=np.int64), np.array(self._packed, dtype=np.uint64))
            lens, packed = self._arrays
            cand = lens[a:b]
            probe = self._pack(cand, g1[cand - base])
            pos = np.searchsorted(packed, probe)
            pos[pos >= packed.size] = 0
            hits = cand[packed[pos] == probe].tolist()
        for length in reversed(hits):
            seqs = self._by_key.get((length, int(g1[length - base]), int(g2[length - base])))
            if seqs:
                ok = [s for s in seqs if accept is None or accept(s)]
                if ok:
                    return length, ok
        return None
