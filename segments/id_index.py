"""The per-segment id index: sorted 64-bit fingerprints of the ``_id`` column.

Built once per reader from the ``_id`` column; a batch lookup computes the queries'
fingerprints once, binary-searches them (``numpy.searchsorted``) and confirms each
candidate by comparing the ids themselves, so a fingerprint collision never yields a
wrong row.  Measured against ``pc.index_in`` (its hash table cannot be kept between
calls) and ``searchsorted`` over fixed-width id bytes: 125 ms against 610–1,150 ms and
500 ms for 50k lookups over 5M ids in 50 segments (docs/design/segments.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_FP_KEYS = np.random.default_rng(0x5EB5).integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)


def _fixed_width(arr: pa.Array) -> np.ndarray:
    """Strings -> 2-D uint8 matrix (rows zero-padded to the longest), columnar."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.binary())
    n = len(arr)
    if n == 0:
        return np.zeros((0, 1), dtype=np.uint8)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]] if offsets[-1] > offsets[0] else np.zeros(0, np.uint8)
    lens = np.diff(offsets)
    width = int(lens.max()) if n else 0
    if width == 0:
        return np.zeros((n, 1), dtype=np.uint8)
    if int(lens.min()) == width:
        return data.reshape(n, width)
    m = np.zeros((n, width), dtype=np.uint8)
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(data.size) - np.repeat(offsets[:-1] - offsets[0], lens)
    m[rows, cols] = data
    return m


def fingerprints(ids: pa.Array) -> np.ndarray:
    """A 64-bit fingerprint per id: the id's bytes, zero-padded to whole 64-bit words,
    summed as ``word_i * K_i`` (odd random keys) then mixed.  Zero padding adds
    nothing, so the padded width does not change an id's fingerprint.

    Each word is gathered straight from the ids' data buffer (8 bytes from the id's start + 8i, through a
    sliding-window view, the bytes past its end masked off) instead of scattering every byte into the
    zero-padded matrix of :func:`_fixed_width` first: the same words (the matrix form stays as the
    reference of ``tests/segments/test_id_index.py``), one gather per word instead of a scatter per byte."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    ids = ids.cast(pa.binary())
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset : ids.offset + n + 1].astype(np.int64)
    lens = np.diff(offsets)
    words = (int(lens.max()) + 7) // 8
    if words > len(_FP_KEYS):
        raise ValueError(f"ids longer than {8 * len(_FP_KEYS)} bytes")
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8)[lo:hi] if hi > lo else np.zeros(0, np.uint8)
    padded = np.concatenate([data, np.zeros(8 * words + 8, dtype=np.uint8)])
    starts = offsets[:-1] - lo
    windows = np.lib.stride_tricks.sliding_window_view(padded, 8)  # row p: bytes p..p+7, no copy

    def word(i: int) -> np.ndarray:
        x = windows[starts + 8 * i].view("<u8").ravel()  # one 8-byte row per id, gathered
        left = np.clip(lens - 8 * i, 0, 8)  # the id's bytes in this word; the rest is masked to zero padding
        x &= np.where(left >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                      (np.uint64(1) << (np.uint64(8) * np.minimum(left, 7).astype(np.uint64))) - np.uint64(1))
        return x

    return _mix(n, (word(i) for i in range(max(words, 1))))


def _mix(n: int, words: Iterable[np.ndarray]) -> np.ndarray:
    """The fingerprints of ``n`` ids from their 64-bit words, word ``i`` of every id at a time (keyed sum, mixed)."""
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, w in enumerate(words):
            x = w * _FP_KEYS[i]
            x ^= x >> np.uint64(32)
            h += x
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(29)
    return h


def _fingerprints_of_matrix(ids: pa.Array) -> np.ndarray:
    """:func:`fingerprints` over :func:`_fixed_width`'s zero-padded matrix: the reference its tests compare with."""
    m = _fixed_width(ids)
    n, width = m.shape
    words = (width + 7) // 8
    if width % 8:
        m = np.concatenate([m, np.zeros((n, words * 8 - width), dtype=np.uint8)], axis=1)
    w = np.ascontiguousarray(m).view("<u8")  # (n, words)
    return _mix(n, (w[:, i] for i in range(words)))


@dataclass(frozen=True, eq=False)
class SortedKeys:
    """A batch of ids' fingerprints in ascending order (``fp``) and each one's position in the batch (``pos``).

    A primary computes them once per bulk and every lookup of that bulk shares them (its buffered runs and the
    shard-wide index); the run the bulk then becomes in the indexing buffer keeps them as its own index, so the
    next bulk's lookup of that run is a ``searchsorted`` (issue 44: a 50,000-id bulk spent 2-3 ms per buffered run
    building an ``index_in`` hash table of the run's ids, again for every later bulk)."""

    fp: np.ndarray  # uint64, ascending
    pos: np.ndarray  # int64: fp[i] is the fingerprint of ids[pos[i]]

    @classmethod
    def of(cls, ids: pa.Array) -> SortedKeys:
        """The sorted fingerprints of ``ids``."""
        h = fingerprints(ids)
        order = np.argsort(h)  # not stable: equal fingerprints are told apart by their ids (see _IdIndex)
        return cls(h[order], order.astype(np.int64))

    @property
    def distinct(self) -> bool:
        """Whether no two ids share a fingerprint."""
        return len(self.fp) < 2 or not bool((self.fp[1:] == self.fp[:-1]).any())

    @classmethod
    def merged(cls, parts: Sequence[SortedKeys], sizes: Sequence[int]) -> SortedKeys:
        """The sorted fingerprints of the concatenation of batches of ``sizes`` ids whose keys are ``parts``.

        A stable sort of the concatenated runs (numpy's timsort finds the sorted runs and merges them): no id's
        fingerprint is computed again, and k runs cost n log k, not the n log n of sorting fresh fingerprints."""
        if len(parts) == 1:
            return parts[0]
        starts = np.cumsum([0, *sizes[:-1]], dtype=np.int64)
        fp = np.concatenate([k.fp for k in parts]) if parts else np.zeros(0, np.uint64)
        pos = np.concatenate([k.pos + start for k, start in zip(parts, starts)]) if parts else np.zeros(0, np.int64)
        order = np.argsort(fp, kind="stable")
        return cls(fp[order], pos[order])

    def renumbered(self, at: np.ndarray, lo: int, hi: int) -> SortedKeys:
        """The keys of the ids that ``at`` places at ``lo``..``hi - 1`` (``at[p]``: where id ``p`` of this batch went,
        -1 for nowhere), numbered from ``lo`` as 0: a segment written from some rows of a buffer, in its row order."""
        where = at[self.pos]
        kept = (where >= lo) & (where < hi)
        return SortedKeys(self.fp[kept], where[kept] - lo)

    def find_in(self, other: SortedKeys) -> tuple[np.ndarray, np.ndarray]:
        """Candidates of these ids in ``other``'s batch, ``other`` :attr:`distinct`: (position here, position there)
        per fingerprint both hold; the caller confirms each pair by its ids (a collision pairs two different ids)."""
        if not len(other.fp) or not len(self.fp):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        lo = np.searchsorted(other.fp, self.fp)  # sorted queries: the search walks ``other`` front to back
        hit = np.flatnonzero(other.fp[np.minimum(lo, len(other.fp) - 1)] == self.fp)
        return self.pos[hit], other.pos[lo[hit]]


class _IdIndex:
    """Sorted fingerprints of a segment's ids, and the rows they come from."""

    __slots__ = ("ids", "fp", "rows")

    def __init__(self, ids: pa.Array, keys: SortedKeys | None = None) -> None:
        """The index of ``ids``; ``keys``: their sorted fingerprints when the caller has them (not computed again)."""
        self.ids = ids
        if keys is not None and len(keys.fp) == len(ids):
            self.fp, self.rows = keys.fp, keys.pos
            return
        h = fingerprints(ids)
        # not stable: no caller relies on the order of equal fingerprints (every lookup orders its answers by
        # query and row), and numpy's SIMD quicksort is 5x faster than its stable sort on 64-bit keys
        order = np.argsort(h)
        self.fp = h[order]
        self.rows = order.astype(np.int64)

    @property
    def distinct(self) -> bool:
        """Whether no two ids share a fingerprint: then no id occurs twice (a False may be a collision)."""
        return len(self.fp) < 2 or not bool((self.fp[1:] == self.fp[:-1]).any())

    def lookup(self, q: pa.Array, qpos: np.ndarray, qh: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if qh is None:
            qh = fingerprints(q)
        nfp = len(self.fp)
        lo = np.searchsorted(self.fp, qh, side="left")  # fastest when qh is sorted
        lo_c = np.minimum(lo, nfp - 1)
        hit = self.fp[lo_c] == qh
        # a fingerprint present more than once: duplicate ids in the segment, or a collision
        nxt = np.minimum(lo_c + 1, nfp - 1)
        multi_mask = hit & (nxt != lo_c) & (self.fp[nxt] == qh)
        single = np.flatnonzero(hit & ~multi_mask)
        cand_q = single
        cand_r = self.rows[lo[single]]
        multi = np.flatnonzero(multi_mask)
        if multi.size:
            hi = np.searchsorted(self.fp, qh[multi], side="right")
            reps = hi - lo[multi]
            mq = np.repeat(multi, reps)
            starts = np.repeat(lo[multi], reps)
            within = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
            cand_q = np.concatenate([cand_q, mq])
            cand_r = np.concatenate([cand_r, self.rows[starts + within]])
        if cand_q.size == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        same = pc.equal(q.take(pa.array(cand_q)), self.ids.take(pa.array(cand_r)))
        keep = np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        out_q, cand_r = qpos[cand_q[keep]].astype(np.int64), cand_r[keep]
        order = np.lexsort((cand_r, out_q))
        return out_q[order], cand_r[order]


def _bisect_all(arr: pa.Array, keys: list[str], base: int) -> tuple[np.ndarray, np.ndarray]:
    """(key index, base + row) of every row of the sorted ``arr`` equal to a key."""
    seq = _ArrowSeq(arr)
    out_q: list[int] = []
    out_r: list[int] = []
    for i, key in enumerate(keys):
        j = bisect.bisect_left(seq, key)
        while j < len(arr) and arr[j].as_py() == key:
            out_q.append(i)
            out_r.append(base + j)
            j += 1
    return np.array(out_q, dtype=np.int64), np.array(out_r, dtype=np.int64)


class _ArrowSeq(Sequence):
    """A sorted Arrow string array as a sequence of Python strings (for ``bisect``)."""

    def __init__(self, arr: pa.Array) -> None:
        self.arr = arr

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self.arr[i].as_py()
