"""A ``get``'s decision: the newest live copy of one document (``ShardDirectory.get``).

Three places may hold the newest operation on an id: the indexing buffer (or a sealed
buffer being written beside the writes), a segment's live copy, and the refreshed deletes
(tombstones). The buffered operation decides when it is newer than everything refreshed;
otherwise the segment copy does, unless a newer buffered operation or a refreshed delete
overrides it. Segment rows come through each reader's in-memory id map
(segments/point_read.py): no batch lookup for one id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.ops import NO_OPS
from shardstore.segments.synthetic import row_source

if TYPE_CHECKING:
    from shardstore.segments.livedocs import LiveDocs
    from shardstore.segments.segment import SegmentReader

__all__ = ["newest_copy"]


def newest_copy(doc_id: str, buffered: tuple[int, pa.Table | None, int] | None, refreshed_seq: int,
                segments: Iterable[tuple[SegmentReader, LiveDocs]], tombstones: pa.Table,
                order: Sequence[str]) -> dict[str, Any] | None:
    """``doc_id``'s newest live copy, or None (module docstring).

    ``buffered``: the newest unrefreshed operation on it as ``IndexBuffer.latest`` gives it (seq#,
    its rows or None for a delete, the row); ``refreshed_seq``: the highest seq# refreshed;
    ``order``: the mapping's field order, to rebuild a null ``_source``.
    """
    if buffered is None or buffered[0] <= refreshed_seq:
        seq, doc = _segment_copy(doc_id, segments, order)
        if buffered is None or buffered[0] <= max(seq, _tombstone_seq(tombstones, doc_id)):
            return doc
    if buffered[1] is None:
        return None
    return _with_source(buffered[1].slice(buffered[2], 1).to_pylist()[0], order)


def _with_source(doc: dict[str, Any], order: Sequence[str]) -> dict[str, Any]:
    """``doc`` (one row as a dict) with a null ``_source`` rebuilt from its fields (one row: in Python)."""
    if doc.get("_source") is None:
        doc["_source"] = row_source(doc, order)
    return doc


def _segment_copy(doc_id: str, segments: Iterable[tuple[SegmentReader, LiveDocs]],
                  order: Sequence[str]) -> tuple[int, dict[str, Any] | None]:
    """(seq#, document) of ``doc_id``'s live copy in a segment, or (NO_OPS, None)."""
    for reader, live in segments:
        info = reader.info
        if info.min_id is None or not (info.min_id <= doc_id <= info.max_id):
            continue
        for r in reader.point_rows(doc_id):
            if live.is_live(r):
                doc = _with_source(reader.row(r), order)
                return doc["_seq_no"], doc
    return NO_OPS, None


def _tombstone_seq(tombstones: pa.Table, doc_id: str) -> int:
    """The seq# of ``doc_id``'s refreshed delete, or NO_OPS."""
    if not tombstones.num_rows:
        return NO_OPS
    hit = tombstones.filter(pc.equal(tombstones.column("_id"), doc_id))
    return max(hit.column("_seq_no").to_pylist(), default=NO_OPS)
