"""A shard's id index across its segments: every segment's id fingerprints in a few sorted levels.

:func:`~shardstore.segments.segment.lookup_segments` searches each segment's own index in turn.  A primary
bulking steadily into an index that holds data keeps adding segments between flushes (one per refresh beside
the writes), and each segment costs every lookup of a batch a fixed set of Arrow kernel calls and a
``searchsorted`` (issue 44: 14-22 segments in ``python -m benches peers``' steady-state bulks).  This index keeps the fingerprints of all the
segments in at most about log2(segments) sorted arrays, the *levels*, so a batch is searched once per level.

Levels (an LSM of sorted arrays): a segment's own index (:class:`~shardstore.segments.id_index._IdIndex`,
already sorted) becomes a new last level; while the last level holds at least half as many entries as the one
before, the two are merged (one stable sort).  A segment that leaves the set (merged away, or holding no live
row) is forgotten at once: its entries stay in their level until the next merge of that level or a rebuild,
and lookups drop them.  When dead entries outnumber live ones, the levels are rebuilt from the live segments.

Answers equal :func:`lookup_segments`' for the same segments (the reference of
``tests/segments/test_shard_id_index.py``): each candidate's id is compared with the segment's own, so a
fingerprint collision never yields a wrong row.  Not thread-safe: its owner (a ShardDirectory) calls it under
its lock.  Batches of at most ``SegmentReader.SMALL_LOOKUP`` ids take ``lookup_segments`` (a get needs no
fingerprint and no index load).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.segments.id_index import SortedKeys
from shardstore.segments.segment import SegmentReader, lookup_segments

__all__ = ["ShardIdIndex"]

_Level = tuple[np.ndarray, np.ndarray, np.ndarray]  # fingerprints (sorted), segment numbers, rows


class ShardIdIndex:
    """Fingerprints of a set of segments' ids in sorted levels (see the module docstring)."""

    def __init__(self) -> None:
        self._levels: list[_Level] = []
        self._number_of: dict[int, int] = {}  # id(reader) -> its number (the reader is held in _readers)
        self._readers: dict[int, SegmentReader] = {}  # number -> reader, for the segments in the set
        self._next = 0
        self._dead = 0  # entries of readers no longer in the set

    @property
    def levels(self) -> int:
        """How many sorted levels there are now."""
        return len(self._levels)

    def lookup(self, readers: Sequence[SegmentReader], ids: pa.Array,
               every: Sequence[SegmentReader] | None = None, *,
               presorted: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[pa.Array, pa.Array, pa.Array]:
        """Find ``ids`` in ``readers``: what :func:`lookup_segments` answers, ``(query_positions, reader_indexes,
        rows)`` ordered by reader then query position then row.  ``every``: the whole segment set of the owner
        (``readers`` is a subset of it), so that lookups over different subsets keep one set of levels.
        ``presorted``: the ids' fingerprints in ascending order and, per entry, its position in ``ids`` (an
        adopted file's own id index: nothing is fingerprinted or sorted again)."""
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not pa.types.is_string(ids.type):
            ids = ids.cast(pa.string())
        if len(ids) <= SegmentReader.SMALL_LOOKUP:
            return lookup_segments(readers, ids)
        self.sync(readers if every is None else every)
        empty = pa.array([], pa.int64())
        position = {self._number_of[id(r)]: k for k, r in enumerate(readers) if id(r) in self._number_of}
        if not position or not self._levels:
            return empty, empty, empty
        pos_of = np.full(self._next, -1, dtype=np.int64)
        for number, k in position.items():
            pos_of[number] = k
        if presorted is not None:
            fps, perm = presorted
            if len(fps) != len(ids) or len(perm) != len(ids):
                raise ValueError(f"lookup: {len(ids)} ids, {len(fps)} sorted fingerprints, {len(perm)} positions")
        else:
            keys = SortedKeys.of(ids)  # sorted queries: each searchsorted walks its level front to back
            fps, perm = keys.fp, keys.pos
        qs, ks, rows = [], [], []
        for lfp, lnum, lrow in self._levels:
            lo = np.searchsorted(lfp, fps, side="left")
            hit = np.flatnonzero(lfp[np.minimum(lo, len(lfp) - 1)] == fps)
            if not hit.size:
                continue
            lo = lo[hit]  # the end of each hit's run only for the hits (a tenth of a steady bulk's ids)
            reps = np.searchsorted(lfp, fps[hit], side="right") - lo
            starts = np.repeat(lo - (np.cumsum(reps) - reps), reps)
            entries = starts + np.arange(int(reps.sum()))
            k = pos_of[lnum[entries]]
            wanted = k >= 0
            qs.append(perm[np.repeat(hit, reps)[wanted]])
            ks.append(k[wanted])
            rows.append(lrow[entries[wanted]])
        if not qs:
            return empty, empty, empty
        q, k, r = np.concatenate(qs), np.concatenate(ks), np.concatenate(rows)
        keep = np.zeros(len(q), dtype=bool)
        for kk in np.unique(k):  # confirm each candidate by its id (a fingerprint collision finds a wrong row)
            sel = np.flatnonzero(k == kk)
            same = pc.equal(ids.take(pa.array(q[sel])), readers[int(kk)].id_index().ids.take(pa.array(r[sel])))
            keep[sel] = np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        q, k, r = q[keep], k[keep], r[keep]
        order = np.lexsort((r, q, k))
        return pa.array(q[order], pa.int64()), pa.array(k[order], pa.int64()), pa.array(r[order], pa.int64())

    def sync(self, readers: Sequence[SegmentReader]) -> None:
        """Make the set exactly ``readers``: forget those gone, add the new ones (each a level, merged as needed).
        A lookup does it first; the owner may do it ahead, off a lookup's path (a refresh beside the writes)."""
        present = {id(r) for r in readers}
        for key in [key for key in self._number_of if key not in present]:
            number = self._number_of.pop(key)
            self._dead += self._readers.pop(number).info.doc_count
        added = [r for r in readers if id(r) not in self._number_of]
        live = sum(r.info.doc_count for r in self._readers.values())
        if self._dead and self._dead > live:  # mostly dead entries: rebuild from the live segments
            kept = list(self._readers.values())
            self._levels, self._number_of, self._readers, self._dead = [], {}, {}, 0
            added = kept + added
        for reader in added:
            self._add(reader)

    def _add(self, reader: SegmentReader) -> None:
        number = self._next
        self._next += 1
        self._number_of[id(reader)] = number
        self._readers[number] = reader
        if reader.info.doc_count == 0:
            return
        index = reader.id_index()
        self._levels.append((index.fp, np.full(len(index.fp), number, dtype=np.int32), index.rows))
        while len(self._levels) >= 2 and 2 * len(self._levels[-1][0]) >= len(self._levels[-2][0]):
            self._levels[-2:] = [self._merged(self._levels[-2], self._levels[-1])]

    def _merged(self, a: _Level, b: _Level) -> _Level:
        """Two levels as one, the entries of segments no longer in the set dropped."""
        fp, num, row = (np.concatenate([x, y]) for x, y in zip(a, b))
        alive = np.isin(num, np.fromiter(self._readers, dtype=np.int32, count=len(self._readers)))
        if not alive.all():
            self._dead -= int((~alive).sum())
            fp, num, row = fp[alive], num[alive], row[alive]
        order = np.argsort(fp, kind="stable")
        return fp[order], num[order], row[order]
