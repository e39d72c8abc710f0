"""One copy of a shard on one node: translog + shard directory + checkpoints, primary or replica.

Write path of a primary (:meth:`ShardCopy.primary_apply`), seeds 004 and 003:

1. the bulk's seq# range is handed out at once (``tracker.generate_seq_nos``);
2. the batch is stamped and applied to the directory first: the mapping parse can
   reject it (``MappingConflict``), and then nothing was written anywhere;
3. it is appended to the translog; with a remote store and ``request`` durability the
   append returns only once the remote translog upload covering it landed;
4. the seq#s are marked processed; the caller replicates the stamped batch and
   acknowledges only after every in-sync copy answered (``replica_apply``).

A replica refuses a batch whose term is below the term it knows (``OperationTermTooOld``).

:meth:`ShardCopy.flush` commits the directory (``segments_N`` with the local checkpoint
and the translog position), uploads the new files and the remote commit, then purges
local translog generations the commit covers and remote ones the *remote* commit
covers (``translog.purge``'s pure rules).  Promotion (:meth:`promote`) rolls the
translog to the new term, fills seq# gaps with no-ops, trims older-term ops above its
max seq#, and claims the term in the blob store, which fences the old primary's next
commit.  :meth:`recover_from_remote` rebuilds a copy from the blob store alone: newest
valid remote commit of the newest term, then the remote translog above its checkpoint.
See docs/design/engine.md.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.core.arrays import one_array
from shardstore.core.ops import index_fields
from shardstore.core.path_strategy import PathStrategy, PlainPathStrategy
from shardstore.engine.errors import (
    OperationTermTooOld,
    RestoreDataLoss,
    ResyncRefused,
    StalePrimary,
)
from shardstore.engine.node.remote import NodeRemote
from shardstore.engine.shard.adopted_ops import AdoptedFile, AdoptedRun, adopted_batch, has_adopted, split_runs
from shardstore.engine.shard.adoption_apply import (
    adopt_fetched,
    adopt_run,
    fetch_adopted,
    remove_leftovers,
    stage_bytes,
)
from shardstore.engine.shard.doc_versions import with_versions
from shardstore.engine.shard.flush_policy import FALLBACK_COMMITS, FlushMark, flush_needed, remote_purge_gate
from shardstore.engine.shard.local_disk import local_disk
from shardstore.engine.shard.request_ledger import RequestLedger
from shardstore.engine.shard.restore_check import ShardLoss
from shardstore.engine.shard.seq_ranges import gaps, split_by_term
from shardstore.engine.shard.staged_write import Refreshing, Staged
from shardstore.engine.shard.store_recovery import read_from_store
from shardstore.engine.shard.write_once import WriteOnce, Written, min_rows_setting
from shardstore.errors import LocalDiskError, TooManyOpenFiles, is_too_many_open_files
from shardstore.segments import merge_scheduler, row_cache
from shardstore.segments.directory import INDEX_BUFFER_BYTES, Prepared, RefreshResult, Sealed, ShardDirectory
from shardstore.segments.errors import CommitConflict, SegmentCorrupted, UploadCancelled
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.mapping import Mapping
from shardstore.segments.merging import MergeCancelled
from shardstore.segments.remote_store import (
    RemoteSegmentStore,
    latest_term,
    list_commit_keys,
    list_terms,
)
from shardstore.segments.stamp import Stamp
from shardstore.segments.versions import SMALL_BATCH
from shardstore.translog.factory import NodeTranslogs, PerShardTranslogs, ShardRemoteTranslog, TranslogFactory
from shardstore.translog.local import LocalTranslog
from shardstore.translog.operations import SCHEMA, OpType, Summary, stamp, unstamped_batch
from shardstore.translog.parquet_frames import PARQUET_MAGIC, parquet_payload_parts
from shardstore.translog.tracker import NO_OPS_PERFORMED, LocalCheckpointTracker
from shardstore.translog.unconfirmed import not_uploaded, uploaded_tops

log = logging.getLogger(__name__)
#: Optimistic concurrency on one id: (id, if_seq_no, if_primary_term).
Expectation = tuple[str, int | None, int | None]
#: Remote segment GC runs after this many uploaded commits (it reads every commit's metadata).
GC_EVERY_FLUSHES = 5
#: The term of a new index's first primary: no term below it ever held a primary (next_free_term starts above 0).
FIRST_TERM = 1
KEEP_REMOTE_COMMITS = 10
#: After a failover, older terms' remote commits are collected once the new term has this many.
OWN_COMMITS_BEFORE_DROPPING_OLDER = 2


@dataclass(frozen=True)
class ShardSpec:
    """What identifies a shard and how it is stored."""

    cluster_uuid: str
    index_uuid: str
    shard: int
    durability: str = "request"
    mapping: dict = field(default_factory=dict)
    strategy: PathStrategy = field(default_factory=PlainPathStrategy)
    buffer_interval: float = 0.0  # group commit: no linger (translog/remote.py)
    upload_timeout: float = 30.0
    #: after a promotion, the re-upload of the shard under the new term starts this much later
    reupload_delay: float = 0.0
    #: the indexing buffer: a bulk that fills it refreshes while its upload is in flight (_log_remote)
    index_buffer_bytes: int = INDEX_BUFFER_BYTES

    @property
    def address(self) -> ShardAddress:
        """Where the shard's blobs live."""
        return ShardAddress(self.cluster_uuid, self.index_uuid, self.shard, self.strategy)


class ShardCopy:
    """One copy (primary or replica) of one shard on one node's disk."""

    def __init__(self, spec: ShardSpec, data_dir: str, store: BlobStore | None, *, primary_term: int,
                 primary: bool, node_remote: NodeRemote | None = None) -> None:
        """``node_remote``: the node's shared translog uploads and claim watch (issue 30); without one, the
        copy uploads its own per-shard remote translog and LISTs its term markers per write."""
        write_once_rows = min_rows_setting()  # a bad setting refuses the copy before it opens anything
        self.spec = spec
        self.store = store
        self.node_remote = node_remote
        #: the remote translog this copy writes as a primary, chosen here once (translog/factory.py)
        self.translogs: TranslogFactory | None = (
            None if store is None else NodeTranslogs(node_remote) if node_remote is not None
            else PerShardTranslogs(store))
        #: the claim-log epoch up to which this primary knows it is not fenced (segments/claim_rule.py)
        self._verified_epoch: int | None = None
        self.path = os.path.join(data_dir, spec.index_uuid, str(spec.shard))
        self.primary = primary
        self.primary_term = primary_term
        self._lock = threading.RLock()
        directory: ShardDirectory | None = None
        try:
            directory = ShardDirectory(os.path.join(self.path, "index"), mapping=spec.mapping,
                                       index_buffer_bytes=spec.index_buffer_bytes, warm=primary)
            self.translog = LocalTranslog(os.path.join(self.path, "translog"), primary_term=primary_term,
                                          durability="request" if spec.durability == "request" else "async")
        except OSError as exc:
            if directory is not None:
                directory.close()  # its lock file is released: a retry can open the copy
            if is_too_many_open_files(exc):  # the process's limit, not a disk fault
                raise TooManyOpenFiles(f"{self.path}: opening the shard copy", exc) from exc
            raise
        self.directory = directory
        remove_leftovers(self.path)  # adopted files a killed process had downloaded (adoption_apply.py)
        commit = self.directory.last_commit
        start = commit.local_checkpoint if commit else NO_OPS_PERFORMED
        self.tracker = LocalCheckpointTracker(max_seq_no=start, local_checkpoint=start)
        try:  # an adopted run's file is fetched from the store here: a failure must not keep the copy's locks
            self._replay_local_translog(start)
        except BaseException:
            for closing in (self.translog.close, self.directory.close):
                with contextlib.suppress(Exception):
                    closing()
            raise
        self.global_checkpoint = NO_OPS_PERFORMED
        self._flushes_since_gc = 0
        self._older_terms_pending = False
        #: local checkpoints of the last FALLBACK_COMMITS commits this copy uploaded in its term (the purge gate)
        self._remote_checkpoints: list[int] = []
        self.requests = RequestLedger()  # request id -> a write's first attempt here: a retry gets its outcome
        self._flushed: FlushMark | None = None  # the state the last successful flush left (flush_policy.py)
        #: what a restore from the store could not bring back (recover_from_remote), or None
        self.restore_loss: ShardLoss | None = None
        self._upload_lock = threading.Lock()  # one remote segment upload at a time (flush or background)
        self._ahead: threading.Thread | None = None  # segments uploaded ahead of the commit (_upload_ahead)
        self._ahead_lock = threading.Lock()  # the names queued for it and whether a thread takes them
        self._ahead_names: set[str] = set()
        self._ahead_running = False
        self._closing = threading.Event()
        #: big parts of new documents encoded once (engine/shard/write_once.py)
        self._write_once = WriteOnce(write_once_rows)
        self._background: threading.Thread | None = None
        self._holds: dict[int, int] = {}  # peer recoveries: token -> first seq# they still need from the translog
        self._holds_lock = threading.Lock()
        #: the local write or fsync that failed this copy for good (docs/design/engine.md, "Local disk faults")
        self.disk_failure: LocalDiskError | None = None
        #: told when a thread no request waits on (a merge, a refresh beside the writes) fails this copy: the node
        #: reports it at once, so the copy leaves the routing before a request meets it (chaos seed 11494)
        self.on_background_failure: Callable[[LocalDiskError], None] | None = None
        self.remote_translog: ShardRemoteTranslog | None = None
        self.remote_segments: RemoteSegmentStore | None = None
        if primary:
            self._start_remote()

    # -- set-up -----------------------------------------------------------------------------

    def _local_disk(self, op: str) -> contextlib.AbstractContextManager[None]:
        """Fail this copy for good on a local write or fsync error (engine/shard/local_disk.py)."""
        return local_disk(self, op)

    def _replay_local_translog(self, above: int) -> None:
        """Re-apply operations the local translog holds above the last commit (restart)."""
        for batch in self.translog.read_operations(above + 1):
            self._apply_stamped(batch, log_it=False)

    def replay(self, batches: Iterable[pa.RecordBatch]) -> int:
        """Apply and log resolved operations from another copy or the store (recovery); returns how many.

        Resolved batches are in seq# order; one batch may span a term change, and it is cut
        at each change so the local translog rolls term by term.  Terms may also go *down*
        along seq#s: a promoted copy fills a gap below an older-term op with a no-op of its
        new term (a write that failed before it was replicated, issue 14 case 2), so the
        operations are logged as history (``history=True``: older terms accepted).
        """
        n = 0
        for batch in batches:
            for part in split_by_term(batch):
                with self._local_disk("write"):
                    self.tracker.advance_max_seq_no(pc.max(part.column("seq_no")).as_py())
                    self._apply_stamped(part, history=True)
                n += part.num_rows
        return n

    def _start_remote(self) -> None:
        if self.store is None:
            return
        addr = self.spec.address
        self.remote_segments = RemoteSegmentStore(self.store, addr, self.primary_term)
        # checked (and collected) at the first flush; a term-1 primary has no older term (terms start at 1)
        self._older_terms_pending = self.primary_term > FIRST_TERM
        self.remote_segments.claim_term()  # fences every older-term primary's next commit
        self._verified_epoch = self.remote_segments.claim_epoch
        if self.spec.durability == "request" and self.translogs is not None:
            # Every operation this copy logged at or below the global checkpoint is durable under an
            # older term's prefix (a primary counts its own operation processed only once uploaded), and
            # replayed history came from the store; a promotion uploads the few above it again
            # (_upload_unconfirmed).  Failover time must not grow with the retained log (issue 14,
            # case 7), so only the generation just rolled for this term and later ones are uploaded
            # here; older terms' logs are purged only once this term's commit covers them
            # (_purge_older_terms).
            self.remote_translog = self.translogs.open(
                self.translog, addr.cluster_uuid, addr.translog_prefix(self.primary_term), self.spec.index_uuid,
                self.spec.shard, upload_timeout=self.spec.upload_timeout, buffer_interval=self.spec.buffer_interval,
                covered_through=self.translog.generation - 1)
            if self.translogs.rolls_before_acknowledging:
                # every round rolls (and so fsyncs, sealed) what it uploads before anything is acknowledged:
                # an append's own fsync would only be paid twice
                self.translog.set_durability("remote")

    # -- writes -----------------------------------------------------------------------------

    @property
    def local_checkpoint(self) -> int:
        """Every op <= it was applied on this copy."""
        return self.tracker.processed_checkpoint

    @property
    def max_seq_no(self) -> int:
        """The highest seq# this copy generated or saw."""
        return self.tracker.max_seq_no

    def primary_apply(self, ops: pa.RecordBatch, *, expect: Expectation | None = None,
                      mapping: Mapping | None = None, fields: pa.Table | None = None,
                      replicate: Callable[[pa.RecordBatch], object] | None = None) -> pa.RecordBatch:
        """Stamp an unstamped bulk with a contiguous seq# range and per-id versions, apply it and make it
        durable; returns it stamped.

        ``replicate(stamped)`` (the primary's replication to its group) runs once the batch is
        applied and logged locally, while its upload is in flight and with no lock of this copy
        held; the call returns only once both settled, and raises the replication's error first.
        It is :meth:`primary_stage`, ``replicate``, then :meth:`settle`.

        ``expect`` (optimistic concurrency: id, if_seq_no, if_primary_term) is checked
        against the id's current copy under the write lock, so two writers racing on the
        same seq# cannot both pass; a mismatch raises VersionConflict and applies nothing.
        ``mapping``: the index mapping the coordinator checked the batch against (every copy
        takes it in first, so no copy decides a field's type on its own); ``fields``: the
        coordinator's parse of the index ops against it, used instead of parsing again when
        this copy's mapping is exactly ``mapping``.
        """
        stamped, pending = self.primary_stage(ops, expect=expect, mapping=mapping, fields=fields)
        if replicate is not None:
            self.replicate_staged(stamped, pending, replicate)
        self.settle(pending)
        return stamped

    def primary_stage(self, ops: pa.RecordBatch, *, expect: Expectation | None = None,
                      mapping: Mapping | None = None, fields: pa.Table | None = None
                      ) -> tuple[pa.RecordBatch, Staged]:
        """Stamp, apply and log a bulk locally and start its upload, without waiting for it; (stamped, pending).

        Nothing is acknowledged before :meth:`settle` of ``pending`` returned.  A node staging the
        bulks of many shards before it settles any of them puts them all in one upload round
        (issue 30; ``NodeTranslog.staging``).
        """
        with self._lock, self._local_disk("write"), row_cache.warmer.foreground():
            if not self.primary:
                raise StalePrimary(f"{self.path}: not a primary (term {self.primary_term}); nothing was applied")
            if mapping is not None:
                self.directory.merge_mapping(mapping)
            if fields is None and mapping is not None:  # the coordinator's parse, carried as the ops' fields column
                fields = index_fields(ops)
            if fields is not None and mapping is not None and self.directory.mapping == mapping \
                    and fields.num_rows == ops.num_rows:
                prepared = Prepared(ops.num_rows, fields, mapping, all_index=True)  # every op is an index op
            else:
                prepared = self.directory.prepare(ops)  # a rejected batch consumes no seq#
            # a big part of new documents may be written once: its encoding runs beside the version lookup
            once = (self._write_once.start(ops, all_index=prepared.all_index, expect=expect)
                    if self.remote_translog is not None else None)
            # fingerprinted and sorted once for the versions and the refresh, when big enough for either to use it
            # (a small part of a many-shard bulk is checked for repeats with a set, and its refresh sorts many parts)
            ops, new_ids, id_keys, order = with_versions(self.directory, ops, expect, ops.num_rows > SMALL_BATCH,
                                                         all_index=prepared.all_index)
            # decided before any seq# is taken: nothing between taking them and logging them may raise
            written = self._write_once.finish(once, ops.column("id"), new_ids, id_keys)
            first = self.tracker.generate_seq_nos(ops.num_rows)
            stamped = stamp(ops, first, self.primary_term)
            seq_nos = (first, first + stamped.num_rows - 1)
            if written is not None:
                staged = self._stage_written(stamped, written, seq_nos, prepared, new_ids)
                if staged is not None:
                    return stamped, staged
            return stamped, self._stage_stamped(stamped, prepared, order, seq_nos, new_ids, id_keys)

    def adopt(self, file: AdoptedFile, *, mapping: Mapping | None = None) -> tuple[pa.RecordBatch, Staged]:
        """Adopt the staged Parquet ``file`` as a segment (a primary): take its rows' seq#s, log one adopted
        operation per row and start the upload, without waiting for it; (the stamped run, pending).

        As :meth:`primary_stage` for a bulk: nothing is acknowledged before :meth:`settle`, and the caller
        replicates the run (replicas adopt the same file: :meth:`replica_apply`).  The file is fetched and checked
        before the lock is taken; a file the directory refuses (a field not in ``mapping``) takes no seq#.
        docs/design/adoption.md, "Step 2" and "Step 3".
        """
        if file.rows < 1:
            raise ValueError(f"adopted file {file.key}: no rows to adopt")
        path = fetch_adopted(self.store, file, self.path, None)  # no seq# is taken yet: the error names none
        try:
            with self._lock, self._local_disk("write"), row_cache.warmer.foreground():
                if not self.primary:
                    raise StalePrimary(f"{self.path}: not a primary (term {self.primary_term}); nothing was applied")
                if mapping is not None:
                    self.directory.merge_mapping(mapping)
                first = self.max_seq_no + 1  # taken once the directory adopted it: a refusal consumes no seq#
                adopted = adopt_fetched(self.directory, path, Stamp(first, self.primary_term))
                if self.tracker.generate_seq_nos(adopted.rows) != first:  # the lock is held: none taken meanwhile
                    raise AssertionError(f"{self.path}: seq#s taken while adopting {file.key}")
                stamped = adopted_batch(file, first, self.primary_term, adopted.ids, adopted.versions)
                seq_nos = (first, first + adopted.rows - 1)
                if self.remote_translog is None:  # nothing to wait for: logged and counted now
                    self.translog.add(stamped)
                    self.tracker.mark_processed_range(*seq_nos)
                    return stamped, Staged(seq_nos, None, (0, 0))
                return stamped, self._log_staged(stamped, seq_nos)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        """Hold this copy while engine/shard/staging.py's columnar pass stages its part; StalePrimary if not a primary."""
        with self._lock, row_cache.warmer.foreground():
            if not self.primary:
                raise StalePrimary(f"{self.path}: not a primary (term {self.primary_term}); nothing was applied")
            yield

    def stage_run(self, stamped: pa.RecordBatch, summary: Summary, docs: pa.Table, ids: list[str],
                  versions: list[int], nbytes: int) -> Staged:
        """Buffer and log a part the columnar pass stamped (under :meth:`staging`) and start its upload."""
        assert summary.seq_no is not None and self.remote_translog is not None
        with self._local_disk("write"):
            self.directory.apply_run(docs, ids, summary.seq_no[0], self.primary_term, versions, nbytes)
            return Staged(summary.seq_no, self.remote_translog, self.remote_translog.append(stamped, summary=summary))

    def replicate_staged(self, stamped: pa.RecordBatch, pending: Staged,
                         replicate: Callable[[pa.RecordBatch], object]) -> None:
        """Run ``replicate(stamped)`` while the staged upload is in flight, holding no lock of this copy
        (docs/design/engine.md, "Replication overlaps the upload"); on its failure the upload is still
        settled (logged) and the replication's error raised."""
        try:
            replicate(stamped)
        except BaseException:
            try:
                self.settle(pending)
            except Exception as exc:  # noqa: BLE001 - the replication error is the one raised; this one is logged
                log.warning("%s: the upload of a batch whose replication failed failed too: %r", self.path, exc)
            raise

    def _stage_stamped(self, stamped: pa.RecordBatch, prepared: Prepared | None,
                       order: pa.Array | None, seq_nos: tuple[int, int], new_ids: np.ndarray | None = None,
                       id_keys: SortedKeys | None = None) -> Staged:
        """Apply and log ``stamped`` locally and start its upload, without waiting for it (under the lock);
        ``new_ids``: per op, whether the version lookup found its id new to the shard (kept for the refresh);
        ``id_keys``: its ids' sorted fingerprints from that lookup (kept as the buffered run's index)."""
        if stamped.num_rows == 0 or self.remote_translog is None:  # nothing to wait for: the usual apply
            self._apply_stamped(stamped, prepared=prepared, order=order)
            return Staged(seq_nos, None, (0, 0))
        self.directory.apply(stamped, prepared, id_order=order, new_ids=new_ids, id_keys=id_keys)
        return self._log_staged(stamped, seq_nos)

    def _stage_written(self, stamped: pa.RecordBatch, written: Written, seq_nos: tuple[int, int],
                       prepared: Prepared, new_ids: np.ndarray) -> Staged | None:
        """Place each piece of a part written once as a segment, upload it ahead and log its file as the piece's
        frame, without waiting for the upload (under the lock; engine/shard/write_once.py).  None when the directory
        refuses the first piece (nothing placed: the row path takes the part at the same seq#s); a later piece it
        refuses goes down the row path with the rest of the part, at their own seq#s.  A local disk error is raised
        (the copy fails: nothing is acknowledged)."""
        remote = self.remote_translog
        assert remote is not None
        n, first = stamped.num_rows, seq_nos[0]
        ids = one_array(stamped.column("id"))
        at = np.arange(n, dtype=np.int64)
        position = None
        for i, (lo, hi) in enumerate(zip(written.cuts, written.cuts[1:])):
            keys = written.keys if (lo, hi) == (0, n) else written.keys.renumbered(at, lo, hi)
            path = stage_bytes(written.files[i], self.path)
            try:
                adopted = self.directory.adopt(path, Stamp(first + lo, self.primary_term), link=True,
                                               new=(ids.slice(lo, hi - lo), keys))
            except OSError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. a field the mapping types otherwise: the row path logs it
                log.warning("%s: rows %d-%d of a part written once were not placed (%s: %s); they take the row path",
                            self.path, lo, n - 1, type(exc).__name__, exc)
                if i == 0:
                    return None
                rest = Prepared(n - lo, None if prepared.fields is None else prepared.fields.slice(lo),
                                prepared.mapping, prepared.all_index)
                return self._stage_stamped(stamped.slice(lo), rest, None, seq_nos, new_ids[lo:],
                                           written.keys.renumbered(at, lo, n))
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self._upload_ahead((adopted.segment,))
            frame = (PARQUET_MAGIC, parquet_payload_parts(self.primary_term, written.files[i]))
            position = remote.append(stamped.slice(lo, hi - lo), frame=frame)
        assert position is not None  # at least one piece
        return Staged(seq_nos, remote, position)

    def _log_staged(self, stamped: pa.RecordBatch, seq_nos: tuple[int, int]) -> Staged:
        """Append what the directory just took to the remote translog (under the lock); a full buffer is sealed and
        written beside the writes first."""
        remote = self.remote_translog
        assert remote is not None
        if self.directory.ready_to_seal:  # its segments are written beside the writes; nothing waits for them
            sealed = self.directory.seal()  # waits for the one before, if it is still being written
            if sealed is not None:
                Refreshing(self.directory, sealed, self.spec.shard, self._refreshed_beside, self._seal_following)
        return Staged(seq_nos, remote, remote.append(stamped))

    def settle(self, staged: Staged) -> None:
        """Wait for a staged batch's upload, check the fence, then count it processed (its seq#s may
        advance the local checkpoint, and so the global one, only once the store holds them)."""
        if staged.remote is None:
            return
        with self._local_disk("write"):
            self._await_upload(staged.remote, staged.position)
            self._check_not_fenced()
        self.tracker.mark_processed_range(*staged.seq_nos)

    def replica_apply(self, stamped: pa.RecordBatch, term: int, global_checkpoint: int,
                      mapping: Mapping | None = None) -> int:
        """Apply a batch the primary stamped (taking in the index ``mapping`` first); returns the local checkpoint."""
        with self._lock, self._local_disk("write"), row_cache.warmer.foreground():
            if mapping is not None:
                self.directory.merge_mapping(mapping)
            if term < self.primary_term:
                raise OperationTermTooOld(
                    f"{self.path}: operations of term {term} refused, this copy knows term {self.primary_term}; "
                    f"not applied")
            if term > self.primary_term:
                self.primary_term = term
            self._apply_stamped(stamped)  # under the lock: a promotion never interleaves with an apply
            self.update_global_checkpoint(global_checkpoint)
            return self.local_checkpoint

    def _apply_stamped(self, stamped: pa.RecordBatch, *, log_it: bool = True, prepared=None,
                       history: bool = False, order: pa.Array | None = None) -> None:
        if stamped.num_rows == 0:
            return
        if prepared is None and has_adopted(stamped):  # adopted runs among the operations: each adopts its file
            for piece in split_runs(stamped, self.path):
                if isinstance(piece, AdoptedRun):
                    adopt_run(self.directory, piece, self.store, self.path)
                    self._log_applied(piece.ops, log_it, history)
                else:
                    self._apply_stamped(piece, log_it=log_it, history=history)
            return
        # mapping conflicts refuse the batch before anything is logged
        self.directory.apply(stamped, prepared, id_order=order)
        self._log_applied(stamped, log_it, history)

    def _log_applied(self, stamped: pa.RecordBatch, log_it: bool, history: bool) -> None:
        """Log operations the directory just applied (unless ``log_it`` is False: a replay of this copy's own
        translog) and count them processed."""
        if log_it:
            if self.remote_translog is not None:
                self._log_remote(stamped, history)  # returns once the upload covering it landed
                self._check_not_fenced()
            else:
                self.translog.add(stamped, history=history)
        seqs = stamped.column("seq_no")
        self.tracker.mark_processed(seqs)

    def _log_remote(self, stamped: pa.RecordBatch, history: bool) -> None:
        """Log ``stamped`` to the remote translog and return once the upload covering it landed."""
        assert self.remote_translog is not None
        remote = self.remote_translog
        self._await_upload(remote, remote.append(stamped, history=history))

    def _await_upload(self, remote: ShardRemoteTranslog, position: tuple[int, int]) -> None:
        """Wait for the upload of what was logged before local ``position``; a full indexing buffer is refreshed
        while it is in flight.

        The upload waits on I/O (the local write and fsync, then the PUT) while a refresh is
        CPU work (sort, Parquet encoding), so a bulk that fills the buffer
        (:attr:`ShardDirectory.buffer_full`, as Elasticsearch writes a segment when its
        indexing buffer is full) overlaps the two instead of leaving the refresh to the
        next flush.  Nothing about acknowledgement changes: the call returns only once the
        upload landed, and an upload failure is raised as before (the refresh only made
        buffered, unacknowledged documents searchable earlier, as a periodic refresh does).
        A refresh that fails on the local disk (an ``OSError``: the copy is then failed for
        good by ``_local_disk``) is raised once the upload settled; any other refresh failure
        is logged and the write goes on as without the overlap (the documents stay buffered
        and the next refresh writes them).  A primary's bulk sealed its full buffer instead (:class:`Refreshing`,
        :meth:`_stage_stamped`): nothing is full here then.
        """
        if self.directory.buffer_full:
            try:
                with self._lock:
                    self._upload_ahead(self.directory.refresh().segments)
            except OSError:  # the local disk: this copy is failed (_local_disk); not acknowledged either way
                try:
                    remote.wait_uploaded(position)
                except Exception as exc:  # noqa: BLE001 - the disk error is the one raised; this one is logged
                    log.error("%s: the translog upload failed too (%s: %s)", self.path, type(exc).__name__, exc)
                raise
            except Exception:  # noqa: BLE001 - not the disk: the write goes on, the next refresh retries
                log.exception("%s: a refresh during the translog upload failed; the documents stay buffered",
                              self.path)
        remote.wait_uploaded(position)

    def _seal_following(self) -> Sealed | None:
        """The buffer that filled while a sealed one was written, sealed for the next write beside the writes (the
        thread that wrote the last one asks, without this copy's lock); None when not ready, or this copy closes or
        no longer leads."""
        if self.closed or not self.primary:
            return None
        return self.directory.seal_if_ready()

    def _refreshed_beside(self, result: RefreshResult | None, error: BaseException | None) -> None:
        """A sealed buffer's segments were written beside the writes (:class:`Refreshing`): upload them ahead of
        the commit; a local disk error fails this copy for good (the node is told at once:
        :attr:`on_background_failure`), any other failure is logged (the next refresh writes those operations).
        Their writes were acknowledged either way: they are in the translog of every in-sync copy."""
        if error is None:
            assert result is not None
            with self._lock:
                self._upload_ahead(result.segments)
            return
        if isinstance(error, OSError):  # LocalDiskError included: the copy keeps it and raises it from now on
            with contextlib.suppress(Exception), self._local_disk("refresh beside the writes"):
                raise error
        if self.disk_failure is not None:
            log.error("%s: the refresh beside the writes failed on the local disk; this copy is failed (%s)",
                      self.path, self.disk_failure)
            self._tell_background_failure()
        elif not self.closed:
            log.error("%s: the refresh beside the writes failed; the documents stay buffered (%s: %s)",
                      self.path, type(error).__name__, error)

    def _upload_ahead(self, names: tuple[str, ...]) -> None:
        """Upload the segments a full indexing buffer's refresh, or a part written once, just wrote, on a background
        thread, without waiting for it (a write's path calls this).

        OpenSearch uploads segments after every refresh; here only these big refreshes do,
        so the next flush (which joins this thread first) finds them sent and writes only
        its commit (docs/design/segments.md, "Uploads ahead of the commit").  A failure is
        logged: the flush uploads whatever is missing, so nothing depends on this upload.
        The names queue; one thread at a time takes all that queued and uploads them, until none is left.
        """
        remote = self.remote_segments
        if remote is None or not names or self._closing.is_set():
            return
        with self._ahead_lock:
            self._ahead_names.update(names)
            if self._ahead_running:
                return  # the running thread takes them before it ends
            self._ahead_running = True
            ahead = threading.Thread(target=self._run_upload_ahead, args=(remote,),
                                     name=f"upload-ahead-{self.spec.shard}", daemon=True)
            ahead.start()  # started before it is published: a close joining it never sees an unstarted thread
            self._ahead = ahead

    def _run_upload_ahead(self, remote: RemoteSegmentStore) -> None:
        """The upload-ahead thread: the queued segments, until none is queued (never this copy's lock: a flush
        holding it joins this thread)."""
        while True:
            with self._ahead_lock:
                names, self._ahead_names = self._ahead_names, set()
                if not names or self._closing.is_set():
                    self._ahead_running = False
                    return
            try:
                files = {r.info.file_name: (r.info.size, r.info.checksum)
                         for r, _live in self.directory.searchable_segments() if r.info.name in names}
                with self._upload_lock:
                    remote.upload_ahead(self.directory.path, files, cancel=self._closing)
            except Exception as exc:  # noqa: BLE001 - the next flush uploads what is missing
                log.info("%s: uploading %d new segments ahead of the commit failed (%s: %s); the flush "
                         "uploads them", self.path, len(names), type(exc).__name__, exc)

    def _join_upload_ahead(self, timeout: float | None = None) -> None:
        """Wait for the upload started by :meth:`_upload_ahead`, if one runs."""
        t = self._ahead
        if t is not None:
            t.join(timeout)

    def _check_not_fenced(self) -> None:
        """StalePrimary if a newer term claimed the shard: what we just logged is never acknowledged.

        One LIST of the shard's term markers after the upload and before the
        acknowledgement.  A newer primary claims its term before it reads the remote
        translog, and records a trim above its max seq#, so an op that passes this check
        was uploaded before the claim and is in the new primary's history, and an op that
        fails it is dropped by every reader (docs/design/engine.md, "Fencing").
        """
        if self.primary and self.store is not None:
            newest = self._newest_claim()
            if newest is not None and newest > self.primary_term:
                self.primary = False
                self.directory.set_warming(False)
                raise StalePrimary(f"{self.path}: shard claimed by primary term {newest}; this primary (term "
                                   f"{self.primary_term}) is stale", term=self.primary_term, current_term=newest)

    def _newest_claim(self) -> int | None:
        """The newest term that claimed this shard, as far as fencing needs to know.

        With a node-level translog the round that uploaded our write listed the claim log
        once for every shard of the node after it landed, so the answer needs no request
        (docs/design/translog.md, "Fencing without a LIST per shard"); a copy that slept
        through more claims than the log keeps LISTs its term markers, as without one.
        """
        if self.node_remote is not None and self._verified_epoch is not None:
            verdict = self.node_remote.claims(self.spec.cluster_uuid).verdict(
                self.spec.index_uuid, self.spec.shard, self.primary_term, self._verified_epoch)
            if verdict.fenced_by is not None:
                return verdict.fenced_by
            if not verdict.check_markers:
                self._verified_epoch = verdict.verified_epoch
                return None
            newest = latest_term(self.store, self.spec.address)
            if newest is None or newest <= self.primary_term:
                self._verified_epoch = verdict.verified_epoch
            return newest
        return latest_term(self.store, self.spec.address)

    def update_global_checkpoint(self, seq_no: int) -> None:
        """Learn a newer global checkpoint (never lowers it)."""
        if seq_no > self.global_checkpoint:
            self.global_checkpoint = seq_no
            self.translog.set_global_checkpoint(seq_no)

    def fill_gaps(self) -> int:
        """Mark every missing seq# up to max_seq_no with a no-op of the current term (promotion); returns how many."""
        with self._lock:
            top = self.max_seq_no
            lc = self.local_checkpoint
            if top <= lc:
                return 0
            missing = [s for lo, hi in gaps(self.tracker.pending_processed_ranges(), lc, top) for s in range(lo, hi + 1)]
            if not missing:
                return 0
            n = len(missing)
            batch = unstamped_batch([int(OpType.NO_OP)] * n, [None] * n, [None] * n, [None] * n,
                                    ["filling gaps after primary promotion"] * n)
            stamped = pa.RecordBatch.from_arrays(
                [pa.array(missing, pa.int64()), pa.array([self.primary_term] * n, pa.int64())] + list(batch.columns),
                schema=SCHEMA)
        self._apply_stamped(stamped)
        return n

    # -- promotion --------------------------------------------------------------------------

    def promote(self, new_term: int) -> None:
        """Become primary of ``new_term``: roll the translog, fill gaps, trim older-term ops above max, fence."""
        with self._local_disk("promote"):
            self._promote(new_term)

    def _promote(self, new_term: int) -> None:
        with self._lock:
            if new_term <= self.primary_term and self.primary:
                raise StalePrimary(f"{self.path}: promotion to term {new_term} but already primary of {self.primary_term}")
            self.primary_term = new_term
            self.translog.roll_generation(new_term)
            self.primary = True
            self._remote_checkpoints = []  # the purge gate counts this term's own commits
            try:
                self._start_remote()  # claims the term: the old primary's next acknowledgement fails
                if self.remote_translog is not None:
                    # recorded in the remote metadata too: readers merging older term prefixes drop
                    # whatever the fenced primary logged above this point
                    self.remote_translog.trim_operations_above(self.max_seq_no, new_term)
                    self._upload_unconfirmed()
                else:
                    self.translog.trim_operations_above(self.max_seq_no, new_term)
            except BaseException:
                self._abandon_promotion()
                raise
        try:
            self.fill_gaps()
        except BaseException:
            with self._lock:
                self._abandon_promotion()
            raise
        # a replica's documents are not searchable until a refresh (it serves no reads); as primary it answers
        # count and scan, which must not drop below what the old primary made searchable (issue 45's newcomer:
        # count 100 -> 0 after a failover onto a peer-recovered replica)
        self.refresh()
        self.directory.set_warming(True)  # it answers gets now: its segments' first gets are hits
        self._start_background_upload()

    def _upload_unconfirmed(self) -> int:
        """Upload again, under the new term, the operations above the global checkpoint that no older term's
        remote translog holds (:mod:`~shardstore.translog.unconfirmed`); returns how many."""
        assert self.remote_translog is not None and self.store is not None
        batches = [b for b in self.translog.read_operations(self.global_checkpoint + 1, self.max_seq_no) if b.num_rows]
        if not batches:
            return 0
        ops = pa.Table.from_batches(batches)
        older = [t for t in pc.unique(ops.column("primary_term")).to_pylist() if t < self.primary_term]
        ops = not_uploaded(ops, uploaded_tops(self.store, self.spec.address, older))
        for batch in ops.to_batches():
            self.remote_translog.add(batch, history=True)
        return ops.num_rows

    def _abandon_promotion(self) -> None:
        """Undo a promotion that failed part-way: a replica again, ready to be promoted to a newer term."""
        self.primary = False
        self.directory.set_warming(False)
        remote, self.remote_translog, self.remote_segments = self.remote_translog, None, None
        if self.translog.durability == "remote":
            self.translog.set_durability("request")
        if remote is not None:
            try:
                remote.close()
            except Exception as exc:  # noqa: BLE001 - its uploads are abandoned with it
                log.warning("%s: closing the abandoned promotion's remote translog: %r", self.path, exc)

    def _start_background_upload(self) -> None:
        """Upload the last local commit under this (new) term in a background thread (seed 001).

        After a promotion the new term's prefix is empty; uploading the segments the copy
        already holds right away makes the first flush cheap and gives restore a commit of
        the new term early, without holding up writes or the failover.
        """
        if self.remote_segments is None or self.directory.last_commit is None:
            return
        background = threading.Thread(target=self._background_upload, name=f"reupload-{self.spec.shard}", daemon=True)
        background.start()  # published once started (a close may join it from another thread)
        self._background = background

    def _background_upload(self) -> None:
        if self._closing.wait(self.spec.reupload_delay):
            return
        with self._upload_lock:
            remote = self.remote_segments
            commit = self.directory.last_commit
            if self._closing.is_set() or remote is None or commit is None or remote.last_commit is not None:
                return  # closing, or a flush already uploaded a commit of this term
            self.directory.lock_commit(commit.generation)
            try:
                remote.upload(self.directory.path, commit, cancel=self._closing)
                log.info("%s: segments re-uploaded under term %d (commit %d)", self.path, self.primary_term,
                         commit.generation)
            except UploadCancelled:
                pass
            except CommitConflict as exc:
                log.warning("%s: background upload fenced: %s", self.path, exc)
            except Exception:  # noqa: BLE001 - the next flush uploads what is missing
                if not self._closing.is_set():
                    log.exception("%s: background upload under term %d failed", self.path, self.primary_term)
            finally:
                self.directory.release_commit(commit.generation)

    def wait_background_upload(self, timeout: float | None = None) -> bool:
        """Wait for the post-promotion background upload; True when none is running."""
        t = self._background
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    @contextlib.contextmanager
    def hold_translog(self, from_seq_no: int) -> Iterator[Callable[[int], None]]:
        """Keep local translog operations >= ``from_seq_no`` while a peer recovery reads them.

        Yields a function that raises the hold as the recovery progresses.
        """
        token = id(object())
        with self._holds_lock:
            self._holds[token] = from_seq_no

        def advance(seq_no: int) -> None:
            with self._holds_lock:
                self._holds[token] = max(self._holds[token], seq_no)
        try:
            yield advance
        finally:
            with self._holds_lock:
                self._holds.pop(token, None)

    def _held_from(self) -> int | None:
        with self._holds_lock:
            return min(self._holds.values()) if self._holds else None

    def resync_from(self, primary: ShardCopy, term: int) -> int:
        """Primary-replica resync after a promotion: apply the new primary's ops above our local checkpoint.

        Refuses (ResyncRefused) when this copy holds operations above the new primary's
        history, which a rollback would have to undo; the caller rebuilds it instead.
        Returns how many operations were applied.
        """
        with self._lock:
            if self.max_seq_no > primary.max_seq_no:
                raise ResyncRefused(f"{self.path}: holds seq# up to {self.max_seq_no}, above the new primary's "
                                    f"{primary.max_seq_no}; it must be rebuilt")
            self.directory.merge_mapping(primary.directory.mapping)  # the primary's field types, not guessed anew
            sent = self.replay(primary.translog.read_operations(self.local_checkpoint + 1))
            self.primary_term = max(self.primary_term, term)
            self.update_global_checkpoint(primary.global_checkpoint)
            return sent

    def refresh(self) -> None:
        """Make buffered documents searchable (writes a segment file; searches see it once no ingest job holds
        the view: segments/held_view.py)."""
        with self._local_disk("refresh"):
            self.directory.refresh()

    def hold_view(self, job: str, seconds: float) -> bool:
        """Hold what searches see for ingest job ``job`` (docs/design/ingest.md, "Atomic visibility"); a replica
        serves no reads and defers its refresh until promoted (segments/directory.py ``hold_view``)."""
        with self._local_disk("refresh"):
            return self.directory.hold_view(job, seconds, refresh=self.primary)

    def advance_view(self, job: str) -> bool:
        """Before ``job``'s first row, pin its view again past the jobs released since it was pinned (a replica: without
        a refresh, as its hold); segments/directory.py ``advance_view``."""
        with self._local_disk("refresh"):
            return self.directory.advance_view(job, refresh=self.primary)

    def release_view(self, job: str) -> bool:
        """End ``job``'s hold; the last one makes everything applied searchable at once (a primary refreshes; a
        replica serves no reads and refreshes when promoted)."""
        with self._local_disk("refresh"):
            return self.directory.release_view(job, refresh=self.primary)

    # -- flush ------------------------------------------------------------------------------

    def flush(self) -> bool:
        """Commit locally, upload the commit, then purge what the (remote) commit covers; False when nothing
        changed since the last flush (then nothing is written and no request is made: engine/shard/flush_policy.py)."""
        with self._lock, self._local_disk("flush"), row_cache.warmer.foreground():
            if self.directory.view_held:  # a commit would show Spark readers and restores part of an ingest job
                log.info("%s: flush deferred while ingest job(s) hold the view", self.path)
                return False
            mark = self._flush_mark()
            if not flush_needed(self._flushed, mark, older_terms_pending=self._older_terms_pending):
                return False
            self._flush()
            self._flushed = mark
        # the merges the policy asks for run on this process's merge thread, at a low priority and without the
        # copy's lock: writes go on meanwhile, and the next flush commits what they made (segments/merging.py,
        # segments/merge_scheduler.py; docs/design/segments.md, "Merges beside the writes")
        merge_scheduler.merges.submit(self.directory.path, self._merge)
        return True

    def _merge(self) -> None:
        """The merges the policy asks for now (the merge thread).  A merge that failed changed nothing (its file is
        removed, its inputs stay).  Out of space, or cancelled by a close: logged, and the next flush asks again.  Any
        other local I/O error, or a damaged input segment, fails the copy for good as a write's would
        (engine/shard/local_disk.py: a failed fsync leaves the page cache untrusted), and the node is told at
        once (:attr:`on_background_failure`)."""
        if self.closed or self.disk_failure is not None:
            return
        try:
            self.directory.maybe_merge()
        except MergeCancelled:
            return
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) or self.closed:
                log.warning("%s: a merge failed (the next flush tries again): %r", self.path, exc)
                return
            self.disk_failure = LocalDiskError(self.path, "merge", exc)
            log.error("%s: %s", self.path, self.disk_failure)
            self._tell_background_failure()
        except SegmentCorrupted as exc:
            self.disk_failure = LocalDiskError(self.path, "merge", exc)
            log.error("%s: a merge read a damaged segment; the copy is failed: %s", self.path, exc)
            self._tell_background_failure()
        except Exception as exc:  # noqa: BLE001 - a bug of the merge, not of the disk: the next flush asks again
            log.warning("%s: a merge failed (the next flush tries again): %r", self.path, exc)

    def _tell_background_failure(self) -> None:
        """Hand the failure a background thread just set to :attr:`on_background_failure` (the node reports the copy
        to the cluster manager; docs/design/engine.md, "Local disk faults")."""
        listener, failure = self.on_background_failure, self.disk_failure
        if listener is None or failure is None or self.closed:
            return
        try:
            listener(failure)
        except Exception as exc:  # noqa: BLE001 - the copy's next request reports it anyway
            log.warning("%s: could not hand on the failure of this copy: %r", self.path, exc)

    def _flush_mark(self) -> FlushMark:
        return FlushMark(self.primary_term, self.primary, self.max_seq_no, self.local_checkpoint,
                         self.global_checkpoint, self.directory.merges_installed)

    def _flush(self) -> None:
        """The flush itself (under the copy lock)."""
        self._join_upload_ahead()  # none starts while we hold the lock; GC below never races one
        checkpoint = self.local_checkpoint
        first_of_shard = self.primary_term == FIRST_TERM and self.directory.last_commit is None
        self.translog.roll_generation()
        commit = self.directory.flush(
            local_checkpoint=checkpoint, primary_term=self.primary_term,
            translog_uuid=str(self.translog.translog_uuid), translog_generation=self.translog.generation,
            user_data={"global_checkpoint": str(self.global_checkpoint)}, merge=False)  # merged after: flush()
        if self.remote_segments is not None:
            self.directory.lock_commit(commit.generation)
            try:
                with self._upload_lock:  # after a background re-upload: only what it did not send
                    self.remote_segments.upload(self.directory.path, commit)
            except CommitConflict as exc:
                raise StalePrimary(f"{self.path}: {exc}; this primary was superseded") from exc
            finally:
                self.directory.release_commit(commit.generation)
            if self.remote_translog is not None:
                # one metadata blob seals what the flush rolled and drops what the commit covers; the
                # checkpoint-gated purge: keep the translog above the commit before this one, so a
                # restore that must fall back past one lost or corrupt commit still finds every
                # operation above the commit it falls back to (docs/design/engine.md, "Restore
                # never returns less"; issue 14, case 1)
                self._remote_checkpoints = [*self._remote_checkpoints, checkpoint][-FALLBACK_COMMITS:]
                gate = remote_purge_gate(self._remote_checkpoints, first_of_shard=first_of_shard)
                self.remote_translog.purge(gate, self.primary_term)
                self._purge_older_terms(gate)
            self._flushes_since_gc += 1
            if self._older_terms_pending or self._flushes_since_gc >= GC_EVERY_FLUSHES:
                self._collect_remote_garbage()
        retention = min(checkpoint, self.global_checkpoint) if not self.primary else checkpoint
        held = self._held_from()
        if held is not None:  # a peer recovery still reads the translog from there
            retention = min(retention, held - 1)
        self.translog.purge(
            last_commit_local_checkpoint=checkpoint, retention_seq_no=retention,
            min_unuploaded_generation=(self.remote_translog.min_unuploaded_generation
                                       if self.remote_translog is not None else None))

    def _collect_remote_garbage(self) -> None:
        """Remote segment GC; older terms' commits go once this term has OWN_COMMITS_BEFORE_DROPPING_OLDER of its own.

        Runs every flush while an older term still holds commits (after a failover), then
        every GC_EVERY_FLUSHES flushes (docs/design/engine.md, "Remote garbage").
        """
        assert self.remote_segments is not None and self.store is not None
        self.remote_segments.gc(keep_last=KEEP_REMOTE_COMMITS, drop_older_terms_after=OWN_COMMITS_BEFORE_DROPPING_OLDER)
        self._flushes_since_gc = 0
        addr = self.spec.address
        self._older_terms_pending = any(list_commit_keys(self.store, addr, t)
                                        for t in list_terms(self.store, addr) if t < self.primary_term)

    def _purge_older_terms(self, checkpoint: int) -> None:
        """Delete older terms' remote translogs once this term's remote commit covers them (all or nothing each).

        Runs only after a remote commit of this term was uploaded, so an older term's log
        outlives the segment upload that makes it unnecessary (seed 001).
        """
        assert self.remote_translog is not None and self.store is not None
        if self.primary_term <= FIRST_TERM:  # no older term: no LIST of the term markers at every flush
            return
        for term in list_terms(self.store, self.spec.address):
            if term < self.primary_term:
                self.remote_translog.purge_older_term(self.spec.address.translog_prefix(term), checkpoint,
                                                      self.primary_term)

    # -- recovery ---------------------------------------------------------------------------

    @classmethod
    def recover_from_remote(cls, spec: ShardSpec, data_dir: str, store: BlobStore, *, primary_term: int,
                            primary: bool = True, known_term: int = 0, accept_data_loss: bool = False,
                            index_name: str | None = None, acknowledged_max: int = NO_OPS_PERFORMED,
                            node_remote: NodeRemote | None = None) -> ShardCopy:
        """Rebuild a copy on an empty disk: newest valid remote commit, then the remote translog above it
        (:func:`~shardstore.engine.shard.store_recovery.read_from_store`, which explains ``known_term`` and
        ``acknowledged_max``).

        Every seq# the store says was acknowledged must come back (docs/design/engine.md,
        "Restore never returns less"), or this raises RestoreDataLoss naming the missing seq#
        ranges and the blobs at fault, before anything is written to the store.  With
        ``accept_data_loss`` the copy is built from what is left and ``copy.restore_loss`` says
        what was dropped.
        """
        path = os.path.join(data_dir, spec.index_uuid, str(spec.shard))
        found = read_from_store(store, spec.address, os.path.join(path, "index"), known_term=known_term,
                                index_name=index_name or spec.index_uuid, acknowledged_max=acknowledged_max)
        loss, batches = found.loss, found.batches
        if loss is not None and not accept_data_loss:
            raise RestoreDataLoss([loss])
        # A copy this node held before a restart is superseded by the store (which holds every acknowledged
        # operation): its translog is at an older primary term than the fresh log below would start at, and
        # reopening it raised StaleTerm on the second restart (issue 29).  Cleared once the restore succeeded.
        if os.path.exists(os.path.join(path, "translog")):
            log.info("%s: the local copy left by an earlier run is replaced by the store's", path)
            shutil.rmtree(os.path.join(path, "translog"))
        # terms only grow along seq#s: start the empty log at term 1, it rolls as replayed terms rise
        copy = cls(spec, data_dir, store, primary_term=1, primary=False, node_remote=node_remote)
        copy.restore_loss = loss
        copy.replay(batches)  # logged in its own translog
        if primary:
            copy.promote(primary_term)
        return copy

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (its files are released)."""
        return self._closing.is_set()

    def close(self) -> None:
        """Stop uploads and release files (what is not durable is lost, like a node stop)."""
        self._closing.set()
        self.wait_background_upload(timeout=30)  # it stops before its next file
        self._join_upload_ahead(timeout=30)  # so does this one
        try:
            if self.remote_translog is not None:
                self.remote_translog.close()
        finally:
            try:
                self.translog.close()
            finally:
                self.directory.close()
