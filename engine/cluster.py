"""The embedded cluster: the production node roles, N of them in this process (issue 42).

``Cluster(store=url, data_dir=..., nodes=3)`` is a thin launcher.  It starts data nodes
``node-0..`` and dedicated cluster-manager nodes ``cm-0..cm-2`` (``cluster_managers``) as
:class:`~shardstore.engine.embedded.EmbeddedNodes`: each one the very
:class:`~shardstore.engine.node.process.NodeProcess` a ``shardstore node`` process runs
(data node, cluster-manager-eligible, coordinator, fault detection, elections), over one
in-process :class:`~shardstore.transport.Transport` and one blob store.  Its document API
is the network :class:`~shardstore.engine.client.Client` over that transport, so a write
takes the path a deployed cluster's does: coordinator, primary, replicas; promotion,
allocation, peer recovery and rebuilds from the store are the manager role's
(:mod:`~shardstore.engine.manager.role`).  There is no second implementation of any of them.

What this module adds is what only an in-process launcher can offer:

- node control: :meth:`kill_node` (a SIGKILL: no flush, optionally the disk wiped),
  :meth:`start_node` (the node's roles again on its data directory);
- fault injection on :attr:`transport` (drops, delays, hooks, partitions by node name);
- reads of the live roles for tests and benches: :attr:`indices` (the elected manager's
  routing), :attr:`nodes` (each live node's :class:`~shardstore.engine.node.data_role.NodeService`),
  :meth:`primary_copy`, :meth:`cluster_state`;
- :meth:`restore`: a new cluster on empty disks from the blob store alone, which returns
  once every shard is back or raises :class:`~shardstore.engine.errors.RestoreDataLoss`.

See docs/design/engine.md, "One set of roles, launched two ways".
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from collections.abc import Mapping as MappingABC
from typing import Any

import pyarrow as pa

from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NoClusterState
from shardstore.engine.coordinator.documents import BulkResult
from shardstore.engine.embedded import EMBEDDED_FD, EmbeddedNodes
from shardstore.engine.errors import (
    ClusterClosed,
    HealthTimeout,
    IndexNotFound,
    InvalidRequest,
    NodeNotFound,
    NodeNotReady,
    RestoreDataLoss,
    ShardUnavailable,
)
from shardstore.engine.manager.allocation import ClusterHealth
from shardstore.engine.manager.metadata import IndexMeta
from shardstore.engine.manager.role import ManagerRole
from shardstore.engine.node.data_role import NodeService
from shardstore.engine.node.datadir import DataDirLock
from shardstore.engine.node.fault_detection import FaultDetectionSettings
from shardstore.engine.shard.restore_check import ShardLoss
from shardstore.engine.shard.shard_copy import ShardCopy
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.transport import Transport

log = logging.getLogger(__name__)
__all__ = ["BulkResult", "Cluster"]  # BulkResult lives in documents.py; imported from here too
#: how long the constructor waits for the first election and for a restore to bring every shard back
START_TIMEOUT = 120.0
#: how long ``kill_node`` / ``start_node`` wait for the manager to act on it
SETTLE_TIMEOUT = 30.0
#: how long a call waits for a cluster manager to be elected before it raises (NodeNotReady)
READY_WAIT = 10.0


def _failed_over(manager: ManagerRole, name: str) -> bool:
    """No shard is routed to ``name`` as its primary, and none waits for a promotion still under way."""
    return all(sr.primary != name and manager.settled(meta.name, sr.shard)
               for meta in list(manager.indices.values()) for sr in meta.routing)


class Cluster:
    """N production node roles in this process behind the document API (see the module docstring).

    On empty data directories over a store that already holds a cluster state, the elected
    manager restores it and rebuilds every shard from the store, as :meth:`restore` does.
    """

    def __init__(self, store: str | BlobStore, data_dir: str = "./shardstore-data", nodes: int = 3,
                 *, cluster_managers: int = 3, transport: Transport | None = None, recovery_delay: float = 1.0,
                 accept_data_loss: bool = False, index_buffer_bytes: int = INDEX_BUFFER_BYTES,
                 fault_detection: FaultDetectionSettings = EMBEDDED_FD, **store_options: Any) -> None:
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
        self.index_buffer_bytes = index_buffer_bytes
        self.data_dir = data_dir
        self._dir_lock = DataDirLock(data_dir)  # before the store: a second cluster on this dir writes nothing
        self._closed = False
        self._launcher: EmbeddedNodes | None = None
        try:
            self.store = open_store(store, **store_options) if isinstance(store, str) else store
            self._launcher = EmbeddedNodes(data_dir, self.store, nodes, names=[f"node-{i}" for i in range(nodes)],
                                           managers=cluster_managers,
                                           fd=fault_detection, recovery_delay=recovery_delay,
                                           transport=transport, index_buffer_bytes=index_buffer_bytes,
                                           accept_data_loss=accept_data_loss)
            self.transport = self._launcher.transport
            self._client = self._launcher.client(timeout=60.0, ready_wait=START_TIMEOUT)
            state = self._started()
            self._cluster_uuid = state.cluster_uuid
            self._client.ready_wait = READY_WAIT  # from now on an election is waited out this long
            #: indices found in the cluster state at start (a restore): their shards came from the store
            self.restored_indices = sorted(state.indices)
            for loss in self.restore_losses:
                log.error("restore accepted a data loss: %s", loss)
        except BaseException:
            self.close()
            raise

    def _started(self) -> Any:
        """Wait for the first manager and, on a restore, for every shard to come back; the applied state."""
        deadline = time.monotonic() + START_TIMEOUT
        self._client.health()  # waits out the first election (NodeNotReady) for up to START_TIMEOUT
        while (state := self.cluster_state()) is None or self.manager() is None:
            if time.monotonic() > deadline:
                raise HealthTimeout(f"no cluster manager elected after {START_TIMEOUT}s")
            time.sleep(0.02)
        if state.indices:  # a restore: every shard is rebuilt from the store, or refuses (RestoreDataLoss)
            while True:
                manager = self.manager()
                failures = manager.store_failures() if manager is not None else []
                losses = [exc for exc in failures if isinstance(exc, RestoreDataLoss)]
                if losses:
                    raise RestoreDataLoss([loss for exc in losses for loss in exc.losses])
                try:
                    health: Any = self.health()
                    if health.status != "red":
                        break
                except NodeNotReady as exc:  # a new election meanwhile: waited out
                    health = exc
                if time.monotonic() > deadline:
                    raise HealthTimeout(f"restore: shards still red after {START_TIMEOUT}s: {health}")
                time.sleep(0.02)
            self.wait_for_allocation()
        return state

    # -- the live roles -----------------------------------------------------------------------------

    def manager(self) -> ManagerRole | None:
        """The elected cluster manager's role (None between managers)."""
        for proc in self._launcher.nodes.copy().values() if self._launcher else ():
            if proc.manager.active:
                return proc.manager
        return None

    def manager_node(self) -> str | None:
        """The elected cluster manager's node name (None between managers)."""
        manager = self.manager()
        return manager.name if manager is not None else None

    def cluster_state(self) -> Any:
        """The cluster state the elected cluster manager last applied (None while there is none)."""
        manager = self.manager()
        return manager.coordination.applied if manager is not None else None

    @property
    def cluster_uuid(self) -> str:
        """This cluster's UUID (a restore chains a new one to the store's last), as its manager last applied it."""
        state = self.cluster_state()
        if state is not None:
            self._cluster_uuid = state.cluster_uuid
        return self._cluster_uuid

    @property
    def indices(self) -> dict[str, IndexMeta]:
        """The elected manager's index metadata and routing, by name (a snapshot)."""
        manager = self.manager()
        return dict(manager.indices) if manager is not None else {}

    @property
    def nodes(self) -> dict[str, NodeService]:
        """Each live data node's data role (its shard copies), by name."""
        return {name: proc.node for name, proc in self._launcher.nodes.copy().items() if proc.node.data}

    @property
    def restore_losses(self) -> list[ShardLoss]:
        """What a restore with ``accept_data_loss=True`` dropped, per shard (else it refuses)."""
        return [c.restore_loss for n in self.nodes.values() for c in list(n.copies.values())
                if c.restore_loss is not None]

    def index_meta(self, index: str) -> IndexMeta:
        """The index's metadata as the elected manager holds it (IndexNotFound, ClusterClosed)."""
        if self._closed:
            raise ClusterClosed(f"index [{index}]")
        meta = self.indices.get(index)
        if meta is None:
            raise IndexNotFound(index)
        return meta

    def primary_copy(self, index: str, shard: int) -> ShardCopy:
        """The shard's primary copy object (in-process access for tests and benches)."""
        meta = self.index_meta(index)
        node = self.primary_of(index, shard)
        copy = self.nodes[node].copies.get((meta.uuid, shard)) if node in self.nodes else None
        if copy is None:
            raise ShardUnavailable(index, shard, f"its primary on {node} is gone")
        return copy

    # -- nodes --------------------------------------------------------------------------------------

    def live_nodes(self) -> list[str]:
        """Names of the data nodes whose roles run."""
        return [n for n in self._launcher.live() if n not in self._launcher.managers]

    def start_node(self, name: str) -> None:
        """Start a stopped node's roles again on its data directory; returns once it joined the cluster."""
        if name not in self._launcher.names:
            raise NodeNotFound(name)
        if name not in self._launcher.nodes:
            self._launcher.restart(name)
            self._settle(lambda m: name in m.members, leaderless=SETTLE_TIMEOUT)  # it may be what restores a quorum

    def kill_node(self, name: str, wipe_disk: bool = False) -> None:
        """Stop a node abruptly, as a SIGKILL (optionally losing its disk).

        Returns once fault detection found it gone and the manager failed its primaries over
        (or left them red with a cause), as a client of a deployed cluster would wait.
        """
        if name not in self._launcher.names:
            raise NodeNotFound(name)
        self._launcher.kill(name)
        if wipe_disk:
            shutil.rmtree(os.path.join(self.data_dir, name), ignore_errors=True)
        self._settle(lambda m: m.name != name and name not in m.members and _failed_over(m, name))

    def _settle(self, done: Any, timeout: float = SETTLE_TIMEOUT, leaderless: float | None = None) -> bool:
        """Wait until ``done(elected manager)`` holds (False after ``timeout``: the caller sees what is)."""
        deadline = time.monotonic() + timeout
        if leaderless is None:  # no quorum of managers: nothing will act
            leaderless = 2 * self._launcher.fd.worst_case_seconds
        since = time.monotonic()
        while time.monotonic() < deadline and not self._closed:
            manager = self.manager()
            if manager is not None:
                since = time.monotonic()
                if done(manager):  # ManagerRole.settled takes the manager's lock itself
                    return True
            elif time.monotonic() - since > leaderless:
                return False
            time.sleep(0.01)
        return False

    def clear_faults(self) -> None:
        """Remove every fault injected on :attr:`transport` (drops, delays, hooks, partitions)."""
        self._launcher.clear_faults()

    # -- the document API (the client's) ------------------------------------------------------------

    def _live_client(self) -> Any:
        if self._closed:
            raise ClusterClosed("the cluster is closed")
        return self._client

    def create_index(self, name: str, shards: int = 1, replicas: int = 1, mappings: dict | None = None,
                     durability: str = "request", source: str = "stored") -> IndexMeta:
        """Create an index; returns once its primaries and the replicas the live nodes can hold are in sync."""
        self._live_client().create_index(name, shards=shards, replicas=replicas, mappings=mappings,
                                         durability=durability, source=source)
        self.wait_for_allocation()
        return self.index_meta(name)

    def bulk(self, index: str, docs: pa.Table | Iterable[MappingABC[str, Any]]) -> BulkResult:
        """Index documents (a table with ``_id`` or dicts with ``_id``); per-item results and the acked ids."""
        return self._live_client().bulk(index, docs)

    def index_doc(self, index: str, doc: MappingABC[str, Any], *, if_seq_no: int | None = None,
                  if_primary_term: int | None = None) -> BulkResult:
        """Index one document with optimistic concurrency (VersionConflict when seq#/term moved on)."""
        return self._live_client().index_doc(index, doc, if_seq_no=if_seq_no, if_primary_term=if_primary_term)

    def delete(self, index: str, doc_id: str, *, if_seq_no: int | None = None,
               if_primary_term: int | None = None) -> BulkResult:
        """Delete one document (optionally only if its current seq# and term match)."""
        return self._live_client().delete(index, doc_id, if_seq_no=if_seq_no, if_primary_term=if_primary_term)

    def get(self, index: str, doc_id: str) -> dict[str, Any] | None:
        """The document (realtime: from the primary, refreshed or not), or None."""
        return self._live_client().get(index, doc_id)

    def refresh(self, index: str) -> None:
        """Make every copy's buffered documents searchable."""
        self._live_client().refresh(index)

    def flush(self, index: str) -> None:
        """Commit every copy; primaries upload their commit and purge what it covers."""
        self._live_client().flush(index)

    def count(self, index: str) -> int:
        """Searchable (refreshed) live documents, over the primaries."""
        return self._live_client().count(index)

    def scan(self, index: str, columns: list[str] | None = None) -> pa.Table:
        """Every searchable live document of the index's primaries as one table."""
        return self._live_client().scan(index, columns=columns)

    def primary_of(self, index: str, shard: int) -> str:
        """The node holding the shard's primary (ShardUnavailable while it has none)."""
        node = self._live_client().primary_of(index, shard)
        if node is None:
            raise ShardUnavailable(index, shard, "no primary")
        return node

    def health(self) -> ClusterHealth:
        """Green (every wanted copy in sync), yellow (a replica missing or recovering) or red (no primary)."""
        return self._live_client().health()

    def wait_for_health(self, status: str = "green", timeout: float = 120.0) -> ClusterHealth:
        """Block until health is at least ``status``; HealthTimeout at once when too few nodes live for green."""
        rank = {"red": 0, "yellow": 1, "green": 2}
        if status not in rank or status == "red":
            raise InvalidRequest(f"wait_for_health status must be 'yellow' or 'green', not {status!r}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                h = self.health()
            except NodeNotReady as exc:  # an election: waited out
                if time.monotonic() >= deadline:
                    raise HealthTimeout(f"cluster health is unknown, not {status}, after {timeout}s: {exc}") from exc
                time.sleep(0.05)
                continue
            if rank[h.status] >= rank[status]:
                return h
            if time.monotonic() >= deadline:
                raise HealthTimeout(f"cluster health is {h.status}, not {status}, after {timeout}s: {h}")
            live = len(self.live_nodes())
            if (status == "green" and h.status == "yellow" and not h.initializing_shards
                    and any(m.replicas + 1 > live for m in self.indices.values())):
                raise HealthTimeout(f"cluster health is yellow and no recovery can make it green (live nodes "
                                    f"{self.live_nodes()}): {h}")
            time.sleep(0.01)

    def wait_for_allocation(self, timeout: float = 120.0) -> None:
        """Block until every shard has a primary and the replicas the live nodes can hold (HealthTimeout)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            live = len(self.live_nodes())
            if h.status == "green" or (h.status == "yellow" and not h.initializing_shards and all(
                    len(sr.in_sync) >= min(m.replicas + 1, live) for m in self.indices.values() for sr in m.routing)):
                return
            if time.monotonic() >= deadline:
                raise HealthTimeout(f"replica recoveries still running after {timeout}s: {h}")
            time.sleep(0.01)

    # -- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node as a SIGKILL would (state neither committed nor in the translog is lost); idempotent."""
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        self._closed = True
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()
        if self._launcher is not None:
            self._launcher.close()
        self._dir_lock.release()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def restore(cls, store: str | BlobStore, data_dir: str, nodes: int = 3, *, recovery_delay: float = 1.0,
                accept_data_loss: bool = False, index_buffer_bytes: int = INDEX_BUFFER_BYTES,
                **store_options: Any) -> Cluster:
        """A new cluster on empty disks from the blob store alone (every index, every shard).

        The elected manager bootstraps from the latest valid cluster state in the store (a
        new cluster UUID chained to it) and rebuilds every shard from the remote segment
        store and translog.  NoClusterState if the store holds none.  RestoreDataLoss if a
        lost or corrupt blob means acknowledged operations cannot come back (it names the
        shard, the seq# ranges and the blobs); with ``accept_data_loss`` the rest is
        restored and ``restore_losses`` lists what was dropped.
        """
        cluster = cls(store, data_dir, nodes, recovery_delay=recovery_delay, accept_data_loss=accept_data_loss,
                      index_buffer_bytes=index_buffer_bytes, **store_options)
        if not cluster.restored_indices:
            location = cluster.store.location
            cluster.close()
            raise NoClusterState(location, "nothing to restore: the store holds no cluster state with indices")
        return cluster
