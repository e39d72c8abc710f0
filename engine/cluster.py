"""The cluster: in-process nodes behind a transport, a cluster manager, and the public API.

``Cluster(store=url, data_dir=..., nodes=3)`` starts nodes ``node-0..`` that hold shard
copies (:class:`~shardstore.engine.shard.ShardCopy`) and cluster-manager nodes ``cm-0..``
that keep the cluster state (:mod:`shardstore.cluster_state`), all talking only through a
:class:`~shardstore.transport.Transport`.  The cluster manager (this class) keeps
the index metadata (:mod:`~shardstore.engine.metadata`): per shard the primary term,
where each copy lives, and the in-sync set; it alone bumps a term, and publishes every
change through the elected cluster-manager node.

Roles, each its own class, none a mixin: a node (:class:`~shardstore.engine.local_node.Node`:
its copies and its ``shard.*`` handler); the cluster manager (this class: allocation,
failing copies, publication), with its promotions (:class:`~shardstore.engine.promotion.Promotions`:
new primaries, red shards and their retries); the coordinator (:class:`~shardstore.engine.documents.Documents`:
routing, per-item results), for which this class is the router.  Neither a node nor the
promotions import this module: what they need of the cluster manager is passed to them.

Write path (:meth:`Cluster.bulk`): documents are routed to shards with Elasticsearch's
murmur3 routing; per shard the coordinator sends the unstamped batch to the primary's
node (``shard.bulk``); the primary stamps, applies and makes it durable, then sends the
stamped batch to every in-sync replica (``shard.replicate``).  A replica that cannot be
reached is failed by the cluster manager (removed from the in-sync set) before the
primary answers.  An item is acknowledged only when all that succeeded.  A lost
answer (``NodeDisconnected``) leaves the items unacknowledged: the caller may retry
them (indexing by id is idempotent).

Failover (:meth:`kill_node`): for each shard whose primary died, the in-sync replica
with the highest local checkpoint is promoted with term + 1 (``ShardCopy.promote``:
roll, fill gaps, trim, claim the term in the store, which fences the old primary).
Missing replicas are rebuilt on live nodes by peer recovery.  See docs/design/engine.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingABC
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.coordination import LocalCluster
from shardstore.cluster_state.errors import ClusterStateSuperseded, NoClusterState, NotMaster
from shardstore.core.path_strategy import PlainPathStrategy
from shardstore.engine.allocation import AllocationWorker, ClusterHealth, cluster_health, plan_replicas
from shardstore.engine.bulk_parts import group_by_node, take_answers, unsent
from shardstore.engine.datadir import DataDirLock
from shardstore.engine.documents import BulkResult, Documents, with_shard_fields
from shardstore.engine.errors import (
    ClusterClosed,
    HealthTimeout,
    IndexAlreadyExists,
    IndexNotCreated,
    IndexNotFound,
    InvalidRequest,
    MappingNotCommitted,
    NodeNotFound,
    RecoverySourceClosed,
    ShardUnavailable,
    StalePrimary,
)
from shardstore.engine.file_budget import check_file_budget
from shardstore.engine.local_node import Node
from shardstore.engine.metadata import IndexMeta, ShardRouting, from_index_metadata, sync_index
from shardstore.engine.promotion import Promotions
from shardstore.engine.recovery import peer_recover
from shardstore.engine.restore_check import ShardLoss
from shardstore.engine.shard import ShardCopy, ShardSpec
from shardstore.engine.validation import check_create_args, check_index_name, check_mapping, check_source_mode
from shardstore.errors import LocalDiskError
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.segments.mapping import Mapping
from shardstore.segments.remote_store import next_free_term
from shardstore.transport import Transport

log = logging.getLogger(__name__)
MANAGER = "cluster-manager"  # the sender name of the coordinator's shard requests
__all__ = ["BulkResult", "Cluster", "Node"]  # BulkResult lives in documents.py; imported from here too


class Cluster:
    """An in-process cluster of nodes over one blob store (see the module docstring).

    On empty data directories over a store that already holds a cluster state, the
    cluster-manager election restores it (a new cluster UUID chained to the old one) and
    every index is recovered from the store, as :meth:`restore` does.
    """

    def __init__(self, store: str | BlobStore, data_dir: str = "./shardstore-data", nodes: int = 3,
                 *, cluster_managers: int = 3, transport: Transport | None = None,
                 recovery_delay: float = 1.0, accept_data_loss: bool = False,
                 index_buffer_bytes: int = INDEX_BUFFER_BYTES, **store_options: Any) -> None:
        if nodes < 1:
            raise InvalidRequest(f"a cluster needs at least one node, got nodes={nodes}")
        if cluster_managers < 1:
            raise InvalidRequest(f"a cluster needs at least one cluster manager, got cluster_managers={cluster_managers}")
        if recovery_delay < 0:
            raise InvalidRequest(f"recovery_delay must be >= 0 seconds, got {recovery_delay}")
        if isinstance(index_buffer_bytes, bool) or not isinstance(index_buffer_bytes, int) or index_buffer_bytes < 1:
            raise InvalidRequest(f"index_buffer_bytes must be an int >= 1, got {index_buffer_bytes!r}")
        if store is None:
            raise InvalidRequest("a cluster needs a blob store (store='file:///path', 's3://bucket/prefix', ...)")
        if store_options and not isinstance(store, str):
            raise InvalidRequest(f"store options {sorted(store_options)} apply to a store URL, not to an opened "
                                 f"{type(store).__name__}")
        #: after a failover, replica rebuilds and the new primary's re-upload start this many seconds later
        self.recovery_delay = recovery_delay
        #: a primary whose buffered documents reach this many Arrow bytes refreshes during the bulk's upload
        self.index_buffer_bytes = index_buffer_bytes
        self._dir_lock = DataDirLock(data_dir)  # before the store: a second cluster on this dir writes nothing
        try:
            self.store = open_store(store, **store_options) if isinstance(store, str) else store
            self.data_dir = data_dir
            self.transport = transport or Transport()
            # Dedicated cluster-manager nodes keep the cluster state (issue 6): elected, two-phase
            # publication through the blob store.  On empty disks over a store that holds a cluster
            # state, the first election restores it (a new cluster UUID chained to the old one).
            self.managers = LocalCluster(self.store, os.path.join(data_dir, "cluster-managers"),
                                         master_nodes=[f"cm-{i}" for i in range(cluster_managers)],
                                         transport=self.transport)
            state = self.managers.elect("cm-0")
            self.cluster_uuid = state.cluster_uuid
            self.indices: dict[str, IndexMeta] = {}
            self._lock = threading.RLock()
            self._mapping_lock = threading.Lock()  # one index-mapping update at a time (before the cluster lock)
            self._mapping_cache: dict[str, tuple[dict, Mapping]] = {}
            self._shard_locks: dict[tuple[str, int], threading.RLock] = {}
            self._initializing: set[tuple[str, int]] = set()  # (index, shard) with a peer recovery running
            self._recovery_failures: dict[tuple[str, int], int] = {}
            #: (index UUID, shard) -> the highest seq# this cluster acknowledged: a rebuild from the store must bring
            #: back at least that much, whatever its (possibly stale) listings show (docs/design/engine.md, invariant 12)
            self._acked_max: dict[tuple[str, int], int] = {}
            self._acked_lock = threading.Lock()
            self._closed = False
            self._allocation = AllocationWorker(self._allocation_round, name="allocation")
            self._writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bulk-shard")
            self.documents = Documents(self)  # the document API; this cluster is its router
            self.nodes: dict[str, Node] = {}
            #: the promotion role: new primaries, red shards (with their causes) and their retry timer
            self.promotions = Promotions(self._lock, self.store, self.indices, self.nodes, live_nodes=self.live_nodes,
                                         set_routing=self._set_routing, shard_spec=self._spec,
                                         schedule_allocation=lambda: self._schedule_allocation(self.recovery_delay),
                                         acknowledged_max=lambda key: self._acked_max.get(key, -1))
            for i in range(nodes):
                self.start_node(f"node-{i}")
            #: what a restore dropped, per shard, when it ran with accept_data_loss=True (else it refuses)
            self.restore_losses: list[ShardLoss] = []
            self._accept_data_loss = accept_data_loss
            try:
                #: indices found in the cluster state at start (a restore): their shards come from the store
                self.restored_indices = self._restore_shards(state)
                for loss in self.restore_losses:
                    log.error("restore accepted a data loss: %s", loss)
            except BaseException:
                self.close()
                raise
            self.wait_for_allocation()
        except BaseException:
            self._dir_lock.release()  # a failed start leaves the directory free
            raise

    # -- nodes ------------------------------------------------------------------------------

    def _node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            raise NodeNotFound(name)
        return node

    def live_nodes(self) -> list[str]:
        """Names of the nodes that are up."""
        return sorted(n for n in self.nodes if self.transport.is_registered(n))

    def start_node(self, name: str) -> None:
        """Start (or restart) a node; replicas missing a copy are rebuilt on it in the background.

        ``cm-N`` names a cluster-manager node: it restarts from its disk and rejoins.
        """
        if name in self.managers.nodes:
            if not self.transport.is_registered(name):
                self.managers.start(name)
            return
        with self._lock:
            if name in self.nodes and self.transport.is_registered(name):
                return
            node = Node(name, os.path.join(self.data_dir, name), self.store, self.transport,
                        in_sync_replicas=self._in_sync_replicas, fail_replica=self._fail_replica,
                        fail_copy=self._fail_copy, shard_lock=self._shard_lock)
            self.nodes[name] = node
            self.transport.register(name, node.handle)
            self._schedule_allocation()
            self.promotions.retry_soon()  # a red shard may be recoverable now

    def kill_node(self, name: str, wipe_disk: bool = False) -> None:
        """Stop a node abruptly (like SIGKILL); its primaries fail over at once, its replicas are rebuilt
        elsewhere in the background (:meth:`health`, :meth:`wait_for_health`).

        ``cm-N`` names a cluster-manager node: if it was the elected one, another is elected
        at the next metadata change.
        """
        if name in self.managers.nodes:
            if self.transport.is_registered(name):
                self.managers.stop(name)
            return
        with self._lock:
            node = self._node(name)
            if self.transport.is_registered(name):
                self.transport.unregister(name)
            node.close(wipe_disk=wipe_disk)
            for index in list(self.indices):
                for shard in range(self.indices[index].shards):
                    meta = self.indices[index]  # re-read: each change below replaces the object
                    sr = meta.routing[shard]
                    if name not in sr.copies:
                        continue
                    others = [n for n in sr.in_sync if n != name and n in self.live_nodes()]
                    if sr.primary == name:
                        self.promotions.promote_or_retry_later(meta, sr, others)
                    else:
                        self._set_routing(meta, sr.shard, copies=[c for c in sr.copies if c != name],
                                          in_sync=[c for c in sr.in_sync if c != name])
            self._schedule_allocation(self.recovery_delay)  # the new primary's first writes go first

    def _fail_replica(self, key: tuple[str, int], node: str, term: int, reason: str) -> None:
        with self._lock:
            meta = next(m for m in self.indices.values() if m.uuid == key[0])
            sr = meta.routing[key[1]]
            if term < sr.primary_term:
                # the cluster manager moved on: the asking primary is stale and must not acknowledge
                raise StalePrimary(f"{meta.name}/{key[1]}: a primary of term {term} asked to fail {node}, but the "
                                   f"shard's primary term is {sr.primary_term}", term=term,
                                   current_term=sr.primary_term)
            if node not in sr.in_sync:
                return
            log.warning("failing replica %s of %s/%d: %s", node, meta.name, key[1], reason)
            copy = self.nodes[node].copies.pop(key, None) if node in self.nodes else None
            if copy is not None:
                copy.close()
            self._set_routing(meta, key[1], copies=[c for c in sr.copies if c != node],
                              in_sync=[c for c in sr.in_sync if c != node])
            self._schedule_allocation()  # a new replica is built in the background

    def _fail_copy(self, key: tuple[str, int], node: str, copy: ShardCopy, reason: str) -> bool:
        """Fail one copy whose local disk failed (docs/design/engine.md, "Local disk faults"): a primary fails
        over like a killed node, a replica is dropped; both are rebuilt in the background.  Whether it was
        the shard's primary."""
        with self._lock:
            meta = next((m for m in self.indices.values() if m.uuid == key[0]), None)
            holder = self.nodes.get(node)
            if meta is None or holder is None or holder.copies.get(key) is not copy:
                return False  # already failed, killed or rebuilt
            sr = meta.routing[key[1]]
            log.error("failing the copy of %s/%d on %s: %s", meta.name, key[1], node, reason)
            holder.discard(key)
            if sr.primary == node:
                others = [n for n in sr.in_sync if n != node and n in self.live_nodes()]
                self.promotions.promote_or_retry_later(meta, sr, others)
                self._schedule_allocation(self.recovery_delay)
                return True
            self._set_routing(meta, key[1], copies=[c for c in sr.copies if c != node],
                              in_sync=[c for c in sr.in_sync if c != node])
            self._schedule_allocation()
            return False

    def _in_sync_replicas(self, key: tuple[str, int]) -> list[str]:
        meta = next(m for m in self.indices.values() if m.uuid == key[0])
        sr = meta.routing[key[1]]
        return [n for n in sr.in_sync if n != sr.primary]

    # -- allocation (background) -----------------------------------------------------------

    def _schedule_allocation(self, delay: float = 0.0) -> None:
        self._recovery_failures.clear()
        self._allocation.schedule(delay)

    def _allocation_round(self) -> bool:
        """Start the next replica recovery the plan asks for; False when there is none (worker thread)."""
        with self._lock:
            live = self.live_nodes()
            load = {n: len(self.nodes[n].copies) for n in live}
            skip = frozenset(self._initializing | {k for k, n in self._recovery_failures.items() if n >= 3})
            plan = plan_replicas(self.indices, live, load, skip)
            if not plan:
                return False
            a = plan[0]
            meta = self.indices[a.index]
            sr = meta.routing[a.shard]
            key = (meta.uuid, a.shard)
            primary = self.nodes[sr.primary].copies.get(key)
            if primary is None:
                self._recovery_failures[(a.index, a.shard)] = 3
                return True
            self._initializing.add((a.index, a.shard))
            spec, target = self._spec(meta, a.shard), self.nodes[a.target]
            expected = (sr.primary, sr.primary_term)

        def finalize(replica: ShardCopy) -> bool:
            with self._lock:
                cur = self.indices.get(a.index)
                if cur is None or cur.uuid != meta.uuid:
                    return False
                csr = cur.routing[a.shard]
                if ((csr.primary, csr.primary_term) != expected or a.target in csr.copies
                        or not self.transport.is_registered(a.target) or self.nodes.get(a.target) is not target):
                    return False
                target.copies[key] = replica
                self._set_routing(cur, a.shard, copies=[*csr.copies, a.target], in_sync=[*csr.in_sync, a.target])
                return True

        t0 = time.monotonic()
        try:
            done = peer_recover(primary, spec, target.data_dir, self.store, node_remote=target.remote,
                                shard_lock=self._shard_lock(key),
                                finalize=finalize)
            if done is None:
                log.info("recovery of %s/%d on %s abandoned: routing changed", a.index, a.shard, a.target)
            else:
                log.info("replica of %s/%d recovered on %s in %.3fs", a.index, a.shard, a.target,
                         time.monotonic() - t0)
        except RecoverySourceClosed as exc:  # the primary moved on: the next round recovers from the new one
            log.info("recovery of %s/%d on %s abandoned: %s", a.index, a.shard, a.target, exc)
        except Exception as exc:  # noqa: BLE001 - retried (3 times) by the next round
            with self._lock:
                self._recovery_failures[(a.index, a.shard)] = self._recovery_failures.get((a.index, a.shard), 0) + 1
            log.warning("recovery of %s/%d on %s failed: %s: %s", a.index, a.shard, a.target, type(exc).__name__, exc)
        finally:
            with self._lock:
                self._initializing.discard((a.index, a.shard))
        return True

    def wait_for_allocation(self, timeout: float | None = 120.0) -> None:
        """Block until no replica recovery is pending or running (HealthTimeout after ``timeout`` seconds)."""
        if not self._allocation.wait_idle(timeout):
            raise HealthTimeout(f"replica recoveries still running after {timeout}s: {self.health()}")

    def health(self) -> ClusterHealth:
        """Green (every wanted copy in sync), yellow (a replica missing or recovering) or red (no primary)."""
        with self._lock:
            return cluster_health(self.indices, self.live_nodes(), frozenset(self._initializing),
                                  self.promotions.causes())

    def wait_for_health(self, status: str = "green", timeout: float = 120.0) -> ClusterHealth:
        """Block until health is at least ``status`` ("yellow" or "green"); HealthTimeout names what is missing."""
        rank = {"red": 0, "yellow": 1, "green": 2}
        if status not in ("yellow", "green"):
            raise InvalidRequest(f"wait_for_health status must be 'yellow' or 'green', not {status!r}")
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if rank[h.status] >= rank[status]:
                return h
            if time.monotonic() >= deadline:
                raise HealthTimeout(f"cluster health is {h.status}, not {status}, after {timeout}s: {h}")
            if self._allocation.idle and h.status == "yellow" and status == "green" and not h.initializing_shards:
                # nothing left to try: fewer live nodes than copies wanted
                raise HealthTimeout(f"cluster health is yellow and no recovery can make it green (live nodes "
                                    f"{self.live_nodes()}): {h}")
            time.sleep(0.01)

    def _shard_lock(self, key: tuple[str, int]) -> threading.RLock:
        with self._lock:
            return self._shard_locks.setdefault(key, threading.RLock())

    # -- metadata ---------------------------------------------------------------------------

    def _spec(self, meta: IndexMeta, shard: int) -> ShardSpec:
        return ShardSpec(meta.data_cluster_uuid or self.cluster_uuid, meta.uuid, shard, durability=meta.durability,
                         mapping=meta.mappings,
                         strategy=meta.strategy, reupload_delay=self.recovery_delay,
                         index_buffer_bytes=self.index_buffer_bytes)

    def _set_routing(self, meta: IndexMeta, shard: int, **changes: Any) -> None:
        cur = self.indices.get(meta.name)
        if cur is not None and cur.uuid == meta.uuid and cur.mappings is not meta.mappings:
            meta = replace(meta, mappings=cur.mappings)  # a mapping update since ``meta`` was read is kept
        new = meta.with_routing(shard, **changes)
        self.indices[meta.name] = new
        self._publish(new)

    def _publish(self, meta: IndexMeta) -> None:
        """Publish the index's metadata through the elected cluster manager (electing one if needed).

        A publication that cannot reach a quorum is logged, not raised: shard safety rests on
        the term markers in the blob store, and the next change republishes the whole index.
        (Creating an index is the exception: :meth:`create_index` raises, see :meth:`_try_publish`.)
        """
        exc = self._try_publish(meta)
        if exc is not None:
            log.error("index %s: cluster state not published (%s: %s); republished at the next change",
                      meta.name, type(exc).__name__, exc)

    def _try_publish(self, meta: IndexMeta) -> Exception | None:
        """Publish the index's metadata (two attempts, electing a manager if needed); the last failure, or None."""
        failure: Exception | None = None
        for _attempt in range(2):
            master = self.managers.master()
            try:
                if master is None:
                    live = [n for n in self.managers.master_names if self.transport.is_registered(n)]
                    if not live:
                        raise NotMaster("(any)", None)
                    self.managers.elect(live[0])
                self.managers.submit(sync_index(meta))
                return None
            except Exception as exc:  # noqa: BLE001 - no quorum, no master, a store or transport failure
                failure = exc
        return failure

    def cluster_state(self):
        """The cluster state the elected cluster manager last applied (None while there is no master)."""
        master = self.managers.master()
        return master.applied if master is not None else None

    def _meta(self, index: str) -> IndexMeta:
        if self._closed:
            raise ClusterClosed(f"index [{index}]")
        if not isinstance(index, str):
            raise InvalidRequest(f"an index name is a string, got {type(index).__name__}")
        meta = self.indices.get(index)
        if meta is None:
            raise IndexNotFound(index)
        return meta

    def create_index(self, name: str, shards: int = 1, replicas: int = 1, mappings: dict | None = None,
                     durability: str = "request", source: str = "stored") -> IndexMeta:
        """Create an index; its shards are allocated over the live nodes (all or nothing: InvalidRequest creates nothing).

        ``source="synthetic"`` stores each document once, as its typed field columns: no JSON
        ``_source`` in the translog or the segments; ``get`` rebuilds it (field order and
        number formatting may differ from what was sent; segments/synthetic.py).
        """
        if self._closed:
            raise ClusterClosed(f"create index [{name}]")
        name = check_index_name(name)
        shards, replicas, durability = check_create_args(shards, replicas, durability)
        source = check_source_mode(source)
        mapping = check_mapping(mappings)
        with self._lock:
            if name in self.indices:
                raise IndexAlreadyExists(name)
            live = self.live_nodes()
            if not live:
                raise IndexNotCreated(name, "no live data node to hold its shards")
            # every node of this cluster lives in this process: all or nothing, before anything is published
            check_file_budget(f"create index [{name}]", shards * (1 + min(replicas, len(live) - 1)))
            meta = IndexMeta(name=name, uuid=uuid.uuid4().hex, shards=shards, replicas=replicas,
                             mappings=mapping.to_dict(), durability=durability, strategy=PlainPathStrategy(),
                             routing=tuple(ShardRouting(s, live[s % len(live)], 1, (live[s % len(live)],),
                                                        (live[s % len(live)],)) for s in range(shards)),
                             data_cluster_uuid=self.cluster_uuid, source=source)
            # all or nothing: an index exists (takes writes) only once the cluster state holds it,
            # or Cluster.restore would lose every write acknowledged to it (issue 14, case 5)
            failure = self._try_publish(meta)
            if isinstance(failure, ClusterStateSuperseded):
                raise failure  # another cluster took the store over: not retryable, this one must stop
            if failure is not None:
                raise IndexNotCreated(name, f"its metadata was not committed to the cluster state "
                                            f"({type(failure).__name__}: {failure})") from failure
            self.indices[name] = meta
            for sr in meta.routing:
                node = self.nodes[sr.primary]
                node.copies[(meta.uuid, sr.shard)] = ShardCopy(self._spec(meta, sr.shard), node.data_dir, self.store,
                                                               primary_term=1, primary=True,
                                                               node_remote=node.remote)
            self._schedule_allocation()
        self.wait_for_allocation()  # empty shards: the replicas are there when create_index returns
        return self.indices[name]

    def primary_of(self, index: str, shard: int) -> str:
        """The node holding the shard's primary."""
        sr = self._meta(index).routing[shard]
        if sr.primary is None:
            raise ShardUnavailable(index, shard, "no primary")
        return sr.primary

    # -- documents (the document API is :class:`Documents`; this cluster is its router) --------

    def bulk(self, index: str, docs: pa.Table | Iterable[MappingABC[str, Any]]) -> BulkResult:
        """Index documents (a table with ``_id`` or dicts with ``_id``); per-item results and the acked ids."""
        return self.documents.bulk(index, docs)

    def index_doc(self, index: str, doc: MappingABC[str, Any], *, if_seq_no: int | None = None,
                  if_primary_term: int | None = None) -> BulkResult:
        """Index one document with optimistic concurrency (VersionConflict when seq#/term moved on)."""
        return self.documents.index_doc(index, doc, if_seq_no=if_seq_no, if_primary_term=if_primary_term)

    def delete(self, index: str, doc_id: str, *, if_seq_no: int | None = None,
               if_primary_term: int | None = None) -> BulkResult:
        """Delete one document (optionally only if its current seq# and term match)."""
        return self.documents.delete(index, doc_id, if_seq_no=if_seq_no, if_primary_term=if_primary_term)

    def get(self, index: str, doc_id: str) -> dict[str, Any] | None:
        """The document (realtime: from the primary, refreshed or not), or None."""
        return self.documents.get(index, doc_id)

    def index_meta(self, index: str) -> IndexMeta:
        """The index's metadata (IndexNotFound, ClusterClosed)."""
        return self._meta(index)

    def mapping_of(self, meta: IndexMeta) -> Mapping:
        """The index mapping of ``meta`` as a :class:`Mapping` (parsed once per mappings dict)."""
        cached = self._mapping_cache.get(meta.uuid)
        if cached is not None and cached[0] is meta.mappings:
            return cached[1]
        mapping = Mapping.from_dict(meta.mappings)
        self._mapping_cache[meta.uuid] = (meta.mappings, mapping)
        return mapping

    def commit_mapping(self, index: str, base: Mapping, proposed: Mapping) -> Mapping:
        """Publish ``proposed`` as the index mapping unless it moved on from ``base``; the index mapping after.

        Lock order: the mapping lock, then the cluster lock (one index-mapping update at a time).
        """
        with self._mapping_lock, self._lock:
            meta = self._meta(index)
            current = self.mapping_of(meta)
            if current != base:
                return current  # another bulk added fields meanwhile: the caller decides against those
            updated = replace(meta, mappings=proposed.to_dict())
            failure = self._try_publish(updated)
            if isinstance(failure, ClusterStateSuperseded):
                raise failure
            if failure is not None:
                raise MappingNotCommitted(index, [f for f in proposed if f not in current], failure) from failure
            self.indices[index] = updated
            return proposed

    def write_shard(self, meta: IndexMeta, shard: int, ops: pa.RecordBatch, expect: tuple | None,
                    mapping: Mapping | None, fields: pa.Table | None) -> pa.RecordBatch:
        """Send one shard's operations to its primary (``shard.bulk``); the stamped operations.

        Lock order: the node takes the shard lock (stage and replicate), then the cluster lock
        (briefly, to fail a replica); the cluster manager never takes a shard lock while it
        holds the cluster lock.
        """
        primary = self.primary_of(meta.name, shard)
        stamped = self.transport.send(MANAGER, primary, "shard.bulk",
                                      {"index_uuid": meta.uuid, "shard": shard, "ops": ops,
                                       "expect": expect, "mapping": mapping, "fields": fields})["ops"]
        self._note_acked(meta.uuid, shard, stamped)
        return stamped

    def _note_acked(self, index_uuid: str, shard: int, stamped: pa.RecordBatch) -> None:
        if stamped.num_rows:
            top = int(np.max(stamped.column("seq_no").to_numpy()))  # no compute call: one per part of a bulk
            with self._acked_lock:
                if top > self._acked_max.get((index_uuid, shard), -1):
                    self._acked_max[(index_uuid, shard)] = top

    def write_shards(self, meta: IndexMeta, parts: list[tuple[int, pa.RecordBatch, pa.Table | None]],
                     mapping: Mapping | None) -> list[pa.RecordBatch | BaseException]:
        """One bulk's parts, one ``shard.bulk_many`` per primary node (in parallel); per part the stamped
        operations or the error (engine/bulk_parts.py)."""
        out: list[pa.RecordBatch | BaseException | None] = [None] * len(parts)
        groups = group_by_node([p[0] for p in parts], lambda s: self.primary_of(meta.name, s))

        def send(node: str | None, positions: list[int]) -> None:
            if node is None or len(positions) == 1:
                for i in positions:
                    out[i] = self._one_part(meta, parts[i], mapping)
                return
            try:
                answer = self.transport.send(MANAGER, node, "shard.bulk_many", {"shards": [
                    {"index_uuid": meta.uuid, "shard": parts[i][0], "ops": parts[i][1], "mapping": mapping,
                     "fields": parts[i][2]} for i in positions]})["results"]
            except Exception as exc:  # noqa: BLE001 - the node is gone: each part on its own (or its error)
                for i in positions:  # applied nothing: sent again one by one; else reported, never sent twice
                    out[i] = self._one_part(meta, parts[i], mapping) if unsent(exc) else exc
                return
            take_answers(positions, answer, out, lambda i: self._one_part(meta, parts[i], mapping),
                         lambda i, ops: self._note_acked(meta.uuid, parts[i][0], ops))

        items = list(groups.items())
        if len(items) == 1:
            send(*items[0])
        else:
            self.run_parallel(lambda item: send(*item), items)
        return out  # type: ignore[return-value]

    def _one_part(self, meta: IndexMeta, part: tuple[int, pa.RecordBatch, pa.Table | None],
                  mapping: Mapping | None) -> pa.RecordBatch | BaseException:
        try:
            return self.write_shard(meta, part[0], part[1], None, mapping, part[2])
        except Exception as exc:  # noqa: BLE001 - reported for this part
            return exc

    def read_doc(self, meta: IndexMeta, shard: int, doc_id: str) -> dict[str, Any] | None:
        """The document from the shard's primary copy (realtime), or None."""
        return self._primary_copy(meta.name, shard).directory.get(doc_id)

    def run_parallel(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``[fn(x) for x in items]`` on the bulk writer threads (ClusterClosed once closed)."""
        try:
            return list(self._writers.map(fn, items))
        except RuntimeError as exc:  # the pool shut down: closed under the caller
            if not self._closed:
                raise
            raise ClusterClosed("bulk") from exc

    # -- reads ------------------------------------------------------------------------------

    def _primary_copy(self, index: str, shard: int) -> ShardCopy:
        meta = self._meta(index)
        node = self.nodes.get(self.primary_of(index, shard))
        copy = node.copies.get((meta.uuid, shard)) if node is not None else None
        if copy is None:
            raise ShardUnavailable(index, shard, f"its primary on {self.primary_of(index, shard)} is gone")
        return copy

    def refresh(self, index: str) -> None:
        """Make every copy's buffered documents searchable."""
        for shard in range(self._meta(index).shards):
            self._each_copy(index, shard, lambda copy: copy.refresh())

    def flush(self, index: str) -> None:
        """Commit every copy; primaries upload their commit and purge what it covers."""
        meta = self._meta(index)
        for shard in range(meta.shards):
            with self._shard_lock((meta.uuid, shard)):
                self._each_copy(index, shard, lambda copy: copy.flush())

    def _routed_copies(self, index: str, shard: int) -> dict[str, ShardCopy]:
        """The shard's copies as routed now (read under the cluster lock), by node; copies already closed left out."""
        with self._lock:
            meta = self._meta(index)
            key = (meta.uuid, shard)
            out = {}
            for n in meta.routing[shard].copies:
                copy = self.nodes[n].copies.get(key) if n in self.nodes else None
                if copy is not None:
                    out[n] = copy
            return out

    def _each_copy(self, index: str, shard: int, action: Callable[[ShardCopy], Any]) -> None:
        """Run ``action`` on every copy of the shard, following the routing as copies fail meanwhile.

        A copy failed or killed concurrently (a write failing a replica, ``kill_node``) is skipped:
        it is no longer routed and is rebuilt.  The routing is read again after each copy, so a
        copy promoted or added meanwhile is not missed.  An error of a copy still routed is raised
        (issue 14, case 4).
        """
        done: list[ShardCopy] = []  # by identity: a copy rebuilt on the same node is a new object
        while True:
            pending = [(n, c) for n, c in self._routed_copies(index, shard).items()
                       if not any(c is d for d in done)]
            if not pending:
                return
            node, copy = pending[0]
            try:
                action(copy)
            except LocalDiskError as exc:
                if self._fail_copy((self._meta(index).uuid, shard), node, copy, str(exc)):
                    raise  # the primary: what it did not finish is retried on the promoted copy
            except Exception:
                if self._routed_copies(index, shard).get(node) is copy:
                    raise
                log.info("%s/%d: copy on %s failed during the operation and was skipped", index, shard, node)
            done.append(copy)

    def count(self, index: str) -> int:
        """Searchable (refreshed) live documents, over the primaries."""
        meta = self._meta(index)
        return sum(self._primary_copy(index, sr.shard).directory.count() for sr in meta.routing)

    def scan(self, index: str, columns: list[str] | None = None) -> pa.Table:
        """Every searchable live document of the index's primaries as one table."""
        meta = self._meta(index)
        tables = []
        for sr in meta.routing:
            copy = self._primary_copy(index, sr.shard)
            tables.append(pa.Table.from_batches(list(copy.directory.scan(columns=columns)),
                                                schema=None) if copy.directory.count() else None)
        tables = [t for t in tables if t is not None]
        return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node (state not committed or in the translog is lost)."""
        with self._lock:
            self._closed = True
            self.promotions.close()
        self._allocation.close()
        self._writers.shutdown(wait=True)
        for name in self.managers.master_names:
            if self.transport.is_registered(name):
                self.managers.stop(name)
        self.managers.await_purges()  # none still deleting when the next cluster reads the store
        for name in list(self.nodes):
            if self.transport.is_registered(name):
                self.transport.unregister(name)
            self.nodes[name].close()
        self._dir_lock.release()

    def _restore_shards(self, state) -> list[str]:
        """Allocate every index of ``state`` from the blob store (a restore); returns their names."""
        restored = []
        live = self.live_nodes()
        for name in sorted(state.indices):
            meta = from_index_metadata(state.indices[name], self.cluster_uuid)
            if name in self.indices:
                continue
            routing = []
            for sr in meta.routing:
                target = live[sr.shard % len(live)]
                node = self.nodes[target]
                spec = self._spec(meta, sr.shard)
                term = next_free_term(self.store, spec.address, at_least=sr.primary_term)
                copy = ShardCopy.recover_from_remote(spec, node.data_dir, self.store, primary_term=term,
                                                     known_term=sr.primary_term, index_name=name,
                                                     accept_data_loss=self._accept_data_loss,
                                                     node_remote=node.remote)
                node.copies[(meta.uuid, sr.shard)] = copy
                if copy.restore_loss is not None:
                    self.restore_losses.append(copy.restore_loss)
                routing.append(ShardRouting(sr.shard, target, term, (target,), (target,)))
            meta = with_shard_fields(meta, self.mapping_of(meta),
                                     [self.nodes[r.primary].copies[(meta.uuid, r.shard)].directory.mapping
                                      for r in routing if r.primary is not None])
            self.indices[name] = meta.with_all_routing(tuple(routing))
            self._publish(self.indices[name])
            restored.append(name)
        if restored:
            log.info("restored %d indices from %s: %s", len(restored), self.store.location, restored)
            self._schedule_allocation()
        return restored

    @classmethod
    def restore(cls, store: str | BlobStore, data_dir: str, nodes: int = 3, *, recovery_delay: float = 1.0,
                accept_data_loss: bool = False, index_buffer_bytes: int = INDEX_BUFFER_BYTES,
                **store_options: Any) -> Cluster:
        """A new cluster on empty disks from the blob store alone (every index, every shard).

        The cluster managers bootstrap from the latest valid cluster state in the store
        (a new cluster UUID chained to it, seed 000); every index is then recovered from
        the remote segment store and translog.  NoClusterState if the store holds none.
        RestoreDataLoss if a lost or corrupt blob means acknowledged operations cannot come
        back (it names the shard, the seq# ranges and the blobs); with ``accept_data_loss``
        the rest is restored and ``restore_losses`` lists what was dropped.
        """
        cluster = cls(store, data_dir, nodes, recovery_delay=recovery_delay, accept_data_loss=accept_data_loss,
                      index_buffer_bytes=index_buffer_bytes, **store_options)
        state = cluster.cluster_state()
        if state is None or state.coordination.term == 0 or not (cluster.restored_indices or state.indices):
            location = cluster.store.location
            cluster.close()
            raise NoClusterState(location, "nothing to restore: the store holds no cluster state with indices")
        return cluster
