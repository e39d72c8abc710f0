"""Reading a shard commit: its segments with live docs, as Arrow, from a local directory or the blob store.

``open_commit(store, address)`` (newest commit of the newest term, ``generation=N``, or
the newest holding no operation above ``max_seq_no``) returns a :class:`ShardCommitReader`.
Remote segment files are fetched whole and verified against the size and CRC32C the commit
records before anything reads them (a partial range read could not be checksummed).  Where
they go is :func:`reads_in_memory`'s choice (docs/design/segments.md, "Reading"): a commit of
at most :data:`IN_MEMORY_COMMIT_BYTES` is held in memory by its reader, as deltalake and
pyiceberg read (no disk write, nothing left behind: issue 44's cold scan); a bigger one, or any
reader given ``cache=True``, goes through :func:`shardstore.segments.read_plan.fetch_verified`,
the one verified disk cache every reader shares.  Then :meth:`ShardCommitReader.scan` reads the
Parquet files with row-group pruning by the filter's statistics and applies the live docs;
:meth:`ShardCommitReader.plan` hands other engines (Spark) the commit as picklable tasks.

Readers pickle as (store, metadata, cache directory, cache choice): cheap to ship to Spark executors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.segments import remote_store
from shardstore.segments.commit import CommitPoint, CommittedSegment
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.read_plan import DEFAULT_CACHE_DIR, CommitPlan, cache_path, fetch_verified
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import get_verified, latest_commit
from shardstore.segments.segment import BASE_SCHEMA, SegmentReader, scan_segments

#: A commit whose files total at most this many bytes is read into memory unless its reader is told to cache.
IN_MEMORY_COMMIT_BYTES = 256 << 20


def reads_in_memory(sizes: Iterable[int], cache: bool | None) -> bool:
    """Whether a reader holds a commit's files (of ``sizes`` bytes) in memory rather than in the disk cache (pure).

    Never with ``cache=True``, always with ``False``, and with ``None`` when they total at most
    :data:`IN_MEMORY_COMMIT_BYTES`.  A file above ``STREAM_OVER`` goes through the disk cache whatever this says.
    """
    if cache is not None:
        return not cache
    return sum(sizes) <= IN_MEMORY_COMMIT_BYTES


class ShardCommitReader:
    """One remote commit of a shard, readable as Arrow with its live docs applied.

    ``cache``: True reads through the shared disk cache (``cache_dir``: another reader, a Spark task, finds the
    files there), False holds them in this reader's memory (the whole commit, each file up to ``STREAM_OVER``),
    None (the default) chooses by the commit's size (:func:`reads_in_memory`).  Pass True when many readers of one
    commit come and go (one per request): each new reader of a commit held in memory downloads it again.
    Calls from several threads are safe; each file is fetched once per reader.
    """

    def __init__(self, store: BlobStore, metadata: RemoteCommitMetadata, cache_dir: str | None = None,
                 *, download_concurrency: int = 8, cache: bool | None = None) -> None:
        self.store = store
        self.metadata = metadata
        self.cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self.download_concurrency = download_concurrency
        self.cache = cache
        self._in_memory = reads_in_memory((f.size for f in metadata.files.values()), cache)
        self._segments: list[tuple[SegmentReader, LiveDocs]] | None = None
        self._kept: dict[str, tuple[SegmentReader, LiveDocs]] = {}  # segments held in memory, by name
        self._lock = threading.Lock()  # one fetch at a time: concurrent callers never download a file twice

    def __getstate__(self) -> dict:
        return {"store": self.store, "metadata": self.metadata, "cache_dir": self.cache_dir,
                "download_concurrency": self.download_concurrency, "cache": self.cache}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state.pop("store"), state.pop("metadata"), state.pop("cache_dir"), **state)

    @property
    def commit(self) -> CommitPoint:
        """The commit point being read."""
        return self.metadata.commit

    @property
    def mapping(self) -> Mapping:
        """The index mapping as of this commit."""
        return Mapping.from_dict(self.commit.mapping)

    def schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        """Base columns plus every mapped field (or just ``columns``)."""
        full = pa.schema(list(BASE_SCHEMA) + list(self.mapping.arrow_schema()))
        return full if columns is None else pa.schema([full.field(c) for c in columns])

    def _held(self, name: str) -> bool:
        """Whether file ``name`` of the commit is read into memory (:func:`reads_in_memory`, small files only)."""
        return self._in_memory and self.metadata.files[name].size <= remote_store.STREAM_OVER

    def _fetch(self, name: str) -> str | bytes:
        """The file's verified bytes (held in memory) or the path of its verified cached copy."""
        if self._held(name):
            return get_verified(self.store, self.metadata.files[name])
        # re-read the cached bytes every time: a reader may outlive a rewrite of its cache
        return fetch_verified(self.store, self.metadata.files[name], self.cache_dir, recheck=True)

    def plan(self, *, shard: int = 0, superseded: pa.Array | None = None) -> CommitPlan:
        """The commit as a read plan (picklable tasks for another engine); ``superseded``: ids read elsewhere."""
        return CommitPlan(shard, self.metadata).with_superseded(superseded)

    def segments(self, which: Sequence[CommittedSegment] | None = None) -> list[tuple[SegmentReader, LiveDocs]]:
        """(reader, live docs) per segment of the commit, downloading and verifying what it does not hold yet."""
        with self._lock:
            return self._segments_locked(which)

    def _segments_locked(self, which: Sequence[CommittedSegment] | None) -> list[tuple[SegmentReader, LiveDocs]]:
        if which is None and self._segments is not None:
            return self._segments
        chosen = list(self.commit.segments if which is None else which)
        fresh = {s.info.name: s for s in chosen if s.info.name not in self._kept}  # held ones: never fetched twice
        names = [n for s in fresh.values() for n in (s.info.file_name, s.livedocs_file) if n]
        if not all(self._held(n) for n in names):
            os.makedirs(self.cache_dir, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, min(self.download_concurrency, len(names) or 1))) as pool:
            got = dict(zip(names, pool.map(self._fetch, names)))
        opened = {name: self._open(s, got) for name, s in fresh.items()}
        out = [self._kept[s.info.name] if s.info.name in self._kept else opened[s.info.name] for s in chosen]
        if which is None:
            self._segments = out
        return out

    def _open(self, s: CommittedSegment, got: dict[str, str | bytes]) -> tuple[SegmentReader, LiveDocs]:
        """Segment ``s`` as (reader, live docs) from its fetched files (paths or verified bytes)."""
        live = LiveDocs.all_live(s.info.doc_count)
        if s.livedocs_file:
            raw = got[s.livedocs_file]
            if isinstance(raw, str):
                with open(raw, "rb") as f:
                    raw = f.read()
            live = LiveDocs.decode(raw, self.metadata.files[s.livedocs_file].key)
        data = got[s.info.file_name]
        if isinstance(data, str):
            return SegmentReader(data, s.info), live
        # its path is where its cached copy goes: written there only if a caller asks for the file (SegmentReader.path)
        remote = self.metadata.files[s.info.file_name]
        pair = SegmentReader(cache_path(remote, self.cache_dir), s.info, data=pa.py_buffer(data)), live
        if not s.livedocs_file or self._held(s.livedocs_file):
            self._kept[s.info.name] = pair
        return pair

    def scan(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None  # noqa: A002
             ) -> Iterator[pa.RecordBatch]:
        """Live documents of the commit as batches of :meth:`schema` (missing fields are nulls)."""
        from shardstore.segments.scan_readers import scan_readers

        yield from scan_readers(self.segments(), self.mapping, columns, filter)

    def count(self) -> int:
        """Live documents in the commit (from the commit point alone, no download)."""
        return self.commit.doc_count

    def get(self, doc_id: str) -> dict | None:
        """The live copy of ``doc_id`` in this commit, or None (downloads only segments whose _id range holds it)."""
        cands = [s for s in self.commit.segments
                 if s.info.min_id is not None and s.info.min_id <= doc_id <= s.info.max_id]
        for reader, live in self.segments(cands):
            _q, rows = reader.lookup(pa.array([doc_id], pa.string()))
            for r in rows.to_pylist():
                if live.is_live(r):
                    return reader.take([r]).to_pylist()[0]
        return None


def open_commit(store: BlobStore, address: ShardAddress, generation: int | None = None,
                cache_dir: str | None = None, *, max_seq_no: int | None = None,
                cache: bool | None = None) -> ShardCommitReader:
    """A reader of the shard's newest remote commit (of ``generation``; holding no operation above ``max_seq_no``).

    ``cache``: where its files go (:class:`ShardCommitReader`): by default a commit of at most
    :data:`IN_MEMORY_COMMIT_BYTES` is held in the reader's memory; ``cache=True`` shares ``cache_dir`` on disk.
    """
    return ShardCommitReader(store, latest_commit(store, address, generation, max_seq_no=max_seq_no), cache_dir,
                             cache=cache)


__all__ = ["IN_MEMORY_COMMIT_BYTES", "CommitPlan", "ShardCommitReader", "open_commit", "reads_in_memory",
           "scan_segments"]
