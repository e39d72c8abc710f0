"""The remote translog: sealed local generations uploaded to the shard's blob store.

``RemoteTranslog(local, store, prefix)`` wraps a :class:`LocalTranslog`.  ``prefix`` is
``<cluster_uuid>/<primary_term>/<index_uuid>/<shard>/translog`` (built by the caller).

Upload (:meth:`RemoteTranslog.upload`): roll the local generation so only sealed,
immutable bytes leave the node; PUT each sealed, not yet uploaded, non-empty generation
file as one data blob (``data/<term>/<gen>__<uuid>.tlog``, ``if_absent``); then PUT ONE
metadata blob (``if_absent``) naming every retained uploaded generation and the
checkpoint (see :mod:`remote_metadata`).  Steady state: 2 PUTs per upload.

Durability: :meth:`add` appends locally, then blocks until an upload has sealed and
uploaded the generation holding its batch AND the metadata PUT naming it succeeded.
Group commit that never waits for nothing (issue 16): one uploader thread starts an upload
as soon as an append waits and no upload is in flight; appends arriving during an upload
are taken together by the next one, which starts the moment the previous one finished.
So a lone writer pays one upload per append and no fixed delay, and concurrent writers
share uploads in proportion to how long one takes (adaptive batching, as RocksDB's and
SlateDB's WAL writers do).  ``buffer_interval`` > 0 adds a linger before every upload
(the old fixed wait; kept for benchmarks that compare it).  If uploads keep failing, waiting appends raise
TranslogUnavailable after ``upload_timeout`` seconds; they never return success for
operations that did not land.

Replay without a disk: :meth:`RemoteTranslog.read_operations` (static) lists
``<prefix>/metadata/`` once (the first key is the newest), reads it and the data blobs
it names, checks size and checksum of everything, and resolves operations exactly as
``LocalTranslog.read_operations`` does (:func:`filter_batch` + :func:`resolve`).  Given
several term prefixes (newest first) it merges their newest metadata, so a primary
that never held the older-term ops still restores them; a data blob purged between
the LIST and the GET makes it re-list and retry instead of failing.

Older terms: :meth:`RemoteTranslog.purge_older_term` deletes an older term's prefix
all at once, and only when a remote segment commit covers every generation there.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

import pyarrow as pa

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.core.ops import NO_OPS
from shardstore.errors import LocalDiskError
from shardstore.fileio import mapped
from shardstore.translog.checkpoint import read_checkpoint
from shardstore.translog.errors import TranslogCorruptedError, TranslogError, TranslogUnavailable
from shardstore.translog.frames import HEADER_SIZE, GenerationHeader, Part, iter_frames
from shardstore.translog.local import LocalTranslog, generation_file, sealed_checkpoint_file
from shardstore.translog.node_format import DATA_DIR as NODE_DATA_DIR
from shardstore.translog.node_format import NODE_TRANSLOG_DIR
from shardstore.translog.node_read import shard_entries
from shardstore.translog.operations import Summary
from shardstore.translog.purge import GenerationInfo, remote_deletable, remote_deletable_sections
from shardstore.translog.remote_metadata import (
    DATA_DIR,
    METADATA_DIR,
    RemoteGeneration,
    RemoteTranslogMetadata,
    data_key,
    decode_metadata,
    generation_checksum,
    metadata_key,
    parse_metadata_key,
)
from shardstore.translog.replay import filter_batch, resolve

UNASSIGNED = -2
_TOP = 2**63 - 1
KEEP_METADATA = 10
#: seconds an uploader thread waits for the next append before it ends (a later append starts another)
UPLOADER_IDLE_SECONDS = 5.0
_READ_ATTEMPTS = 3


# --------------------------------------------------------------------------- read helpers
# (the seq# filtering and per-seq# resolution both translogs share live in replay.py)


def _join(prefix: str, key: str) -> str:
    return f"{prefix.rstrip('/')}/{key}" if prefix else key


def latest_metadata_key(store: BlobStore, prefix: str) -> str | None:
    """The key of the newest metadata blob under ``prefix`` (one LIST, no GET); None if none.

    Metadata blobs are never overwritten, so an unchanged key means an unchanged translog.
    """
    first = next(iter(store.list(_join(prefix, METADATA_DIR))), None)
    return None if first is None else first.key


_STATE_CACHE: dict[tuple[str, str], RemoteTranslogMetadata] = {}


def translog_state_key(store: BlobStore, prefix: str) -> tuple:
    """What names the translog under ``prefix`` as it is now, by LISTs alone once its newest metadata was read:
    that metadata's key and, for a node-level translog, the newest round key of each stream it names (the
    per-shard metadata is not rewritten per round, issue 30).  Equal keys mean equal operations."""
    key = latest_metadata_key(store, prefix)
    if key is None:
        return (None,)
    md = _STATE_CACHE.get((store.location, key))
    if md is None:  # metadata blobs are written once under unique keys: read once per process
        md = decode_metadata(store.get(key), key)
        if len(_STATE_CACHE) > 4096:
            _STATE_CACHE.clear()
        _STATE_CACHE[(store.location, key)] = md
    rounds = tuple(next((b.key for b in store.list(f"{stream}/{NODE_DATA_DIR}")), None)
                   for stream, _first, _index, _shard in md.streams)
    return (key, rounds)


def latest_metadata(store: BlobStore, prefix: str) -> tuple[str, RemoteTranslogMetadata] | None:
    """(key, metadata) of the newest metadata blob under ``prefix``: one LIST, one GET; None if none."""
    listing = iter(store.list(_join(prefix, METADATA_DIR)))
    first = next(listing, None)
    if first is None:
        return None
    return first.key, decode_metadata(store.get(first.key), first.key)


class _MissingBlob(TranslogCorruptedError):
    """A data blob the metadata names is gone (purged meanwhile, or lost)."""


def read_generation(store: BlobStore, entry: RemoteGeneration) -> bytes:
    """A data blob's bytes after checking size, CRC32 and header (TranslogCorruptedError names the key)."""
    key = entry.blob_key
    try:
        # a section of a node-level round (offset >= 0) is a range of its data blob (node_format.py)
        data = store.get(key) if entry.offset < 0 else store.get_range(key, entry.offset, entry.size)
    except BlobNotFound:
        raise _MissingBlob(key, 0, "data blob named by the metadata is missing") from None
    if len(data) != entry.size:
        raise TranslogCorruptedError(key, min(len(data), entry.size), f"size {len(data)}, metadata says {entry.size}")
    crc = generation_checksum(data)
    if crc != entry.crc32:
        raise TranslogCorruptedError(key, max(entry.offset, 0), f"checksum mismatch (metadata {entry.crc32:#010x}, computed {crc:#010x})")
    header = GenerationHeader.decode(data, key)
    if header.generation != entry.generation or header.primary_term != entry.primary_term:
        raise TranslogCorruptedError(
            key, 0, f"header names generation {header.generation} term {header.primary_term}, "
            f"metadata says generation {entry.generation} term {entry.primary_term}"
        )
    return data


def _checked(view: memoryview, path: str, end: int) -> tuple[GenerationHeader, int]:
    """The header and whole-blob checksum of a sealed generation's bytes, every frame's CRC checked first."""
    header = GenerationHeader.decode(view, path)
    for _frame in iter_frames(view, HEADER_SIZE, end, path):
        pass
    return header, generation_checksum(view)


def newest_trim(trim: tuple[int, int] | None, seq_no: int, term: int) -> tuple[int, int]:
    """The (seq_no, term) trim a translog records after ``trim_operations_above(seq_no, term)``."""
    return (seq_no, term) if trim is None or term >= trim[1] else trim


def apply_trims(entry: RemoteGeneration, trims: list[tuple[int, int]]) -> RemoteGeneration:
    """``entry`` with every applicable (seq_no, term) trim of a merged prefix folded into its trimmed-above seq#."""
    t = entry.trimmed_above_seq_no
    for seq_no, term in trims:
        if entry.primary_term < term:
            t = seq_no if t == UNASSIGNED else min(t, seq_no)
    return entry if t == entry.trimmed_above_seq_no else replace(entry, trimmed_above_seq_no=t)


# --------------------------------------------------------------------------- the remote translog


class RemoteTranslog:
    """Uploads a LocalTranslog's sealed generations; acknowledges appends once they landed."""

    def __init__(
        self,
        local: LocalTranslog,
        store: BlobStore,
        prefix: str,
        *,
        buffer_interval: float = 0.0,
        upload_timeout: float = 30.0,
        retry_pause: float = 0.05,
        keep_metadata: int = KEEP_METADATA,
        covered_through: int | None = None,
    ) -> None:
        """``covered_through``: local generations up to it are durable in another (older term's) remote
        translog and are never uploaded here: a promoted replica's retained log (issue 14, case 7)."""
        self.local = local
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.buffer_interval = buffer_interval
        self.upload_timeout = upload_timeout
        self.retry_pause = retry_pause
        self.keep_metadata = keep_metadata
        self.writer = uuid.uuid4().hex
        self._upload_lock = threading.Lock()  # one upload (or purge) at a time
        self._cond = threading.Condition()
        self._requested = 0  # highest local generation an appender waits for
        self._closed = False
        self._last_error: BaseException | None = None
        self.uploads = 0  # completed metadata PUTs
        self._entries: dict[int, RemoteGeneration] = {}
        self._data_keys: dict[int, str] = {}  # key chosen per generation (stable across retries)
        self._metadata: RemoteTranslogMetadata | None = None
        self._trim: tuple[int, int] | None = None
        self._metadata_keys: set[str] = set()  # metadata blobs known to exist under the prefix (purge deletes old)
        self._listed_metadata = False  # whether those of earlier processes were listed once
        first_local = min(g.generation for g in local.generations())
        self._uploaded_through = first_local - 1  # every local generation <= this is covered remotely
        if covered_through is not None:
            self._uploaded_through = max(self._uploaded_through, covered_through)
        self._recover()
        #: the uploader thread, started by the first append and ended after UPLOADER_IDLE_SECONDS without
        #: one, so threads grow with the shards being written, not with the shards a node holds (issue 30)
        self._thread: threading.Thread | None = None

    # -- state ------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Adopt the newest metadata of this translog (restart); refuse a prefix we cannot sort ahead of."""
        found = latest_metadata(self.store, self.prefix)
        if found is None:
            return
        key, md = found
        if md.translog_uuid == self.local.translog_uuid:
            self._metadata = md
            self._entries = {e.generation: e for e in md.entries}
            self._trim = md.trim
            self._uploaded_through = max(self._uploaded_through, md.generation)
            return
        term, gen, _ = parse_metadata_key(key)
        if (term, gen) >= (self.local.primary_term, self.local.generation - 1):  # our first key may use gen - 1
            raise TranslogError(
                f"{self.prefix}: holds metadata {key} of translog {md.translog_uuid} at term {term} generation {gen}; "
                f"translog {self.local.translog_uuid} (term {self.local.primary_term}, generation "
                f"{self.local.generation}) would not sort ahead of it"
            )

    @property
    def uploaded_generations(self) -> list[RemoteGeneration]:
        """The retained uploaded generations (what the last metadata lists)."""
        with self._cond:
            return [self._entries[g] for g in sorted(self._entries)]

    @property
    def uploaded_through(self) -> int:
        """Every local generation <= this has landed remotely (with a metadata blob naming it)."""
        return self._uploaded_through

    @property
    def min_unuploaded_generation(self) -> int:
        """For LocalTranslog.purge(min_unuploaded_generation=...)."""
        return self._uploaded_through + 1

    @property
    def metadata(self) -> RemoteTranslogMetadata | None:
        """The last metadata this instance wrote or adopted."""
        return self._metadata

    # -- uploading --------------------------------------------------------------------------

    def upload(self) -> RemoteTranslogMetadata:
        """Seal and upload new generations, then write one metadata blob (no PUT if nothing is new)."""
        return self._upload(force=False)

    def _upload(self, *, force: bool, drop: frozenset[int] = frozenset()) -> RemoteTranslogMetadata:
        with self._upload_lock:
            gens = self.local.generations()
            current = gens[-1]
            if current.num_ops > 0 or force:
                self.local.roll_generation()
                gens = self.local.generations()
            sealed_through = gens[-1].generation - 1
            if sealed_through <= self._uploaded_through and not drop and self._metadata is not None:
                return self._metadata
            entries = dict(self._entries)
            for g in drop:
                entries.pop(g, None)
            for info in gens[:-1]:
                if info.generation <= self._uploaded_through:
                    # refresh trims recorded locally after the upload
                    if info.generation in entries:
                        cp = read_checkpoint(self.local.directory, sealed_checkpoint_file(info.generation))
                        if cp.trimmed_above_seq_no != entries[info.generation].trimmed_above_seq_no:
                            entries[info.generation] = replace(
                                entries[info.generation], trimmed_above_seq_no=cp.trimmed_above_seq_no)
                    continue
                if info.num_ops == 0:
                    continue  # nothing to replay: no data blob, no entry
                entries[info.generation] = self._put_generation(info.generation)
            cp = read_checkpoint(self.local.directory)
            live = [e for e in entries.values() if e.num_ops > 0]
            md = RemoteTranslogMetadata(
                primary_term=self.local.primary_term,
                generation=sealed_through,
                translog_uuid=self.local.translog_uuid,
                min_seq_no=min((e.min_seq_no for e in live), default=NO_OPS),
                max_seq_no=max((e.max_seq_no for e in live), default=NO_OPS),
                global_checkpoint=cp.global_checkpoint,
                min_translog_generation=min(entries, default=sealed_through + 1),
                entries=tuple(entries[g] for g in sorted(entries)),
                trim=self._trim,
            )
            key = _join(self.prefix, metadata_key(md.primary_term, md.generation, self.writer))
            try:
                self.store.put(key, md.encode(), if_absent=True, token=self.writer)
            except BlobAlreadyExists:
                existing = decode_metadata(self.store.get(key), key)
                if existing != md:
                    raise TranslogError(f"{key}: a different metadata blob already exists") from None
            with self._cond:
                self._metadata_keys.add(key)
                self._entries = entries
                self._metadata = md
                self._uploaded_through = sealed_through
                self.uploads += 1
                self._cond.notify_all()
            return md

    def _put_generation(self, generation: int) -> RemoteGeneration:
        """Upload one sealed generation file: every frame CRC-checked before the bytes leave the node.

        The file is checked through a read-only memory map and then streamed to the store
        (a large generation, e.g. one 22 MB frame of a whole-table bulk, is neither copied
        into a Python buffer nor held twice); a file longer than its sealed checkpoint is
        read into memory up to it, as before.
        """
        cp = read_checkpoint(self.local.directory, sealed_checkpoint_file(generation))
        path = f"{self.local.directory}/{generation_file(generation)}"
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < cp.offset:
                raise TranslogCorruptedError(path, size, f"short sealed generation: sealed checkpoint covers {cp.offset}")
            if size == cp.offset:  # checked through a memory map, then streamed from the file
                with mapped(f) as view:
                    header, checksum = _checked(view, path, cp.offset)
                f.seek(0)
                key = self._put_data(generation, header, lambda k: self.store.put_stream(
                    k, f, if_absent=True, token=self.writer), cp.offset)
            else:  # longer than its sealed checkpoint: the sealed bytes only
                data = f.read(cp.offset)
                header, checksum = _checked(memoryview(data), path, cp.offset)
                key = self._put_data(generation, header, lambda k: self.store.put(
                    k, data, if_absent=True, token=self.writer), cp.offset)
        return RemoteGeneration(
            generation=generation, primary_term=header.primary_term, blob_key=key, size=cp.offset,
            crc32=checksum, min_seq_no=cp.min_seq_no, max_seq_no=cp.max_seq_no,
            num_ops=cp.num_ops, trimmed_above_seq_no=cp.trimmed_above_seq_no,
        )

    def _put_data(self, generation: int, header: GenerationHeader, put: Callable[[str], object], size: int) -> str:
        """PUT a generation's data blob under its key (chosen once, reused on retry); returns the key."""
        key = self._data_keys.setdefault(
            generation, _join(self.prefix, data_key(header.primary_term, generation, uuid.uuid4().hex)))
        try:
            put(key)
        except BlobAlreadyExists:  # an earlier attempt of ours landed although it reported failure
            if self.store.stat(key).size != size:
                raise TranslogError(f"{key}: a different data blob already exists") from None
        return key

    def _ensure_uploader(self) -> None:
        """Start the uploader thread if none runs (called holding ``_cond``)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=f"translog-upload-{self.prefix}")
            self._thread.start()

    def _loop(self) -> None:
        pause = self.retry_pause
        while True:
            with self._cond:
                while not self._closed and self._requested <= self._uploaded_through:
                    if not self._cond.wait(UPLOADER_IDLE_SECONDS) and self._requested <= self._uploaded_through:
                        self._thread = None  # idle: the next append starts another
                        return
                if self._closed:
                    return
            if self.buffer_interval > 0:
                time.sleep(self.buffer_interval)  # optional linger; by default the next upload starts at once
            try:
                before = self._uploaded_through
                self._upload(force=False)
                self._last_error = None
                pause = self.retry_pause
                if self._uploaded_through == before:
                    # nothing to upload covers what is asked (a wait on a generation with no operations):
                    # do not spin; a new append or close() wakes the loop
                    with self._cond:
                        self._cond.wait(self.retry_pause)
            except BaseException as exc:  # noqa: BLE001 - reported to the waiting appenders
                with self._cond:
                    self._last_error = exc
                    self._cond.notify_all()
                    self._cond.wait(pause)  # close() wakes us
                pause = min(pause * 2, 1.0)

    # -- appending --------------------------------------------------------------------------

    def add(self, batch: pa.RecordBatch, *, history: bool = False) -> tuple[int, int]:
        """Append locally, then return only once an upload covering the batch has landed (``history``: see LocalTranslog.add)."""
        position = self.append(batch, history=history)
        if batch.num_rows == 0:
            return position
        self.wait_uploaded(position[0])
        return position

    def append(self, batch: pa.RecordBatch, *, history: bool = False, summary: Summary | None = None,
               frame: tuple[bytes, list[Part]] | None = None) -> tuple[int, int]:
        """Append locally and start the upload covering it without waiting; its position (wait with
        :meth:`wait_uploaded` on ``position[0]`` before acknowledging).  ``summary``, ``frame``: as
        ``LocalTranslog.add``."""
        position = self.local.add(batch, history=history, summary=summary, frame=frame)
        if batch.num_rows:
            with self._cond:
                self._requested = max(self._requested, position[0])
                self._ensure_uploader()
                self._cond.notify_all()
        return position

    def wait_uploaded(self, generation: int | tuple[int, int], timeout: float | None = None) -> None:
        """Block until local ``generation`` (or an append's (generation, offset): its generation) is covered
        remotely; TranslogUnavailable after the timeout."""
        if isinstance(generation, tuple):
            generation = generation[0]
        deadline = time.monotonic() + (self.upload_timeout if timeout is None else timeout)
        with self._cond:
            if self._closed:
                raise TranslogError(f"{self.prefix}: the remote translog is closed")
            self._requested = max(self._requested, generation)
            if self._uploaded_through < generation:
                self._ensure_uploader()
            self._cond.notify_all()
            while self._uploaded_through < generation:
                if isinstance(self._last_error, LocalDiskError):
                    raise self._last_error  # the local log failed for good: no upload will ever cover it
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    err = self._last_error
                    raise TranslogUnavailable(
                        f"{self.store.location}/{self.prefix}: generation {generation} not uploaded within "
                        f"{self.upload_timeout}s; last error: {err!r}; the operations are NOT acknowledged"
                    ) from err
                self._cond.wait(left)

    def trim_operations_above(self, seq_no: int, term: int) -> RemoteTranslogMetadata:
        """Trim locally, then upload a metadata blob recording the trims."""
        self.local.trim_operations_above(seq_no, term)
        with self._upload_lock, self._cond:
            self._trim = newest_trim(self._trim, seq_no, term)  # not racing an upload that copied the entries before the trim
            self._entries = {g: apply_trims(e, [(seq_no, term)]) for g, e in self._entries.items()}
        return self._upload(force=True)

    # -- purging ----------------------------------------------------------------------------

    def purge(self, remote_commit_local_checkpoint: int, remote_commit_primary_term: int) -> set[int]:
        """Upload what is sealed and drop uploaded generations a durably uploaded remote segment commit covers,
        in one metadata blob; returns the dropped generations.

        Order: the new metadata without them first, then, in one delete request, their data
        blobs and the metadata blobs older than the newest ``keep_metadata`` (a flush of one
        changed shard: one metadata PUT and one DELETE, no LIST once the old keys are known).
        """
        entries = self.uploaded_generations
        infos = [GenerationInfo(e.generation, e.primary_term, e.min_seq_no, e.max_seq_no, e.num_ops) for e in entries]
        current = max([self._uploaded_through + 1, *(e.generation + 1 for e in entries)])
        doomed = remote_deletable(
            infos,
            remote_commit_local_checkpoint=remote_commit_local_checkpoint,
            remote_commit_primary_term=remote_commit_primary_term,
            current_generation=current,
        )
        keys = [e.blob_key for e in entries if e.generation in doomed]
        self._upload(force=bool(doomed), drop=frozenset(doomed))
        keys += self._old_metadata_keys()
        if keys:
            self.store.delete(keys)
            with self._cond:
                self._metadata_keys.difference_update(keys)
        return doomed

    def _old_metadata_keys(self) -> list[str]:
        """Metadata blobs after the newest ``keep_metadata``: the keys this instance wrote, plus one LIST the
        first time (blobs of an earlier process or writer of this prefix)."""
        if not self._listed_metadata:
            listed = [b.key for b in self.store.list(_join(self.prefix, METADATA_DIR))]
            with self._cond:
                self._metadata_keys.update(listed)
                self._listed_metadata = True
        with self._cond:
            known = sorted(self._metadata_keys)  # keys sort newest first (inverted term and generation)
        return known[self.keep_metadata:]

    # -- reading ----------------------------------------------------------------------------

    @staticmethod
    def read_operations(
        store: BlobStore, prefix: str | Sequence[str], from_seq_no: int, to_seq_no: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Operations from the newest metadata under ``prefix`` (or several term prefixes), no local files needed.

        With several prefixes (the shard's current term first, then the older terms it
        still needs) every prefix's newest metadata contributes its generations and one
        resolution runs over all of them: the highest term wins per seq#, and each
        generation's trimmed-above seq# drops what a later primary trimmed.

        A data blob that vanishes between the LIST and its GET was purged by the live
        primary meanwhile: the listing is read again and the read retried (up to
        ``_READ_ATTEMPTS`` times) before a missing blob counts as corruption.
        """
        prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
        seen: list[str | None] | None = None
        round_gone = False
        for attempt in range(_READ_ATTEMPTS):
            found = [latest_metadata(store, p.rstrip("/")) for p in prefixes]
            keys = [f[0] if f else None for f in found]
            if seen is not None and keys == seen and not round_gone:
                break  # nothing newer to retry with: the blob is really missing
            # a node-translog round listed, then deleted (a purge, or the collection of a dead stream: its
            # sections are covered, translog/stream_gc.py): listed again, it is not there any more
            round_gone = False
            seen = keys
            entries: dict[tuple[str, int], RemoteGeneration] = {}
            trims = [f[1].trim for f in found if f is not None and f[1].trim is not None]
            for f in found:
                if f is not None:
                    for e in (*f[1].entries, *stream_entries(store, f[1])):
                        entries.setdefault((e.blob_key, e.offset), apply_trims(e, trims))
            try:
                return RemoteTranslog.read_entries(store, entries.values(), from_seq_no, to_seq_no)
            except _MissingBlob as exc:
                missing = exc
                round_gone = f"/{NODE_TRANSLOG_DIR}/" in exc.path
        raise missing

    @staticmethod
    def read_entries(
        store: BlobStore, entries: Iterable[RemoteGeneration], from_seq_no: int, to_seq_no: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Resolve the operations of the given uploaded generations."""
        top = _TOP if to_seq_no is None else to_seq_no
        out = []
        for e in entries:
            if e.num_ops == 0 or e.max_seq_no < from_seq_no or e.min_seq_no > top:
                continue
            try:
                data = read_generation(store, e)
                for frame in iter_frames(data, HEADER_SIZE, None, e.blob_key, decode=True):
                    if frame.max_seq_no < from_seq_no or frame.min_seq_no > top:
                        continue
                    out.append(filter_batch(frame.batch(), from_seq_no, top, e.trimmed_above_seq_no))
            except TranslogCorruptedError as exc:
                if e.offset < 0:
                    raise
                # a section: named by its blob and offset, so a caller leaves out only this one
                raise type(exc)(section_path(e.blob_key, e.offset), exc.offset, exc.reason) from None
        return resolve(out)

    def purge_older_term(self, prefix: str, remote_commit_local_checkpoint: int, remote_commit_primary_term: int) -> list[str]:
        """Delete an older term's whole remote translog once a remote commit covers all of it; returns the keys
        (:func:`purge_older_prefix`)."""
        own = {e.blob_key for e in self.uploaded_generations}
        return purge_older_prefix(self.store, prefix, own_prefix=self.prefix, own_keys=own,
                                  term=self.local.primary_term, checkpoint=remote_commit_local_checkpoint,
                                  commit_term=remote_commit_primary_term)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the uploader (waiting appenders get TranslogUnavailable); the local log stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> RemoteTranslog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def section_path(blob_key: str, offset: int) -> str:
    """How a read error names an uploaded generation: its blob key, and ``@<offset>`` for a node round's section."""
    return blob_key if offset < 0 else f"{blob_key}@{offset}"


def stream_entries(store: BlobStore, md: RemoteTranslogMetadata) -> list[RemoteGeneration]:
    """The sections a version 3 metadata's node streams hold beyond its entries (none for the per-shard format)."""
    if not md.streams:
        return []
    out: list[RemoteGeneration] = []
    for stream, first, index_uuid, shard in md.streams:
        out += shard_entries(store, [(stream, first)], index_uuid, shard)
    return out


def purge_older_prefix(store: BlobStore, prefix: str, *, own_prefix: str, own_keys: set[str], term: int,
                       checkpoint: int, commit_term: int) -> list[str]:
    """Delete an older term's whole per-shard remote translog once a remote commit covers all of it; the keys.

    All or nothing: while any generation under ``prefix`` still holds an operation the
    remote commit does not cover (same rule as a purge), nothing there is deleted, so the
    older prefix stays readable.  Blobs the current translog names (``own_keys``) are never
    deleted.  Data blobs go before the metadata naming them.  Sections of node-level rounds
    the older metadata names are not deleted here: their rounds are reference counted by the
    node that wrote them.
    """
    prefix = prefix.rstrip("/")
    if prefix == own_prefix:
        raise TranslogError(f"{prefix}: purge_older_term is for older term prefixes; use purge() for the own one")
    found = latest_metadata(store, prefix)
    if found is not None:
        _key, md = found
        if md.primary_term >= term:
            raise TranslogError(f"{prefix}: holds term {md.primary_term}, not older than this translog's term {term}")
        listed = [*md.entries, *stream_entries(store, md)]  # a node translog's pieces share generations
        doomed = remote_deletable_sections(listed, remote_commit_local_checkpoint=checkpoint,
                                           remote_commit_primary_term=commit_term)
        if len(doomed) < len(listed):
            return []
    data = [b.key for b in store.list(_join(prefix, DATA_DIR)) if b.key not in own_keys]
    meta = [b.key for b in store.list(_join(prefix, METADATA_DIR))]
    if data:
        store.delete(data)
    if meta:
        store.delete(meta)
    return data + meta


__all__ = ["RemoteTranslog", "filter_batch", "latest_metadata", "latest_metadata_key", "newest_trim", "purge_older_prefix",
           "read_generation", "resolve", "section_path", "stream_entries", "translog_state_key"]
