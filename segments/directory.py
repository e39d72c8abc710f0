"""The local shard directory: an Arrow indexing buffer, segments, live docs, commit points, merges.

Operations arrive as translog batches (:data:`shardstore.translog.operations.SCHEMA`).
:meth:`ShardDirectory.apply` parses index sources against the mapping (a conflict
rejects the whole batch before anything is buffered) and buffers them; deletes are
buffered as (id, seq#).  :meth:`ShardDirectory.refresh` turns the buffer into one new
segment, columnar throughout:

1. per id, the operation with the highest seq# wins (buffer, deletes and tombstones);
2. existing live copies of the winning ids are found with each segment's id index
   (no row-by-row scan); a copy with a lower seq# is marked deleted in that segment's
   live docs, a copy with a higher seq# makes the buffered operation stale (a replica
   receiving operations out of order) and it is dropped;
3. the surviving index operations are written as one segment sorted by ``_id``.

:meth:`ShardDirectory.flush` refreshes, writes one new live-docs file per segment
whose deletions changed (``<segment>_<gen>.liv``; segments are never rewritten),
optionally merges (tiered policy), writes ``segments_N`` atomically, keeps the last
``keep_commits`` commits plus locked ones, and deletes files no retained commit or
open segment needs.  See docs/design/segments.md, "Local shard directory".
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import filled, one_array, take_rows
from shardstore.core.ops import NO_OPS
from shardstore.core.records import crc32c
from shardstore.fileio import write_atomic
from shardstore.segments import row_cache
from shardstore.segments.adoption import Reapplied, check_adoptable, reapply_plan, row_versions
from shardstore.segments.commit import (
    CommitPoint,
    commit_file_name,
    list_commit_generations,
    read_commit,
    write_commit,
)
from shardstore.segments.directory_records import Adopted, Prepared, RefreshResult, Sealed, _Segment
from shardstore.segments.errors import InvalidDocument, SegmentCorrupted, SegmentError
from shardstore.segments.gc import local_deletable, retained_commits
from shardstore.segments.held_view import HeldView, ViewTag
from shardstore.segments.id_index import SortedKeys, _IdIndex
from shardstore.segments.index_buffer import DELETES as _DELETES
from shardstore.segments.index_buffer import IndexBuffer, buffered_docs, split_ops
from shardstore.segments.livedocs import LiveDocs, livedocs_file_name
from shardstore.segments.mapping import Mapping
from shardstore.segments.merge_policy import TieredMergePolicy
from shardstore.segments.merging import MergeInput, carried_deletes, write_merged
from shardstore.segments.newest_copy import newest_copy
from shardstore.segments.refresh_plan import RefreshPlan, buffer_order, index_rows, older_copies, plan_refresh
from shardstore.segments.scan_readers import scan_readers
from shardstore.segments.segment import (
    BASE_SCHEMA,
    SegmentInfo,
    SegmentReader,
    conform,
    segment_file_name,
    write_segment,
)
from shardstore.segments.segment_writer import place_stamped
from shardstore.segments.shard_id_index import ShardIdIndex
from shardstore.segments.stamp import Stamp
from shardstore.segments.synthetic import index_op_fields
from shardstore.segments.version_map import SEEN, VersionMap
from shardstore.segments.versions import Finder, latest_versions

log = logging.getLogger(__name__)
LOCK_FILE = "write.lock"
#: The indexing buffer: once the buffered documents' Arrow bytes reach this, ``buffer_full`` is
#: true and the engine refreshes while the bulk's translog upload is in flight (engine/shard/shard_copy.py).
INDEX_BUFFER_BYTES = 32 << 20
#: A primary seals its buffer for a refresh beside the writes once it holds this share of ``index_buffer_bytes``
#: and no sealed buffer is being written (``ready_to_seal``): the refreshes keep pace with a steady bulk stream
#: instead of starting only when the buffer is full (docs/design/segments.md, "A full buffer is refreshed beside
#: the writes").
SEAL_EARLY_SHARE = 0.25
#: A refresh beside the writes (a sealed buffer) of at least twice this many documents writes one segment per core,
#: in parallel: a buffer that filled over several bulks while the one before was written (the writes take a core
#: meanwhile, and a flush may be waiting for it).
PARALLEL_SEGMENT_DOCS = 40_000
#: The same for a refresh its caller waits for with no sealed write beside it (a flush's tail): the writes that
#: wait for it leave the other cores idle (docs/design/segments.md, "Parts of a refresh").
FOREGROUND_PART_DOCS = 16_384
#: how long closing waits for a refresh beside the writes to end (it writes into the directory)
CLOSE_WAIT_SECONDS = 60.0


def _discard(readers: list[SegmentReader]) -> None:
    """Close and remove segment files written but never published."""
    for reader in readers:
        reader.close()
        with contextlib.suppress(OSError):
            os.unlink(reader.path)


def _mask(live: LiveDocs) -> np.ndarray:
    """A segment's live docs as a numpy bool array (one per row)."""
    return np.asarray(live.mask().to_numpy(zero_copy_only=False), dtype=bool)


class ShardDirectory:
    """One shard's local segments and commits (single writer per directory)."""

    def __init__(
        self,
        path: str,
        *,
        mapping: Mapping | dict | None = None,
        dynamic: bool = True,
        keep_commits: int = 3,
        merge_policy: TieredMergePolicy | None = None,
        fsync: bool = True,
        warm: bool = True,
        index_buffer_bytes: int | None = None,
    ) -> None:
        self.path = path
        #: ``buffer_full`` once the buffered documents hold this many Arrow bytes (default INDEX_BUFFER_BYTES)
        self.index_buffer_bytes = INDEX_BUFFER_BYTES if index_buffer_bytes is None else index_buffer_bytes
        self._warm = warm  # queue published segments for the row-cache warmer (off for throw-away directories)
        self.dynamic = dynamic
        self.keep_commits = keep_commits
        self.merge_policy = merge_policy or TieredMergePolicy()
        self._fsync = fsync
        self._lock = threading.RLock()
        os.makedirs(path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SegmentError(f"{path}: the shard directory is open by another writer ({LOCK_FILE} is locked)") from None
        self._segments: dict[str, _Segment] = {}
        self._id_index = ShardIdIndex()  # every segment's id fingerprints in a few levels (under the lock)
        self._buffer = IndexBuffer()
        #: a full buffer whose segments a refresh beside the writes is writing (seal, write_sealed): still visible to
        #: version lookups and realtime gets until they are installed; ``_sealed_failed``: that refresh failed
        self._sealed: IndexBuffer | None = None
        self._sealed_failed = False
        self._sealed_done = threading.Condition(self._lock)
        #: the buffer a refresh beside the writes planned from, while it waits for the sealed one (not to be sealed)
        self._refreshing: IndexBuffer | None = None
        #: one merging thread at a time (taken before ``_lock``, never while holding it); the files merges are
        #: writing, kept by ``_delete_unreferenced``; ``_closed``: a merge finishing after close installs nothing
        self._merge_lock = threading.Lock()
        self._merging_files: set[str] = set()
        self._closed = False
        #: merges installed since the directory was opened (a copy's flush mark: a merge installed after the flush
        #: that asked for it makes the next flush commit it, engine/shard/flush_policy.py)
        self.merges_installed = 0
        self._tombstones = _DELETES.empty_table()
        #: every operation refreshed (in a segment or a tombstone) has a seq# <= this: a buffered operation
        #: above it is newer than any refreshed copy, so the buffer alone decides its id
        self._refreshed_seq = NO_OPS
        self._locked: dict[int, int] = {}  # commit generation -> lock count
        self._view = HeldView()  # what reads see while ingest jobs apply (segments/held_view.py)
        self._deferred_pin: int | None = None  # a replica's hold without a refresh: its buffer's seq# mark (hold_view)
        self.last_commit: CommitPoint | None = None
        self.max_seq_no = NO_OPS
        try:
            gens = list_commit_generations(path)
            if gens:
                self.last_commit = read_commit(path, gens[-1])
                self._load(self.last_commit)
                self.max_seq_no = self._refreshed_seq = self.last_commit.max_seq_no
            given = mapping if isinstance(mapping, Mapping) else Mapping.from_dict(mapping or {})
            committed = Mapping.from_dict(self.last_commit.mapping) if self.last_commit else Mapping(())
            self.mapping = committed.with_fields({n: given[n] for n in given.order}) if len(given) else committed
            self._delete_unreferenced()
            for leftover in os.listdir(path):  # a write torn by a kill (a merge's, a refresh's): ours alone, locked
                if leftover.startswith(".") and leftover.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(path, leftover))
        except BaseException:
            self.close()
            raise

    # -- opening ----------------------------------------------------------------------------

    def _load(self, commit: CommitPoint) -> None:
        for cs in commit.segments:
            path = os.path.join(self.path, cs.info.file_name)
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                raise SegmentCorrupted(path, f"segment file named by {commit.file_name} is missing") from None
            if size != cs.info.size:
                raise SegmentCorrupted(path, f"size {size}, {commit.file_name} says {cs.info.size}")
            live = LiveDocs.all_live(cs.info.doc_count)
            if cs.livedocs_file is not None:
                lpath = os.path.join(self.path, cs.livedocs_file)
                with open(lpath, "rb") as f:
                    data = f.read()
                if (len(data), crc32c(data)) != (cs.livedocs_size, cs.livedocs_checksum):
                    raise SegmentCorrupted(lpath, f"size/CRC32C {len(data)}/{crc32c(data):#010x}, {commit.file_name} "
                                                  f"says {cs.livedocs_size}/{cs.livedocs_checksum:#010x}")
                live = LiveDocs.decode(data, lpath)
            self._segments[cs.info.name] = _Segment(
                SegmentReader(path, cs.info), live, cs.livedocs_generation, cs.livedocs_file,
                cs.livedocs_size, cs.livedocs_checksum)
            self._queue_warming(self._segments[cs.info.name].reader)

    def set_warming(self, on: bool) -> None:
        """Queue published segments for the row-cache warmer from now on (every current one too) or not: a replica
        serves no point reads, so its copy warms nothing until it is promoted."""
        with self._lock:
            was, self._warm = self._warm, on
            if on and not was:
                for seg in self._segments.values():
                    self._queue_warming(seg.reader)

    def _queue_warming(self, reader: SegmentReader) -> None:
        """Hand a newly published segment to the row-cache warmer: its first get is then a hit."""
        if self._warm:
            row_cache.warmer.submit(reader)

    # -- writing ----------------------------------------------------------------------------

    def merge_mapping(self, mapping: Mapping) -> None:
        """Take in the fields of ``mapping`` (the index's, decided once for every shard); MappingConflict on a clash.

        The index's field order comes first (a rebuilt ``_source`` lists its members in it:
        segments/source_keep.py); fields only this copy maps follow.
        """
        with self._lock:
            if mapping is not self.mapping and len(mapping):
                merged = mapping.merged(self.mapping)
                self.mapping = self.mapping if merged == self.mapping and merged.order == self.mapping.order else merged

    def prepare(self, ops: pa.RecordBatch | pa.Table) -> Prepared:
        """Check and parse a batch (stamped or not) without buffering it: MappingConflict / InvalidDocument here.

        A primary prepares before it hands out seq#s, so a rejected batch consumes none.
        """
        table = ops if isinstance(ops, pa.Table) else pa.Table.from_batches([ops])
        idx, dels = split_ops(table)
        if dels.num_rows and dels.column("id").null_count:
            raise InvalidDocument(None, None, "a delete operation has no id")
        with self._lock:
            fields, mapping = None, self.mapping
            if idx.num_rows:
                fields, mapping = index_op_fields(idx, self.mapping, dynamic=self.dynamic)
        return Prepared(table.num_rows, fields, mapping)

    def apply(self, ops: pa.RecordBatch | pa.Table, prepared: Prepared | None = None, *,
              id_order: pa.Array | None = None, new_ids: np.ndarray | None = None,
              id_keys: SortedKeys | None = None) -> int:
        """Buffer a batch of stamped translog operations (index, delete, no-op); returns how many were buffered.

        Index sources are parsed against the mapping first (or taken from ``prepared``):
        MappingConflict or InvalidDocument rejects the whole batch and nothing of it is
        buffered.  ``id_order``: the permutation sorting the batch's ids, if the caller
        sorted them already (a primary does, for the versions); kept for the refresh when
        every operation is an index operation.  ``new_ids``: per operation, whether the caller's version
        lookup (:meth:`current_versions` with ``seen``, under the same write lock) found no copy of its id at
        all; kept likewise, so the refresh looks for older copies of the other ids only
        (docs/design/segments.md, "Ids new to the shard").  ``id_keys``: the sorted fingerprints of the batch's
        ids the caller's version lookup computed; kept likewise, as the buffered run's index for the next lookups.
        """
        table = ops if isinstance(ops, pa.Table) else pa.Table.from_batches([ops])
        if table.num_rows == 0:
            return 0
        if prepared is None:
            prepared = self.prepare(table)
        elif prepared.rows != table.num_rows:
            raise SegmentError(f"prepared {prepared.rows} rows, asked to apply {table.num_rows}")
        idx, dels = (table, table.slice(0, 0)) if prepared.all_index else split_ops(table)
        with self._lock:
            if idx.num_rows:
                assert prepared.fields is not None
                docs = buffered_docs(idx, prepared.fields)
                if prepared.mapping is not self.mapping:
                    self.mapping = self.mapping.with_fields({n: prepared.mapping[n] for n in prepared.mapping.order})
                whole = docs.num_rows == table.num_rows  # every operation an index operation: rows line up
                self._buffer.add_docs(docs, id_order if whole and id_order is not None and len(id_order) == docs.num_rows
                                      else None,
                                      new_ids if whole and new_ids is not None and len(new_ids) == docs.num_rows
                                      else None,
                                      id_keys if whole and id_keys is not None and len(id_keys.fp) == docs.num_rows
                                      else None)
            if dels.num_rows:
                self._buffer.add_deletes(pa.table([dels.column("id"), dels.column("seq_no")], schema=_DELETES))
            top = pc.max(table.column("seq_no")).as_py()
            self.max_seq_no = max(self.max_seq_no, top)
        return idx.num_rows + dels.num_rows

    def apply_run(self, docs: pa.Table, ids: list[str], first_seq_no: int, primary_term: int,
                  versions: list[int], nbytes: int) -> None:
        """Buffer a primary's run of index operations already stamped and parsed against this directory's mapping
        (:func:`buffered_docs` rows with the seq#s ``first_seq_no``.. in order, their ids and versions as lists,
        ``nbytes`` their share of the Arrow bytes): engine/shard/staging.py's columnar pass."""
        with self._lock:
            self._buffer.add_run(docs, ids, first_seq_no, primary_term, versions, nbytes)
            self.max_seq_no = max(self.max_seq_no, first_seq_no + len(ids) - 1)

    def adopt(self, path: str, stamp: Stamp, *, link: bool = False, versions: np.ndarray | None = None,
              new: tuple[pa.Array, SortedKeys] | None = None) -> Adopted:
        """Make the Parquet file ``path`` (``_id`` and mapped fields, no metadata columns) a segment of this
        directory as it is: row ``r`` at seq# ``stamp.seq_no_base + r`` (segments/stamp.py; docs/design/adoption.md).

        Under the lock, as one step: the file is copied in (hard-linked with ``link``: see
        :func:`~shardstore.segments.segment_writer.place_stamped`) and fsynced; its ids are looked up; a row
        whose id the shard holds or the file repeats is re-applied (``segments/adoption.py``: deleted from the
        new segment, buffered as an index operation at its seq# with its real version); the segment is
        published like a refresh's (a held view does not show it).

        The caller applies operations in seq# order: every seq# below the stamp's is applied first (a shard
        copy's local checkpoint is ``seq_no_base - 1``), or the lookups miss an id and the copies disagree on
        its version.  The directory keeps no checkpoint; a primary's adoption (no ``versions``) refuses a stamp
        at or below its max seq# (SegmentError).  ``versions``: per row, the version the primary gave it (a
        replica's or a replay's adoption of the primary's run): rows are re-applied as the primary did
        (``reapply_plan``'s ``given``), and a replay over rows already here re-applies them at their own seq#s,
        as a replayed index operation is (the newest seq# wins at the refresh).  A field the mapping lacks, or
        maps to another type: MappingConflict (merge the file's fields first); a bad ``_id`` or ``_source``
        column: ValueError.  Nothing changes when it raises.  ``new``: the file's ids and their sorted fingerprints
        when the caller (a primary, under its copy's lock) found every one of them new to the shard and distinct: no
        lookup, nothing re-applied (a part written once: engine/shard/write_once.py).
        """
        with self._lock:
            self._settle_sealed()
            if versions is None and stamp.seq_no_base <= self.max_seq_no:
                raise SegmentError(f"{self.path}: a file adopted at seq# {stamp.seq_no_base} is at or below the "
                                   f"directory's max seq# {self.max_seq_no}")
            self._pin_deferred_view()  # a replica's deferred view pins before the segment is there, as a refresh's
            name = f"seg_{uuid.uuid4().hex[:16]}"
            dest = os.path.join(self.path, segment_file_name(name))
            info = place_stamped(path, dest, name, stamp, link=link, fsync=self._fsync)
            reader = SegmentReader(dest, info)
            published = False
            try:
                check_adoptable(reader.schema, self.mapping, path)
                if new is not None:
                    reader.install_index(*new)
                index = reader.id_index()
                ids = index.ids
                if versions is not None and len(versions) != info.doc_count:
                    raise SegmentError(f"{path}: {info.doc_count} rows, {len(versions)} versions given to adopt it")
                if new is not None:  # the caller's lookup found them all new and distinct: nothing to re-apply
                    if versions is not None or len(ids) != info.doc_count:
                        raise SegmentError(f"{path}: new ids given for {len(ids)} of {info.doc_count} rows")
                    again = Reapplied(np.zeros(0, np.int64), np.zeros(0, np.int64))
                else:
                    distinct = index.distinct
                    found = self._versions_of_file(index) if distinct else self.current_versions(ids, seen=True)
                    again = reapply_plan(ids, found.column(SEEN), found.column("_version"), versions,
                                         distinct=distinct)
                live = LiveDocs.all_live(info.doc_count)
                docs = None
                if again.rows.size:
                    live = live.delete(pa.array(again.rows, pa.int64()))
                    docs = reader.take(again.rows)
                    docs = docs.set_column(docs.schema.get_field_index("_version"), "_version",
                                           pa.array(again.versions, pa.int64()))
                    docs = conform(docs, pa.schema(list(BASE_SCHEMA) + [docs.schema.field(n) for n in docs.schema.names
                                                                         if n not in BASE_SCHEMA.names]))
                if docs is not None:
                    self._buffer.add_docs(docs)  # last of what can fail: the segment goes in with it, or neither
                self._segments[name] = _Segment(reader, live, dirty=live.deleted_count > 0)
                published = True
            finally:
                if not published:
                    reader.close()
                    row_cache.row_groups.forget(dest)
                    with contextlib.suppress(OSError):
                        os.unlink(dest)
            if info.doc_count:
                self.max_seq_no = max(self.max_seq_no, info.max_seq_no)
                self._refreshed_seq = max(self._refreshed_seq, info.max_seq_no)  # the segment holds up to here
            self._queue_warming(reader)
            return Adopted(name, info.doc_count, int(again.rows.size), one_array(ids),
                           row_versions(info.doc_count, again))

    @property
    def buffer_full(self) -> bool:
        """Whether the buffered documents hold at least ``index_buffer_bytes`` of Arrow data."""
        return self._buffer.doc_bytes >= self.index_buffer_bytes

    @property
    def ready_to_seal(self) -> bool:
        """Whether a writer should :meth:`seal` the buffer now: it is full, or it holds ``SEAL_EARLY_SHARE`` of the
        budget and no sealed buffer is being written (sealing then waits for nothing)."""
        held = self._buffer.doc_bytes
        return held >= self.index_buffer_bytes or (self._sealed is None and held >= self.index_buffer_bytes * SEAL_EARLY_SHARE)

    def refresh(self) -> RefreshResult:
        """Make buffered operations searchable: new segments (one per core from ``2 * FOREGROUND_PART_DOCS`` rows),
        older copies marked deleted."""
        with self._lock:
            if self._sealed is not None and not self._sealed_failed and self._deferred_pin is None and self._buffer:
                beside = self._refresh_beside_sealed()
                if beside is not None:
                    return beside
            self._settle_sealed()
            pinned = self._pin_deferred_view()
            if pinned is not None:  # the view's segment first, then the rest: one result for both
                rest = self.refresh()
                return RefreshResult(pinned.segment or rest.segment, pinned.indexed + rest.indexed,
                                     pinned.deleted + rest.deleted, pinned.stale + rest.stale,
                                     pinned.segments + rest.segments)
            if not self._buffer:
                return RefreshResult(None)
            plan = plan_refresh(self._buffer, self._tombstones)
            stale, marks = older_copies(self._segment_list(), plan, self._find)
            keep = index_rows(plan, stale)
            readers, _perm = self._write_readers(plan.docs, keep, plan.keys, FOREGROUND_PART_DOCS)
            result = self._install(plan, stale, marks, readers, None, self.max_seq_no)
            self._buffer = IndexBuffer()
            return result

    def _refresh_beside_sealed(self) -> RefreshResult | None:
        """Under the lock, while a sealed buffer is being written on another thread: write this buffer's segments
        meanwhile, then wait for that one to be installed and install these right after it, so a refresh (a flush's
        tail) no longer waits for the sealed write before it starts (docs/design/segments.md, "A full buffer is
        refreshed beside the writes").

        What the plan was made from must not change while the lock is released for that wait, or nothing written
        here is kept (the files are removed) and None tells the caller to refresh the usual way: the sealed write
        failed (its operations came back in front of the buffer), another writer buffered operations, or a
        tombstone was there before or came with the sealed buffer's install (the plan reads them)."""
        buffer, tombstones, top = self._buffer, self._tombstones, self.max_seq_no
        mark = (len(buffer.docs), len(buffer.deletes))
        plan = plan_refresh(buffer, tombstones)
        readers, perm = self._write_readers(plan.docs, index_rows(plan, None), plan.keys, PARALLEL_SEGMENT_DOCS)
        self._refreshing = buffer  # not sealed by the thread that installs the sealed one (seal_if_ready)
        try:
            self._settle_sealed()  # releases the lock while it waits
        finally:
            self._refreshing = None
        try:
            if self._buffer is not buffer or (len(buffer.docs), len(buffer.deletes)) != mark or tombstones.num_rows \
                    or self._tombstones.num_rows or self._deferred_pin is not None or self._closed:
                _discard(readers)  # started over: nothing written here stays
                return None
            result = self._install_written(plan, readers, perm, top)
        except BaseException:
            if not any(r.info.name in self._segments for r in readers):  # nothing of it published: none stays
                _discard(readers)
            raise
        self._buffer = IndexBuffer()
        return result

    def _install_written(self, plan: RefreshPlan, readers: list[SegmentReader], perm: np.ndarray,
                         top: int) -> RefreshResult:
        """Under the lock: look up the older copies of segments written beside the writes from ``plan`` (all its
        winners kept, in the order ``perm`` of :func:`buffer_order`) and install them; a winner found stale since is
        deleted in its own new segment."""
        stale, marks = older_copies(self._segment_list(), plan, self._find)
        kept = pc.is_valid(plan.winners.column("_row")).to_numpy(zero_copy_only=False)
        # per written row (buffer order), whether its winner turned stale: the winners' flags, as keep's
        return self._install(plan, stale, marks, readers, stale[kept][perm], top)

    def seal(self) -> Sealed | None:
        """Take the buffer out of the write path for :meth:`write_sealed` on another thread; None when there is
        nothing to seal or a replica's hold deferred a view (then :meth:`refresh` it in place).

        A new buffer takes the writes; the sealed one stays visible to version lookups and realtime gets until its
        segments are installed.  One is sealed at a time: sealing waits for the one before to be installed (the
        writer that filled the next buffer meanwhile waits: back-pressure).  See docs/design/segments.md, "A full
        buffer is refreshed beside the writes".
        """
        with self._lock:
            self._settle_sealed()
            return self._seal_buffer()

    def seal_if_ready(self) -> Sealed | None:
        """Seal the buffer at once if it is :attr:`ready_to_seal` and nothing waits: no sealed buffer is being written,
        no refresh beside the writes planned from it, the directory is open; else None.  The thread that just installed
        a sealed buffer's segments takes the next one this way, so a buffer that filled meanwhile is not left for the
        next bulk (or the flush) to seal (docs/design/segments.md, "A full buffer is refreshed beside the writes")."""
        with self._lock:
            if self._closed or self._sealed is not None or self._buffer is self._refreshing or not self.ready_to_seal:
                return None
            return self._seal_buffer()

    def _seal_buffer(self) -> Sealed | None:
        """Under the lock, none sealed: take the buffer out of the write path."""
        if self._deferred_pin is not None or not self._buffer:
            return None
        sealed, self._buffer = self._buffer, IndexBuffer()
        self._sealed, self._sealed_failed = sealed, False
        return Sealed(sealed, self.max_seq_no, self._tombstones)

    def write_sealed(self, sealed: Sealed) -> RefreshResult:
        """Write a sealed buffer's segments without the lock, then, under it, mark the older copies deleted and
        publish the segments at the same moment (no search sees a document twice or not at all).  A winner found
        stale then (a newer copy in a segment) is deleted in its own new segment.  On failure nothing is published
        and the next refresh puts the operations back in front of the buffer."""
        readers: list[SegmentReader] = []
        try:
            plan = plan_refresh(sealed.buffer, sealed.tombstones)
            keep = index_rows(plan, None)
            readers, perm = self._write_readers(plan.docs, keep, plan.keys, PARALLEL_SEGMENT_DOCS)
            with self._lock:
                result = self._install_written(plan, readers, perm, sealed.top)
                self._sealed = None
                self._sealed_done.notify_all()
        except BaseException:
            with self._lock:
                if self._sealed is sealed.buffer:  # not installed
                    self._sealed_failed = True
                    self._sealed_done.notify_all()
                    _discard(readers)
            raise
        self._index_ahead()
        return result

    def _index_ahead(self) -> None:
        """Take the segments just installed into the shard-wide id index now, on the thread that wrote them, so the
        next bulk's version lookup does not merge their fingerprints into the levels first (issue 44); on a failure
        (an id index that cannot be read) the next lookup tries again and raises it."""
        with self._lock:
            if self._closed:
                return
            try:
                self._id_index.sync(self._readers())
            except Exception as exc:  # noqa: BLE001 - the lookup that needs it syncs again (and raises)
                log.debug("%s: the id index was not brought up to date ahead of the next lookup: %r", self.path, exc)

    def _settle_sealed(self) -> None:
        """Under the lock: wait until no refresh runs beside the writes (the lock is released meanwhile); the
        operations of one that failed go back in front of the buffer, in order."""
        while self._sealed is not None and not self._sealed_failed:
            self._sealed_done.wait()
        if self._sealed is not None:
            back, self._sealed, self._sealed_failed = self._sealed, None, False
            for docs, order, new, keys in zip(self._buffer.docs, self._buffer.orders, self._buffer.news,
                                              self._buffer.keys):
                back.add_docs(docs, order, new, keys)
            for deletes in self._buffer.deletes:
                back.add_deletes(deletes)
            self._buffer = back

    def _readers(self) -> list[SegmentReader]:
        """Under the lock: every installed segment's reader (the shard-wide id index's set)."""
        return [s.reader for s in self._segments.values()]

    def _segment_list(self) -> list[tuple[str, SegmentReader, LiveDocs]]:
        return [(name, seg.reader, seg.live) for name, seg in self._segments.items()]

    def _write_readers(self, docs: pa.Table | None, keep: pa.Array, keys: SortedKeys | None,
                       part_docs: int) -> tuple[list[SegmentReader], np.ndarray]:
        """Write the ``keep`` rows of ``docs`` as new segment files in buffer order and open them, their version
        columns and id index built from ``docs`` (no lock needed: nothing is published); with the permutation of
        ``keep`` they were written in (:func:`buffer_order`).  ``keys``: the sorted fingerprints of every id of
        ``docs`` (``IndexBuffer.sorted_keys``), when the buffer has them: the id indexes are cut from them.
        ``part_docs``: as in :meth:`_write_segments`."""
        if not len(keep):
            return [], np.zeros(0, dtype=np.int64)
        assert docs is not None
        keep, perm = buffer_order(keep, docs.num_rows)
        infos = self._write_segments(docs, keep, part_docs)
        n = len(keep)
        at = None  # per row of docs, its place among the written rows (-1: not written)
        if keys is not None and len(keys.fp) == docs.num_rows:
            at = np.full(docs.num_rows, -1, dtype=np.int64)
            at[np.asarray(keep.to_numpy(zero_copy_only=False), dtype=np.int64)] = np.arange(n, dtype=np.int64)
        readers = []
        for i, info in enumerate(infos):
            reader = SegmentReader(os.path.join(self.path, info.file_name), info)
            lo, hi = n * i // len(infos), n * (i + 1) // len(infos)  # the writer's parts, as _write_segments split them
            part = keep.slice(lo, hi - lo)
            reader.install_version_columns(*(take_rows(docs.column(c), part) for c in ("_seq_no", "_primary_term", "_version")))
            # the next version lookup reads no _id back, and fingerprints none again
            reader.install_index(take_rows(one_array(docs.column("_id")), part),
                                 keys.renumbered(at, lo, hi) if keys is not None and at is not None else None)
            readers.append(reader)
        return readers, perm

    def _install(self, plan: RefreshPlan, stale: np.ndarray, marks: dict[str, pa.Array], readers: list[SegmentReader],
                 dead: np.ndarray | None, top: int) -> RefreshResult:
        """Under the lock: mark the older copies deleted, publish the new segments (``dead``: per written row, a
        winner found stale since, deleted in its own segment), remember the winning deletes as tombstones."""
        deleted = 0
        for name, rows in marks.items():
            seg = self._segments[name]
            before = seg.live.deleted_count
            seg.live = seg.live.delete(rows)
            seg.dirty = seg.dirty or seg.live.deleted_count != before
            deleted += seg.live.deleted_count - before
        written, start = [], 0
        for reader in readers:
            n = reader.info.doc_count
            live = LiveDocs.all_live(n)
            gone = None if dead is None else np.flatnonzero(dead[start:start + n])
            if gone is not None and gone.size:
                live = live.delete(pa.array(gone, pa.int64()))
            self._segments[reader.info.name] = _Segment(reader, live, dirty=live.deleted_count > 0)
            self._queue_warming(reader)
            written.append(reader.info.name)
            start += n
        indexed = start - (int(dead.sum()) if dead is not None else 0)
        # deletes that won are remembered as tombstones (a late, older index op stays dead)
        winners = plan.winners
        not_stale = pa.array(~stale, pa.bool_())
        is_del = pc.and_(pc.is_null(winners.column("_row")), not_stale)
        self._tombstones = pa.table({"_id": plan.ids.filter(is_del), "_seq_no": plan.seq_nos.filter(is_del)},
                                    schema=_DELETES)
        self._refreshed_seq = max(self._refreshed_seq, top)
        applied = pc.and_(winners.column("_buffered"), not_stale)
        n_applied = int(pc.sum(applied.cast(pa.int64())).as_py() or 0)
        return RefreshResult(written[0] if written else None, indexed, deleted, plan.ops - n_applied, tuple(written))

    def _write_segments(self, docs: pa.Table, rows: pa.Array, part_docs: int) -> list[SegmentInfo]:
        """Write the ``rows`` of ``docs`` (ascending, one per id) as one segment, or one per core when many.

        Rows stay in buffer order (docs/design/segments.md, "Refreshed segments keep the buffer's order"): a
        segment whose ids happen to ascend is format 1, any other format 2 (unsorted), found through its id index;
        a merge writes id order again.  A refresh of at least ``2 * part_docs`` documents
        (:data:`FOREGROUND_PART_DOCS` or :data:`PARALLEL_SEGMENT_DOCS`: docs/design/segments.md, "Parts of a
        refresh") is cut into contiguous runs of rows written at once on a thread each (the Parquet encoding
        releases the GIL), as Lucene flushes one segment per indexing thread: each id in one of them only, and the
        merge policy folds them later.
        """
        n = len(rows)
        parts = max(1, min(os.cpu_count() or 1, n // part_docs))

        def write(i: int) -> SegmentInfo:
            lo, hi = n * i // parts, n * (i + 1) // parts
            name = f"seg_{uuid.uuid4().hex[:16]}"
            # the writer takes its rows a part at a time (a run of consecutive rows is a slice), on its own thread
            return write_segment(os.path.join(self.path, segment_file_name(name)), docs, rows=rows.slice(lo, hi - lo),
                                 name=name, fsync=self._fsync, sort=False)

        if parts == 1:
            return [write(0)]
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="segment-write") as pool:
            futures = [pool.submit(write, i) for i in range(parts)]
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:  # none is published: the parts that were written go too
            for f in futures:
                if f.exception() is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.path, f.result().file_name))
            raise failed
        return [f.result() for f in futures]

    def prune_tombstones(self, up_to_seq_no: int) -> int:
        """Forget delete tombstones at or below ``up_to_seq_no`` (no op at or below it can still arrive)."""
        with self._lock:
            before = self._tombstones.num_rows
            self._tombstones = self._tombstones.filter(pc.greater(self._tombstones.column("_seq_no"), up_to_seq_no))
            return before - self._tombstones.num_rows

    # -- merging ----------------------------------------------------------------------------

    def maybe_merge(self) -> list[str]:
        """Run the merges the tiered policy asks for now, each written beside the writes (segments/merging.py);
        the new segments' names.  None while a view is held (a merge would take away a pinned segment's file) or
        while another thread merges (it holds the merge lock: this call does not wait for it)."""
        if not self._merge_lock.acquire(blocking=False):
            return []
        try:
            with self._lock:
                self._settle_sealed()
                if self.view_held or self._closed:
                    return []
                merges = self.merge_policy.find_merges([s.stats() for s in self._segments.values()])
            out = []
            for names in merges:
                name = self._merge(names)
                if name is None:  # the segments changed under it: the policy decides again next time
                    break
                out.append(name)
            return out
        finally:
            self._merge_lock.release()

    def force_merge(self, max_segments: int = 1) -> list[str]:
        """Merge until at most ``max_segments`` segments remain (deleted docs dropped), under the lock throughout."""
        out = []
        with self._merge_lock, self._lock:
            self._settle_sealed()
            if self.view_held:
                return out
            while True:
                merges = self.merge_policy.find_forced_merges([s.stats() for s in self._segments.values()], max_segments)
                if not merges:
                    return out
                done = [self._merge(m) for m in merges]
                out += [n for n in done if n is not None]
                if None in done:
                    return out

    def _merge(self, names: Sequence[str]) -> str | None:
        """Merge the segments ``names`` into one, written without the lock unless the caller holds it, installed under
        it with the rows deleted meanwhile deleted in it too (segments/merging.py); the new segment's name, or None
        when an input changed meanwhile (the new file is removed, nothing changes).  Call with the merge lock."""
        new_name = f"seg_{uuid.uuid4().hex[:16]}"
        file = segment_file_name(new_name)
        with self._lock:
            if self._closed:
                return None
            inputs = [MergeInput(n, self._segments[n].reader, self._segments[n].live) for n in names]
            self._merging_files.add(file)  # kept from _delete_unreferenced until installed or dropped
        installed = False
        merged = None
        try:
            merged = write_merged(inputs, self.path, new_name, fsync=self._fsync, cancelled=lambda: self._closed)
            with self._lock:
                self._settle_sealed()  # a refresh beside the writes names the segments it marks: it ends first
                now = [self._segments.get(i.name) for i in inputs]
                if self._closed or self.view_held or any(s is None or s.reader is not i.reader
                                                         for s, i in zip(now, inputs)):
                    log.info("%s: a merge of %d segments dropped: the segments changed while it ran", self.path,
                             len(names))
                    return None
                live = None
                if merged.reader is not None:  # everything that can fail first, then the swap
                    gone = carried_deletes([_mask(i.live) for i in inputs], [_mask(s.live) for s in now if s is not None],
                                           merged.order)
                    live = LiveDocs.all_live(merged.reader.info.doc_count)
                    if gone.size:
                        live = live.delete(pa.array(gone, pa.int64()))
                    self._segments[new_name] = _Segment(merged.reader, live, dirty=live.deleted_count > 0)
                gone_paths = [self._segments[name].reader.path for name in names]
                for name in names:
                    del self._segments[name]  # files stay while a retained commit references them
                installed = True
                self.merges_installed += 1
                self._merging_files.discard(file)
                for path in gone_paths:
                    row_cache.warmer.discard(path)
                if merged.reader is not None:
                    self._queue_warming(merged.reader)
            log.info("merged %d segments into %s (%d docs)", len(names), new_name, len(merged.order))
            return new_name
        finally:
            if not installed:
                with self._lock:
                    self._merging_files.discard(file)
                    if merged is not None and merged.reader is not None:
                        merged.reader.close()
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.path, file))

    # -- committing -------------------------------------------------------------------------

    def flush(
        self,
        *,
        local_checkpoint: int,
        primary_term: int,
        translog_uuid: str = "",
        translog_generation: int = 0,
        history_uuid: str | None = None,
        user_data: dict[str, str] | None = None,
        merge: bool = True,
    ) -> CommitPoint:
        """Refresh, write changed live docs, maybe merge, then write ``segments_N`` and clean up."""
        with self._lock:
            self.refresh()
            if merge:
                self.maybe_merge()
            for seg in self._segments.values():
                if seg.dirty:
                    gen = seg.live_gen + 1
                    name = livedocs_file_name(seg.name, gen)
                    data = seg.live.encode()
                    write_atomic(self.path, name, data, fsync=self._fsync)
                    seg.live_gen, seg.live_file, seg.live_size, seg.live_checksum = gen, name, len(data), crc32c(data)
                    seg.dirty = False
            prev = self.last_commit
            commit = CommitPoint(
                generation=(prev.generation + 1) if prev else 1,
                primary_term=primary_term,
                segments=tuple(s.committed() for s in self._segments.values()),
                max_seq_no=self.max_seq_no,
                local_checkpoint=local_checkpoint,
                translog_uuid=translog_uuid,
                translog_generation=translog_generation,
                history_uuid=history_uuid or (prev.history_uuid if prev else uuid.uuid4().hex),
                mapping=self.mapping.to_dict(),
                user_data=dict(user_data or {}),
            )
            write_commit(self.path, commit)
            self.last_commit = commit
            self._delete_unreferenced()
            return commit

    def lock_commit(self, generation: int) -> None:
        """Keep ``segments_<generation>`` and its files until :meth:`release_commit` (e.g. while uploading)."""
        with self._lock:
            if generation not in list_commit_generations(self.path):
                raise SegmentError(f"{self.path}: no commit {generation} to lock")
            self._locked[generation] = self._locked.get(generation, 0) + 1

    def release_commit(self, generation: int) -> None:
        """Undo one :meth:`lock_commit`."""
        with self._lock:
            n = self._locked.get(generation, 0) - 1
            if n > 0:
                self._locked[generation] = n
            else:
                self._locked.pop(generation, None)
            self._delete_unreferenced()

    def _delete_unreferenced(self) -> list[str]:
        self._settle_sealed()  # the files a refresh beside the writes is writing are not published yet
        gens = list_commit_generations(self.path)
        keep = retained_commits(gens, self.keep_commits, self._locked)
        kept_files = []
        for g in gens:
            if g in keep:
                try:
                    c = self.last_commit if self.last_commit and self.last_commit.generation == g else read_commit(self.path, g)
                except (SegmentCorrupted, OSError):
                    continue
                kept_files.append(frozenset(c.files()) | {commit_file_name(g)})
        open_files = {LOCK_FILE} | self._view.pinned_files() | self._merging_files
        for seg in self._segments.values():
            open_files.add(seg.reader.info.file_name)
            if seg.live_file:
                open_files.add(seg.live_file)
        on_disk = [n for n in os.listdir(self.path) if not n.startswith(".")]
        doomed = local_deletable(on_disk, kept_files, open_files)
        for name in sorted(doomed):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        return sorted(doomed)

    # -- reading ----------------------------------------------------------------------------

    def searchable_segments(self) -> list[tuple[SegmentReader, LiveDocs]]:
        """The refreshed segments with their live docs (a point-in-time view), held views aside: what a commit,
        an upload or a check works on."""
        with self._lock:
            return [(s.reader, s.live) for s in self._segments.values()]

    def visible_segments(self, *, write_deferred: bool = True) -> list[tuple[SegmentReader, LiveDocs]]:
        """What searches see: the refreshed segments, or the view an ingest job holds (segments/held_view.py).  Not
        ``write_deferred``: a replica's view deferred by its hold is taken as pinned, without writing it."""
        return self.tagged_view(write_deferred=write_deferred)[0]

    def tagged_view(self, *, write_deferred: bool = True) -> tuple[list[tuple[SegmentReader, LiveDocs]], ViewTag]:
        """:meth:`visible_segments` with the ingest jobs that view hides and shows, taken at once (ViewTag)."""
        with self._lock:
            if write_deferred:
                self._pin_deferred_view()
            view, tag = self._view.read(self.searchable_segments)
            self._log_lapsed()
            return view, tag

    def count(self, *, write_deferred: bool = True) -> int:
        """Live documents visible to search (refreshed; the held view while an ingest job holds it).  Not
        ``write_deferred``: the cluster view's count of every copy (a look at the cluster writes no segment)."""
        return sum(live.live_count for _reader, live in self.visible_segments(write_deferred=write_deferred))

    # -- views held for ingest jobs (segments/held_view.py) ------------------------------------------

    @property
    def view_held(self) -> bool:
        """Whether an ingest job holds this copy's view."""
        with self._lock:
            return self._view.held

    def hold_view(self, job: str, seconds: float, *, refresh: bool = True) -> bool:
        """Hold what searches see for ``job`` for at most ``seconds``: the first hold refreshes, then pins the
        segments (everything acknowledged before it stays searchable); True when this pinned the view.

        Not ``refresh`` (a replica, which serves no reads): the first hold writes nothing and marks the buffer's
        seq# instead (every operation acknowledged before the job is buffered at or below it, every row of the
        job is stamped above it); the buffered operations up to that mark are written and pinned only if the
        view is read or anything would change the segments before the release: a promotion's refresh, a full
        buffer (:meth:`_pin_deferred_view`).  So a replica's hold costs no segment write.
        """
        with self._lock:
            self._settle_sealed()
            first = not self._view.held
            if first and refresh:
                self.refresh()
            pinned = self._view.hold(job, seconds, self.searchable_segments)
            if pinned and not refresh and self._buffer:
                self._deferred_pin = self.max_seq_no
            return pinned

    def advance_view(self, job: str, *, refresh: bool = True) -> bool:
        """Before ``job``'s first row: a view it alone holds, pinned before other jobs' releases, is pinned again from
        what is applied now (a refresh first; a replica marks its buffer instead, as its hold does), so it shows
        those jobs as their own last release would have (segments/held_view.py ``advance``); True when it did."""
        with self._lock:
            self._settle_sealed()
            if not self._view.can_advance(job):
                return False
            if refresh:
                self.refresh()
            self._deferred_pin = self.max_seq_no if not refresh and self._buffer else None
            return self._view.advance(job, self.searchable_segments)

    def release_view(self, job: str, *, refresh: bool = True) -> bool:
        """``job`` ends its hold; once no job holds the view, a refresh (unless not ``refresh``: a replica, which
        serves no reads) makes every buffered operation searchable at once with the rest (one step under the lock:
        no reader sees half); True then."""
        with self._lock:
            self._settle_sealed()
            if set(self._view.jobs) - {job}:
                self._view.release(job)
                return False
            try:
                if refresh:
                    self.refresh()
            finally:  # a refresh that failed (the local disk: this copy is failed) still ends the hold
                released = self._view.release(job)
                if released:
                    self._deferred_pin = None
            return released

    def _pin_deferred_view(self) -> RefreshResult | None:
        """Write and pin the view a hold without a refresh deferred (:meth:`hold_view`): the buffered operations up
        to its mark become new segments, the rest stay buffered, and the view pins the segments then; what that
        refresh did, or None when no mark stands.  A refresh that fails (the disk) keeps the mark: the next one
        writes the same operations first."""
        upto, self._deferred_pin = self._deferred_pin, None
        if upto is None or not self._view.held:
            return None
        above_docs, above_deletes = self._buffer.split_above(upto)
        top = self.max_seq_no
        self.max_seq_no = upto  # the refresh's high-water mark: only what it writes
        try:
            done = self.refresh()
        except BaseException:
            self._deferred_pin = upto
            raise
        finally:
            self.max_seq_no = top
            for docs in above_docs:
                self._buffer.add_docs(docs)
            for dels in above_deletes:
                self._buffer.add_deletes(dels)
        self._view.repin(self.searchable_segments)
        return done

    def _log_lapsed(self) -> None:
        if self._view.lapsed:
            jobs, self._view.lapsed = self._view.lapsed, []
            log.warning("%s: the view held for ingest job(s) %s lapsed (no release within its lease): what is "
                        "applied of them is searchable", self.path, ", ".join(jobs))

    def scan(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,  # noqa: A002
             view: list[tuple[SegmentReader, LiveDocs]] | None = None) -> Iterator[pa.RecordBatch]:
        """Live documents of the refreshed segments (or of ``view``, from :meth:`tagged_view`) as batches with the
        mapping's full schema."""
        yield from scan_readers(self.visible_segments() if view is None else view, self.mapping, columns, filter)

    def get(self, doc_id: str, *, realtime: bool = True) -> dict[str, Any] | None:
        """The newest live copy of ``doc_id`` (buffered operations too when ``realtime``), or None."""
        with self._lock:
            return newest_copy(doc_id, self._latest_buffered(doc_id) if realtime else None, self._refreshed_seq,
                               ((s.reader, s.live) for s in self._segments.values()), self._tombstones,
                               self.mapping.order)

    def _latest_buffered(self, doc_id: str) -> tuple[int, pa.Table | None, int] | None:
        """The newest unrefreshed operation on ``doc_id`` (the buffer's, or a sealed buffer's), as ``IndexBuffer.latest``."""
        hit = self._buffer.latest(doc_id) if self._buffer else None
        if self._sealed is not None:
            older = self._sealed.latest(doc_id)
            if older is not None and (hit is None or older[0] > hit[0]):
                hit = older
        return hit

    def _buffered_maps(self) -> list[VersionMap]:
        """The version maps of the unrefreshed operations: a sealed buffer's (if any), then the buffer's."""
        return ([self._sealed.versions] if self._sealed is not None else []) + [self._buffer.versions]

    def current_versions(self, ids: pa.Array, *, unique: bool = False, seen: bool = False,
                         find: Finder | None = None, keys: SortedKeys | None = None) -> pa.Table:
        """Per id (order kept): ``_seq_no``, ``_primary_term``, ``_version`` of its newest live copy, buffered
        operations included (nulls when absent or deleted); see :mod:`~shardstore.segments.versions` (``unique``:
        the caller knows no id occurs twice; ``seen``: the ``_seen`` column too; ``find``: how the ids are found in
        the segments, :meth:`_find` unless given; ``keys``: the ids' sorted fingerprints, if the caller has them:
        the buffered runs and the shard-wide id index then search them, nothing is fingerprinted again)."""
        with self._lock:
            segments = [(s.reader, s.live) for s in self._segments.values() if s.live.live_count]
            maps = self._buffered_maps()
            newest = min(m.min_seq_no for m in maps) > self._refreshed_seq
            if find is None and keys is not None and unique:
                every = self._readers()

                def find(readers: Sequence[SegmentReader], q: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
                    return self._id_index.lookup(readers, q, every, presorted=(keys.fp, keys.pos))

            return latest_versions(ids, maps, segments, None if newest else self._tombstones, unique=unique,
                                   seen=seen, find=find or self._find, keys=keys)

    def _versions_of_file(self, index: _IdIndex) -> pa.Table:
        """Under the lock: :meth:`current_versions` (``seen``) of an adopted file whose ids are distinct, found
        through the shard-wide id index with the file's own sorted fingerprints (nothing fingerprinted or sorted
        again: ``ShardIdIndex.lookup``'s ``presorted``)."""
        every = self._readers()

        def find(readers: Sequence[SegmentReader], ids: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
            return self._id_index.lookup(readers, ids, every, presorted=(index.fp, index.rows))

        return self.current_versions(index.ids, unique=True, seen=True, find=find)

    def _find(self, readers: Sequence[SegmentReader], ids: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
        """Under the lock: ``ids`` in ``readers`` (a subset of this directory's segments) through the shard-wide id
        index, which keeps levels over all of them (segments/shard_id_index.py)."""
        return self._id_index.lookup(readers, ids, self._readers())

    def current_version_numbers(self, ids: list[str], arr: pa.Array) -> list[int] | np.ndarray:
        """Per id of ``ids`` (``arr``: the same ids as Arrow), the version its next write counts from: that of its
        newest live copy (:meth:`current_versions`), 0 when it has none."""
        with self._lock:
            versions = self._buffer.versions
            newest = versions.min_seq_no > self._refreshed_seq
            if self._sealed is None and not any(s.live.live_count for s in self._segments.values()) \
                    and (newest or not self._tombstones.num_rows):
                return versions.versions(ids, arr)  # the buffer alone decides (as latest_versions would)
        found = self.current_versions(arr).column("_version")
        return np.asarray(filled(found, 0).to_numpy(zero_copy_only=False), dtype=np.int64)

    def verify(self) -> None:
        """Check every segment file's full CRC32C (SegmentCorrupted names the first bad one)."""
        for reader, _live in self.searchable_segments():
            reader.verify()

    def close(self) -> None:
        """Release the directory's write lock and open segment files (buffered, unrefreshed operations are dropped)."""
        with self._lock:  # a refresh beside the writes ends first: it writes into this directory
            self._closed = True  # a merge beside the writes installs nothing any more
            deadline = time.monotonic() + CLOSE_WAIT_SECONDS
            while self._sealed is not None and not self._sealed_failed and time.monotonic() < deadline:
                self._sealed_done.wait(max(0.0, deadline - time.monotonic()))
            if self._sealed is not None and not self._sealed_failed:
                log.error("%s: closed while a refresh beside the writes still ran after %.0f s; its operations are "
                          "in the translog", self.path, CLOSE_WAIT_SECONDS)
        for seg in self._segments.values():
            row_cache.warmer.discard(seg.reader.path)  # unqueued first; its decoded row groups would only take budget
            seg.reader.close()
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> ShardDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
