"""Per-id version lookup: which seq#, term and version each id's newest live copy has.

A primary needs it for every bulk (Elasticsearch's version map): an index or delete of
an id gets ``version = current + 1`` (1 for an id it does not hold), and a write with
``if_seq_no`` / ``if_primary_term`` is checked against the current seq# and term
under the shard's write lock.

The buffered (unrefreshed) operations are found in the shard's
:class:`~shardstore.segments.version_map.VersionMap` (one dict lookup per id); the segments
through their fingerprint index (:func:`~shardstore.segments.segment.lookup_segments`).  When
both hold copies, the candidates are sorted by (id, seq# descending) and the first of each run
wins.  A delete winning means "absent".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import filled, one_array
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.segment import SegmentReader, lookup_segments
from shardstore.segments.version_map import VERSIONS_SCHEMA, VersionMap, first_of_runs, strictly_ascending, with_seen

#: finds ids in segment readers: ``(readers, ids) -> (query_positions, reader_indexes, rows)`` (lookup_segments)
Finder = Callable[[Sequence[SegmentReader], pa.Array], tuple[pa.Array, pa.Array, pa.Array]]

_CANDIDATE = pa.schema([pa.field("q", pa.int64()), pa.field("_seq_no", pa.int64()),
                        pa.field("_primary_term", pa.int64()), pa.field("_version", pa.int64()),
                        pa.field("deleted", pa.bool_())])


def latest_versions(ids: pa.Array, buffered: VersionMap | Sequence[VersionMap] | None,
                    segments: Sequence[tuple[SegmentReader, LiveDocs]], tombstones: pa.Table | None = None,
                    *, unique: bool = False, seen: bool = False, find: Finder = lookup_segments,
                    keys: SortedKeys | None = None) -> pa.Table:
    """Per id of ``ids`` (duplicates allowed, order kept): seq#, term and version of its newest live copy.

    ``unique``: the caller knows no id occurs twice (a primary that sorted them, :func:`ids_unique`): the two
    hash passes that fold repeats and map them back are skipped.  ``seen``: the table has the
    :data:`~shardstore.segments.version_map.SEEN` column too (any copy found, deleted or not).  ``find``: how the
    ids are found in the segments' readers (:func:`lookup_segments`' contract; a directory passes its
    :class:`~shardstore.segments.shard_id_index.ShardIdIndex`).  ``keys``: the sorted fingerprints of ``ids``,
    which hold no id twice (``unique``), if the caller has them: the buffered runs use them (and so may ``find``).

    ``tombstones`` (``_id``, ``_seq_no`` of refreshed deletes): needed only when a buffered operation
    may be older than a refreshed one (a replica applying out of order); None when every buffered
    operation is newer than everything refreshed (a primary), so the buffer decides the ids it holds.
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = one_array(ids)
    # several maps: a buffer sealed for a refresh running beside the writes, and the buffer after it
    maps = [m for m in (buffered if isinstance(buffered, (list, tuple)) else (buffered,)) if m is not None and len(m)]
    buffered = maps[0] if len(maps) == 1 else None
    if not maps or (tombstones is not None and not tombstones.num_rows):
        tombstones = None  # a tombstone only ever outranks a buffered operation
    if not maps and not segments:  # nothing to find (a fresh shard)
        return _absent(len(ids), seen)
    if buffered is not None and not segments and tombstones is None:  # the buffer alone decides: one dict lookup per id
        return buffered.lookup(ids, seen=seen, keys=keys)
    if not unique:
        keys = None  # they are the fingerprints of ``ids``, not of the unique ids below
    uniq = ids if unique else pc.unique(ids)
    found_any = np.zeros(len(uniq), dtype=bool)  # any candidate of the id: a live segment copy, a buffered op, a tombstone
    cands = []
    if len(uniq):
        readers = [r for r, _ in segments]
        qpos, segidx, rows = find(readers, uniq)
        if len(qpos):
            seg_np, rows_np, q_np = segidx.to_numpy(), rows.to_numpy(), qpos.to_numpy()
            for k in np.unique(seg_np):
                sel = seg_np == k
                reader, live = segments[int(k)]
                r = rows_np[sel]
                alive = np.asarray(live.mask().take(pa.array(r)).to_numpy(zero_copy_only=False), dtype=bool)
                if not alive.any():
                    continue
                hit = pa.array(r[alive])
                seq, term, version = reader.version_columns()  # cached per segment: no row group decoded per bulk
                cands.append(pa.table([pa.array(q_np[sel][alive], pa.int64()), seq.take(hit), term.take(hit),
                                       version.take(hit), pa.array(np.zeros(int(alive.sum()), dtype=bool))],
                                      schema=_CANDIDATE))
    if tombstones is not None:
        cands.append(_refreshed_deletes(tombstones, uniq))
    if not cands and len(maps) < 2:  # no live segment copy of any id: the buffer (if any) decides
        return _absent(len(ids), seen) if buffered is None else buffered.lookup(ids, seen=seen, keys=keys)
    cands += [m.candidates_table(uniq, _CANDIDATE, keys) for m in maps]
    cands = [c for c in cands if c.num_rows]
    if not cands:
        return _absent(len(ids), seen)
    for c in cands:
        found_any[c.column("q").to_numpy()] = True
    out = {name: np.zeros(len(uniq), dtype=np.int64) for name in VERSIONS_SCHEMA.names}
    found = np.zeros(len(uniq), dtype=bool)
    allc = pa.concat_tables(cands)
    allc = allc.take(pc.sort_indices(allc, sort_keys=[("q", "ascending"), ("_seq_no", "descending")]))
    q_sorted = allc.column("q").combine_chunks()
    first = first_of_runs(q_sorted)
    winners = allc.filter(pc.and_(first, pc.invert(allc.column("deleted"))))
    wq = winners.column("q").to_numpy()
    found[wq] = True
    for name in VERSIONS_SCHEMA.names:
        out[name][wq] = filled(winners.column(name), 0).to_numpy()
    if unique:
        table = pa.table([pa.array(out[name], pa.int64(), mask=~found) for name in VERSIONS_SCHEMA.names],
                         schema=VERSIONS_SCHEMA)
        return with_seen(table, found_any, seen)
    back = pc.index_in(ids, value_set=uniq).to_numpy(zero_copy_only=False).astype(np.int64)
    mask = ~found[back]
    table = pa.table([pa.array(out[name][back], pa.int64(), mask=mask) for name in VERSIONS_SCHEMA.names],
                     schema=VERSIONS_SCHEMA)
    return with_seen(table, found_any[back], seen)


def id_order(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The permutation putting ``ids`` in ascending order (stable): computed once per bulk by the primary,
    for :func:`next_versions` and, as a hint, for the refresh that sorts the same ids again."""
    return pc.array_sort_indices(ids)


def ids_unique(ids: pa.Array, order: pa.Array) -> bool:
    """Whether no id occurs twice, given ``order`` (:func:`id_order` of ``ids``): the sorted ids strictly ascend."""
    return strictly_ascending(one_array(ids).take(order))


def next_versions(ids: pa.Array, current: pa.Array, order: pa.Array | None = None, *,
                  unique: bool | None = None) -> pa.Array:
    """Versions for a batch of index/delete ops: current (null = 0) + 1, +1 more per earlier op on the same id.

    ``order``: :func:`id_order` of ``ids`` if the caller has it (else it is computed here); ``unique``: whether
    no id occurs twice, if the caller knows (:func:`ids_unique`).
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = one_array(ids)
    n = len(ids)
    if n == 0:
        return pa.array([], pa.int64())
    base = np.asarray(filled(current, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    repeats = _has_repeats(ids, order) if unique is None else not unique
    if not repeats:  # no id twice in the batch (the common bulk): no ranks to count
        return pa.array(base + 1, pa.int64())
    codes = ids.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - run_start
    return pa.array(base + rank + 1, pa.int64())


#: up to this many ids, :func:`_has_repeats` counts them in a Python set (no Arrow kernel calls), so a
#: caller need not sort them first (:func:`id_order`)
SMALL_BATCH = 256


def _has_repeats(ids: pa.Array, order: pa.Array | None = None) -> bool:
    """Whether some id occurs twice: neighbours compared after a sort (a string sort beats a hash pass here)."""
    n = len(ids)
    if n < 2:
        return False
    if n <= SMALL_BATCH:  # a shard's slice of a many-shard bulk: a set beats three Arrow calls
        return len(set(ids.to_pylist())) < n
    return not ids_unique(ids, id_order(ids) if order is None else order)


def _absent(n: int, seen: bool = False) -> pa.Table:
    table = pa.table([pa.nulls(n, pa.int64()) for _ in VERSIONS_SCHEMA.names], schema=VERSIONS_SCHEMA)
    return with_seen(table, np.zeros(n, dtype=bool), seen)


def _refreshed_deletes(tombstones: pa.Table, uniq: pa.Array) -> pa.Table:
    """The tombstones of ``uniq``'s ids as candidates (a delete: the id is absent unless a newer copy wins)."""
    q = pc.index_in(tombstones.column("_id"), value_set=uniq)
    hit = pc.is_valid(q)
    n = int(pc.sum(hit.cast(pa.int64())).as_py() or 0)
    return pa.table([q.filter(hit).cast(pa.int64()), tombstones.column("_seq_no").filter(hit), pa.nulls(n, pa.int64()),
                     pa.nulls(n, pa.int64()), pa.array(np.ones(n, dtype=bool))], schema=_CANDIDATE)


