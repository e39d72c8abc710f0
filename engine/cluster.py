"""The embedded cluster: the production node roles, N of them in this process (issue 42).

``Cluster(store=url, data_dir=..., nodes=3)`` starts data nodes ``node-0..`` and dedicated managers ``cm-0..``
(``cluster_managers=0``: every node holds every role), each the very ``NodeProcess`` a ``shardstore node`` runs,
over one in-process transport and one blob store.  It *is* the network ``Client`` over that transport, so a write
takes a deployed cluster's path; no role is implemented twice.  It adds what only an in-process launcher offers:
node control as ``ProcessCluster`` drives processes (kill, stop, restart, pause, partitions through
``net/local_faults.py``), ``kill_node``/``start_node`` that wait for the manager to act, reads of the live roles,
and :meth:`restore`.  docs/design/engine.md, "One set of roles, launched two ways".
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

import shardstore.engine.errors as err
from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NoClusterState
from shardstore.engine.client import RETRY_WAIT, Client, serve_in_process
from shardstore.engine.coordinator.role import FAILOVER_WAIT
from shardstore.engine.manager.metadata import IndexMeta
from shardstore.engine.manager.role import ManagerRole
from shardstore.engine.manager.translog_gc import COLLECT_EVERY, GRACE_SECONDS
from shardstore.engine.node.data_role import NodeService
from shardstore.engine.node.datadir import DataDirLock
from shardstore.engine.node.fault_detection import FaultDetectionSettings
from shardstore.engine.node.process import ROLES, NodeProcess, NodeSettings
from shardstore.engine.shard.restore_check import ShardLoss
from shardstore.engine.shard.shard_copy import ShardCopy
from shardstore.net.local_faults import LocalFaults
from shardstore.net.local_link import LocalLink
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.transport import Transport

log = logging.getLogger(__name__)
#: how long the constructor waits for the first election and for a restore to bring every shard back
START_TIMEOUT = 120.0
#: how long ``kill_node`` / ``start_node`` wait for the manager to act on it
SETTLE_TIMEOUT = 30.0
#: fault detection of embedded nodes: checks (and election timers) every 0.1 s, so a killed node is out at once and
#: a manager elected within a few tenths; a silent peer after 3 * (0.1 + 1.0) s (a check's 1 s outlasts a loaded host)
EMBEDDED_FD = FaultDetectionSettings(interval=0.1, timeout=1.0, retries=3)


class Cluster(Client):
    """N production node roles in this process behind the document API (see the module docstring)."""

    def __init__(self, store: str | BlobStore, data_dir: str = "./shardstore-data", nodes: int = 3, *,
                 cluster_managers: int = 3, names: list[str] | None = None, transport: Transport | None = None,
                 recovery_delay: float = 1.0, accept_data_loss: bool = False,
                 index_buffer_bytes: int = INDEX_BUFFER_BYTES, fault_detection: FaultDetectionSettings = EMBEDDED_FD,
                 ready_wait: float = 10.0, failover_wait: float = FAILOVER_WAIT, request_timeout: float = 30.0,
                 retry_wait: float = RETRY_WAIT, translog_gc_grace: float = GRACE_SECONDS,
                 translog_gc_every: float = COLLECT_EVERY, **store_options: Any) -> None:
        """Start the nodes (on a store holding a cluster state: restore it); returns once a manager is elected."""
        if nodes < 1 or cluster_managers < 0 or recovery_delay < 0 or store is None:
            raise err.InvalidRequest(f"a cluster needs a store, nodes >= 1, cluster_managers >= 0 and recovery_delay "
                                 f">= 0, got {store=}, {nodes=}, {cluster_managers=}, {recovery_delay=}")
        if store_options and not isinstance(store, str):
            raise err.InvalidRequest(f"store options {sorted(store_options)} apply to a URL, not to a {type(store).__name__}")
        data = list(names) if names is not None else [f"node-{i}" for i in range(nodes)]
        if len(data) != nodes or len(set(data)) != nodes:
            raise err.InvalidRequest(f"{nodes} nodes need {nodes} distinct names, got {data}")
        self.data_dir, self.recovery_delay, self.fd = data_dir, recovery_delay, fault_detection
        self.managers = [f"cm-{i}" for i in range(cluster_managers)]
        self.names = data + self.managers
        self._options = dict(index_buffer_bytes=index_buffer_bytes, accept_data_loss=accept_data_loss,
                             request_timeout=request_timeout, failover_wait=failover_wait,
                             translog_gc_grace=translog_gc_grace, translog_gc_every=translog_gc_every)
        self._dir_lock = DataDirLock(data_dir)  # before the store: a second cluster on this dir writes nothing
        self._closed = False
        #: each running node's roles, by name
        self.processes: dict[str, NodeProcess] = {}
        self._links: dict[str, LocalLink] = {}
        try:
            self.store = open_store(store, **store_options) if isinstance(store, str) else store
            self.transport = transport or Transport()
            #: pauses and partitions by node name (``pause``, ``resume``, ``cut``, ``isolate``, ``split``, ``heal``)
            self.faults = LocalFaults(self.transport, lambda: self.names)
            for name in self.names:
                self._start(name)
            super().__init__(self.names, transport=LocalLink(self.transport, default_timeout=60.0),
                             ready_wait=START_TIMEOUT)
            state = self._started()
            self.ready_wait = ready_wait  # from now on an election is waited out this long
            self.retry_wait = retry_wait  # a write whose answer was lost is sent again this long (engine/client.py)
            self._cluster_uuid = state.cluster_uuid
            serve_in_process(self.store.location, self)  # a Spark job of this process writes through it
            #: indices found in the cluster state at start (a restore): their shards came from the store
            self.restored_indices = sorted(state.indices)
            for loss in self.restore_losses:
                log.error("restore accepted a data loss: %s", loss)
        except BaseException:
            self.close()
            raise

    def _start(self, name: str) -> None:
        roles, eligible = (ROLES, self.names) if not self.managers else (
            frozenset({"cluster_manager"} if name in self.managers else {"data"}), self.managers)
        settings = NodeSettings(name=name, data_dir=os.path.join(self.data_dir, name), store="embedded", listen=name,
                                seed_hosts=tuple(n for n in self.names if n != name), initial_managers=tuple(eligible),
                                roles=roles, fault_detection=self.fd, recovery_delay=self.recovery_delay,
                                nodes_per_process=len(self.names), **self._options)
        link = LocalLink(self.transport, default_timeout=settings.request_timeout,
                         action_timeouts=settings.action_timeouts())
        self.processes[name], self._links[name] = NodeProcess(settings, transport=link, store=self.store), link

    def _started(self) -> Any:
        """Wait for a manager and, on a restore, for every shard to come back; the applied cluster state."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            manager = self.manager()
            lost = [e for e in manager.store_failures() if isinstance(e, err.RestoreDataLoss)] if manager else []
            if lost:  # a rebuild from the store refused: acknowledged operations are gone
                raise err.RestoreDataLoss([loss for exc in lost for loss in exc.losses])
            try:
                if manager is not None and manager.coordination.applied is not None and self.health().settled:
                    return manager.coordination.applied
            except err.NodeNotReady:  # an election meanwhile: waited out
                pass
            if time.monotonic() > deadline:
                raise err.HealthTimeout(f"no manager, or shards not back from the store, after {START_TIMEOUT}s")
            time.sleep(0.02)

    def _call(self, action: str, request: dict[str, Any], timeout: float | None = None) -> Any:
        if self._closed:
            raise err.ClusterClosed(f"{action} on a closed cluster")
        return super()._call(action, request, timeout)

    # -- the live roles -----------------------------------------------------------------------------

    def manager(self) -> ManagerRole | None:
        """The elected cluster manager's role (None between managers)."""
        return next((p.manager for p in list(self.processes.values()) if p.manager.active), None)

    def cluster_state(self) -> Any:
        """The cluster state the elected cluster manager last applied (None while there is none)."""
        manager = self.manager()
        return manager.coordination.applied if manager is not None else None

    @property
    def cluster_uuid(self) -> str:
        """This cluster's UUID (a restore chains a new one to the store's last), as its manager last applied it."""
        self._cluster_uuid = getattr(self.cluster_state(), "cluster_uuid", self._cluster_uuid)
        return self._cluster_uuid

    @property
    def indices(self) -> dict[str, IndexMeta]:
        """The elected manager's index metadata and routing, by name (a snapshot)."""
        manager = self.manager()
        return dict(manager.indices) if manager is not None else {}

    @property
    def nodes(self) -> dict[str, NodeService]:
        """Each live data node's data role (its shard copies), by name."""
        return {name: proc.node for name, proc in list(self.processes.items()) if proc.node.data}

    @property
    def restore_losses(self) -> list[ShardLoss]:
        """What a restore with ``accept_data_loss=True`` dropped, per shard (else it refuses)."""
        return [c.restore_loss for n in self.nodes.values() for c in list(n.copies.values()) if c.restore_loss]

    def index_meta(self, index: str) -> IndexMeta:
        """The index's metadata as the elected manager holds it (err.IndexNotFound, err.ClusterClosed)."""
        if self._closed:
            raise err.ClusterClosed(f"index [{index}]")
        if (meta := self.indices.get(index)) is None:
            raise err.IndexNotFound(index)
        return meta

    def primary_copy(self, index: str, shard: int) -> ShardCopy:
        """The shard's primary copy object (in-process access for tests and benches)."""
        uuid, node = self.index_meta(index).uuid, self.primary_of(index, shard)
        copy = self.nodes[node].copies.get((uuid, shard)) if node in self.nodes else None
        if copy is None:
            raise err.ShardUnavailable(index, shard, f"no primary copy (routed to {node})")
        return copy

    # -- nodes --------------------------------------------------------------------------------------

    def live(self) -> list[str]:
        """Names of the nodes whose roles run (managers included)."""
        return [n for n in self.names if n in self.processes]

    def live_nodes(self) -> list[str]:
        """Names of the data nodes whose roles run."""
        return [n for n in self.live() if n not in self.managers]

    def kill(self, name: str) -> None:
        """As a SIGKILL: no message from or to the node from now on, then its roles stop without a flush."""
        node, link = self.processes.pop(name, None), self._links.pop(name, None)
        if link is not None:
            link.sever()  # before the resume: a paused node handles nothing of what its pause held
            self.faults.dead(name)
        self.faults.resume(name)
        if node is not None:
            node.shutdown(clean=False)

    def stop(self, name: str, timeout: float = 60.0) -> int:
        """A clean shutdown (flush the primaries, leave the cluster); 0 as a process's exit status."""
        node = self.processes.pop(name, None)
        self._links.pop(name, None)
        self.faults.resume(name)
        if node is not None:
            node.shutdown(clean=True)
        return 0

    def restart(self, name: str) -> None:
        """The node's roles again on its data directory (a new member, as a restarted process)."""
        if name in self.processes:
            raise err.InvalidRequest(f"node {name} is running; stop or kill it first")
        self.faults.revived(name)
        self._start(name)

    def kill_node(self, name: str, wipe_disk: bool = False) -> None:
        """:meth:`kill` (optionally losing the disk), then wait until the manager removed the node and failed
        its primaries over (or left them red with a cause), as a client of a deployed cluster would wait."""
        if name not in self.names:
            raise err.NodeNotFound(name)
        self.kill(name)
        if wipe_disk:
            shutil.rmtree(os.path.join(self.data_dir, name), ignore_errors=True)
        self._settle(lambda m: m.name != name and name not in m.members and m.failed_over(name))

    def start_node(self, name: str) -> None:
        """Start a stopped node's roles again on its data directory; returns once it joined the cluster."""
        if name not in self.names:
            raise err.NodeNotFound(name)
        if name not in self.processes:
            self.restart(name)
            self._settle(lambda m: name in m.members, leaderless=SETTLE_TIMEOUT)  # it may restore a quorum

    def _settle(self, done: Any, leaderless: float | None = None) -> bool:
        """Wait until ``done(elected manager)`` holds (False after SETTLE_TIMEOUT: the caller sees what is)."""
        deadline = since = time.monotonic()
        deadline += SETTLE_TIMEOUT
        leaderless = 2 * self.fd.worst_case_seconds if leaderless is None else leaderless
        while time.monotonic() < deadline and not self._closed:
            if (manager := self.manager()) is not None:
                since = time.monotonic()
                if done(manager):
                    return True
            elif time.monotonic() - since > leaderless or not self._quorum_runs() and not any(
                    p.cm.master for p in list(self.processes.values())):  # nothing will act, and every node knows
                return False
            time.sleep(0.01)
        return False

    def _quorum_runs(self) -> bool:
        """Whether a majority of the cluster-manager-eligible nodes runs (else no manager can be elected)."""
        eligible = self.managers or self.names
        return 2 * len([n for n in eligible if n in self.processes]) > len(eligible)

    def clear_faults(self) -> None:
        """Remove every fault a caller injected on :attr:`transport` (drops, delays, hooks, partitions)."""
        self.faults.clear_faults()

    def client(self, names: list[str] | None = None, **options: Any) -> Client:
        """Another client, of every node (stopped ones are skipped at each call) or of ``names`` only."""
        return Client(names or self.names, transport=LocalLink(self.transport,
                                                               default_timeout=options.pop("timeout", 60.0)), **options)

    def call(self, name: str, action: str, request: Any, timeout: float = 30.0) -> Any:
        """Send one action straight to node ``name`` (what a stale router or a peer would send)."""
        return self.transport.send("test", name, action, request, timeout=timeout)

    # -- lifecycle ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node as a SIGKILL would (state neither committed nor in the translog is lost); idempotent."""
        if getattr(self, "_stopped", False):
            return
        self._stopped = self._closed = True
        if getattr(self, "_transport", None) is not None:
            serve_in_process(self.store.location, self, running=False)
            super().close()
        for node in list(getattr(self, "processes", {}).values()):  # every loop ends before any node stops
            node.stop_deciding()
        for name in list(getattr(self, "processes", {})):
            try:
                self.kill(name)
            except Exception:  # noqa: BLE001 - best effort at teardown
                log.warning("stopping node %s", name, exc_info=True)
        self._dir_lock.release()

    @classmethod
    def restore(cls, store: str | BlobStore, data_dir: str, nodes: int = 3, **options: Any) -> Cluster:
        """A new cluster on empty disks from the blob store alone: the manager bootstraps from the store's last
        cluster state and rebuilds every shard (NoClusterState; RestoreDataLoss naming shard, seq# ranges, blobs)."""
        cluster = cls(store, data_dir, nodes, **options)
        if not cluster.restored_indices:
            cluster.close()
            raise NoClusterState(cluster.store.location, "nothing to restore: the store holds no cluster state "
                                 "with indices")
        return cluster
