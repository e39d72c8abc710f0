"""A merge written beside the writes (docs/design/segments.md, "Merges beside the writes").

The directory picks the segments to merge under its lock and takes a *snapshot* of each: its reader and
the live docs in force then (:class:`~shardstore.segments.livedocs.LiveDocs` is immutable: a delete makes a
new one).  :func:`write_merged` reads the snapshot's live rows, each input through a reader of its own (never
the shared reader's Parquet handle, which a search may be reading), and writes them as one new segment
sorted by ``_id``, holding no lock: bulks, adoptions, refreshes and lookups go on against the current
segments, so a merge of a million rows no longer stops a shard's writes for its whole length.

Back under its lock the directory installs the new segment only if every input is still there, unchanged
but for deletions; a row deleted meanwhile (a refresh marking an older copy, a delete, a re-applied row) is
deleted in the new segment too: :func:`carried_deletes` maps it through the merge's row order (pure, tested
against an oracle).  Otherwise the new file is removed and nothing changes: the policy asks again at the
next flush.

Invariants: the new segment holds exactly the rows live in the inputs at the snapshot, each once, in
``_id`` order (rows of one id in their input order); after the install every row deleted in an input is
deleted in it.  Each input's scan is checked against the snapshot row by row (its ``_seq_no`` column against
the rows the live docs name), so a scan that skipped or reordered rows fails the merge instead of
mis-mapping a deletion.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array
from shardstore.segments.errors import SegmentError
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.segment import SegmentReader, segment_file_name, write_segment

__all__ = ["MergeCancelled", "MergeInput", "Merged", "carried_deletes", "write_merged"]


class MergeCancelled(SegmentError):
    """The directory closed while a merge ran beside the writes: nothing was installed."""


@dataclass(frozen=True)
class MergeInput:
    """One segment to merge as the snapshot saw it: its name, reader and live docs."""

    name: str
    reader: SegmentReader
    live: LiveDocs


@dataclass(frozen=True)
class Merged:
    """A merge's new segment, not yet installed: its reader (None when no input had a live row: nothing written)
    and ``order``: per new row, its position among the inputs' live rows at the snapshot, input after input."""

    reader: SegmentReader | None
    order: np.ndarray


def carried_deletes(then: Sequence[np.ndarray], now: Sequence[np.ndarray], order: np.ndarray) -> np.ndarray:
    """The new segment's rows to delete (ascending): those whose input row was live at the snapshot and is not now.

    ``then`` / ``now``: per input, its live mask (bool, one per input row) at the snapshot and now; ``order``: as
    :attr:`Merged.order`.
    """
    if len(then) != len(now):
        raise ValueError(f"carried_deletes: {len(then)} snapshot masks, {len(now)} current ones")
    gone, offset = [], 0
    for was, is_ in zip(then, now):
        if len(was) != len(is_):
            raise ValueError(f"carried_deletes: a live mask of {len(was)} rows then, {len(is_)} now")
        rows = np.flatnonzero(was)
        gone.append(offset + np.flatnonzero(~np.asarray(is_, dtype=bool)[rows]))
        offset += rows.size
    if offset != len(order):
        raise ValueError(f"carried_deletes: {offset} live rows at the snapshot, a merge of {len(order)}")
    positions = np.concatenate(gone) if gone else np.empty(0, np.int64)
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order), dtype=np.int64)
    return np.sort(new_row[positions])


def write_merged(inputs: Sequence[MergeInput], directory: str, name: str, *, fsync: bool,
                 cancelled: Callable[[], bool] = lambda: False) -> Merged:
    """Write the live rows of ``inputs`` as the segment ``name`` in ``directory`` (no lock held; see the module
    docstring); its reader has the id index and version columns installed from memory.  Raises on an I/O error or a
    scan that does not match the snapshot (SegmentError), and MergeCancelled once ``cancelled()`` (the directory
    closed: checked before each input and before the write); the new file is then removed."""
    tables = []
    for item in inputs:
        if cancelled():
            raise MergeCancelled(f"{directory}: closed while a merge read {item.name}")
        if not item.live.live_count:
            continue
        own = SegmentReader(item.reader.path, item.reader.info, data=item.reader.data)  # its own handle (module docstring)
        try:
            table = pa.Table.from_batches(list(own.scan(live=item.live, use_threads=False)), schema=None)
            _check_scan(item, own, table)
        finally:
            own.close()
        tables.append(table)
    if not tables:
        return Merged(None, np.empty(0, dtype=np.int64))
    merged = pa.concat_tables(tables, promote_options="default")
    order = pc.array_sort_indices(merged.column("_id"))  # stable: rows of one id keep their order
    merged = merged.take(order)  # in _id order already: write_segment writes the rows as they are
    if cancelled():
        raise MergeCancelled(f"{directory}: closed before a merge wrote {name}")
    path = os.path.join(directory, segment_file_name(name))
    try:
        info = write_segment(path, merged, name=name, fsync=fsync)
        reader = SegmentReader(os.path.join(directory, info.file_name), info)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    reader.install_index(one_array(merged.column("_id")))  # the next version lookup reads and sorts none back
    reader.install_version_columns(*(one_array(merged.column(c)) for c in ("_seq_no", "_primary_term", "_version")))
    return Merged(reader, np.asarray(order.to_numpy(), dtype=np.int64))


def _check_scan(item: MergeInput, own: SegmentReader, table: pa.Table) -> None:
    """SegmentError unless ``table`` holds exactly the input's live rows at the snapshot, in row order."""
    rows = np.flatnonzero(np.asarray(item.live.mask().to_numpy(zero_copy_only=False), dtype=bool))
    if table.num_rows != rows.size:
        raise SegmentError(f"{item.reader.path}: a merge read {table.num_rows} rows, the snapshot has {rows.size} live")
    want = np.asarray(own.seq_nos().to_numpy(zero_copy_only=False))[rows]
    got = np.asarray(one_array(table.column("_seq_no")).to_numpy(zero_copy_only=False))
    if not np.array_equal(want, got):
        raise SegmentError(f"{item.reader.path}: a merge read its live rows out of order; the merge is abandoned")
