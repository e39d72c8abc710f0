"""The read plan of a shard commit: small picklable tasks that any engine reads, and the one verified cache.

A reader (the Python scan, Spark's ``format("shardstore")`` executors, the JVM bridge's
fast path, the changes feed) never walks a commit's segments itself: it asks for a
:class:`CommitPlan` (``open_commit(store, address).plan()``) and reads its
:class:`ReadTask` s, as pyiceberg's ``scan().plan_files()`` hands an engine its file tasks.
A task holds only references (blob key, size, CRC32C of the segment and of its live-docs
file), the segment's stats, a row-group range and the ids a newer source supersedes (a few
hundred bytes plus those ids): it ships to any executor without any segment bytes.

Every remote file a task reads goes through :func:`fetch_verified`: fetched whole into the
local cache and checked against the size and CRC32C its commit records before anything reads
it (docs/design/segments.md, "Read plan"; a commit reader holding a small commit in memory
checks the same way: segments/reader.py).  A process remembers which cached files it
verified (by size, CRC32C, mtime and inode); ``recheck=True`` re-reads the bytes anyway.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from shardstore.blobstores.base import BlobStore
from shardstore.core.records import crc32c
from shardstore.segments.dictionary_read import open_segment_file
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.remote_metadata import RemoteCommitMetadata, RemoteFile
from shardstore.segments.remote_store import download_file
from shardstore.segments.segment import BASE_SCHEMA, SegmentInfo, SegmentReader, conform, mentions, prunable
from shardstore.segments.stamp import group_starts, read_groups, stamped_schema
from shardstore.segments.synthetic import fill_sources

__all__ = ["DEFAULT_CACHE_DIR", "ROWS_PER_TASK", "WHOLE_SEGMENTS", "CommitPlan", "ReadTask", "cache_path", "fetch_verified"]

#: Where remote segment files are cached unless a reader is given another directory.
DEFAULT_CACHE_DIR = os.path.join(tempfile.gettempdir(), "shardstore-cache")
#: Without ``row_groups_per_task``, a large segment is split into ranges of row groups of about this many rows.
ROWS_PER_TASK = 1_000_000
#: ``row_groups_per_task`` that makes every task a whole segment (Spark's own Parquet reader splits files itself).
WHOLE_SEGMENTS = 2**31
#: Rows a task reads, filters and yields at a time (a task holds one chunk, not its whole range).
BATCH_ROWS = 128 * 1024

_VERIFIED: dict[str, tuple[int, int, int, int]] = {}  # local path -> (size, crc, mtime_ns, inode) verified here
_VERIFIED_LOCK = threading.Lock()


def cache_path(remote: RemoteFile, cache_dir: str | None = None) -> str:
    """Where ``remote`` is cached: its blob key (unique per upload) made a file name, so two commits never clash."""
    return os.path.join(cache_dir or DEFAULT_CACHE_DIR, remote.key.replace("/", "_"))


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def fetch_verified(store: BlobStore, remote: RemoteFile, cache_dir: str | None = None, *,
                   recheck: bool = False) -> str:
    """The local copy of ``remote`` whose size and CRC32C match its commit (downloaded when missing or stale).

    A copy this process verified and nobody rewrote since (same size, mtime, inode) is
    trusted without re-reading it unless ``recheck``; a download is verified by
    :func:`~shardstore.segments.remote_store.download_file` (SegmentCorrupted names the blob).
    """
    path = cache_path(remote, cache_dir)
    stamp = _stamp(path)
    if stamp is not None and stamp[0] == remote.size:
        memo = (remote.size, remote.checksum, stamp[1], stamp[2])
        if not recheck and _VERIFIED.get(path) == memo:
            return path
        with open(path, "rb") as f:
            if crc32c(f.read()) == remote.checksum:
                with _VERIFIED_LOCK:
                    _VERIFIED[path] = memo
                return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    download_file(store, remote, path, durable=False)  # a cache: every later use checks it again (above)
    stamp = _stamp(path)
    if stamp is not None:
        with _VERIFIED_LOCK:
            _VERIFIED[path] = (remote.size, remote.checksum, stamp[1], stamp[2])
    return path


def read_livedocs(store: BlobStore, remote: RemoteFile, cache_dir: str | None = None) -> LiveDocs:
    """The verified live-docs bitmap ``remote`` names."""
    with open(fetch_verified(store, remote, cache_dir), "rb") as f:
        return LiveDocs.decode(f.read(), remote.key)


@dataclass(frozen=True, eq=False)
class ReadTask:
    """One segment of a commit, or a range of its row groups: references and stats only (picklable, small)."""

    shard: int
    info: SegmentInfo
    data: RemoteFile
    livedocs: RemoteFile | None  # None: every row is live
    row_groups: tuple[int, int]  # [lo, hi)
    superseded: pa.Array | None = None  # ids a newer source replaces, clipped to the segment's id range
    order: tuple[str, ...] = ()  # the index's field order: a null _source asked for is rebuilt in it

    def local_file(self, store: BlobStore, cache_dir: str | None = None) -> tuple[str, pa.Array | None]:
        """(verified local path, row numbers to drop or None): live docs' deletions and superseded ids' rows."""
        path = fetch_verified(store, self.data, cache_dir)
        deleted = None
        if self.livedocs is not None:
            live = read_livedocs(store, self.livedocs, cache_dir)
            if live.deleted_count:
                deleted = live.deleted_rows()
        if self.superseded is not None:
            _q, rows = SegmentReader(path, self.info).lookup(self.superseded)
            if len(rows):
                rows = rows.cast(pa.int64())
                deleted = rows if deleted is None else pa.concat_arrays([deleted.cast(pa.int64()), rows])
        return path, deleted

    def read(self, store: BlobStore, schema: pa.Schema, filter: pc.Expression | None = None,  # noqa: A002
             work: pa.Schema | None = None, cache_dir: str | None = None,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """The task's live rows passing ``filter``, as batches of exactly ``schema`` (absent columns null, cast).

        ``work`` is the schema the filter is evaluated on (``schema`` plus the columns only
        the filter reads); row groups whose statistics rule the filter out are not read.
        """
        path = fetch_verified(store, self.data, cache_dir)
        live = read_livedocs(store, self.livedocs, cache_dir) if self.livedocs is not None else None
        pf = open_segment_file(path)  # dictionary strings read as such, cast back by read_groups (dictionary_read.py)
        md = pf.metadata
        lo, hi = self.row_groups
        groups = list(range(lo, min(hi, md.num_row_groups)))
        stamp = self.info.stamp  # a stamped file's metadata columns are made as it is read (segments/stamp.py)
        if groups and prunable(self.info, filter):
            frag = next(iter(ds.dataset(path, format="parquet").get_fragments()))
            kept = {p.row_groups[0].id for p in frag.subset(row_group_ids=groups).split_by_row_group(filter)}
            groups = [g for g in groups if g in kept]
        if not groups:
            return
        work = work or schema
        present = set(stamped_schema(pf.schema_arrow, stamp).names)
        want = [n for n in schema.names if n in present]
        extra = [n for n in present if n not in want and filter is not None and mentions(filter, n)]
        if self.superseded is not None and "_id" not in want:
            extra.append("_id")
        rebuild = "_source" in want  # a null _source (source_keep, synthetic source) is rebuilt from every field
        if rebuild:
            extra += [n for n in pf.schema_arrow.names if n not in want and n not in extra and n not in BASE_SCHEMA.names]
        starts = group_starts(md).tolist()
        mask = live.mask() if live is not None and live.deleted_count else None
        chunk: list[int] = []
        for i, g in enumerate(groups):
            chunk.append(g)
            rows = sum(starts[c + 1] - starts[c] for c in chunk)
            if rows < batch_rows and i + 1 < len(groups):
                continue
            t = read_groups(pf, stamp, chunk, want + extra, starts=starts)
            keep = None
            if mask is not None:
                keep = pa.concat_arrays([mask.slice(starts[c], starts[c + 1] - starts[c]) for c in chunk])
            if self.superseded is not None:
                fresh = pc.invert(pc.is_in(t.column("_id"), value_set=self.superseded))
                keep = fresh if keep is None else pc.and_(keep, fresh)
            if keep is not None:
                t = t.filter(keep)
            if rebuild and t.num_rows:  # before the filter, which keeps only the columns it reads
                t = fill_sources(t, self.order)
            if filter is not None and t.num_rows:
                t = conform(t, work).filter(filter)
            if t.num_rows:
                yield from conform(t, schema).to_batches(max_chunksize=batch_rows)
            chunk = []


def _in_range(ids: pa.Array | None, info: SegmentInfo) -> pa.Array | None:
    """The ids of ``ids`` inside the segment's [min_id, max_id] (None when none is)."""
    if ids is None or info.min_id is None or len(ids) == 0:
        return None
    out = ids.filter(pc.and_(pc.greater_equal(ids, info.min_id), pc.less_equal(ids, info.max_id)))
    return out if len(out) else None


@dataclass(frozen=True, eq=False)
class CommitPlan:
    """One shard's chosen remote commit, ready to be split into read tasks (no I/O)."""

    shard: int
    metadata: RemoteCommitMetadata
    superseded: pa.Array | None = None  # ids whose newer operations live elsewhere (a translog tail)

    @property
    def mapping(self) -> Mapping:
        """The index mapping as of this commit."""
        return Mapping.from_dict(self.metadata.commit.mapping)

    def with_superseded(self, ids: pa.Array | None) -> CommitPlan:
        """The same plan with ``ids`` (a newer source's) excluded from every task."""
        return replace(self, superseded=ids if ids is not None and len(ids) else None)

    def tasks(self, keep: Callable[[SegmentInfo], bool] | None = None,
              row_groups_per_task: int = 0) -> list[ReadTask]:
        """Tasks of the segments with live rows that ``keep`` accepts (by their stats).

        ``row_groups_per_task``: 0 splits a segment into ranges of about
        :data:`ROWS_PER_TASK` rows; N, into ranges of N row groups; :data:`WHOLE_SEGMENTS`, not at all.
        """
        out = []
        files = self.metadata.files
        for seg in self.metadata.commit.segments:
            if seg.live_count == 0 or (keep is not None and not keep(seg.info)):
                continue
            data = files[seg.info.file_name]
            liv = files[seg.livedocs_file] if seg.livedocs_file else None
            sup = _in_range(self.superseded, seg.info)
            groups = max(1, seg.info.row_groups)
            step = row_groups_per_task or max(1, round(ROWS_PER_TASK * groups / max(1, seg.info.doc_count)))
            for start in range(0, groups, step):
                out.append(ReadTask(self.shard, seg.info, data, liv, (start, min(groups, start + step)), sup,
                                    self.mapping.order))
        return out
