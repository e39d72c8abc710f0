"""The data role of a node: its shard copies and the transport actions that reach them (issue 29).

A :class:`NodeService` owns the copies on one node's disk and answers the ``shard.*`` and
``recovery.*`` actions; everything another node, the cluster manager or a coordinator
does to a copy goes through these actions, so the node can be a separate process behind
a network transport (docs/design/transport.md, "Actions").  Payloads hold only JSON
values and Arrow data (the wire codec's kinds).

Per primary copy the node keeps its *replication group* (the in-sync replicas' node
names) and a *write lock*: a bulk stamps, applies and replicates under it, and the last
phase of a peer recovery runs under it, so a replica joins the group between two bulks
and never misses one (docs/design/engine.md, invariant 4).  The group changes only

- under the write lock, from the answer of the cluster manager to ``cm.replica_started``,
  ``cm.fail_replica`` or from a promotion this node runs, or
- by ``shard.group`` from the cluster manager, which only ever *removes* names.

A replica that cannot apply a write is failed through the cluster manager before the
primary answers; a primary that cannot reach the cluster manager to do so does not
acknowledge (``ShardUnavailable``).  A replica that stops answering (cut off, paused) is
found within fault-detection time, not a request timeout (issue 41): once a write has
waited ``fault_detection.timeout`` on it, the primary pings its node (``node.ping``) every
``interval`` (at once after a ping that timed out); ``retries`` failed pings in a row (or a
refused connection) fail the replica: about ``(retries + 1) * timeout`` (4 s by default).
A slow replica that still answers its pings is waited for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NoReturn

import pyarrow as pa

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NotMaster
from shardstore.core.path_strategy import PathStrategy
from shardstore.engine.coordinator.bulk_parts import NodeRoles, apply_one, apply_parts, joining_hold, staging_hold
from shardstore.engine.errors import (
    InvalidRequest,
    NodeNotReady,
    OperationTermTooOld,
    ResyncRefused,
    ShardUnavailable,
    StalePrimary,
    WriteNotAcknowledged,
)
from shardstore.engine.node.fault_detection import FaultDetectionSettings
from shardstore.engine.node.remote import NodeRemote
from shardstore.engine.shard.adopted_ops import AdoptedFile, run_summary
from shardstore.engine.shard.local_disk import BACKGROUND_OPS
from shardstore.engine.shard.request_ledger import Applied
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.errors import LocalDiskError
from shardstore.fileio import tree_bytes
from shardstore.segments.held_view import ViewTag
from shardstore.segments.mapping import Mapping
from shardstore.transport import NodeDisconnected

log = logging.getLogger(__name__)
#: how long a request the cluster manager sends under its own lock waits for a shard's write lock
MANAGER_LOCK_WAIT = 5.0

Key = tuple[str, int]
#: bytes per ``recovery.chunk`` answer when a replica copies its primary's files
CHUNK_BYTES = 4 * 1024 * 1024
#: seconds a clean shutdown waits, in all, for bulks in flight before it skips flushing their shards
SHUTDOWN_FLUSH_SECONDS = 20.0


def spec_to_wire(spec: ShardSpec) -> dict[str, Any]:
    """A :class:`ShardSpec` as JSON values."""
    return {"cluster_uuid": spec.cluster_uuid, "index_uuid": spec.index_uuid, "shard": spec.shard,
            "durability": spec.durability, "mapping": dict(spec.mapping), "strategy": spec.strategy.to_dict(),
            "reupload_delay": spec.reupload_delay, "index_buffer_bytes": spec.index_buffer_bytes}


def spec_from_wire(d: dict[str, Any]) -> ShardSpec:
    """The :class:`ShardSpec` of :func:`spec_to_wire`."""
    return ShardSpec(d["cluster_uuid"], d["index_uuid"], int(d["shard"]), durability=d["durability"],
                     mapping=dict(d["mapping"]), strategy=PathStrategy.from_dict(d["strategy"]),
                     reupload_delay=float(d["reupload_delay"]), index_buffer_bytes=int(d["index_buffer_bytes"]))


def call_manager(send: Callable[..., Any], manager: Callable[[], str | None], me: str, action: str,
                 request: dict[str, Any], wait: float, *, idempotent: bool = False,
                 attempt_timeout: float | None = None, pool: ThreadPoolExecutor | None = None) -> Any:
    """``send(manager(), action, request)``, waiting out an election for up to ``wait`` seconds.

    Retried while no manager is known, the one asked says it is not the manager, or the
    request did not reach it (``delivered`` False).  An ``idempotent`` request is also sent
    again when its answer was lost, or (with a ``pool`` to wait in) as soon as this node
    follows another manager than the one asked (a manager cut off mid-call: the next attempt
    goes to whoever manages then); each attempt waits at most ``attempt_timeout`` seconds.
    """
    deadline = time.monotonic() + wait
    while True:
        master = manager()
        try:
            if master is None:
                raise NotMaster(me, None)
            if attempt_timeout is None:
                return send(master, action, request)
            timeout = max(0.1, min(attempt_timeout, deadline - time.monotonic()))
            if not idempotent or pool is None:
                return send(master, action, request, timeout=timeout)
            future = pool.submit(send, master, action, request, timeout=timeout)
            given_up = time.monotonic() + timeout
            while True:
                try:
                    return future.result(timeout=0.1)
                except FutureTimeout:
                    if manager() != master or time.monotonic() >= given_up:
                        raise NotMaster(me, manager()) from None  # asked again, of whoever manages now
        except (NotMaster, NodeDisconnected) as exc:
            if isinstance(exc, NodeDisconnected) and exc.delivered is not False and not idempotent:
                raise
            if time.monotonic() >= deadline:
                if isinstance(exc, NotMaster):  # no manager to submit to: unavailable, not a conflict to re-read
                    raise NodeNotReady(me) from exc
                raise
            time.sleep(0.05)


def _mapping(d: dict | None) -> Mapping | None:
    return None if d is None else Mapping.from_dict(d)


class NodeService:
    """One node's shard copies and their actions (see the module docstring)."""

    def __init__(self, name: str, data_dir: str, store: BlobStore | None, send: Callable[..., Any],
                 manager: Callable[[], str | None], *, manager_wait: float = 10.0,
                 fault_detection: FaultDetectionSettings | None = None,
                 may_read: Callable[[str, int], bool] | None = None, data: bool = True,
                 owner: str | None = None) -> None:
        self.name = name
        #: whether this node has the data role: the manager allocates copies to data nodes only
        self.data = data
        #: whether this node's primary of (index UUID, shard) may serve a read now (its read lease, its routing)
        self._may_read = may_read or (lambda index_uuid, shard: True)
        #: how fast a replica that stopped answering is failed (see the module docstring)
        self.fault_detection = fault_detection or FaultDetectionSettings()
        self._replication = ThreadPoolExecutor(max_workers=64, thread_name_prefix=f"replicate-{name}")
        #: reports of copies failed off a request's path (:meth:`_report_in_background`), one at a time; its thread
        #: is started here, at normal priority (one the merge thread started would run at the merges' nice +10)
        self._reports = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"report-{name}")
        self._reports.submit(lambda: None)
        #: how long a primary waits for an elected cluster manager to report a failed replica to
        self.manager_wait = manager_wait
        self.data_dir = data_dir
        self.store = store
        self._send = send  # send(target, action, request) -> response
        self._manager = manager  # the elected cluster manager's node name, or None
        self.copies: dict[Key, ShardCopy] = {}
        #: the node-level translog and claim watch every primary copy here shares (issue 30)
        self.remote = NodeRemote(store, name, owner=owner) if store is not None else None
        self.groups: dict[Key, tuple[str, ...]] = {}
        self._write_locks: dict[Key, threading.RLock] = {}
        self._lock = threading.RLock()
        self._recoveries: dict[str, tuple[ShardCopy, contextlib.ExitStack, Any]] = {}
        self._recovering: dict[Key, ShardCopy] = {}  # replicas being built here (they take the tail)
        self._rebuilding: set[Key] = set()  # copies whose directory a request is wiping and building again
        os.makedirs(data_dir, exist_ok=True)

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, action: str, req: dict[str, Any]) -> Any:
        """Transport entry point for ``shard.*`` and ``recovery.*`` actions."""
        method = _ACTIONS.get(action)
        if method is None:
            raise InvalidRequest(f"node {self.name}: unknown action {action!r}")
        return method(self, req)

    def _key(self, req: dict[str, Any]) -> Key:
        return (str(req["index_uuid"]), int(req["shard"]))

    def _copy(self, req: dict[str, Any], *, primary: bool = False) -> ShardCopy:
        key = self._key(req)
        copy = self.copies.get(key)
        if copy is None or (primary and not copy.primary):
            raise ShardUnavailable(key[0], key[1], f"{self.name} holds no {'primary' if primary else 'copy'}")
        failure = copy.disk_failure
        if failure is not None:  # failed before this request: reported, and the request goes elsewhere
            raise self._failed_before(key, copy, failure)
        return copy

    def _failed_before(self, key: Key, copy: ShardCopy, failure: LocalDiskError) -> ShardUnavailable:
        """What a request that meets a copy failed before it (a merge, a refresh beside the writes) raises: a
        ShardUnavailable the coordinator waits out like a failover, the copy reported off the request's path (the
        request may be one the cluster manager sent while holding its lock: a report from here would wait for it)."""
        self._report_in_background(key, copy, failure)
        return ShardUnavailable(key[0], key[1], f"its copy on {self.name} failed before this request ({failure})")

    def _install(self, key: Key, copy: ShardCopy) -> None:
        """Serve ``copy`` as this node's copy of ``key``; a failure of one of its background threads is reported."""
        with self._lock:
            self.copies[key] = copy
            copy.on_background_failure = lambda exc: self._report_in_background(key, copy, exc)
        if copy.disk_failure is not None:  # failed while it was being built: nothing told the listener
            self._report_in_background(key, copy, copy.disk_failure)

    def _report_in_background(self, key: Key, copy: ShardCopy, exc: LocalDiskError) -> None:
        """:meth:`_report_disk_failure` on this node's reporting thread (docs/design/engine.md, "Local disk faults"):
        neither the process's one merge thread nor a request the cluster manager sent waits for the manager's
        answer and the copy's close."""
        try:
            self._reports.submit(self._report_disk_failure, key, copy, exc)
        except RuntimeError:  # the node is closing: its copies are closed anyway
            log.debug("%s: not reporting %s, the node is closing", self.name, copy.path)

    def write_lock(self, key: Key) -> threading.RLock:
        """The lock a bulk of ``key`` holds while it stamps, applies and replicates."""
        with self._lock:
            return self._write_locks.setdefault(key, threading.RLock())

    @contextlib.contextmanager
    def _manager_asked_lock(self, key: Key) -> Iterator[None]:
        """The write lock, for a request the cluster manager sends while it holds its own lock (open, promote,
        rebuild from the store): waited for at most :data:`MANAGER_LOCK_WAIT` seconds, then ShardUnavailable.

        A holder of this lock may be waiting for that manager (a peer recovery's finalize asks it to mark the
        replica in sync): waiting longer would deadlock the two (simulator seeds 1111 and 1360, issue 42: for
        good in process, a request timeout over the network).  The manager retries the shard later.
        """
        lock = self.write_lock(key)
        if not lock.acquire(timeout=MANAGER_LOCK_WAIT):
            raise ShardUnavailable(key[0], key[1], f"{self.name}: the shard is busy (its write lock held over "
                                                   f"{MANAGER_LOCK_WAIT:g}s, a recovery finalizing); retried later")
        try:
            yield
        finally:
            lock.release()

    def _manager_call(self, action: str, request: dict[str, Any], *, idempotent: bool = False) -> Any:
        """Send to the elected cluster manager, waiting out an election (up to ``manager_wait`` seconds).

        An ``idempotent`` request is sent again to the next manager when an attempt's answer is
        lost; an attempt waits at most a publication's time (4 fault-detection timeouts, >= 5 s).
        """
        attempt = max(5.0, 4 * self.fault_detection.timeout) + self.fault_detection.timeout if idempotent else None
        return call_manager(self._send, self._manager, self.name, action, request, self.manager_wait,
                            idempotent=idempotent, attempt_timeout=attempt, pool=self._replication)

    # -- copies ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _rebuild(self, key: Key) -> Iterator[None]:
        """One request at a time wipes and builds ``key``'s directory here (open, restore, peer recovery): a second
        is refused (ShardUnavailable, the manager retries later) instead of deleting the files of the first, which
        would then register a copy whose segments are gone (simulator seed 9535: a manager asking again after a
        lost answer, the first recovery still running)."""
        with self._lock:
            if key in self._rebuilding:
                raise ShardUnavailable(key[0], key[1], f"{self.name}: a recovery of it is running here; retried "
                                                       f"later")
            self._rebuilding.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._rebuilding.discard(key)

    def _open(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.open``: a new empty copy (a created index's primary)."""
        spec = spec_from_wire(req["spec"])
        key = (spec.index_uuid, spec.shard)
        with self._rebuild(key), self._manager_asked_lock(key):
            self._discard(key)
            shutil.rmtree(os.path.join(self.data_dir, spec.index_uuid, str(spec.shard)), ignore_errors=True)
            self._install(key, ShardCopy(spec, self.data_dir, self.store, primary_term=int(req["term"]),
                                         primary=True, node_remote=self.remote))
            self.groups[key] = ()
        return {"local_checkpoint": self.copies[key].local_checkpoint}

    def _recover_from_store(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.recover_from_store``: rebuild a primary from the blob store alone (restore, red shard)."""
        spec = spec_from_wire(req["spec"])
        key = (spec.index_uuid, spec.shard)
        with self._rebuild(key), self._manager_asked_lock(key):
            self._discard(key)
            shutil.rmtree(os.path.join(self.data_dir, spec.index_uuid, str(spec.shard)), ignore_errors=True)
            assert self.store is not None
            copy = ShardCopy.recover_from_remote(
                spec, self.data_dir, self.store, primary_term=int(req["term"]), known_term=int(req["known_term"]),
                index_name=req.get("index_name"), accept_data_loss=bool(req.get("accept_data_loss", False)),
                acknowledged_max=int(req.get("acknowledged_max", -1)), node_remote=self.remote)
            self._install(key, copy)
            self.groups[key] = ()
        loss = copy.restore_loss
        return {"mapping": copy.directory.mapping.to_dict(), "local_checkpoint": copy.local_checkpoint,
                "loss": None if loss is None else str(loss)}

    def _discard(self, key: Key, copy: ShardCopy | None = None) -> bool:
        """Drop and close this node's copy of ``key`` (only if it is ``copy``, when given); whether one was dropped."""
        with self._lock:
            if copy is not None and self.copies.get(key) is not copy:
                return False
            copy = self.copies.pop(key, None)
            self.groups.pop(key, None)
        if copy is None:
            return False
        try:
            copy.close()
        except Exception as exc:  # noqa: BLE001 - a failed copy's close error is only logged
            log.warning("closing the copy %s on %s: %r", copy.path, self.name, exc)
        return True

    def _discard_action(self, req: dict[str, Any]) -> bool:
        """``shard.discard``: drop this node's copy (failed or moved); whether there was one."""
        return self._discard(self._key(req))

    def _stats(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """``shard.stats``: the copy's checkpoints and state, or None when this node holds none."""
        copy = self.copies.get(self._key(req))
        if copy is None:
            return None
        commit = copy.directory.last_commit
        return {"local_checkpoint": copy.local_checkpoint, "max_seq_no": copy.max_seq_no, "primary": copy.primary,
                "term": copy.primary_term, "global_checkpoint": copy.global_checkpoint,
                "committed_checkpoint": commit.local_checkpoint if commit is not None else -1,
                "disk_failure": None if copy.disk_failure is None else str(copy.disk_failure)}

    def _ping(self, _req: dict[str, Any]) -> bool:
        """``node.ping``: this node answers (a primary waiting on a replica asks its node)."""
        return True

    def node_stats(self, _req: dict[str, Any] | None = None) -> dict[str, Any]:
        """``node.stats``: the copies held (index UUID, shard, primary, term, global checkpoint) and the store requests.

        A replica in the last phase of its recovery counts: the manager may already have
        committed it to the routing (``cm.replica_started``) before it joins :attr:`copies`.
        """
        metrics = getattr(self.store, "metrics", None)
        requests = dict(metrics()["requests"]) if callable(metrics) else {}
        held = {**self._recovering, **self.copies}
        return {"copies": [[k[0], k[1], c.primary, c.primary_term, c.global_checkpoint] for k, c in list(held.items())],
                "requests": requests, "data": self.data,
                "process": self.remote.owner if self.remote is not None else None}  # its translog streams name it

    def _shards(self, _req: dict[str, Any]) -> list[dict[str, Any]]:
        """``node.shards``: each copy this node holds, for the cluster view (engine/coordinator/cluster_view.py)."""
        out = []
        for (index_uuid, shard), copy, state in [*((k, c, "recovering") for k, c in list(self._recovering.items())),
                                                 *((k, c, "started") for k, c in list(self.copies.items()))]:
            commit = copy.directory.last_commit
            committed = commit.local_checkpoint if commit is not None else -1
            out.append({"index_uuid": index_uuid, "shard": int(shard), "primary": copy.primary, "state": state,
                        "term": copy.primary_term, "local_checkpoint": copy.local_checkpoint,
                        "global_checkpoint": copy.global_checkpoint, "max_seq_no": copy.max_seq_no,
                        "committed_checkpoint": committed,
                        "docs": copy.directory.count(write_deferred=False),  # a look writes no replica's deferred view
                        "bytes": tree_bytes(copy.path),
                        "disk_failure": None if copy.disk_failure is None else str(copy.disk_failure)})
        return out

    def _group(self, req: dict[str, Any]) -> bool:
        """``shard.group``: the cluster manager removed replicas; keep only those still named."""
        key = self._key(req)
        keep = set(req["replicas"])
        with self._lock:
            if key in self.groups:
                self.groups[key] = tuple(n for n in self.groups[key] if n in keep)
        return True

    # -- writes ---------------------------------------------------------------------------------

    def _replicate_to_group(self, key: Key, copy: ShardCopy, stamped: pa.RecordBatch, mapping: Any,
                            checkpoints: list[int], request_id: str | None = None) -> None:
        """Send ``stamped`` to the shard's group at once (while the primary's own upload is in flight); each replica
        remembers ``request_id`` with it (engine/shard/request_ledger.py)."""
        request = {"index_uuid": key[0], "shard": key[1], "ops": stamped, "term": copy.primary_term,
                   "global_checkpoint": copy.global_checkpoint, "mapping": mapping, "request": request_id}
        sent = [(replica, self._replication.submit(self._send, replica, "shard.replicate", request))
                for replica in self.groups.get(key, ())]
        for replica, future in sent:
            try:
                checkpoints.append(self._await_replica(key, replica, future))
            except OperationTermTooOld:
                raise  # a newer term exists: this primary is stale, the write is not acknowledged
            except Exception as exc:  # noqa: BLE001 - unreachable, or it refused what the primary applied
                self._fail_replica(key, replica, copy.primary_term, f"{type(exc).__name__}: {exc}")

    def _await_replica(self, key: Key, replica: str, future: Future) -> Any:
        """The replica's answer; ReplicaUnresponsive once its node failed ``retries`` pings in a row (see module doc)."""
        fd = self.fault_detection
        try:
            return future.result(timeout=fd.timeout)
        except FutureTimeout:
            pass
        failed = 0
        while True:
            try:
                self._send(replica, "node.ping", {}, timeout=fd.timeout)
                failed = 0
            except NodeDisconnected as exc:
                failed = fd.retries if exc.delivered is False else failed + 1
            except Exception:  # noqa: BLE001 - it answered (with a refusal): it is alive
                failed = 0
            if failed >= fd.retries:
                if future.done():
                    return future.result()
                raise ShardUnavailable(key[0], key[1], f"replica {replica} failed {failed} pings while a write waited on it")
            try:  # a failed ping already took its timeout: the next one goes at once
                return future.result(timeout=fd.interval if failed == 0 else 0.0)
            except FutureTimeout:
                continue

    def _bulk(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.bulk`` on the primary (engine/coordinator/bulk_parts.py, ``apply_one``); the coordinator reads only the
        seq#, term and version of the stamped batch: sending back its sources would double the bytes."""
        expect = None if req.get("expect") is None else tuple(req["expect"])
        return {"ops": apply_one(req, self._key(req), self._roles(), expect=expect)}

    def _adopt(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.adopt`` on the primary: adopt a staged Parquet file as a segment of the shard, as one replicated
        write (engine/shard/adopted_ops.py; docs/design/adoption.md); the seq#s it took, its term, how many rows
        and how many of them were re-applied (an update, an id the file repeats).  A retry with the same
        ``request`` id answers the first attempt's outcome and adopts nothing."""
        f = req["file"]
        file = AdoptedFile(str(f["key"]), int(f["size"]), int(f["crc32c"]), int(f["rows"]))
        return apply_one(req, self._key(req), self._roles(),
                         stage=lambda copy: copy.adopt(file, mapping=_mapping(req.get("mapping"))),
                         reply=run_summary)

    def _settle(self, key: Key, copy: ShardCopy, pending: Any) -> None:
        try:
            copy.settle(pending)
        except LocalDiskError as exc:
            self._report_disk_failure(key, copy, exc)
            raise

    def _bulk_many(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.bulk_many``: one bulk's parts for several shards whose primaries are here, staged together
        inside one hold of this node's upload round (issue 30), replicated, then settled; per part
        ``{"ops"}`` or ``{"error", "retry"}`` (engine/coordinator/bulk_parts.py)."""
        return {"results": apply_parts(req["shards"], self._roles())}

    def _roles(self) -> NodeRoles:
        """This node's side of a bulk for engine/coordinator/bulk_parts.py."""
        return NodeRoles(
            lock=self.write_lock, primary=lambda part: self._copy(part, primary=True),
            hold=lambda keys: staging_hold(self.remote, self.copies, keys),
            join=lambda key: joining_hold(self.remote, self.copies, key), replicate=self._replicate_to_group,
            settle=self._settle, disk_failed=self._report_disk_failure, mapping=_mapping, confirm=self._confirm,
            reply=lambda stamped: stamped.select(["seq_no", "primary_term", "version"]))

    def _fail_replica(self, key: Key, replica: str, term: int, reason: str) -> None:
        """Have the cluster manager take ``replica`` out of the in-sync set before this primary acknowledges."""
        try:
            answer = self._manager_call("cm.fail_replica", {"index_uuid": key[0], "shard": key[1], "node": replica,
                                                            "term": term, "reason": reason}, idempotent=True)
        except Exception as exc:  # noqa: BLE001 - no manager, or it refused (a stale primary): not acknowledged
            if isinstance(exc, OperationTermTooOld | StalePrimary):
                raise
            raise WriteNotAcknowledged(key[0], key[1], f"replica {replica} failed ({reason}) and the cluster "
                                                       f"manager could not be told ({type(exc).__name__}: {exc})") from exc
        self.groups[key] = tuple(answer["replicas"])

    def _report_disk_failure(self, key: Key, copy: ShardCopy, exc: LocalDiskError) -> None:
        """Drop the copy and tell the cluster manager its disk failed (it fails over or rebuilds); once per copy: a
        copy already dropped (reported by another thread, or replaced) is not reported again."""
        if not self._discard(key, copy):
            return
        try:
            self._manager_call("cm.copy_failed", {"index_uuid": key[0], "shard": key[1], "node": self.name,
                                                  "reason": str(exc)})
        except Exception as err:  # noqa: BLE001 - fault detection notices the copy missing anyway
            log.warning("%s: could not report the failed copy %s: %r", self.name, copy.path, err)

    def _replicate(self, req: dict[str, Any]) -> int:
        """``shard.replicate`` on a replica: apply what the primary stamped; the local checkpoint."""
        key = self._key(req)
        copy = self.copies.get(key) or self._recovering.get(key)
        if copy is None:
            raise ShardUnavailable(key[0], key[1], f"no copy on {self.name}")
        checkpoint = copy.replica_apply(req["ops"], int(req["term"]), int(req["global_checkpoint"]),
                                        _mapping(req.get("mapping")))
        copy.requests.record(req.get("request"), req["ops"])  # applied and durable here: a promoted retry finds it
        return checkpoint

    def _confirm(self, key: Key, copy: ShardCopy, first: Applied) -> None:
        """A retried write's first attempt (engine/shard/request_ledger.py) is as durable as an acknowledgement:
        in the store through this copy (its upload settled) and on every in-sync copy (the global checkpoint,
        brought up to date by asking the group); else ShardUnavailable, and the sender tries again later."""
        if first.pending is not None and first.max_seq_no > copy.local_checkpoint:
            self._settle(key, copy, first.pending)  # the first attempt's upload (raises if it failed)
        if first.max_seq_no > copy.local_checkpoint:
            raise ShardUnavailable(key[0], key[1], f"the first attempt of this write (up to seq# {first.max_seq_no}) "
                                                   f"is not yet durable here; retry")
        if first.max_seq_no <= copy.global_checkpoint:
            return
        checkpoints = [copy.local_checkpoint]
        for replica in self.groups.get(key, ()):
            stats = self._send(replica, "shard.stats", {"index_uuid": key[0], "shard": key[1]},
                               timeout=self.fault_detection.timeout)
            checkpoints.append(-1 if stats is None else int(stats["local_checkpoint"]))
        copy.update_global_checkpoint(min(checkpoints))
        if first.max_seq_no > copy.global_checkpoint:
            raise ShardUnavailable(key[0], key[1], f"the first attempt of this write (up to seq# {first.max_seq_no}) "
                                                   f"is not yet on every in-sync copy; retry")

    # -- promotion ------------------------------------------------------------------------------

    def _promote(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.promote``: become primary of ``term``, resync the other in-sync copies; those kept."""
        key = self._key(req)
        term = int(req["term"])
        with self._manager_asked_lock(key):
            copy = self._copy(req)
            copy.promote(term)
            kept = []
            for other in req["replicas"]:
                if other == self.name:
                    continue
                try:
                    sent = self._resync(key, copy, other, term)
                    kept.append(other)
                    log.info("resynced %s/%d on %s: %d operations", key[0], key[1], other, sent)
                except Exception as exc:  # noqa: BLE001 - rebuilt by peer recovery instead
                    log.warning("resync of %s/%d on %s failed (%s: %s); it is rebuilt", key[0], key[1], other,
                                type(exc).__name__, exc)
            self.groups[key] = tuple(kept)
        return {"kept": kept, "local_checkpoint": copy.local_checkpoint}

    def _resync(self, key: Key, primary: ShardCopy, other: str, term: int) -> int:
        stats = self._send(other, "shard.stats", {"index_uuid": key[0], "shard": key[1]})
        if stats is None:
            raise ShardUnavailable(key[0], key[1], f"{other} holds no copy")
        ops = list(primary.translog.read_operations(int(stats["local_checkpoint"]) + 1))
        return self._send(other, "shard.resync", {
            "index_uuid": key[0], "shard": key[1], "term": term, "ops": ops, "max_seq_no": primary.max_seq_no,
            "global_checkpoint": primary.global_checkpoint, "mapping": primary.directory.mapping.to_dict()})

    def _resync_apply(self, req: dict[str, Any]) -> int:
        """``shard.resync`` on an in-sync copy: the new primary's operations above our checkpoint."""
        copy = self._copy(req)
        with copy._lock:
            if copy.max_seq_no > int(req["max_seq_no"]):
                raise ResyncRefused(f"{copy.path}: holds seq# up to {copy.max_seq_no}, above the new primary's "
                                    f"{req['max_seq_no']}; it must be rebuilt")
            copy.directory.merge_mapping(Mapping.from_dict(req["mapping"]))
            sent = copy.replay(req["ops"])
            copy.primary_term = max(copy.primary_term, int(req["term"]))
            copy.update_global_checkpoint(int(req["global_checkpoint"]))
            return sent

    # -- reads and maintenance ----------------------------------------------------------------

    def _leased_primary(self, req: dict[str, Any]) -> ShardCopy:
        """The primary copy a read may use: only within the node's read lease (issue 41, transport.md)."""
        copy = self._copy(req, primary=True)
        key = self._key(req)
        if not self._may_read(key[0], key[1]):
            raise ShardUnavailable(key[0], key[1], f"{self.name} has not heard from a majority lately, or its "
                                                   f"routing no longer names it the primary; read from the current one")
        return copy

    def _get(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """``shard.get``: a realtime read on the primary, within the read lease."""
        return self._leased_primary(req).directory.get(req["id"])

    def _count(self, req: dict[str, Any]) -> int | dict[str, Any]:
        """``shard.count``: the primary's live documents, within the read lease; ``tagged``: as
        ``{"count", "hidden", "held", "shown"}``, the ingest jobs its view hides, holds and shows (segments/held_view.py)."""
        view, tag = self._leased_primary(req).directory.tagged_view()
        count = sum(live.live_count for _reader, live in view)
        return _tagged(tag, count=count) if req.get("tagged") else count

    def _scan(self, req: dict[str, Any]) -> pa.Table | None | dict[str, Any]:
        """``shard.scan``: the primary's refreshed documents (None: none), within the read lease; ``tagged``: as
        ``{"table", "hidden", "held", "shown"}`` (see ``shard.count``)."""
        directory = self._leased_primary(req).directory
        view, tag = directory.tagged_view()
        table = (pa.Table.from_batches(list(directory.scan(columns=req.get("columns"), view=view)))
                 if any(live.live_count for _reader, live in view) else None)
        return _tagged(tag, table=table) if req.get("tagged") else table

    def _refresh(self, req: dict[str, Any]) -> bool:
        self._on_local_disk(req, lambda copy: copy.refresh())
        return True

    def _on_local_disk(self, req: dict[str, Any], fn: Callable[[ShardCopy], Any]) -> Any:
        """``fn`` on the request's copy; a local disk failure is reported (the copy is failed and rebuilt:
        docs/design/engine.md, invariant 13), then raised."""
        copy = self._copy(req)
        try:
            return fn(copy)
        except LocalDiskError as exc:
            self._raise_disk_failure(self._key(req), copy, exc)
        except Exception as exc:
            self._raise_if_dropped(self._key(req), copy, exc)
            raise

    def _raise_if_dropped(self, key: Key, copy: ShardCopy, exc: Exception) -> None:
        """ShardUnavailable (the coordinator waits it out) when ``copy`` was dropped and closed under the request that
        got ``exc`` (failed by another thread, or moved): its error is the close's, not an answer."""
        if copy.closed and self.copies.get(key) is not copy and not isinstance(exc, ShardUnavailable):
            raise ShardUnavailable(key[0], key[1], f"its copy on {self.name} was closed under the request "
                                                   f"({type(exc).__name__}: {exc})") from exc

    def _raise_disk_failure(self, key: Key, copy: ShardCopy, exc: LocalDiskError) -> NoReturn:
        """Raise for a request whose copy's local disk failed: its own failure as it is, reported now; a background
        thread's (a merge, met between :meth:`_copy`'s check and the call) as :meth:`_failed_before`."""
        if exc.op in BACKGROUND_OPS:
            raise self._failed_before(key, copy, exc) from exc
        self._report_disk_failure(key, copy, exc)
        raise exc

    def _hold_view(self, req: dict[str, Any]) -> bool:
        """``shard.hold_view``: this copy's searches keep their view while ingest job ``job`` applies, for at most
        ``seconds`` (docs/design/ingest.md, "Atomic visibility")."""
        return self._on_local_disk(req, lambda copy: copy.hold_view(str(req["job"]), float(req["seconds"])))

    def _advance_view(self, req: dict[str, Any]) -> bool:
        """``shard.advance_view``: before ingest job ``job``'s first row, its view shows the jobs released since."""
        return self._on_local_disk(req, lambda copy: copy.advance_view(str(req["job"])))

    def _release_view(self, req: dict[str, Any]) -> bool:
        """``shard.release_view``: ingest job ``job`` is done; the last release makes it searchable at once."""
        return self._on_local_disk(req, lambda copy: copy.release_view(str(req["job"])))

    def _flush(self, req: dict[str, Any]) -> bool:
        key = self._key(req)
        with self.write_lock(key):
            copy = self._copy(req)
            try:
                copy.flush()
            except LocalDiskError as exc:  # as a refresh: a full or failing disk fails the copy, not the node
                self._raise_disk_failure(key, copy, exc)
            except Exception as exc:
                self._raise_if_dropped(key, copy, exc)
                raise
        return True

    # -- peer recovery: the target side ---------------------------------------------------------

    def _recover_replica(self, req: dict[str, Any]) -> bool:
        """``shard.recover_replica``: build a replica here from ``source``'s primary; True once in sync (one at a time
        per copy: :meth:`_rebuild`)."""
        spec = spec_from_wire(req["spec"])
        with self._rebuild((spec.index_uuid, spec.shard)):
            return self._recover_replica_now(spec, req["source"])

    def _recover_replica_now(self, spec: ShardSpec, source: str) -> bool:
        key = (spec.index_uuid, spec.shard)
        rid = uuid.uuid4().hex
        dest = os.path.join(self.data_dir, spec.index_uuid, str(spec.shard))
        self._discard(key)
        shutil.rmtree(dest, ignore_errors=True)
        start = self._send(source, "recovery.start", {"index_uuid": key[0], "shard": key[1], "id": rid})
        replica: ShardCopy | None = None
        try:
            os.makedirs(os.path.join(dest, "index"), exist_ok=True)
            for name, size in start["files"]:
                self._fetch_file(source, rid, name, int(size), os.path.join(dest, "index", name))
            replica = ShardCopy(spec, self.data_dir, self.store, primary_term=1, primary=False,
                                node_remote=self.remote)
            replica.replay(self._send(source, "recovery.ops", {"id": rid, "from": replica.local_checkpoint + 1}))
            self._recovering[key] = replica
            self._send(source, "recovery.finalize", {"id": rid, "target": self.name,
                                                     "from": replica.local_checkpoint + 1})
            self._install(key, replica)
            replica = None
            return True
        finally:
            self._recovering.pop(key, None)
            if replica is not None:
                replica.close()
            with contextlib.suppress(Exception):
                self._send(source, "recovery.end", {"id": rid})

    def _fetch_file(self, source: str, rid: str, name: str, size: int, path: str) -> None:
        with open(path, "wb") as f:
            offset = 0
            while offset < size:
                chunk = self._send(source, "recovery.chunk", {"id": rid, "name": name, "offset": offset,
                                                              "length": min(CHUNK_BYTES, size - offset)})
                if not chunk:
                    raise ShardUnavailable(source, -1, f"recovery source ended {name} at {offset} of {size} bytes")
                f.write(chunk)
                offset += len(chunk)
            f.flush()
            os.fsync(f.fileno())

    def _recovery_tail(self, req: dict[str, Any]) -> int:
        """``recovery.tail``: the last operations, sent by the primary under its write lock."""
        key = self._key(req)
        replica = self._recovering.get(key)
        if replica is None:
            raise ShardUnavailable(key[0], key[1], f"no recovery of it running on {self.name}")
        if req.get("mapping") is not None:
            replica.directory.merge_mapping(Mapping.from_dict(req["mapping"]))
        replica.replay(req["ops"])
        replica.primary_term = max(replica.primary_term, int(req["term"]))
        replica.update_global_checkpoint(int(req["global_checkpoint"]))
        return replica.local_checkpoint

    # -- peer recovery: the source side (the primary) ------------------------------------------

    def _recovery_start(self, req: dict[str, Any]) -> dict[str, Any]:
        """``recovery.start``: lock the last commit and hold the translog above it; the files to copy."""
        copy = self._copy(req, primary=True)
        stack = contextlib.ExitStack()
        commit = copy.directory.last_commit
        start = commit.local_checkpoint if commit is not None else -1
        stack.enter_context(copy.hold_translog(start + 1))
        files: list[tuple[str, int]] = []
        if commit is not None:
            copy.directory.lock_commit(commit.generation)
            stack.callback(copy.directory.release_commit, commit.generation)
            for name in [*commit.files(), commit.file_name]:
                files.append((name, os.path.getsize(os.path.join(copy.directory.path, name))))
        self._recoveries[req["id"]] = (copy, stack, commit)
        return {"files": files, "start": start}

    def _recovery_session(self, rid: str) -> ShardCopy:
        session = self._recoveries.get(rid)
        if session is None:
            raise ShardUnavailable("recovery", -1, f"no recovery {rid} on {self.name}")
        return session[0]

    def _recovery_chunk(self, req: dict[str, Any]) -> bytes:
        copy = self._recovery_session(req["id"])
        name = os.path.basename(req["name"])  # a file of the locked commit, never a path the peer chose
        with open(os.path.join(copy.directory.path, name), "rb") as f:
            f.seek(int(req["offset"]))
            return f.read(int(req["length"]))

    def _recovery_ops(self, req: dict[str, Any]) -> list[pa.RecordBatch]:
        copy = self._recovery_session(req["id"])
        return list(copy.translog.read_operations(int(req["from"])))

    def _recovery_finalize(self, req: dict[str, Any]) -> bool:
        """``recovery.finalize``: under the write lock, send the tail and have the manager mark the copy in sync."""
        copy = self._recovery_session(req["id"])
        key = (copy.spec.index_uuid, copy.spec.shard)
        target = req["target"]
        with self.write_lock(key):
            if self.copies.get(key) is not copy or not copy.primary:
                raise ShardUnavailable(key[0], key[1], f"the primary on {self.name} changed during the recovery")
            self._send(target, "recovery.tail", {
                "index_uuid": key[0], "shard": key[1], "ops": list(copy.translog.read_operations(int(req["from"]))),
                "term": copy.primary_term, "global_checkpoint": copy.global_checkpoint,
                "mapping": copy.directory.mapping.to_dict()})
            answer = self._manager_call("cm.replica_started", {"index_uuid": key[0], "shard": key[1],
                                                               "node": target, "primary": self.name,
                                                               "term": copy.primary_term})
            self.groups[key] = tuple(answer["replicas"])
        return True

    def _recovery_end(self, req: dict[str, Any]) -> bool:
        session = self._recoveries.pop(req["id"], None)
        if session is not None:
            session[1].close()
        return True

    # -- lifecycle ------------------------------------------------------------------------------

    def flush_all(self, within: float = SHUTDOWN_FLUSH_SECONDS) -> None:
        """Flush every primary copy (a clean shutdown): its commit is uploaded, its translog trimmed.

        All within ``within`` seconds: a shard whose write lock a bulk still holds past that (its
        replica stopped answering, and the request waits out its timeout) is not flushed.  Nothing
        acknowledged depends on it: the remote translog holds every acknowledged write; the flush only
        makes the next start cheaper.
        """
        deadline = time.monotonic() + within
        for key, copy in list(self.copies.items()):
            if not copy.primary:
                continue
            lock = self.write_lock(key)
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("%s: %s not flushed at shutdown: a bulk held it past %.0fs", self.name, copy.path, within)
                continue
            try:
                copy.flush()
            except Exception as exc:  # noqa: BLE001 - the remote translog still holds what was acknowledged
                log.warning("%s: flush of %s at shutdown failed: %r", self.name, copy.path, exc)
            finally:
                lock.release()

    def close(self) -> None:
        """Close every copy (what is not in the translog is lost, as in a crash)."""
        self._replication.shutdown(wait=False, cancel_futures=True)
        self._reports.shutdown(wait=False, cancel_futures=True)
        for session in list(self._recoveries.values()):
            session[1].close()
        self._recoveries.clear()
        for key in list(self.copies):
            self._discard(key)
        if self.remote is not None:
            self.remote.close()


_ACTIONS: dict[str, Callable[[NodeService, dict[str, Any]], Any]] = {
    "shard.open": NodeService._open,
    "shard.recover_from_store": NodeService._recover_from_store,
    "shard.discard": NodeService._discard_action,
    "shard.stats": NodeService._stats,
    "shard.group": NodeService._group,
    "shard.bulk": NodeService._bulk,
    "shard.bulk_many": NodeService._bulk_many,
    "shard.adopt": NodeService._adopt,
    "shard.replicate": NodeService._replicate,
    "shard.promote": NodeService._promote,
    "shard.resync": NodeService._resync_apply,
    "shard.get": NodeService._get,
    "shard.count": NodeService._count,
    "shard.scan": NodeService._scan,
    "shard.refresh": NodeService._refresh,
    "shard.flush": NodeService._flush,
    "shard.hold_view": NodeService._hold_view,
    "shard.release_view": NodeService._release_view,
    "shard.advance_view": NodeService._advance_view,
    "shard.recover_replica": NodeService._recover_replica,
    "recovery.start": NodeService._recovery_start,
    "recovery.chunk": NodeService._recovery_chunk,
    "recovery.ops": NodeService._recovery_ops,
    "recovery.tail": NodeService._recovery_tail,
    "recovery.finalize": NodeService._recovery_finalize,
    "recovery.end": NodeService._recovery_end,
    "node.stats": NodeService.node_stats,
    "node.ping": NodeService._ping,
    "node.shards": NodeService._shards,
}
#: the actions a node's data role answers
ACTIONS = frozenset(_ACTIONS)


def _tagged(tag: ViewTag, **answer: Any) -> dict[str, Any]:
    """A read's answer with the ingest jobs its view hides and shows (engine/coordinator/view_reads.py)."""
    return {**answer, "hidden": sorted(tag.hidden), "held": sorted(tag.held), "shown": sorted(tag.shown)}
