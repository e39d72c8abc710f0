"""The local translog: generation files of checksummed Arrow frames plus a checkpoint file.

Layout of a translog directory::

    translog-<gen>.tlog   header, then frames (one stamped operation batch each)
    translog-<gen>.ckp    the checkpoint a generation was sealed with (older generations)
    translog.ckp          the checkpoint of the current generation, replaced atomically

An append validates the whole batch (nothing is written if any row is bad), encodes it
as one frame and writes it.  A *sync* flushes, fsyncs the generation file and then
replaces ``translog.ckp``; only bytes the checkpoint covers count as durable.  Under
``request`` durability an append returns after a sync covering it; concurrent appenders
share one fsync (group commit: whoever syncs covers everything flushed before it).
Under ``remote`` durability (a primary whose node-level remote translog uploads every sealed
generation, issue 30) neither an append nor a roll fsyncs: the upload round rolls the
generation, then makes the rolls of all its shards durable with one sync of the filesystem
(:func:`~shardstore.fileio.sync_filesystem`) before it uploads them, and nothing is
acknowledged before that.  A SIGKILL loses nothing the page cache holds; a power cut may
leave such a log torn past its last round, which the engine never reopens (a restarted
node rebuilds its copies from the store and its peers).
Under ``async`` durability a background thread syncs every ``sync_interval`` seconds,
and also rolls a full generation (so an append never waits for the roll's fsyncs).

On open, frames up to the checkpoint must be intact (else TranslogCorruptedError names
the file and offset); anything after it is a torn or unacknowledged tail and is cut off.
A new generation starts when the current file passes ``generation_bytes`` and whenever
the primary term changes.  See docs/design/translog.md.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.compute as pc

from shardstore import fileio
from shardstore.core.arrays import one_array
from shardstore.core.ops import NO_OPS
from shardstore.errors import LocalDiskError, TooManyOpenFiles, is_too_many_open_files
from shardstore.translog.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from shardstore.translog.errors import StaleTerm, TranslogError
from shardstore.translog.frames import (
    FORMAT_VERSION,
    GenerationHeader,
    Part,
    encode_schema_frame,
    frame_header,
    frame_parts,
    scan,
)
from shardstore.translog.operations import DEFAULT_MAX_SOURCE_BYTES, SCHEMA, Summary, check, summarize
from shardstore.translog.pieces import GenerationImage, Piece
from shardstore.translog.purge import GenerationInfo, local_deletable
from shardstore.translog.replay import filter_batch, resolve
from shardstore.translog.tracker import LocalCheckpointTracker, ascending_by_one

UNASSIGNED = -2
CHECKPOINT = "translog.ckp"
_SCHEMA_FRAME = encode_schema_frame(SCHEMA)  # the second record of every generation file
_CATCH_UP_SYNCS = 3
_CATCH_UP_BYTES = 1024 * 1024


def generation_file(generation: int) -> str:
    """File name of a generation's operations."""
    return f"translog-{generation}.tlog"


def sealed_checkpoint_file(generation: int) -> str:
    """File name of the checkpoint a generation was sealed with."""
    return f"translog-{generation}.ckp"


def _write_frame(f: Any, header: bytes, parts: list[Part]) -> None:
    """Append a frame: buffered when it is one small payload, else one ``writev`` of header and parts (no copy)."""
    try:
        fileio.disk_fault("write", f.name)
    except fileio.TornWrite:
        f.write(header[: len(header) // 2])  # a torn frame: recovery cuts it back to the checkpoint
        f.flush()
        raise
    if len(parts) == 1:
        f.write(header)
        f.write(parts[0])
        return
    f.flush()  # what the buffer holds goes first
    views = [memoryview(header), *(memoryview(p) for p in parts)]
    fd = f.fileno()
    while views:
        n = os.writev(fd, views)
        while views and n >= views[0].nbytes:  # drop what was written (a short write is rare, not impossible)
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class _GenerationFile:
    """The current generation file, open for appends only while in use (issue 30: the descriptors a node
    needs do not grow with its idle shards).

    The log releases it when idle -- after a roll and after a sync that covered every append --
    and the next write opens it again (``O_APPEND``).  Running out of descriptors there is
    :class:`~shardstore.errors.TooManyOpenFiles` (retryable), never a failed log: nothing was
    written.  Released only under the log's sync and write locks, so no fsync loses its fd.
    """

    def __init__(self, path: str) -> None:
        self.name = path
        self._f: BinaryIO | None = None
        self._closed = False
        self._lock = threading.Lock()  # an append and a sync's fileno() may open it at once

    def _open(self) -> BinaryIO:
        f = self._f
        if f is None:
            with self._lock:
                if self._closed:
                    raise ValueError(f"I/O operation on closed generation file {self.name}")
                if self._f is None:
                    self._f = open(self.name, "ab")  # noqa: SIM115 - held until released
                f = self._f
        return f

    def write(self, data: bytes | memoryview) -> int:
        """Buffered append (opening the file if released)."""
        return self._open().write(data)

    def flush(self) -> None:
        """Flush the buffer (nothing to do when released; ValueError once closed, as a closed file)."""
        if self._closed:
            raise ValueError(f"flush of closed generation file {self.name}")
        f = self._f
        if f is not None:
            f.flush()

    def fileno(self) -> int:
        """The descriptor (opening the file if released)."""
        return self._open().fileno()

    def release(self) -> None:
        """Flush and close the descriptor; the next write opens the file again."""
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            f.close()

    def close(self) -> None:
        """Release it for good: a later write, flush or fileno raises ValueError (a closed file's error)."""
        with self._lock:
            self._closed = True
        self.release()


#: seq#s appended and not yet durable: a stamped batch's lo..hi range, or its seq# column otherwise
_Pending = "tuple[int, int] | pa.Array"


def _mark_persisted(tracker: LocalCheckpointTracker, pending: list) -> None:
    """Count ``pending`` (see :data:`_Pending`) durable: a range needs no array pass."""
    for p in pending:
        if isinstance(p, tuple):
            tracker.mark_persisted_range(*p)
        else:
            tracker.mark_persisted(p)


class _Current:
    """The open generation: its file, and the stats the next checkpoint will record.

    Appends bump plain counters; the :class:`Checkpoint` (a validated frozen dataclass,
    ~25 µs to rebuild) is built only when someone reads ``checkpoint``.
    """

    def __init__(self, checkpoint: Checkpoint, file: _GenerationFile, pending: list[_Pending],
                 image: GenerationImage | None = None) -> None:
        self.file = file
        self.pending = pending
        #: under ``remote`` durability, the bytes no round landed yet, as written: the node round uploads
        #: them as pieces without rolling or reading the file back (:meth:`LocalTranslog.pieces`)
        self.image = image
        self.checkpoint = checkpoint

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint covering every append so far."""
        if self._dirty:
            self._cp = replace(self._cp, offset=self.offset, num_ops=self.num_ops, min_seq_no=self.min_seq_no,
                               max_seq_no=self.max_seq_no, global_checkpoint=self.global_checkpoint)
            self._dirty = False
        return self._cp

    @checkpoint.setter
    def checkpoint(self, cp: Checkpoint) -> None:
        self._cp = cp
        self.generation = cp.generation
        self.primary_term = cp.primary_term
        self.offset, self.num_ops, self.min_seq_no, self.max_seq_no = cp.offset, cp.num_ops, cp.min_seq_no, cp.max_seq_no
        self.global_checkpoint = cp.global_checkpoint
        self._dirty = False

    def learn_global_checkpoint(self, seq_no: int) -> None:
        """Raise the global checkpoint the next checkpoint records to ``seq_no`` (never lowers it)."""
        if seq_no > self.global_checkpoint:
            self.global_checkpoint = seq_no
            self._dirty = True

    def appended(self, nbytes: int, count: int, lo: int, hi: int) -> None:
        """Account for one frame of ``count`` operations with seq#s lo..hi."""
        self.offset += nbytes
        self.num_ops += count
        self.min_seq_no = lo if self.min_seq_no == NO_OPS else min(self.min_seq_no, lo)
        self.max_seq_no = max(self.max_seq_no, hi)
        self._dirty = True


class LocalTranslog:
    """A shard's local operation log (thread-safe)."""

    def __init__(
        self,
        directory: str,
        *,
        primary_term: int,
        translog_uuid: uuid.UUID | None = None,
        durability: Literal["request", "async", "remote"] = "request",
        sync_interval: float = 5.0,
        generation_bytes: int = 64 * 1024 * 1024,
        max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES,
        fsync: bool = True,
    ) -> None:
        if durability not in ("request", "async", "remote"):
            raise TranslogError(f"durability must be 'request', 'async' or 'remote', not {durability!r}")
        self.directory = directory
        self.durability = durability
        self.generation_bytes = generation_bytes
        self.max_source_bytes = max_source_bytes
        self._fsync = fsync
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._synced: tuple[int, int] = (0, 0)  # (generation, offset) covered by translog.ckp
        self._sealed: dict[int, Checkpoint] = {}
        self._images: dict[int, GenerationImage] = {}  # sealed generation -> what no round landed yet
        self.tracker = LocalCheckpointTracker()
        self._closed = threading.Event()
        self._tragic: LocalDiskError | None = None  # set by a failed local write or fsync (see _tragedy)
        self._wake = threading.Event()  # async durability: the syncer's early wake-up (a full generation)
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(os.path.join(directory, CHECKPOINT)):
            self._recover(translog_uuid, primary_term)
        else:
            self._create(translog_uuid or uuid.uuid4(), primary_term)
        self._syncer: threading.Thread | None = None
        if durability == "async":
            self._syncer = threading.Thread(target=self._sync_loop, args=(sync_interval,), daemon=True,
                                            name=f"translog-sync-{os.path.basename(directory)}")
            self._syncer.start()

    # -- opening ----------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _new_generation_file(self, generation: int, term: int, tl_uuid: uuid.UUID, *,
                             fsync: bool = True) -> tuple[_GenerationFile, bytes]:
        """Create a generation file holding its header and schema frame, fsynced unless ``fsync`` is false;
        (the file, released until the first append, the bytes written)."""
        header = GenerationHeader(translog_uuid=tl_uuid, primary_term=term, generation=generation).encode()
        header += _SCHEMA_FRAME  # the schema, once per generation: batch frames carry none
        path = self._path(generation_file(generation))
        with open(path, "xb") as f:
            fileio.disk_fault("write", path)
            f.write(header)
            f.flush()
            if self._fsync and fsync:
                fileio.fsync(f.fileno(), path)
        return _GenerationFile(path), header  # opened again by the first append

    @staticmethod
    def _fresh_checkpoint(generation: int, offset: int, term: int, base: Checkpoint | None,
                          tl_uuid: uuid.UUID) -> Checkpoint:
        """The checkpoint of a generation with nothing appended yet (global checkpoint and minimum from ``base``)."""
        return Checkpoint(
            generation=generation,
            offset=offset,
            num_ops=0,
            min_seq_no=NO_OPS,
            max_seq_no=NO_OPS,
            global_checkpoint=base.global_checkpoint if base else NO_OPS,
            min_translog_generation=base.min_translog_generation if base else generation,
            trimmed_above_seq_no=UNASSIGNED,
            translog_uuid=tl_uuid,
            primary_term=term,
        )

    def _start_generation(self, generation: int, term: int, base: Checkpoint | None, tl_uuid: uuid.UUID) -> None:
        f, header = self._new_generation_file(generation, term, tl_uuid)
        cp = self._fresh_checkpoint(generation, len(header), term, base, tl_uuid)
        self._cur = _Current(cp, f, [], GenerationImage(header) if self.durability == "remote" else None)
        write_checkpoint(self.directory, cp, fsync=self._fsync)
        self._synced = (generation, cp.offset)

    def _create(self, tl_uuid: uuid.UUID, term: int) -> None:
        self._start_generation(1, term, None, tl_uuid)

    def _recover(self, expected: uuid.UUID | None, term: int) -> None:
        cp = read_checkpoint(self.directory)
        if expected is not None and cp.translog_uuid != expected:
            raise TranslogError(
                f"{self.directory}: translog UUID {cp.translog_uuid} is not the expected {expected}"
            )
        for gen in range(cp.min_translog_generation, cp.generation):
            self._sealed[gen] = read_checkpoint(self.directory, sealed_checkpoint_file(gen))
            scan(self._path(generation_file(gen)), self._sealed[gen].offset)  # intact up to its checkpoint
        self._remove_orphans(cp.generation)
        path = self._path(generation_file(cp.generation))
        found = scan(path, cp.offset)  # raises on damage inside the checkpointed range
        with open(path, "r+b") as f:  # cut the torn / unacknowledged tail
            f.truncate(cp.offset)
            if self._fsync:
                os.fsync(f.fileno())
        self._cur = _Current(cp, _GenerationFile(path), [])
        self._synced = (cp.generation, cp.offset)
        if cp.max_seq_no >= 0:
            self._mark_recovered()
        if term < cp.primary_term:
            raise StaleTerm(f"{self.directory}: opened with primary term {term} below the log's {cp.primary_term}")
        if term > cp.primary_term:
            self.roll_generation(term)
        elif found.header.version != FORMAT_VERSION or found.schema != SCHEMA:
            self.roll_generation()  # an older format's file is sealed as it is; new frames go to a new file

    def _remove_orphans(self, current: int) -> None:
        """Delete generation files above the checkpointed one: a roll interrupted by a crash.

        A new generation holds no acknowledged operation until translog.ckp names it, so
        its file (and a sealed checkpoint written for it) can go.
        """
        for name in os.listdir(self.directory):
            stem, _, ext = name.partition(".")
            if ext in ("tlog", "ckp") and stem.startswith("translog-") and stem[9:].isdigit():
                if int(stem[9:]) > current:
                    os.unlink(self._path(name))

    def _mark_recovered(self) -> None:
        seqs = [b.column("seq_no") for b in self.read_operations(0)]
        if seqs:
            arr = pa.concat_arrays([one_array(s) for s in seqs])
            self.tracker.advance_max_seq_no(pc.max(arr).as_py())
            self.tracker.mark_processed(arr)
            self.tracker.mark_persisted(arr)

    # -- writing ----------------------------------------------------------------------------

    @property
    def primary_term(self) -> int:
        """The term of the current generation."""
        return self._cur.primary_term

    @property
    def generation(self) -> int:
        """The current generation number."""
        return self._cur.generation

    @property
    def translog_uuid(self) -> uuid.UUID:
        """The UUID every generation header and checkpoint of this log carries."""
        return self._cur.checkpoint.translog_uuid

    @property
    def persisted_checkpoint(self) -> int:
        """Highest seq# s such that every op <= s is durable here."""
        return self.tracker.persisted_checkpoint

    def add(self, batch: pa.RecordBatch, *, history: bool = False, summary: Summary | None = None,
            frame: tuple[bytes, list[Part]] | None = None) -> tuple[int, int]:
        """Append a stamped batch; returns its (generation, end offset) once durable per the policy.

        An operation of a term below the log's current term is refused, unless ``history``:
        a copy replaying another copy's resolved history (recovery, restore) may meet an
        older-term operation above a newer-term no-op that filled a gap at a promotion
        (issue 14, case 2), as Elasticsearch's translog accepts any term up to its own.
        ``summary``: the batch's :class:`Summary` when the caller has it (its ``batch`` is this one; ranges may be
        bounds), else it is computed here.  ``frame``: (magic, payload parts) of this very batch already encoded
        another way (a Parquet frame of a part written once: translog/parquet_frames.py), written instead of
        the frame :func:`frame_parts` would make.
        """
        if batch.num_rows == 0:
            return (self.generation, self._cur.checkpoint.offset)
        if summary is None:
            summary = summarize(batch)  # the column ranges, computed once for the roll, the checks and the frame
        if summary.primary_term is not None and summary.primary_term[1] > self.primary_term:
            self.roll_generation(summary.primary_term[1])
        batch = check(summary, current_term=0 if history else self.primary_term, max_source_bytes=self.max_source_bytes)
        assert summary.seq_no is not None  # check() refused null seq#s
        lo, hi = summary.seq_no
        # a large batch's own buffers, not a copy; FT for typed operations
        magic, parts = frame if frame is not None else frame_parts(batch)
        header = frame_header(parts, batch.num_rows, lo, hi, magic=magic)
        size = int.from_bytes(header[2:6], "little")
        with self._write_lock:
            self._check_open()
            cur = self._cur
            try:
                _write_frame(cur.file, header, parts)
            except OSError as exc:
                raise self._tragedy("write", exc) from exc
            if cur.image is not None:
                cur.image.append(header, parts, batch.num_rows, lo, hi)
            cur.appended(len(header) + size, batch.num_rows, lo, hi)
            seqs = batch.column(0)
            contiguous = hi - lo + 1 == batch.num_rows and (summary.contiguous or ascending_by_one(seqs))
            cur.pending.append((lo, hi) if contiguous else seqs)
            position = (cur.generation, cur.offset)
            self.tracker.advance_max_seq_no(hi)
        if self.durability == "request":
            self.sync(position)
        if position[1] >= self.generation_bytes and position[0] == self.generation:
            if self._syncer is not None:
                self._wake.set()  # async: the syncer seals it; the append does not wait for the roll's fsyncs
            else:
                self.roll_generation()
        return position

    def set_durability(self, durability: Literal["request", "remote"]) -> None:
        """Switch between ``request`` and ``remote`` durability (a copy promoted to, or leaving, a primary
        whose node-level remote translog rolls and seals every generation it uploads, then syncs them all at once)."""
        if durability not in ("request", "remote") or self.durability == "async":
            raise TranslogError(f"{self.directory}: cannot switch durability from {self.durability!r} to "
                                f"{durability!r}")
        if durability == "request" and self.durability == "remote":
            # what was logged and rolled without an fsync is made durable before the log promises it again
            with self._write_lock:
                self.durability = durability
                self._cur.image = None
            try:
                fileio.sync_filesystem(self.directory, files=[self._path(CHECKPOINT)])  # rolls no round synced
            except OSError as exc:
                raise self._tragedy("fsync", exc) from exc
            self.sync()
            return
        self.durability = durability

    @property
    def _durable(self) -> bool:
        """Whether a sync or roll fsyncs now: not under ``remote`` durability, whose node-level round
        makes every roll it uploads durable with one filesystem sync (NodeTranslog, issue 30)."""
        return self._fsync and self.durability != "remote"

    def _check_open(self) -> None:
        if self._tragic is not None:
            raise self._tragic
        if self._closed.is_set():
            raise TranslogError(f"{self.directory}: the translog is closed")

    def _tragedy(self, op: str, exc: OSError) -> LocalDiskError | TooManyOpenFiles:
        """A failed local write or fsync: the log is failed for good (a torn frame may sit in the file, and
        after a failed fsync the page cache cannot be trusted); every later call raises the same error.

        Out of file descriptors (EMFILE/ENFILE) is no tragedy: a file could not be opened, so nothing
        was written or synced through it; the call fails (TooManyOpenFiles) and a later one may succeed.
        """
        if is_too_many_open_files(exc):
            return TooManyOpenFiles(f"{self.directory}: local {op}", exc)
        if self._tragic is None:
            self._tragic = LocalDiskError(self.directory, op, exc)
        return self._tragic

    def sync(self, upto: tuple[int, int] | None = None) -> None:
        """Make everything appended so far (or up to ``upto``) durable; concurrent callers share one fsync."""
        with self._sync_lock:
            if upto is not None and self._synced >= upto:
                return  # another appender's fsync already covered us
            if self._tragic is not None:
                raise self._tragic
            with self._write_lock:
                cur = self._cur
                try:
                    cur.file.flush()
                except OSError as exc:
                    raise self._tragedy("write", exc) from exc
                cp = cur.checkpoint
                pending, cur.pending = cur.pending, []
            durable = self._durable
            try:
                if durable:
                    fileio.fsync(cur.file.fileno(), cur.file.name)
                write_checkpoint(self.directory, cp, fsync=durable)
            except OSError as exc:
                raise self._tragedy("fsync", exc) from exc
            self._synced = (cp.generation, cp.offset)
            with self._write_lock:
                if self._cur is cur and cur.offset == cp.offset:
                    cur.file.release()  # idle: its descriptor is not held until the next append
            _mark_persisted(self.tracker, pending)

    def _sync_loop(self, interval: float) -> None:
        """Async durability: sync every ``interval`` seconds, and roll a full generation as soon as asked."""
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                with self._write_lock:
                    full = self._cur.offset >= self.generation_bytes
                if full:
                    self.roll_generation()  # syncs first
                else:
                    self.sync()
            except Exception:  # async appends are not acknowledged durable; the next sync tries again
                continue

    def set_global_checkpoint(self, seq_no: int) -> None:
        """Record the global checkpoint (persisted with the next sync)."""
        with self._write_lock:
            self._cur.learn_global_checkpoint(seq_no)

    def roll_generation(self, new_term: int | None = None) -> Checkpoint:
        """Seal the current generation and start the next (with ``new_term`` if the term changed); the sealed checkpoint."""
        if self._durable:
            self._sync_before_roll()
        with self._sync_lock:  # one roll at a time; no sync may write translog.ckp until it is done
            with self._write_lock:
                cp = self._cur.checkpoint
            term = cp.primary_term if new_term is None else new_term
            if term < cp.primary_term:
                raise StaleTerm(f"{self.directory}: term {term} is below the log's {cp.primary_term}")
            generation = cp.generation + 1
            if self._tragic is not None:
                raise self._tragic
            durable = self._durable
            try:
                f, header = self._new_generation_file(generation, term, cp.translog_uuid,
                                                      fsync=durable)  # fsynced, appends go on
                with self._write_lock:  # the switch: only a flush under the write lock
                    old = self._cur
                    old.file.flush()
                    sealed = old.checkpoint
                    fresh = self._fresh_checkpoint(generation, len(header), term, sealed, sealed.translog_uuid)
                    self._cur = _Current(fresh, f, [], GenerationImage(header) if self.durability == "remote" else None)
                    self._sealed[sealed.generation] = sealed
                    if old.image is not None and old.image.end == sealed.offset and sealed.num_ops:
                        self._images[sealed.generation] = old.image
                # Appends now land in the new file; they count only once translog.ckp names it (below).  A
                # crash before that leaves an orphan file, removed on open.
                if durable:
                    fileio.fsync(old.file.fileno(), old.file.name)
                old.file.close()
                write_checkpoint(self.directory, sealed, fsync=durable,
                                 name=sealed_checkpoint_file(sealed.generation))
                write_checkpoint(self.directory, fresh, fsync=durable)
            except OSError as exc:
                raise self._tragedy("roll", exc) from exc
            self._synced = (generation, fresh.offset)
        _mark_persisted(self.tracker, old.pending)
        return sealed

    def _sync_before_roll(self) -> None:
        """Sync what was appended (again while appends go on), so that the roll's sealing fsync, which holds
        up every sync, has little left to do."""
        self.sync()
        for _ in range(_CATCH_UP_SYNCS):  # appends went on during that fsync: sync them too, so that the
            with self._write_lock:        # sealing fsync below (which holds up every sync) has little left to do
                behind = self._cur.offset - self._synced[1] if self._synced[0] == self._cur.generation else 0
            if behind <= _CATCH_UP_BYTES:
                break
            self.sync()

    # -- reading, trimming, purging -----------------------------------------------------------

    def sealed_checkpoint(self, generation: int) -> Checkpoint:
        """The checkpoint ``generation`` was sealed with (KeyError if it is not a retained sealed generation)."""
        with self._write_lock:
            return self._sealed[generation]

    def pieces(self, generation: int, offset: int) -> tuple[list[Piece], tuple[int, int]] | None:
        """What was appended from local position (``generation``, ``offset``) on, as pieces (one per generation
        holding some), and the position they end at; None when some of it is not held in memory (a log
        reopened, or not under ``remote`` durability): the caller rolls and reads the files then.

        The current generation's buffered writes are flushed, so a filesystem sync covers them, and
        what it held counts durable, as a roll would have counted it (translog/pieces.py).
        """
        with self._write_lock:
            self._check_open()
            cur = self._cur
            if cur.image is None:
                return None
            held = [(self._sealed[g], self._images.get(g)) for g in sorted(self._sealed)
                    if g >= generation and self._sealed[g].num_ops]
            held.append((cur.checkpoint, cur.image))
            out = []
            for cp, image in held:
                start = offset if cp.generation == generation else 0
                if cp.generation < generation or (cp.generation == generation and start >= cp.offset):
                    continue  # landed already
                if image is None or not image.holds(start):
                    return None  # not held (landed once already: a node translog reopened over this log)
                piece = image.piece(cp.generation, cp.primary_term, start, cp.trimmed_above_seq_no)
                if piece is not None:
                    out.append(piece)
            if out and out[-1].generation == cur.generation:
                try:
                    cur.file.flush()  # so the round's filesystem sync covers it
                except OSError as exc:
                    raise self._tragedy("write", exc) from exc
            pending, cur.pending = cur.pending, []
            through = (cur.generation, cur.offset)
        _mark_persisted(self.tracker, pending)
        return out, through

    def release_images(self, through: tuple[int, int]) -> None:
        """A round landed everything before local position ``through``: forget those bytes."""
        generation, offset = through
        with self._write_lock:
            for g in [g for g in self._images if g <= generation]:
                if g < generation:
                    del self._images[g]
                else:
                    self._images[g].release(offset)
            if self._cur.image is not None and self._cur.generation == generation:
                self._cur.image.release(offset)

    @property
    def current_offset(self) -> int:
        """How many bytes the current generation's file holds."""
        return self._cur.offset

    def sealed_after(self, generation: int) -> list[Checkpoint]:
        """The sealed checkpoints of the retained generations above ``generation``, oldest first."""
        with self._write_lock:
            return [self._sealed[g] for g in sorted(self._sealed) if g > generation]

    @property
    def current_num_ops(self) -> int:
        """How many operations the current (unsealed) generation holds."""
        return self._cur.num_ops

    def generations(self) -> list[GenerationInfo]:
        """What each retained generation holds (for the purge rules)."""
        with self._write_lock:
            cps = [*(self._sealed[g] for g in sorted(self._sealed)), self._cur.checkpoint]
        return [GenerationInfo(c.generation, c.primary_term, c.min_seq_no, c.max_seq_no, c.num_ops) for c in cps]

    def read_operations(self, from_seq_no: int, to_seq_no: int | None = None) -> Iterator[pa.RecordBatch]:
        """Operations with from <= seq# <= to, one winner per seq# (the highest term), trims applied."""
        with self._write_lock:
            self._cur.file.flush()
            cps = [*(self._sealed[g] for g in sorted(self._sealed)), self._cur.checkpoint]
        top = to_seq_no if to_seq_no is not None else 2**63 - 1
        batches = []
        for cp in cps:
            if cp.num_ops == 0 or cp.max_seq_no < from_seq_no or cp.min_seq_no > top:
                continue
            for frame in scan(self._path(generation_file(cp.generation)), cp.offset).frames:
                if frame.max_seq_no < from_seq_no or frame.min_seq_no > top:
                    continue
                batches.append(filter_batch(frame.batch(), from_seq_no, top, cp.trimmed_above_seq_no))
        return resolve(batches)

    def trim_operations_above(self, seq_no: int, term: int) -> None:
        """Drop, from every generation of a term below ``term``, the operations above ``seq_no``."""
        self.sync()
        with self._sync_lock, self._write_lock:
            for gen, cp in list(self._sealed.items()):
                if cp.primary_term < term:
                    trimmed = seq_no if cp.trimmed_above_seq_no == UNASSIGNED else min(seq_no, cp.trimmed_above_seq_no)
                    new = replace(cp, trimmed_above_seq_no=trimmed)
                    write_checkpoint(self.directory, new, fsync=self._fsync, name=sealed_checkpoint_file(gen))
                    self._sealed[gen] = new
            cur = self._cur.checkpoint
            if cur.primary_term < term:
                trimmed = seq_no if cur.trimmed_above_seq_no == UNASSIGNED else min(seq_no, cur.trimmed_above_seq_no)
                self._cur.checkpoint = replace(cur, trimmed_above_seq_no=trimmed)
                write_checkpoint(self.directory, self._cur.checkpoint, fsync=self._fsync)

    def delete_generations(self, generations: set[int]) -> None:
        """Delete sealed generations (a prefix, as the purge rules decide) and record the new minimum."""
        with self._sync_lock, self._write_lock:
            doomed = sorted(g for g in generations if g in self._sealed)
            keep = [g for g in sorted(self._sealed) if g not in doomed]
            if keep and doomed and doomed[-1] > keep[0]:
                raise TranslogError(f"{self.directory}: generations {doomed} are not a prefix of {sorted(self._sealed)}")
            new_min = keep[0] if keep else self._cur.checkpoint.generation
            self._cur.checkpoint = replace(self._cur.checkpoint, min_translog_generation=new_min)
            write_checkpoint(self.directory, self._cur.checkpoint, fsync=self._fsync)  # first: never reference a gone file
            for g in doomed:
                del self._sealed[g]
                self._images.pop(g, None)
                for name in (generation_file(g), sealed_checkpoint_file(g)):
                    try:
                        os.unlink(self._path(name))
                    except FileNotFoundError:
                        pass

    def purge(
        self,
        *,
        last_commit_local_checkpoint: int,
        retention_seq_no: int,
        min_unuploaded_generation: int | None = None,
    ) -> set[int]:
        """Delete the sealed generations the pure local purge rule allows; returns them."""
        doomed = local_deletable(
            self.generations(),
            current_generation=self.generation,
            last_commit_local_checkpoint=last_commit_local_checkpoint,
            retention_seq_no=retention_seq_no,
            min_unuploaded_generation=min_unuploaded_generation,
        )
        if doomed:
            self.delete_generations(doomed)
        return doomed

    def close(self) -> None:
        """Sync and close (the async syncer stops)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        if self._syncer is not None:
            self._syncer.join()  # lets a roll in progress finish
        if self._tragic is not None:  # failed for good: nothing more is made durable, the file just closes
            with self._write_lock, contextlib.suppress(OSError):
                self._cur.file.close()
            return
        self.sync()
        with self._write_lock:
            self._cur.file.close()

    def __enter__(self) -> LocalTranslog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["LocalTranslog", "SCHEMA", "generation_file", "sealed_checkpoint_file"]
