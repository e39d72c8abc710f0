"""Reading a shard commit: its segments with live docs, as Arrow, from a local directory or the blob store.

``open_commit(store, address)`` (newest commit of the newest term, ``generation=N``, or
the newest holding no operation above ``max_seq_no``) returns a :class:`ShardCommitReader`.
Remote segment files are fetched whole into a local cache directory and verified against
the size and CRC32C the commit records before anything reads them (a partial range read
could not be checksummed): :func:`shardstore.segments.read_plan.fetch_verified`, the one
verified cache every reader shares.  Then :meth:`ShardCommitReader.scan` reads the cached
Parquet files with row-group pruning by the filter's statistics and applies the live docs;
:meth:`ShardCommitReader.plan` hands other engines (Spark) the commit as picklable tasks.

Readers pickle as (store, metadata, cache directory): cheap to ship to Spark executors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.segments.commit import CommitPoint, CommittedSegment
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.read_plan import DEFAULT_CACHE_DIR, CommitPlan, fetch_verified
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import latest_commit
from shardstore.segments.segment import BASE_SCHEMA, SegmentReader, scan_segments


class ShardCommitReader:
    """One remote commit of a shard, readable as Arrow with its live docs applied."""

    def __init__(self, store: BlobStore, metadata: RemoteCommitMetadata, cache_dir: str | None = None,
                 *, download_concurrency: int = 8) -> None:
        self.store = store
        self.metadata = metadata
        self.cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self.download_concurrency = download_concurrency
        self._segments: list[tuple[SegmentReader, LiveDocs]] | None = None

    def __getstate__(self) -> dict:
        return {"store": self.store, "metadata": self.metadata, "cache_dir": self.cache_dir,
                "download_concurrency": self.download_concurrency}

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

    def _fetch(self, name: str) -> str:
        # re-read the cached bytes every time: a reader may outlive a rewrite of its cache
        return fetch_verified(self.store, self.metadata.files[name], self.cache_dir, recheck=True)

    def plan(self, *, shard: int = 0, superseded: pa.Array | None = None) -> CommitPlan:
        """The commit as a read plan (picklable tasks for another engine); ``superseded``: ids read elsewhere."""
        return CommitPlan(shard, self.metadata).with_superseded(superseded)

    def segments(self, which: Sequence[CommittedSegment] | None = None) -> list[tuple[SegmentReader, LiveDocs]]:
        """(reader, live docs) per segment of the commit, downloading and verifying what is not cached."""
        if which is None and self._segments is not None:
            return self._segments
        chosen = list(self.commit.segments if which is None else which)
        os.makedirs(self.cache_dir, exist_ok=True)
        names = [s.info.file_name for s in chosen] + [s.livedocs_file for s in chosen if s.livedocs_file]
        with ThreadPoolExecutor(max_workers=max(1, min(self.download_concurrency, len(names) or 1))) as pool:
            paths = dict(zip(names, pool.map(self._fetch, names)))
        out = []
        for s in chosen:
            live = LiveDocs.all_live(s.info.doc_count)
            if s.livedocs_file:
                with open(paths[s.livedocs_file], "rb") as f:
                    live = LiveDocs.decode(f.read(), self.metadata.files[s.livedocs_file].key)
            out.append((SegmentReader(paths[s.info.file_name], s.info), live))
        if which is None:
            self._segments = out
        return out

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
                cache_dir: str | None = None, *, max_seq_no: int | None = None) -> ShardCommitReader:
    """A reader of the shard's newest remote commit (of ``generation``; holding no operation above ``max_seq_no``)."""
    return ShardCommitReader(store, latest_commit(store, address, generation, max_seq_no=max_seq_no), cache_dir)


__all__ = ["CommitPlan", "ShardCommitReader", "open_commit", "scan_segments"]
