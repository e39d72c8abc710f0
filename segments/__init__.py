"""shardstore.segments: Parquet segments, commit points and the remote segment store (docs/design/segments.md).

- ``mapping``: field types, dynamic mapping, columnar JSON parsing (``MappingConflict``);
- ``segment``, ``livedocs``: the immutable Parquet segment file and its deleted-rows bitmap;
- ``commit``, ``directory``: commit points ``segments_N`` and the local shard directory
  (buffer, refresh, flush, merges, retention);
- ``remote_store``, ``remote_metadata``, ``reader``: incremental upload, fencing, restore,
  GC and locks, and reading a remote commit as Arrow (``reader.open_commit`` is also
  ``shardstore.open_commit``);
- ``read_plan``: a commit as picklable read tasks for other engines (Spark) and the one
  verified segment cache every reader shares;
- pure decisions: ``merge_policy``, ``gc`` (path strategies and ``ShardAddress`` come from
  :mod:`shardstore.core`, re-exported here).
"""

from shardstore.core.address import ShardAddress
from shardstore.core.path_strategy import HashedPrefixPathStrategy, PathStrategy, PlainPathStrategy
from shardstore.segments.commit import CommitPoint, CommittedSegment
from shardstore.segments.directory import RefreshResult, ShardDirectory
from shardstore.segments.errors import (
    CommitConflict,
    CommitNotFound,
    InvalidDocument,
    MappingConflict,
    SegmentCorrupted,
    SegmentError,
)
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import FieldType, Mapping, parse_sources, sources_from_pylist, sources_from_table
from shardstore.segments.merge_policy import TieredMergePolicy
from shardstore.segments.reader import ShardCommitReader, open_commit
from shardstore.segments.remote_store import RemoteSegmentStore, RestoreResult, restore
from shardstore.segments.segment import SegmentInfo, SegmentReader, write_segment

__all__ = [
    "CommitConflict",
    "CommitNotFound",
    "CommitPoint",
    "CommittedSegment",
    "FieldType",
    "HashedPrefixPathStrategy",
    "InvalidDocument",
    "LiveDocs",
    "Mapping",
    "MappingConflict",
    "PathStrategy",
    "PlainPathStrategy",
    "RefreshResult",
    "RemoteSegmentStore",
    "RestoreResult",
    "SegmentCorrupted",
    "SegmentError",
    "SegmentInfo",
    "SegmentReader",
    "ShardAddress",
    "ShardCommitReader",
    "ShardDirectory",
    "TieredMergePolicy",
    "open_commit",
    "parse_sources",
    "restore",
    "sources_from_pylist",
    "sources_from_table",
    "write_segment",
]
