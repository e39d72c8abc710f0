"""The node-level remote translog: one upload round puts every changed shard's operations in one blob (issue 30).

:class:`NodeTranslog` is one per node (process) and store; :meth:`NodeTranslog.open_shard`
gives each primary copy a :class:`NodeShardTranslog`, which the engine uses exactly like
a per-shard :class:`~shardstore.translog.remote.RemoteTranslog` (append, wait, trim,
purge).  Layout and byte formats: :mod:`node_format`; design and the fencing argument:
docs/design/translog.md, "Node-level translog".

**A round** (one uploader thread per node, started by an append, ended when idle):

1. take every shard whose appends wait; for each, under its own upload lock only, take
   what it appended since the last landed round as a *piece* (``remote`` durability: the
   log holds those bytes; translog/pieces.py), else roll the local generation and read the
   sealed generations not uploaded yet (every frame CRC-checked) -- no copy lock of the
   engine is held at any point; then one filesystem sync makes every shard's new bytes
   durable (one per round, not one fsync per shard);
2. PUT one data blob (the sections, then the index) and one index blob, both ``if_absent``;
3. run ``after_round`` (the engine's claim-log listing: one LIST, the fence);
4. only then count the sections uploaded and wake the waiting appends, which the engine
   acknowledges after its per-shard fence verdict (no request).

Appends arriving during a round go in the next one, which starts as soon as this one ends
(group commit across shards and clients, no timer).  Steady state: 2 PUT + 1 LIST per round,
whatever the number of shards or clients in it.

**Readers** find a shard's sections through its per-shard metadata (format version 3,
:mod:`remote_metadata`): its ``entries`` (sections with an offset) and its ``streams``,
``(stream, first round, index_uuid, shard)``: rounds of that stream from that round on may
hold more of it.  That metadata is written when a copy opens (it names the stream before
the first round can hold the shard), at a trim (promotion) and at a purge (flush): never
per round.

**Purge** stays per shard (the pure rule of :mod:`purge`); a round's blobs are deleted once
no shard still retains a section of it (reference counted per round).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from shardstore import fileio
from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists
from shardstore.core.ops import NO_OPS
from shardstore.errors import LocalDiskError
from shardstore.translog.chained import ChainedReader, FileRegion, Part, file_crc32c
from shardstore.translog.checkpoint import Checkpoint, read_checkpoint
from shardstore.translog.errors import TranslogCorruptedError, TranslogError, TranslogUnavailable
from shardstore.translog.frames import HEADER_SIZE, GenerationHeader, iter_frames
from shardstore.translog.frames import Part as FramePart
from shardstore.translog.local import CHECKPOINT, LocalTranslog, generation_file
from shardstore.translog.node_format import (
    RoundIndex,
    Section,
    data_key,
    index_key,
    new_stream_id,
    stream_prefix,
    trailer,
)
from shardstore.translog.node_read import forget_cached, shard_entries
from shardstore.translog.operations import Summary
from shardstore.translog.pieces import Piece
from shardstore.translog.purge import remote_deletable_sections
from shardstore.translog.records import ZLIB_CRC_VERSION
from shardstore.translog.remote import (
    KEEP_METADATA,
    _checked,
    apply_trims,
    latest_metadata,
    newest_trim,
    purge_older_prefix,
)
from shardstore.translog.remote_metadata import (
    METADATA_DIR,
    RemoteGeneration,
    RemoteTranslogMetadata,
    generation_checksum,
    metadata_key,
    parse_metadata_key,
)

log = logging.getLogger(__name__)

#: seconds the uploader waits for the next append before it ends (a later append starts another)
UPLOADER_IDLE_SECONDS = 5.0


#: a retained section: (local generation, data blob key, offset in it)
EntryKey = tuple[int, str, int]

#: at a round, a current local generation this big is rolled (its file and what a purge may drop stay small)
NODE_ROLL_BYTES = 4 * 1024 * 1024


def entry_key(e: RemoteGeneration) -> EntryKey:
    """The key a retained section is known by, from its uploaded entry."""
    return section_key(e.generation, e.blob_key, e.offset)


def read_sealed(directory: str, cp: Checkpoint) -> Piece:
    """A sealed generation as one piece, every frame's CRC checked, its bytes left in the file: the round streams
    them to the store (a 1 GB generation is never held in memory, issue 46; a version 1 file is read whole)."""
    path = f"{directory}/{generation_file(cp.generation)}"
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < cp.offset:
            raise TranslogCorruptedError(path, size, f"short sealed generation: sealed checkpoint covers {cp.offset}")
        f.seek(0)
        head = f.read(HEADER_SIZE)
        header = GenerationHeader.decode(head, path)
        if header.version == ZLIB_CRC_VERSION:  # legacy: its blob checksum is zlib's CRC32, taken over the bytes
            f.seek(0)
            data = f.read(cp.offset)
            header, _checksum = _checked(memoryview(data), path, cp.offset)
            return Piece(cp.generation, header.primary_term, data, 0, cp.offset, cp.min_seq_no, cp.max_seq_no,
                         cp.num_ops, cp.trimmed_above_seq_no)
        for _frame in iter_frames(f, HEADER_SIZE, cp.offset, path):  # one frame in memory at a time
            pass
    try:
        crc = file_crc32c(path, cp.offset)
    except OSError as exc:
        raise TranslogCorruptedError(path, 0, f"sealed generation unreadable: {exc}") from None
    return Piece(cp.generation, header.primary_term, b"", 0, cp.offset, cp.min_seq_no, cp.max_seq_no, cp.num_ops,
                 cp.trimmed_above_seq_no, region=FileRegion(path, cp.offset), crc=crc)


def section_key(generation: int, data_key: str, offset: int) -> EntryKey:
    """The key a retained section is known by."""
    return (generation, data_key, offset)


class NodeTranslog:
    """One node's translog uploads: a round puts the new sealed generations of all its shards in one data blob."""

    def __init__(self, store: BlobStore, cluster_uuid: str, *, node: str = "node",
                 after_round: Callable[[], None] | None = None, retry_pause: float = 0.05,
                 owner: str | None = None) -> None:
        """``after_round``: run after a round landed and before its writes count as uploaded (the fence);
        ``owner``: the node process's ephemeral id, named in the stream id (the store-side collection of the
        streams of processes that are gone tells them by it: docs/design/translog.md, "Collecting dead streams")."""
        self.store = store
        self.node = node
        self.stream = new_stream_id(owner)
        self.prefix = stream_prefix(cluster_uuid, self.stream)
        self.writer = uuid.uuid4().hex
        self.after_round = after_round
        self.retry_pause = retry_pause
        self._cond = threading.Condition()
        self._pending: dict[int, NodeShardTranslog] = {}
        self._next_round = 0
        self._open_round: int | None = None  # numbered, not done: it may still seal shards
        self._refs: dict[int, set[tuple[int, EntryKey]]] = {}  # round -> {(id(handle), section)} still retained
        self._thread: threading.Thread | None = None
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"translog-sync-{node}")
        self._closed = False
        #: group commit: a round closes the current epoch and waits for the holds taken in it or before
        #: (epoch -> [staging() holds, joining() holds]); a hold taken later never delays it
        self._epoch = 0
        self._holds: dict[int, list[int]] = {}
        self._join_window = 0.0  # how long the last round took: the most a round waits for joining() holds
        self._joined = 0  # joining() holds released (one-shard bulks staged) not yet counted into a round
        self._siblings = 0  # how many the last round carried: the next one expects as many (group commit)
        self._round_ended = 0.0  # when the last round acknowledged its appends
        self._leftover = 0  # one-shard bulks staged while the last round ran (the next round carries them)
        self._turnaround = 0.0  # moving average: from a round's end to the next one-shard bulk arriving here
        self.rounds = 0  # rounds that landed

    @property
    def next_round(self) -> int:
        """The oldest round that may still take an append logged now: the round numbered but not done (it
        may still seal shards), else the number the next one will get.  A per-shard metadata names it as
        the first round to scan, so no round holds a shard before the round its metadata names."""
        with self._cond:
            return self._next_round if self._open_round is None else self._open_round

    def open_shard(self, local: LocalTranslog, prefix: str, index_uuid: str, shard: int, *,
                   upload_timeout: float = 30.0, covered_through: int | None = None,
                   keep_metadata: int = KEEP_METADATA) -> NodeShardTranslog:
        """The remote translog of one primary copy on this node (writes its per-shard metadata naming the stream)."""
        return NodeShardTranslog(self, local, prefix, index_uuid, shard, upload_timeout=upload_timeout,
                                 covered_through=covered_through, keep_metadata=keep_metadata)

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        """Hold the next round while the caller appends to several shards, so one round takes them all.

        A node writing one bulk's parts for many shards stages them all (CPU work, no waiting)
        inside this, then waits: their uploads share one data blob instead of the first part
        starting a round alone.  Rounds already running are not held, nor is a round by a hold
        taken after it started waiting (epochs: no starvation under back-to-back holds).
        """
        with self._hold(0):
            yield

    @contextlib.contextmanager
    def joining(self) -> Iterator[None]:
        """Ask the next round to wait for an append about to be staged (a round's time at most without progress).

        A bulk that waits for its shard's lock behind another client's holds this while it waits
        and stages: the round that would start as soon as the first client's append is logged
        takes the queued ones too, instead of one round (2 PUTs) per client.  Bounded (see
        :meth:`_await_stagers`), since a holder may wait on a lock held by someone who waits for that round.
        """
        with self._hold(1):
            yield

    @contextlib.contextmanager
    def _hold(self, kind: int) -> Iterator[None]:
        with self._cond:
            epoch = self._epoch
            self._holds.setdefault(epoch, [0, 0])[kind] += 1
            if kind:
                if self._round_ended:  # the first bulk after a round: how long its client took to come back
                    gap = time.monotonic() - self._round_ended
                    self._turnaround = min(gap, 1.0) if not self._turnaround else 0.8 * self._turnaround + 0.2 * min(gap, 1.0)
                    self._round_ended = 0.0
                self._cond.notify_all()  # a round expecting siblings counts it
        try:
            yield
        finally:
            with self._cond:
                held = self._holds[epoch]
                held[kind] -= 1
                if held == [0, 0]:
                    del self._holds[epoch]
                self._joined += kind
                self._cond.notify_all()

    def _held_through(self, epoch: int) -> tuple[int, int]:
        """(staging() holds, joining() holds) taken in ``epoch`` or before (under the condition)."""
        held = [h for e, h in self._holds.items() if e <= epoch]
        return sum(h[0] for h in held), sum(h[1] for h in held)

    def _await_stagers(self) -> int:
        """Close the epoch, then wait for its staging() holds, and for its joining() holds as long as one
        of them is released within a round's time of the last (under the condition).

        The joining holders queue on one shard lock and stage one after another, so each release
        restarts the wait; a holder that makes no progress for a round's time (it may wait on a
        lock whose holder waits for this round) is left to the next round.  Holds taken after the
        epoch closed are not waited for, so the wait ends.  Returns how many one-shard bulks were staged
        for this round.
        """
        self._await_siblings()
        epoch = self._epoch
        self._epoch += 1
        self._await_holders(epoch)
        carried, self._joined = self._joined, 0
        return carried

    def _await_holders(self, epoch: int) -> None:
        deadline = 0.0
        last_joining = -1
        while not self._closed:
            staging, joining = self._held_through(epoch)
            if not staging and not joining:
                return
            if staging:
                self._cond.wait()
                continue
            if joining != last_joining:  # progress: a joining holder staged (or the first look)
                last_joining = joining
                deadline = time.monotonic() + self._join_window
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _await_siblings(self) -> None:
        """Before closing the epoch: when the last round carried several one-shard bulks (concurrent
        clients), wait until as many are staged or under way here, at most the last round's duration.

        Concurrent clients' bulks reach the node one after another, each after its coordinator's
        parse; a round taking only those staged so far would carry one or two of them (2 PUTs
        each).  The wait is PostgreSQL's ``commit_siblings`` idea with the bound measured, not
        configured: a lone client (the last round carried one bulk) never waits, and the wait
        ends as soon as the expected bulks are in (docs/design/translog.md, "Group commit").
        """
        if self._siblings < 2 or not self._join_window:
            return
        deadline = time.monotonic() + min(self._join_window + self._turnaround, 1.0)
        expected = self._siblings + self._leftover  # the last round's bulks come back, plus those staged during it
        while not self._closed:
            joining = sum(h[1] for h in self._holds.values())
            if self._joined + joining >= expected:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    # -- rounds ---------------------------------------------------------------------------------

    def _request(self, handle: NodeShardTranslog) -> None:
        with self._cond:
            if self._closed:
                return
            was_idle = not self._pending
            self._pending[id(handle)] = handle
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name=f"node-translog-{self.node}")
                self._thread.start()
            if was_idle:  # the uploader waits for the first request only (holds wake it otherwise): no
                self._cond.notify_all()  # wake-up per shard of a bulk, each a GIL hand-off to a thread with nothing to do

    def _forget(self, handle: NodeShardTranslog) -> None:
        with self._cond:
            self._pending.pop(id(handle), None)

    def _loop(self) -> None:
        pause = self.retry_pause
        while True:
            with self._cond:
                while not self._closed and not self._pending:
                    if not self._cond.wait(UPLOADER_IDLE_SECONDS) and not self._pending:
                        self._thread = None  # idle: the next append starts another
                        return
                carried = self._await_stagers()
                if self._closed:
                    self._thread = None
                    return
                handles = list(self._pending.values())
                self._pending.clear()
            started = time.monotonic()
            try:
                if not self._round(handles):
                    pause = self.retry_pause
                    with self._cond:  # nothing uploaded: its count, duration and timing say nothing
                        self._joined += carried
                    continue
                self._join_window = min(time.monotonic() - started, 1.0)
                with self._cond:
                    self._siblings = carried  # none (multi-shard bulks only): the next round expects none back
                    self._round_ended = time.monotonic()
                    self._leftover = self._joined  # staged while that round ran: the next one carries them
                pause = self.retry_pause
            except BaseException as exc:  # noqa: BLE001 - reported to the waiting appends, then retried
                for h in handles:
                    h._failed(exc)
                with self._cond:
                    self._joined += carried  # the retry carries them
                    for h in handles:
                        if not h._closed:
                            self._pending.setdefault(id(h), h)
                    self._cond.wait(pause)  # close() wakes us
                pause = min(pause * 2, 1.0)

    def _round(self, handles: list[NodeShardTranslog]) -> bool:
        """One upload round over ``handles`` (see the module); whether it uploaded anything."""
        with self._cond:
            round_no = self._next_round
            self._next_round += 1  # a failed attempt's number is never reused: its PUT may have landed
            self._open_round = round_no
        try:
            return self._upload_round(round_no, handles)
        finally:
            with self._cond:
                self._open_round = None

    def _upload_round(self, round_no: int, handles: list[NodeShardTranslog]) -> bool:
        parts: list[Part] = []
        sections: list[Section] = []
        owners: list[tuple[NodeShardTranslog, list[Section]]] = []
        offset = 0
        for h in handles:
            mine: list[Section] = []
            for s in h._seal(round_no):
                mine.append(Section(h.index_uuid, h.shard, s.generation, s.primary_term, offset, s.size,
                                    s.crc if s.crc is not None else generation_checksum(s.data), s.min_seq_no,
                                    s.max_seq_no, s.num_ops, s.trimmed_above_seq_no))
                parts.append(s.part)
                offset += s.size
            sections.extend(mine)
            owners.append((h, mine))
        if sections:
            # one sync per round, not an fsync per shard, beside the data blob's PUT: both end before the index blob,
            # which makes the round count (docs/design/translog.md, "Local durability: one sync per round per node")
            durable = self._syncer.submit(_sync_local, [h for h, mine in owners if mine])
            key = data_key(self.prefix, round_no)
            index = RoundIndex(self.prefix, round_no, self.node, tuple(sections)).encode()
            parts.append(trailer(index))
            try:
                self._put_parts(key, parts)
                put_failed = None
            except BaseException as exc:  # noqa: BLE001 - raised below, unless the local sync failed too
                put_failed = exc
            local_failed = durable.exception()
            if local_failed is not None:  # the copies fail (LocalDiskError) and the round counts for nothing:
                if put_failed is None:  # its data blob, which landed beside the sync, goes too
                    with contextlib.suppress(Exception):
                        self.store.delete([key])
                raise local_failed
            if put_failed is not None:
                raise put_failed
            self._put(index_key(self.prefix, round_no), index)
            with self._cond:
                self._refs[round_no] = {(id(h), section_key(s.generation, key, s.offset)) for h, mine in owners
                                        for s in mine}
        for h, mine in owners:
            h._landed_round(round_no, mine)
        unconfirmed = sections or any(h._unconfirmed for h, _mine in owners)
        if self.after_round is not None and unconfirmed:
            # the fence listing: after the round landed, before anything counts as uploaded (a round with
            # nothing new, asked for by a waiter that came while the last one ran, lists nothing)
            self.after_round()
        for h, _mine in owners:
            h._confirm()
        if sections:
            with self._cond:
                self.rounds += 1
        return bool(sections)

    def _put_parts(self, key: str, parts: list[Part]) -> None:
        """The round's data blob: one put of the joined bytes, or streamed when a section stays in its file."""
        if not any(isinstance(p, FileRegion) for p in parts):
            self._put(key, b"".join(parts))  # type: ignore[arg-type]
            return
        reader = ChainedReader(parts)
        try:
            try:
                self.store.put_stream(key, reader, if_absent=True, token=self.writer)
            except BlobAlreadyExists:  # an earlier attempt of ours landed although it reported failure
                if self.store.stat(key).size != reader.size:
                    raise TranslogError(f"{key}: a different node translog blob already exists") from None
        finally:
            reader.close()

    def _put(self, key: str, data: bytes) -> None:
        try:
            self.store.put(key, data, if_absent=True, token=self.writer)
        except BlobAlreadyExists:  # an earlier attempt of ours landed although it reported failure
            if self.store.stat(key).size != len(data):
                raise TranslogError(f"{key}: a different node translog blob already exists") from None

    def release(self, handle: NodeShardTranslog, released: list[tuple[int, EntryKey]]) -> list[str]:
        """Drop ``handle``'s (round, section) references; the keys of rounds no shard retains any more."""
        keys: list[str] = []
        with self._cond:
            for round_no, section in released:
                refs = self._refs.get(round_no)
                if refs is None:
                    continue
                refs.discard((id(handle), section))
                if not refs:
                    del self._refs[round_no]
                    keys += [data_key(self.prefix, round_no), index_key(self.prefix, round_no)]
        forget_cached(self.store, keys)
        return keys

    @property
    def retained_rounds(self) -> int:
        """Rounds some shard still retains a section of."""
        with self._cond:
            return len(self._refs)

    def close(self) -> None:
        """Stop the uploader (waiting appends get TranslogUnavailable)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        self._syncer.shutdown(wait=False)


def _sync_local(handles: list[NodeShardTranslog]) -> None:
    """Make the rolls a round just sealed durable: one filesystem sync per device their logs live on
    (their rolls wrote without fsyncs, ``remote`` durability); a failure fails the round as a local
    disk fault (LocalDiskError: the copies are failed, nothing is acknowledged)."""
    devices: dict[int, list[str]] = {}
    for h in handles:
        devices.setdefault(h.device, []).append(h.local.directory)
    for directories in devices.values():
        try:
            fileio.sync_filesystem(directories[0], files=[os.path.join(d, CHECKPOINT) for d in directories])
        except OSError as exc:
            raise LocalDiskError(str(exc.filename or directories[0]), "fsync", exc) from exc


class NodeShardTranslog:
    """One primary copy's remote translog inside a :class:`NodeTranslog` (the interface of RemoteTranslog)."""

    def __init__(self, node: NodeTranslog, local: LocalTranslog, prefix: str, index_uuid: str, shard: int, *,
                 upload_timeout: float = 30.0, covered_through: int | None = None,
                 keep_metadata: int = KEEP_METADATA) -> None:
        self.node = node
        self.local = local
        self.store = node.store
        self.prefix = prefix.rstrip("/")
        self.index_uuid = index_uuid
        self.shard = shard
        self.upload_timeout = upload_timeout
        self.keep_metadata = keep_metadata
        self.writer = uuid.uuid4().hex
        self.device = os.stat(local.directory).st_dev  # the round syncs each filesystem once
        self._upload_lock = threading.Lock()  # sealing, metadata writes and purges of this shard, one at a time
        self._cond = threading.Condition()
        self._closed = False
        self._last_error: BaseException | None = None
        self.uploads = 0
        self._entries: dict[EntryKey, RemoteGeneration] = {}
        self._rounds: dict[EntryKey, int] = {}  # section -> round of this node holding it
        self._unconfirmed: set[EntryKey] = set()  # landed, the fence listing after them not passed yet
        #: (round, local position it uploads through) of a round in flight
        self._sealing: tuple[int, tuple[int, int]] | None = None
        #: local positions (generation, offset): everything logged before them landed / passed the fence
        self._landed = (min(g.generation for g in local.generations()), 0)
        if covered_through is not None:
            self._landed = max(self._landed, (covered_through + 1, 0))
        self._uploaded = self._landed
        self._metadata: RemoteTranslogMetadata | None = None
        self._metadata_generation = -1  # the last metadata key's generation (keys must keep sorting newest first)
        self._metadata_keys: set[str] = set()
        self._listed_metadata = False
        self._trim: tuple[int, int] | None = None
        self._recover()
        with self._upload_lock:
            self._write_metadata()  # names this node's stream before any round can hold this shard

    # -- state ----------------------------------------------------------------------------------

    def _recover(self) -> None:
        """Adopt this translog's newest metadata (a restart), its sections in earlier streams included."""
        found = latest_metadata(self.store, self.prefix)
        if found is None:
            return
        key, md = found
        term, gen, _ = parse_metadata_key(key)
        self._metadata_generation = gen
        if md.translog_uuid != self.local.translog_uuid:
            if (term, gen) >= (self.local.primary_term, self.local.generation - 1):
                raise TranslogError(
                    f"{self.prefix}: holds metadata {key} of translog {md.translog_uuid} at term {term} generation "
                    f"{gen}; translog {self.local.translog_uuid} (term {self.local.primary_term}, generation "
                    f"{self.local.generation}) would not sort ahead of it")
            return
        entries = {entry_key(e): e for e in md.entries}
        earlier = [(s[0], s[1]) for s in md.streams]
        for e in shard_entries(self.store, earlier, self.index_uuid, self.shard):
            entries.setdefault(entry_key(e), e)  # sections of an earlier process: kept, never released by us
        self._entries = entries
        self._trim = md.trim
        self._metadata = md
        # Landed from the start of the newest generation the entries name (never the metadata's own generation,
        # which numbers its keys and may run ahead of this log's: new appends would count uploaded).  That
        # generation may be this log's current one, uploaded in pieces up to an offset no entry records: it
        # is uploaded again from its start (a duplicate section reads as the same operations), never skipped.
        if entries:
            top = min(max(k[0] for k in entries), self.local.generation)
            self._landed = self._uploaded = max(self._uploaded, (top, 0))

    @property
    def uploaded_generations(self) -> list[RemoteGeneration]:
        """The retained uploaded generations."""
        with self._cond:
            return [self._entries[k] for k in sorted(self._entries) if k not in self._unconfirmed]

    @property
    def uploaded_through(self) -> int:
        """Every local generation <= this has landed remotely and passed the round's fence listing."""
        return self._uploaded[0] - 1

    @property
    def min_unuploaded_generation(self) -> int:
        """For LocalTranslog.purge(min_unuploaded_generation=...)."""
        return self._uploaded[0]

    @property
    def metadata(self) -> RemoteTranslogMetadata | None:
        """The last per-shard metadata written or adopted."""
        return self._metadata

    # -- the round's side -----------------------------------------------------------------------

    def _seal(self, round_no: int) -> list[Piece]:
        """What this shard's part of a round uploads: the pieces logged since the last landed round
        (``remote`` durability), else its local generation rolled and the sealed ones read back."""
        with self._upload_lock:
            if self._closed:
                return []
            if self.local.current_offset >= NODE_ROLL_BYTES:
                self.local.roll_generation()  # keeps the local files (and what a purge may drop) small
            found = self.local.pieces(*self._landed)
            if found is not None:
                pieces, through = found
                out = pieces
            else:
                if self.local.current_num_ops > 0:
                    self.local.roll_generation()
                through = (self.local.generation, 0)
                out = [read_sealed(self.local.directory, cp) for cp in self.local.sealed_after(self._landed[0] - 1)
                       if cp.num_ops and (cp.generation, cp.offset) > self._landed]
            self._sealing = (round_no, through)
            return out

    def _landed_round(self, round_no: int, sections: list[Section]) -> None:
        """The round's blobs landed: its sections are retained (not acknowledged before :meth:`_confirm`)."""
        with self._upload_lock:
            key = data_key(self.node.prefix, round_no)
            with self._cond:
                for s in sections:
                    k = section_key(s.generation, key, s.offset)
                    self._entries[k] = s.entry(key)
                    self._rounds[k] = round_no
                    self._unconfirmed.add(k)
                if self._sealing is not None and self._sealing[0] == round_no:
                    self._landed = max(self._landed, self._sealing[1])
                    self._sealing = None
            self.local.release_images(self._landed)

    def _confirm(self) -> None:
        """The round passed the fence listing: what landed counts as uploaded."""
        with self._cond:
            if self._landed > self._uploaded:
                self._uploaded = self._landed
                self.uploads += 1
            self._unconfirmed.clear()
            self._last_error = None
            self._cond.notify_all()

    def _failed(self, exc: BaseException) -> None:
        with self._upload_lock, self._cond:
            self._sealing = None
            self._last_error = exc
            self._cond.notify_all()

    # -- appending ------------------------------------------------------------------------------

    def add(self, batch: pa.RecordBatch, *, history: bool = False) -> tuple[int, int]:
        """Append locally, then return once a round covering the batch landed and passed the fence listing."""
        position = self.append(batch, history=history)
        if batch.num_rows:
            self.wait_uploaded(position)
        return position

    def append(self, batch: pa.RecordBatch, *, history: bool = False, summary: Summary | None = None,
               frame: tuple[bytes, list[FramePart]] | None = None) -> tuple[int, int]:
        """Append locally and ask for a round covering it; its position (wait with :meth:`wait_uploaded`);
        ``summary``, ``frame``: as ``LocalTranslog.add``."""
        position = self.local.add(batch, history=history, summary=summary, frame=frame)
        if batch.num_rows:
            self.node._request(self)
        return position

    def wait_uploaded(self, position: tuple[int, int] | int, timeout: float | None = None) -> None:
        """Block until everything logged before local ``position`` (an append's (generation, offset); a bare
        generation: what it holds now) is uploaded; TranslogUnavailable after the timeout."""
        if isinstance(position, int):
            current = self.local.generation
            position = (current, self.local.current_offset) if position >= current else (position + 1, 0)
        generation = position[0]
        deadline = time.monotonic() + (self.upload_timeout if timeout is None else timeout)
        with self._cond:
            if self._closed:
                raise TranslogError(f"{self.prefix}: the remote translog is closed")
            if self._uploaded >= position:
                return
        self.node._request(self)
        with self._cond:
            while self._uploaded < position:
                if isinstance(self._last_error, LocalDiskError):
                    raise self._last_error  # the local log failed for good: no round will ever cover it
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    err = self._last_error
                    raise TranslogUnavailable(
                        f"{self.store.location}/{self.node.prefix}: generation {generation} of {self.prefix} not "
                        f"uploaded within {self.upload_timeout}s; last error: {err!r}; the operations are NOT "
                        f"acknowledged") from err
                self._cond.wait(left)

    def _sync_all(self) -> None:
        """Wait until everything logged locally is uploaded (no round when nothing is left to upload)."""
        target = (self.local.generation, self.local.current_offset)
        if self._uploaded >= target:
            return
        if self.local.current_num_ops > 0 or any(
                cp.num_ops and (cp.generation, cp.offset) > self._uploaded
                for cp in self.local.sealed_after(self._uploaded[0] - 1)):
            self.wait_uploaded(target)

    def upload(self) -> RemoteTranslogMetadata:
        """Upload everything logged locally, then write this shard's metadata."""
        self._sync_all()
        with self._upload_lock:
            return self._write_metadata()

    def trim_operations_above(self, seq_no: int, term: int) -> RemoteTranslogMetadata:
        """Trim locally, upload what is logged, then write a metadata blob recording the trim."""
        self.local.trim_operations_above(seq_no, term)
        self._sync_all()
        with self._upload_lock:
            with self._cond:
                self._trim = newest_trim(self._trim, seq_no, term)
                self._entries = {g: apply_trims(e, [(seq_no, term)]) for g, e in self._entries.items()}
            return self._write_metadata()

    # -- per-shard metadata and purge -----------------------------------------------------------

    def _write_metadata(self) -> RemoteTranslogMetadata:
        """PUT this shard's metadata: retained sections plus the stream rounds that may hold more (upload lock held)."""
        first = self._sealing[0] if self._sealing is not None else self.node.next_round
        with self._cond:
            entries = dict(self._entries)
        cp = read_checkpoint(self.local.directory)
        live = [e for e in entries.values() if e.num_ops > 0]
        generation = max(self._metadata_generation + 1, self._uploaded[0] - 1)
        md = RemoteTranslogMetadata(
            primary_term=self.local.primary_term,
            generation=generation,
            translog_uuid=self.local.translog_uuid,
            min_seq_no=min((e.min_seq_no for e in live), default=NO_OPS),
            max_seq_no=max((e.max_seq_no for e in live), default=NO_OPS),
            global_checkpoint=cp.global_checkpoint,
            min_translog_generation=min((k[0] for k in entries), default=self._uploaded[0]),
            entries=tuple(entries[k] for k in sorted(entries)),
            trim=self._trim,
            streams=((self.node.prefix, first, self.index_uuid, self.shard),),
        )
        key = f"{self.prefix}/{metadata_key(md.primary_term, generation, self.writer)}"
        self.store.put(key, md.encode(), if_absent=True, token=self.writer)
        with self._cond:
            self._metadata_generation = generation
            self._metadata_keys.add(key)
            self._metadata = md
        return md

    def purge(self, remote_commit_local_checkpoint: int, remote_commit_primary_term: int) -> set[int]:
        """Drop uploaded generations a durably uploaded remote commit covers: one metadata PUT, then one DELETE of
        the rounds no shard retains any more and of metadata beyond the newest ``keep_metadata``."""
        with self._upload_lock:
            doomed_entries = remote_deletable_sections(
                self.uploaded_generations, remote_commit_local_checkpoint=remote_commit_local_checkpoint,
                remote_commit_primary_term=remote_commit_primary_term)
            doomed = {e.generation for e in doomed_entries}
            released = []
            with self._cond:
                for e in doomed_entries:
                    k = entry_key(e)
                    self._entries.pop(k, None)
                    if k in self._rounds:
                        released.append((self._rounds.pop(k), k))
            if not doomed_entries and self._metadata is not None and self._metadata.streams \
                    and self._metadata.entries == tuple(self._entries[k] for k in sorted(self._entries)):
                return doomed  # nothing changed since the last metadata: no request
            self._write_metadata()
        keys = self.node.release(self, released) + self._old_metadata_keys()
        if keys:
            self.store.delete(keys)
            with self._cond:
                self._metadata_keys.difference_update(keys)
        return doomed

    def _old_metadata_keys(self) -> list[str]:
        if not self._listed_metadata:
            listed = [b.key for b in self.store.list(f"{self.prefix}/{METADATA_DIR}")]
            with self._cond:
                self._metadata_keys.update(listed)
                self._listed_metadata = True
        with self._cond:
            known = sorted(self._metadata_keys)  # newest first
        return known[self.keep_metadata:]

    def purge_older_term(self, prefix: str, remote_commit_local_checkpoint: int,
                         remote_commit_primary_term: int) -> list[str]:
        """Delete an older term's per-shard remote translog once a remote commit covers all of it (see remote.py)."""
        own = {e.blob_key for e in self.uploaded_generations}
        return purge_older_prefix(self.store, prefix, own_prefix=self.prefix, own_keys=own,
                                  term=self.local.primary_term, checkpoint=remote_commit_local_checkpoint,
                                  commit_term=remote_commit_primary_term)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the node's rounds (waiting appends get TranslogUnavailable); the local log stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.node._forget(self)

    def __enter__(self) -> NodeShardTranslog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["NodeShardTranslog", "NodeTranslog"]
