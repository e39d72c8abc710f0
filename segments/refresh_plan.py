"""What a refresh writes and marks deleted, decided from an indexing buffer: pure Arrow work, no I/O.

A refresh (segments/directory.py) turns a buffer into segments in three steps, each a function here
or there:

1. :func:`plan_refresh`: per id, the newest buffered operation wins (buffered deletes and the
   directory's tombstones included), in ``_id`` order;
2. :func:`older_copies`: the live copies the segments hold of the winning ids, found with each
   segment's id index; a copy older than its winner is to be marked deleted, a copy newer makes the
   winner stale (a replica receiving operations out of order);
3. the directory writes the winning index operations as segments, marks the older copies deleted and
   remembers the winning deletes as tombstones.

Step 1 reads only the buffer and the tombstones, so a refresh of a sealed buffer (one taken out of the
write path, :meth:`ShardDirectory.seal` then :meth:`~ShardDirectory.write_sealed`) runs it with no lock held; step 2 reads the
segments' live docs, so it runs under the directory's lock, at the moment the new segments are
installed (docs/design/segments.md, "A full buffer is refreshed beside the writes").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.index_buffer import DELETES, IndexBuffer
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.segment import SegmentReader, lookup_segments
from shardstore.segments.versions import Finder, first_of_runs, strictly_ascending

__all__ = ["RefreshPlan", "buffer_order", "index_rows", "older_copies", "plan_refresh"]


@dataclass(frozen=True)
class RefreshPlan:
    """A buffer's refresh decided: its documents as one table and, per id, the operation that wins."""

    docs: pa.Table | None  # the buffered documents, one table (None: only deletes were buffered)
    ops: int  # buffered operations in all (documents and deletes)
    #: per id the newest operation, in ``_id`` order (or in buffer order when every buffered document has an id of
    #: its own: :func:`_distinct_winners`): ``_id``, ``_seq_no``, ``_row`` (its row of ``docs``; null for a delete or
    #: a tombstone), ``_buffered`` (False: an older tombstone, not an operation of this buffer)
    winners: pa.Table
    #: per winner, whether its id was new to the shard when its writer looked it up (``IndexBuffer.news``): no older
    #: copy of it can be in a segment, so :func:`older_copies` skips it; None: every winner is looked up
    new: np.ndarray | None = None
    #: the sorted fingerprints of every id of ``docs`` (``IndexBuffer.sorted_keys``), or None when an entry lacked
    #: them: the refresh cuts its segments' id indexes from them
    keys: SortedKeys | None = None

    @property
    def ids(self) -> pa.Array:
        """The winning ids, one per id (ascending, or in buffer order: see ``winners``)."""
        return one_array(self.winners.column("_id"))

    @property
    def seq_nos(self) -> pa.Array:
        """The winners' seq#s."""
        return one_array(self.winners.column("_seq_no"))


def plan_refresh(buffer: IndexBuffer, tombstones: pa.Table) -> RefreshPlan:
    """Step 1 of the module docstring for ``buffer`` and the directory's ``tombstones`` (``DELETES`` rows)."""
    docs = (pa.concat_tables(buffer.docs, promote_options="default").combine_chunks() if buffer.docs else None)
    deletes = pa.concat_tables(buffer.deletes).combine_chunks() if buffer.deletes else DELETES.empty_table()
    n_docs = docs.num_rows if docs is not None else 0
    keys = buffer.sorted_keys() if docs is not None else None
    winners = _distinct_winners(buffer, docs, tombstones, keys)
    if winners is None:
        winners = _presorted_winners(buffer, docs, tombstones)
    if winners is None:
        winners = _winners(docs, deletes, tombstones)
    return RefreshPlan(docs, n_docs + deletes.num_rows, winners, _new_winners(buffer, winners), keys)


def _distinct_winners(buffer: IndexBuffer, docs: pa.Table | None, tombstones: pa.Table,
                      keys: SortedKeys | None) -> pa.Table | None:
    """Every buffered document, in buffer order, when each is the only operation on its id: the buffer holds index
    operations only, no tombstone stands, and the ids' fingerprints (``keys``, the buffer's own) are all different,
    so no id is there twice; else None (a fingerprint shared by two ids falls back too: the ids decide then).

    The bulks of new documents that fill a buffer between refreshes: no sort of the ids at all (issue 44)."""
    if docs is None or keys is None or buffer.deletes or tombstones.num_rows or not keys.distinct:
        return None
    n = docs.num_rows
    return pa.table({"_id": one_array(docs.column("_id")), "_seq_no": one_array(docs.column("_seq_no")),
                     "_row": pa.array(np.arange(n, dtype=np.int64)), "_buffered": pa.array(np.ones(n, dtype=bool))})


def _new_winners(buffer: IndexBuffer, winners: pa.Table) -> np.ndarray | None:
    """Per winner, whether its writer found its id new to the shard (``IndexBuffer.news`` of its row; a delete, a
    tombstone or a row without the hint: False); None when no entry of the buffer has the hint.

    Why skipping those is safe (docs/design/segments.md, "Ids new to the shard"): the writer's lookup saw every
    segment and every buffered operation (the sealed buffer's too) under the shard's write lock, and found none
    for the id.  A segment installed since holds only operations that were buffered then, or later operations on
    the id, which are newer than this one and so win instead of it; a merge adds no id."""
    if all(n is None for n in buffer.news):
        return None
    flags = np.concatenate([n if n is not None else np.zeros(d.num_rows, dtype=bool)
                            for d, n in zip(buffer.docs, buffer.news)])
    rows = one_array(winners.column("_row"))
    valid = np.asarray(pc.is_valid(rows).to_numpy(zero_copy_only=False), dtype=bool)
    at = np.asarray(pc.fill_null(rows, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return valid & flags[at] if len(flags) else np.zeros(len(rows), dtype=bool)


def older_copies(segments: Sequence[tuple[str, SegmentReader, LiveDocs]], plan: RefreshPlan,
                 find: Finder = lookup_segments) -> tuple[np.ndarray, dict[str, pa.Array]]:
    """Step 2: ``(stale, marks)``: per winner whether a live segment copy is newer (bool), and per segment name the
    rows of live copies older than their winner (to mark deleted); ``find``: as in :func:`latest_versions`."""
    ids, seqs = plan.ids, plan.seq_nos
    stale = np.zeros(len(ids), dtype=bool)
    marks: dict[str, pa.Array] = {}
    if not segments or not len(ids):
        return stale, marks
    if plan.new is not None:  # ids new to the shard have no older copy to find
        asked = np.flatnonzero(~plan.new)
        if not asked.size:
            return stale, marks
        all_q, all_s, all_r = find([reader for _name, reader, _live in segments], ids.take(pa.array(asked)))
        all_q = pa.array(asked[all_q.to_numpy()], pa.int64())  # positions among the winners again
    else:
        all_q, all_s, all_r = find([reader for _name, reader, _live in segments], ids)
    if not len(all_q):
        return stale, marks
    seg_of = pc.cast(all_s, pa.int64()).to_numpy()
    bounds = np.flatnonzero(np.diff(seg_of)) + 1  # results come ordered by segment
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(seg_of)]])):
        name, reader, live = segments[int(seg_of[lo])]
        qpos, rows = all_q.slice(lo, hi - lo), all_r.slice(lo, hi - lo)
        alive = live.mask().take(rows)
        qpos, rows = qpos.filter(alive), rows.filter(alive)
        if len(qpos) == 0:
            continue
        newer_here = pc.greater(reader.seq_nos().take(rows), seqs.take(qpos))
        if pc.any(newer_here).as_py():
            stale[qpos.filter(newer_here).to_numpy()] = True
        doomed = rows.filter(pc.invert(newer_here))
        if len(doomed):
            marks[name] = doomed
    return stale, marks


def _presorted_winners(buffer: IndexBuffer, docs: pa.Table | None, tombstones: pa.Table) -> pa.Table | None:
    """The winners from the order hints, when every batch of the buffer is index ops whose writer sorted their ids
    (``id_order``) or found them distinct (its ``keys``: sorted here), and there are no deletes or tombstones; else
    None (the general path decides).

    The hinted runs are merged by one stable sort of the ids alone (one batch needs none), cheaper than the general
    path's two-key sort of the raw buffer.  An id in several batches (a bulk updating what an earlier one wrote)
    keeps its last copy: batches are buffered in seq# order, so the last is the newest, which is checked (the
    seq#s must rise within every run of one id) before it is trusted."""
    if docs is None or not buffer.docs or buffer.deletes or tombstones.num_rows:
        return None
    orders = []
    for batch, order, keys in zip(buffer.docs, buffer.orders, buffer.keys):
        if order is None and keys is None:
            return None
        # a batch whose writer found its ids' fingerprints all different skipped the sort (engine/shard/doc_versions.py):
        # it is sorted here, beside the writes, only when another batch shares an id with it
        orders.append(order if order is not None else pc.array_sort_indices(one_array(batch.column("_id"))))
    runs, offset = [], 0
    for batch, order in zip(buffer.docs, orders):
        runs.append(pc.add(order.cast(pa.int64()), offset) if offset else order.cast(pa.int64()))
        offset += batch.num_rows
    order = runs[0] if len(runs) == 1 else pa.concat_arrays(runs)
    ids = one_array(docs.column("_id")).take(order)
    if len(runs) > 1:
        merged = pc.sort_indices(ids)  # stable: the copies of one id keep their buffer order
        order, ids = order.take(merged), ids.take(merged)
    seqs = one_array(docs.column("_seq_no")).take(order)
    if not strictly_ascending(ids):
        n = len(ids)
        if ids.null_count or n < 2:
            return None
        same = pc.equal(ids.slice(1), ids.slice(0, n - 1))  # row i + 1 repeats row i's id
        rising = pc.greater(seqs.slice(1), seqs.slice(0, n - 1))
        if not pc.all(pc.or_(pc.invert(same), rising)).as_py():
            return None  # a repeat whose later copy is not the newer one: the general path decides
        last = pa.concat_arrays([pc.invert(same), pa.array([True])])  # the last copy of each id
        if not pc.all(pc.less_equal(ids.slice(0, n - 1), ids.slice(1))).as_py():
            return None  # the hints did not sort the ids
        order, ids, seqs = order.filter(last), ids.filter(last), seqs.filter(last)
    return pa.table({"_id": ids, "_seq_no": seqs, "_row": order,
                     "_buffered": pa.array(np.ones(len(order), dtype=bool))})


def _winners(docs: pa.Table | None, deletes: pa.Table, tombstones: pa.Table) -> pa.Table:
    """Per id of the buffer (documents, deletes) and the tombstones, the newest operation, in ``_id`` order."""
    n_docs = docs.num_rows if docs is not None else 0
    ops = pa.table({
        "_id": pa.concat_arrays([one_array(docs.column("_id")) if docs is not None else pa.array([], pa.string()),
                                 one_array(deletes.column("_id")), one_array(tombstones.column("_id"))]),
        "_seq_no": pa.concat_arrays([one_array(docs.column("_seq_no")) if docs is not None else pa.array([], pa.int64()),
                                     one_array(deletes.column("_seq_no")), one_array(tombstones.column("_seq_no"))]),
        "_row": pa.concat_arrays([pa.array(np.arange(n_docs, dtype=np.int64)),
                                  pa.nulls(deletes.num_rows + tombstones.num_rows, pa.int64())]),
        "_buffered": pa.array(np.arange(n_docs + deletes.num_rows + tombstones.num_rows)
                              < n_docs + deletes.num_rows),
    })
    order = pc.sort_indices(ops, sort_keys=[("_id", "ascending"), ("_seq_no", "descending")])
    ops = ops.take(order)
    return ops.filter(first_of_runs(one_array(ops.column("_id"))))


def buffer_order(keep: pa.Array, n_docs: int) -> tuple[pa.Array, np.ndarray]:
    """``keep`` (rows of a buffer's ``n_docs`` documents, each at most once, in any order) in buffer order, and the
    permutation taking ``keep`` there: ``(rows, perm)`` with ``rows == keep[perm]`` ascending.

    A refresh writes its segments in buffer order (docs/design/segments.md, "Refreshed segments keep the buffer's
    order"): rows in ascending order are read front to back, and all of them at once are the buffer itself, whose
    slices are written with no copy; linear in ``n_docs``, no sort."""
    k = np.asarray(keep.to_numpy(zero_copy_only=False), dtype=np.int64)
    where = np.full(n_docs, -1, dtype=np.int64)
    where[k] = np.arange(len(k), dtype=np.int64)
    perm = where[where >= 0]
    if len(perm) != len(k):
        raise ValueError(f"a refresh's rows name a document twice ({len(k) - len(perm)} repeats)")
    return pa.array(k[perm], pa.int64()), perm


def index_rows(plan: RefreshPlan, stale: np.ndarray | None) -> pa.Array:
    """The rows of ``plan.docs`` a refresh writes, in the winners' order: the winning index operations (not ``stale``)."""
    rows = plan.winners.column("_row")
    keep = pc.is_valid(rows)
    if stale is not None:
        keep = pc.and_(keep, pa.array(~stale, pa.bool_()))
    return one_array(rows).filter(keep)
