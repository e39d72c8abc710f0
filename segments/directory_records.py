"""What a shard directory keeps per segment, and what its writes return (segments/directory.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from shardstore.segments.commit import CommittedSegment
from shardstore.segments.index_buffer import IndexBuffer
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.merge_policy import SegmentStats
from shardstore.segments.segment import SegmentReader

__all__ = ["Adopted", "Prepared", "RefreshResult", "Sealed"]


@dataclass
class _Segment:
    """A searchable segment and the live docs in force (possibly not yet written)."""

    reader: SegmentReader
    live: LiveDocs
    live_gen: int = 0  # generation of the newest live-docs FILE written
    live_file: str | None = None
    live_size: int = 0
    live_checksum: int = 0
    dirty: bool = False  # live docs changed since the file above

    @property
    def name(self) -> str:
        return self.reader.info.name

    def committed(self) -> CommittedSegment:
        return CommittedSegment(self.reader.info, self.live_gen, self.live_file, self.live_size,
                                self.live_checksum, self.live.deleted_count)

    def stats(self) -> SegmentStats:
        info = self.reader.info
        return SegmentStats(info.name, info.size, info.doc_count, self.live.live_count)


@dataclass(frozen=True)
class RefreshResult:
    """What a refresh did."""

    segment: str | None  # the new segment's name (the first, when a big refresh wrote several), None if none
    indexed: int = 0  # documents written to the new segment
    deleted: int = 0  # older copies marked deleted
    stale: int = 0  # buffered operations that did not apply: the same id has an op with a higher seq#
    segments: tuple[str, ...] = ()  # every segment the refresh wrote (one per core for a big refresh)


@dataclass(frozen=True)
class Adopted:
    """What :meth:`ShardDirectory.adopt` did."""

    segment: str  # the new segment's name
    rows: int  # rows of the file (seq#s taken)
    reapplied: int  # of them, re-applied as operations (an update, an id the file repeats)
    ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()), repr=False)  # the file's, row order
    versions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)  # per row (row_versions)


@dataclass(frozen=True)
class Sealed:
    """A buffer sealed for a refresh beside the writes (:meth:`ShardDirectory.seal`)."""

    buffer: IndexBuffer
    top: int  # the directory's max seq# when it was sealed: every sealed operation is at or below it
    tombstones: pa.Table  # the tombstones then (the winners are decided against them)


@dataclass(frozen=True)
class Prepared:
    """A batch checked against the mapping: its parsed field columns and the mapping they need."""

    rows: int
    fields: pa.Table | None
    mapping: Mapping
    all_index: bool = False  # every operation is an index operation (the caller knows: no split needed)
