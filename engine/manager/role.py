"""The cluster-manager role of a node process: allocation, promotion and publication (issue 29).

Active only on the elected cluster-manager node (the coordination layer,
:mod:`shardstore.cluster_state.coordination`, elects it over the transport).  It keeps
the index metadata (:class:`~shardstore.engine.manager.metadata.IndexMeta`: per shard the primary
term, the copies and the in-sync set) and the membership (the data nodes that joined and
still answer the follower checks, :mod:`~shardstore.engine.node.fault_detection`).  It reaches
copies only through the data role's actions (:mod:`~shardstore.engine.node.data_role`) and
publishes every change of an index through the coordination layer before it acts on it
(docs/design/transport.md, "Actions"; docs/design/engine.md, invariants 3 and 7).

Its own actions (``cm.*``): ``join``, ``create_index``, ``put_mapping``, ``fail_replica``,
``replica_started``, ``copy_failed``, ``health``.

When a node leaves, each primary it held is promoted at once: the in-sync copy with the
highest local checkpoint becomes primary of term + 1 (``shard.promote``; it claims the
term in the store, which fences the old primary, and resyncs the other copies).  A shard
with no in-sync copy left is rebuilt from the blob store.  A failed promotion leaves the
shard red with its cause and is retried at the next :meth:`ManagerRole.tick` (engine/manager/promotion.py).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.coordination import ClusterManagerNode
from shardstore.cluster_state.errors import ClusterStateSuperseded, NoQuorum, NotMaster
from shardstore.core.address import ShardAddress
from shardstore.core.path_strategy import PlainPathStrategy
from shardstore.engine.coordinator.validation import (
    check_create_args,
    check_index_name,
    check_mapping,
    check_source_mode,
)
from shardstore.engine.errors import IndexAlreadyExists, IndexNotCreated, IndexNotFound, StalePrimary
from shardstore.engine.manager.allocation import AllocationWorker, ClusterHealth, cluster_health, plan_replicas
from shardstore.engine.manager.ingest_gc import IngestCollector
from shardstore.engine.manager.invariants import check_routing
from shardstore.engine.manager.metadata import IndexMeta, ShardRouting, indices_from_state, sync_index
from shardstore.engine.manager.promotion import Promotions
from shardstore.engine.manager.routing_check import RoutingFault, held_from_stats, routing_faults
from shardstore.engine.manager.translog_gc import COLLECT_EVERY, GRACE_SECONDS, CollectionWorker, StreamCollector
from shardstore.engine.node.data_role import spec_to_wire
from shardstore.engine.node.file_budget import check_file_budget
from shardstore.engine.node.read_lease import ReadLeases
from shardstore.engine.shard.shard_copy import ShardSpec
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.segments.mapping import Mapping

log = logging.getLogger(__name__)
#: what an operator wants at the default level (a node logs WARNING and up, and this logger's INFO): the cluster
#: formed and who manages it, nodes joining and leaving in order (src/shardstore/cli.py, ``node``)
events = logging.getLogger("shardstore.events")
#: a shard whose replica recovery failed 3 times in a row is not tried again for this many seconds
RECOVERY_PAUSE = 5.0
#: seconds a background notice (:meth:`ManagerRole.notify`) waits for its answer
NOTIFY_TIMEOUT = 10.0
#: seconds between two checks of the routing against what the members hold (engine/manager/routing_check.py)
RECONCILE_EVERY = 2.0


class ManagerRole:
    """The elected cluster manager's metadata, membership and decisions (see the module docstring)."""

    def __init__(self, name: str, coordination: ClusterManagerNode, store: BlobStore,
                 send: Callable[..., Any], *, recovery_delay: float = 0.5, check_timeout: float = 1.0,
                 read_lease: float = 0.0, index_buffer_bytes: int = INDEX_BUFFER_BYTES,
                 accept_data_loss: bool = False, nodes_per_process: int = 1,
                 translog_gc_grace: float = GRACE_SECONDS, translog_gc_every: float = COLLECT_EVERY) -> None:
        self.name = name
        self.coordination = coordination
        self.store = store
        self.send = send  # send(target, action, request) -> response
        self.recovery_delay = recovery_delay
        self.check_timeout = check_timeout  # a member that does not answer in this long at activation is out
        self.index_buffer_bytes = index_buffer_bytes
        self.accept_data_loss = accept_data_loss
        self.nodes_per_process = nodes_per_process  # data nodes sharing one process's open-file limit
        self._lock = threading.RLock()
        self.lock = self._lock  # the promotions' too (engine/manager/promotion.py): one lock over the routing
        self.indices: dict[str, IndexMeta] = {}
        self.members: dict[str, str] = {}  # node name -> transport address
        self._data: set[str] = set()  # the members with the data role: copies are allocated to them only
        self._ephemeral: dict[str, str] = {}  # member -> the process id it joined with
        self.active = False
        self._initializing: set[tuple[str, int]] = set()
        #: (index, shard) -> (failed recoveries in a row, when the last failed): 3 in a row pause it for a while
        self._failures: dict[tuple[str, int], tuple[int, float]] = {}
        self._reconciled_at = 0.0  # monotonic time of the last routing check
        #: until when a removed node may still serve reads: its primaries are promoted only after (issue 41)
        self._leases = ReadLeases(read_lease)
        self._notifier = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"notify-{name}")
        self._allocation = AllocationWorker(self._allocation_round, name=f"allocation-{name}")
        #: shards without a primary: their promotion or rebuild from the store, and why they are red
        self.promotions = Promotions(self)
        #: the store-side collection of dead node-translog streams (issue 46), on its own thread
        self.translog_gc = CollectionWorker(StreamCollector(store, grace=translog_gc_grace), self._gc_snapshot,
                                            every=translog_gc_every, name=f"translog-gc-{name}",
                                            ingest=IngestCollector(store, shard_address=self._shard_address,
                                                                   copy_commits=self._copy_commits),
                                            ingest_cluster=self._ingest_cluster)

    # -- activation -------------------------------------------------------------------------------

    def activate(self, members: dict[str, str], answered: float = 0.0) -> None:
        """Take over as cluster manager with the applied state's indices and the candidate ``members``.

        Each candidate is asked which copies it holds (``node.stats``): one that does not answer
        is not a member, and a copy the routing names but its node no longer holds (the node
        restarted) is treated as lost, its primary promoted elsewhere.  ``answered``: at least how
        long ago this node last answered a follower check of another manager (engine/node/read_lease.py).
        """
        held: dict[str, set[tuple[str, int]]] = {}
        ids: dict[str, str] = {}
        ago: dict[str, float] = {self.name: answered}
        data: set[str] = set()

        def ask(node: str) -> None:
            try:
                check = self.send(node, "fd.follower_check", {"master": self.name,
                                                               "term": self.coordination.current_term},
                                   timeout=self.check_timeout)
                ids[node] = check["ephemeral_id"]
                ago[node] = float(check.get("answered", 0.0))
                stats = self.send(node, "node.stats", {}, timeout=self.check_timeout)
                held[node] = {(k[0], int(k[1])) for k in stats["copies"]}
                if stats.get("data", True):
                    data.add(node)
            except Exception as exc:  # noqa: BLE001 - not a member until it joins
                log.info("%s: %s is not a member at activation: %s", self.name, node, exc)
        with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:  # a paused member costs one timeout
            list(pool.map(ask, members))
        with self._lock:
            state = self.coordination.applied
            self.indices = indices_from_state(state) if state is not None else {}
            # what the previous managers granted is unknown: a primary's node (answering or not: it may be
            # removed later) may serve reads until a lease after their last round a quorum answered, which a
            # quorum of answers here bounds (two quorums share a node); without one, until a lease from now.  A
            # shard already without a primary may be waiting out its old primary's lease: it waits as long
            # (engine/node/read_lease.py)
            now = time.monotonic()
            answering = {n for n in ago if n in held or n == self.name}
            since = now - min(ago[n] for n in answering) if self.coordination.has_quorum(answering) else now
            self._leases.assume({sr.primary for m in self.indices.values() for sr in m.routing
                                 if sr.primary and sr.primary != self.name}, since)
            self.promotions.lease_waits = {(m.name, sr.shard): since + self._leases.seconds for m in self.indices.values()
                                 for sr in m.routing if sr.primary is None}
            self.members = {n: a for n, a in members.items() if n in held}
            self._data = data & set(self.members)
            self._ephemeral = ids
            self.active = True
            self.promotions.causes.clear()
            self._publish_members()
            self._leases.took_over(self._applied_version())
            for name in list(self.indices):
                for sr in self.indices[name].routing:
                    key = (self.indices[name].uuid, sr.shard)
                    for node in [*(c for c in sr.copies if c != sr.primary), *([sr.primary] if sr.primary else [])]:
                        if key not in held.get(node, set()):
                            self._node_left_shard(name, sr.shard, node, answered=node in held)
                    if self.indices[name].routing[sr.shard].primary is None:
                        self.promotions.causes.setdefault((name, sr.shard), "no primary")
            self._publish_members()
        self.promotions.retry_red()
        self._allocation.schedule()
        events.info("%s is the cluster manager (term %d), members %s", self.name, self.coordination.current_term,
                    sorted(self.members))

    def is_member(self, name: str, ephemeral_id: str) -> bool:
        """Whether ``name`` is a member as the process ``ephemeral_id`` (not an earlier run of it)."""
        return name in self.members and self._ephemeral.get(name) == ephemeral_id

    def leader_check(self, name: str, ephemeral_id: str, applied: list[int] | None) -> dict[str, bool]:
        """Answer a follower's leader check: whether it is a member, and whether its read lease is renewed.

        A lease is granted only to a member that applied the publications that took a primary
        from it and the one this manager took over with: a node that missed one (a link cut one
        way, a rejoin whose publication never reached it) may hold a primary the routing moved
        away from, and must not go on serving reads from it (engine/node/read_lease.py).
        """
        member = self.is_member(name, ephemeral_id)
        version = None if applied is None else (int(applied[0]), int(applied[1]))
        lease = member and self.active and self._leases.grant(name, version, time.monotonic())
        return {"member": member, "lease": lease}

    def deactivate(self) -> None:
        """Stop acting as cluster manager (another node was elected, or this one lost its quorum)."""
        with self._lock:
            self.active = False

    def close(self, wait: float = 60.0) -> None:
        """Stop the allocation worker (waiting up to ``wait`` seconds for a round in progress)."""
        self.deactivate()
        self._notifier.shutdown(wait=False, cancel_futures=True)
        self._allocation.close(wait)
        self.translog_gc.close()

    def _gc_snapshot(self) -> tuple[frozenset[str], dict[str, dict[tuple[str, int], ShardAddress]]] | None:
        """What a translog collection pass needs (engine/manager/translog_gc.py): the members' process ids and
        each data cluster's shard addresses; None when not managing or a member's process id is not known yet."""
        with self._lock:
            if not self.active:
                return None
            owners = [self._ephemeral.get(n) for n in self.members]
            if not owners or any(o is None for o in owners):
                return None
            clusters: dict[str, dict[tuple[str, int], ShardAddress]] = {}
            for meta in self.indices.values():
                for sr in meta.routing:
                    clusters.setdefault(meta.data_cluster_uuid, {})[(meta.uuid, sr.shard)] = self.spec(meta, sr.shard).address
            return frozenset(o for o in owners if o is not None), clusters

    def _shard_address(self, index_uuid: str, shard: int) -> ShardAddress | None:
        """Where a shard of the index of UUID ``index_uuid`` keeps its blobs; None when no index has that UUID."""
        meta = next((m for m in list(self.indices.values()) if m.uuid == index_uuid), None)
        return None if meta is None else self.spec(meta, shard).address

    def _copy_commits(self, index_uuid: str, shard: int) -> list[int | None]:
        """The local checkpoint of each routed copy's newest local commit (``shard.stats``; None for a copy that did
        not answer or holds none): an adopted job's files go only once every copy's commit holds its runs."""
        meta = next((m for m in list(self.indices.values()) if m.uuid == index_uuid), None)
        if meta is None:
            return [None]
        out: list[int | None] = []
        for node in meta.routing[shard].copies:
            try:
                stats = self.send(node, "shard.stats", {"index_uuid": index_uuid, "shard": shard},
                                  timeout=self.check_timeout)
                out.append(None if stats is None or "committed_checkpoint" not in stats
                           else int(stats["committed_checkpoint"]))
            except Exception:  # noqa: BLE001 - not known: the files stay until a later pass
                out.append(None)
                break  # one unknown copy keeps the files: the others need not be asked
        return out or [None]

    def _ingest_cluster(self) -> str | None:
        """The cluster UUID ingest jobs are staged under (the applied state's), while this node manages."""
        state = self.coordination.applied
        return state.cluster_uuid if self.active and state is not None else None

    def _collect_translog(self, req: dict[str, Any]) -> bool:
        """``cm.collect_translog``: a flush asks for a collection pass soon (answered at once)."""
        self.translog_gc.request()
        return True

    def submit(self, task: Any) -> None:
        """Publish ``task`` (committed on a majority) before anything acts on it; step down if it was not.

        A manager that cannot commit has lost its quorum (cut off, or deposed): it stops at once
        and acts on nothing it decided (docs/design/engine.md, invariant 3; issue 41).
        """
        try:
            self.coordination.submit(task)
        except (NoQuorum, NotMaster, ClusterStateSuperseded):
            self.step_down("a publication was not committed by a majority")
            raise

    def step_down(self, reason: str, *, orderly: bool = False) -> None:
        """Stop acting as cluster manager now: no promotion, no verdict, no index creation until re-elected."""
        with self._lock:
            was = self.active
            self.active = False
        if self.coordination.is_master or self.coordination.master == self.name:
            self.coordination.is_master = False
            self.coordination.master = None
        if was:
            (log.info if orderly else log.warning)("%s steps down as cluster manager: %s", self.name, reason)

    def notify(self, node: str, action: str, request: dict[str, Any]) -> None:
        """Send ``request`` in the background: never wait, holding the manager's lock, on a node that may be gone.

        For what the committed routing already decided (drop a copy, shrink a group): a node
        that misses it is corrected by its next write, its rejoin or the routing check.  A
        manager that waited here on a cut-off node held every other decision (and the
        primary's ``cm.fail_replica``) for the request timeout (issue 41).
        """
        def send() -> None:
            try:
                self.send(node, action, request, timeout=NOTIFY_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - see above
                log.info("%s: %s to %s not delivered: %r", self.name, action, node, exc)
        self._notifier.submit(send)

    def _check_active(self) -> None:
        if not self.active or not self.coordination.is_master:
            self.active = False
            raise NotMaster(self.name, self.coordination.master)

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, action: str, req: dict[str, Any]) -> Any:
        """Transport entry point for ``cm.*`` actions (NotMaster when this node is not the manager)."""
        self._check_active()
        method = {
            "cm.join": self._join, "cm.create_index": self._create_index, "cm.put_mapping": self._put_mapping,
            "cm.fail_replica": self._fail_replica, "cm.replica_started": self._replica_started,
            "cm.copy_failed": self._copy_failed, "cm.health": self._health,
            "cm.collect_translog": self._collect_translog,
        }.get(action)
        if method is None:
            raise NotMaster(self.name, self.coordination.master)
        return method(req)

    # -- membership ---------------------------------------------------------------------------------

    def _join(self, req: dict[str, Any]) -> dict[str, Any]:
        name, ephemeral = req["name"], req["ephemeral_id"]
        if name in self.members and self._ephemeral.get(name) != ephemeral:
            # its lease is not forgotten: a join can arrive late, from an older run of the node than the member
            self.node_left(name, "it restarted (a new process): its copies are gone")
        with self._lock:
            fresh = self.members.get(name) != req["address"] or self._ephemeral.get(name) != ephemeral
            state = self.coordination.applied
            if state is not None and (req.get("applied") is None or tuple(req["applied"]) < (state.term, state.version)):
                fresh = True  # it missed a publication (a connection still failing): publish again, to it too
            if req.get("follows") != self.name:
                # it does not follow this manager (it dropped it after a one-way cut, issue 41): only a
                # publication makes a node a follower, so publish again; else it never rejoins
                fresh = True
            if name not in self.members:
                events.info("%s: node %s joined the cluster at %s", self.name, name, req["address"])
                self._drop_unrouted(name)
            self.members[name] = req["address"]
            if req.get("data", True):
                self._data.add(name)
            else:
                self._data.discard(name)
            self._ephemeral[name] = ephemeral
            self._failures.clear()
            if fresh:
                self._publish_members(force=True)
        self._allocation.schedule()
        self.promotions.retry_red()
        return {"master": self.name, "term": self.coordination.current_term}

    def _drop_unrouted(self, node: str) -> None:
        """Have a (re)joining ``node`` discard every copy the routing does not give it (lock held).

        A node removed while it was paused (SIGSTOP) or cut off wakes up with copies, some of
        them primaries of an older term; they are fenced in the store, and dropped here.
        """
        routed = {(m.uuid, r.shard) for m in self.indices.values() for r in m.routing if node in r.copies}
        try:
            held = self.send(node, "node.stats", {}, timeout=self.check_timeout)["copies"]
        except Exception as exc:  # noqa: BLE001 - it joins again at its next leader check
            log.info("%s: copies of joining %s not listed: %r", self.name, node, exc)
            return
        for index_uuid, shard in held_from_stats(held):
            if (index_uuid, shard) not in routed:
                log.warning("%s: %s rejoined with a copy of %s/%s that is no longer routed to it; discarding it",
                            self.name, node, index_uuid, shard)
                self.send(node, "shard.discard", {"index_uuid": index_uuid, "shard": int(shard)})  # it is joining: up

    def node_left(self, node: str, reason: str, *, orderly: bool = False) -> None:
        """A member stopped answering (fault detection), or left in ``orderly`` shutdown: promote its primaries,
        drop its replicas."""
        with self._lock:
            self._data.discard(node)
            if self.members.pop(node, None) is None:
                return
            self._ephemeral.pop(node, None)
            self.coordination.peers = tuple(n for n in self.members if n != self.name)  # no publication waits on it
            self._failures.clear()  # recoveries that failed towards it are planned elsewhere now
            (events.info if orderly else log.warning)("%s: node %s left the cluster: %s", self.name, node, reason)
            for name in list(self.indices):
                for sr in self.indices[name].routing:
                    if node in sr.copies or sr.primary == node:
                        self._node_left_shard(name, sr.shard, node)
            self._publish_members()
        self._allocation.schedule(self.recovery_delay)

    def _applied_version(self) -> tuple[int, int]:
        """(term, version) of the cluster state this manager applied last."""
        state = self.coordination.applied
        return (0, 0) if state is None else (state.term, state.version)

    def _node_left_shard(self, name: str, shard: int, node: str, *, answered: bool = False) -> None:
        """``node``'s copy of the shard is gone (lock held): a primary is promoted elsewhere, a replica dropped.

        Unless ``node`` ``answered`` (it holds no such copy), its primary is promoted only once its
        read lease is over: till then the shard has no primary and waits, red with the cause (issue 41).
        """
        meta = self.indices[name]
        sr = meta.routing[shard]
        if sr.primary == node:
            term, version = self._applied_version()
            # no grant to it from now until it applied the routing change below (version + 1, or later)
            wait = self._leases.take_primary(node, (term, version + 1), time.monotonic())
            if answered:
                wait = 0.0
            if wait > 0:
                rest = [c for c in sr.in_sync if c != node]
                self.set_routing(meta, shard, primary=None, copies=[c for c in sr.copies if c != node], in_sync=rest)
                self.promotions.causes[(name, shard)] = (f"waiting {wait:.1f}s for {node}'s read lease to end before "
                                                   f"promoting a copy (it may still answer reads)")
                self.promotions.lease_waits[(name, shard)] = time.monotonic() + wait
                log.info("%s/%d: promotion waits %.1fs for %s's read lease", name, shard, wait, node)
                return
            self.promotions.promote(meta, sr, [n for n in sr.in_sync if n != node and n in self.members])
            return
        self.set_routing(meta, shard, copies=[c for c in sr.copies if c != node],
                          in_sync=[c for c in sr.in_sync if c != node])
        if sr.primary is not None:
            # told in the background: a primary that misses it fails the replica itself at its next write
            self.notify(sr.primary, "shard.group", {"index_uuid": meta.uuid, "shard": shard,
                                                     "replicas": [n for n in sr.in_sync if n not in (node, sr.primary)]})

    def _publish_members(self, force: bool = False) -> None:
        """Put the membership (name -> address) in the cluster state: every node's address book.

        Publications go to the members only from now on: a removed node (dead, paused, cut off)
        costs a publication nothing.
        """
        members = dict(sorted(self.members.items()))
        self.coordination.peers = tuple(n for n in members if n != self.name)

        def task(state):
            if state.nodes != members:
                return state.with_nodes(members)
            if force:  # the same members: a new version all the same, for a node that missed the last one
                return state.with_custom("membership", {"revision": state.version + 1})
            return state
        self.submit(task)

    # -- metadata -----------------------------------------------------------------------------------

    def spec(self, meta: IndexMeta, shard: int) -> ShardSpec:
        return ShardSpec(meta.data_cluster_uuid, meta.uuid, shard, durability=meta.durability,
                         mapping=meta.mappings, strategy=meta.strategy, reupload_delay=self.recovery_delay,
                         index_buffer_bytes=self.index_buffer_bytes)

    def set_routing(self, meta: IndexMeta, shard: int, **changes: Any) -> IndexMeta:
        cur = self.indices.get(meta.name, meta)
        new = cur.with_routing(shard, **changes)
        check_routing(meta.name, cur.routing[shard], new.routing[shard])  # engine/manager/invariants.py
        self.submit(sync_index(new))  # published (committed on a majority) before it is acted on
        self.indices[meta.name] = new
        return new

    def _meta_by_uuid(self, index_uuid: str) -> IndexMeta:
        meta = next((m for m in self.indices.values() if m.uuid == index_uuid), None)
        if meta is None:
            raise IndexNotFound(index_uuid)
        return meta

    def _create_index(self, req: dict[str, Any]) -> dict[str, Any]:
        name = check_index_name(req["name"])
        shards, replicas, durability = check_create_args(req.get("shards", 1), req.get("replicas", 1),
                                                         req.get("durability", "request"))
        source = check_source_mode(req.get("source", "stored"))
        mapping = check_mapping(req.get("mappings"))
        with self._lock:
            if name in self.indices:
                raise IndexAlreadyExists(name)
            live = self.data_nodes()
            if not live:
                raise IndexNotCreated(name, "no live data node to hold its shards")
            # all or nothing, before anything is published: the copies a node (a process; all of them when the
            # nodes share this process, as embedded) opens must fit its open-file limit (engine/node/file_budget.py)
            copies = shards * (1 + min(replicas, len(live) - 1))
            check_file_budget(f"create index [{name}]",
                              -(-copies // len(live)) * min(len(live), self.nodes_per_process))
            meta = IndexMeta(name=name, uuid=uuid.uuid4().hex, shards=shards, replicas=replicas,
                             mappings=mapping.to_dict(), durability=durability, strategy=PlainPathStrategy(),
                             routing=tuple(ShardRouting(s, live[s % len(live)], 1, (live[s % len(live)],),
                                                        (live[s % len(live)],)) for s in range(shards)),
                             data_cluster_uuid=self.coordination.applied.cluster_uuid, source=source)
            try:
                self.submit(sync_index(meta))
            except ClusterStateSuperseded:
                raise  # another cluster took the store over: no retry helps, this one must stop
            except Exception as exc:
                raise IndexNotCreated(name, f"its metadata was not committed ({type(exc).__name__}: {exc})") from exc
            self.indices[name] = meta
            for sr in meta.routing:
                self.send(sr.primary, "shard.open", {"spec": spec_to_wire(self.spec(meta, sr.shard)), "term": 1})
        self._allocation.schedule()
        return {"uuid": meta.uuid}

    def _put_mapping(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            meta = self.indices.get(req["index"])
            if meta is None:
                raise IndexNotFound(req["index"])
            current = Mapping.from_dict(meta.mappings)
            if current != Mapping.from_dict(req["base"]):
                return current.to_dict()
            updated = replace(meta, mappings=Mapping.from_dict(req["proposed"]).to_dict())
            self.submit(sync_index(updated))
            self.indices[meta.name] = updated
            return updated.mappings

    # -- copies failing and joining -----------------------------------------------------------------

    def _fail_replica(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            meta = self._meta_by_uuid(req["index_uuid"])
            shard, node = int(req["shard"]), req["node"]
            sr = meta.routing[shard]
            if int(req["term"]) < sr.primary_term:
                raise StalePrimary(f"{meta.name}/{shard}: a primary of term {req['term']} asked to fail {node}, but "
                                   f"the shard's primary term is {sr.primary_term}", term=int(req["term"]),
                                   current_term=sr.primary_term)
            if node in sr.in_sync:
                log.warning("failing replica %s of %s/%d: %s", node, meta.name, shard, req.get("reason"))
                sr = self.set_routing(meta, shard, copies=[c for c in sr.copies if c != node],
                                       in_sync=[c for c in sr.in_sync if c != node]).routing[shard]
                self.notify(node, "shard.discard", {"index_uuid": meta.uuid, "shard": shard})
        self._allocation.schedule()
        return {"replicas": [n for n in sr.in_sync if n != sr.primary]}

    def _replica_started(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            meta = self._meta_by_uuid(req["index_uuid"])
            shard, node = int(req["shard"]), req["node"]
            sr = meta.routing[shard]
            if (sr.primary, sr.primary_term) != (req["primary"], int(req["term"])) or node not in self.members:
                raise StalePrimary(f"{meta.name}/{shard}: recovery on {node} from {req['primary']} (term "
                                   f"{req['term']}) refused; the primary is now {sr.primary} of term "
                                   f"{sr.primary_term}", term=int(req["term"]), current_term=sr.primary_term)
            if node not in sr.in_sync:
                sr = self.set_routing(meta, shard, copies=[*dict.fromkeys([*sr.copies, node])],
                                       in_sync=[*sr.in_sync, node]).routing[shard]
            return {"replicas": [n for n in sr.in_sync if n != sr.primary]}

    def _copy_failed(self, req: dict[str, Any]) -> bool:
        with self._lock:
            meta = self._meta_by_uuid(req["index_uuid"])
            self._node_left_shard(meta.name, int(req["shard"]), req["node"], answered=True)
        self._allocation.schedule(self.recovery_delay)
        return True

    def reconcile(self) -> list[RoutingFault]:
        """Check the committed routing against what every member holds, and heal each difference (issue 41).

        A copy the routing names but its node does not hold as routed (engine/manager/routing_check.py)
        is treated as lost: a primary is promoted elsewhere or rebuilt, a replica rebuilt.  The
        members are asked outside the lock; a shard whose routing changed meanwhile is left to
        the next check.  The faults acted on.
        """
        with self._lock:
            if not self.active:
                return []
            snapshot = dict(self.indices)
            members = [n for n in self.members]
        held: dict[str, Any] = {}

        def ask(node: str) -> None:
            try:
                held[node] = held_from_stats(self.send(node, "node.stats", {}, timeout=self.check_timeout)["copies"])
            except Exception as exc:  # noqa: BLE001 - fault detection deals with a member that does not answer
                log.debug("%s: node.stats of %s failed: %r", self.name, node, exc)
        with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
            list(pool.map(ask, members))
        acted = []
        with self._lock:
            self._reconciled_at = time.monotonic()
            for copies in held.values():
                for key, copy in copies.items():
                    if copy.primary:
                        self.promotions.acknowledged[key] = max(self.promotions.acknowledged.get(key, -1), copy.global_checkpoint)
            if not self.active:
                return []
            for fault in routing_faults({n: m for n, m in snapshot.items() if self.indices.get(n) is m}, held):
                meta = self.indices.get(fault.index)
                if meta is not snapshot.get(fault.index):
                    continue  # an earlier fault of this index changed its routing: the next check sees it anew
                log.warning("%s: %s/%d on %s: %s (the routing says otherwise); treating the copy as lost",
                            self.name, fault.index, fault.shard, fault.node, fault.what)
                if fault.what == "stale_primary":
                    self.notify(fault.node, "shard.discard", {"index_uuid": meta.uuid, "shard": fault.shard})
                # a copy held as a primary of another term may still serve reads: its lease is waited out
                self._node_left_shard(fault.index, fault.shard, fault.node, answered=fault.what != "stale_primary")
                acted.append(fault)
        if acted:
            self._allocation.schedule()
        return acted

    def _health(self, req: dict[str, Any]) -> dict[str, Any]:
        """``cm.health``: checked against what the members hold first (one ``node.stats`` each), so green is true."""
        self.reconcile()
        return self.health(req.get("index")).__dict__

    def tick(self) -> None:
        """Periodic work of the manager (fault-detection thread): check the routing, retry red shards and
        paused recoveries."""
        if time.monotonic() - self._reconciled_at >= RECONCILE_EVERY:
            self.reconcile()
        if self.promotions.causes:
            self.promotions.retry_red()
            self._allocation.schedule()
        elif self._failures and self._allocation.idle:
            self._allocation.schedule()  # a recovery paused after 3 failures is tried again once the pause ends

    # -- allocation -----------------------------------------------------------------------------------

    def _allocation_round(self) -> bool:
        """Start the next replica recovery the plan asks for; False when there is none (worker thread)."""
        with self._lock:
            if not self.active:
                return False
            live = self.data_nodes()
            load = {n: 0 for n in live}
            for m in self.indices.values():
                for r in m.routing:
                    for c in r.copies:
                        if c in load:
                            load[c] += 1
            now = time.monotonic()
            skip = frozenset(self._initializing | {k for k, (n, at) in self._failures.items()
                                                   if n >= 3 and now - at < RECOVERY_PAUSE})
            plan = plan_replicas(self.indices, live, load, skip)
            if not plan:
                return False
            a = plan[0]
            meta = self.indices[a.index]
            sr = meta.routing[a.shard]
            self._initializing.add((a.index, a.shard))
        log.info("recovering a replica of %s/%d on %s from %s", a.index, a.shard, a.target, sr.primary)
        try:
            self.send(a.target, "shard.recover_replica", {"spec": spec_to_wire(self.spec(meta, a.shard)),
                                                           "source": sr.primary})
            log.info("replica of %s/%d recovered on %s", a.index, a.shard, a.target)
        except Exception as exc:  # noqa: BLE001 - retried (3 times) by the next rounds
            with self._lock:
                n = self._failures.get((a.index, a.shard), (0, 0.0))[0]
                self._failures[(a.index, a.shard)] = (n + 1, time.monotonic())
            log.warning("recovery of %s/%d on %s failed: %s: %s", a.index, a.shard, a.target, type(exc).__name__, exc)
        finally:
            with self._lock:
                self._initializing.discard((a.index, a.shard))
        return True

    def data_nodes(self) -> list[str]:
        """The members with the data role, sorted (where copies may live)."""
        with self._lock:
            return sorted(n for n in self.members if n in self._data)

    def settled(self, name: str, shard: int) -> bool:
        """Whether the shard has a live primary or is red with a failure named (not waiting for a lease or its
        first promotion): what an embedded ``kill_node`` waits for."""
        with self._lock:
            meta = self.indices.get(name)
            if meta is None:
                return True
            sr = meta.routing[shard]
            if sr.primary is not None:
                return sr.primary in self.members
            cause = self.promotions.causes.get((name, shard))
            return ((name, shard) in self.promotions.not_retried or (name, shard) in self.promotions.retry_at
                    or not any(n in self.members for n in sr.in_sync) and cause is not None
                    and not cause.startswith(("waiting", "no primary")))

    def failed_over(self, node: str) -> bool:
        """No shard has ``node`` as its primary, and none waits for a promotion still under way."""
        with self._lock:
            keys = [(meta.name, sr.shard) for meta in self.indices.values() for sr in meta.routing
                    if sr.primary != node]
            if len(keys) < sum(len(meta.routing) for meta in self.indices.values()):
                return False
        return all(self.settled(name, shard) for name, shard in keys)

    def not_retried(self) -> frozenset[tuple[str, int]]:
        """Red shards another writer claimed: no promotion is retried (a restore brings them back)."""
        return frozenset(self.promotions.not_retried)

    def store_failures(self) -> list[Exception]:
        """Why the shards that no rebuild from the store brought back failed (a restore's RestoreDataLoss)."""
        with self._lock:
            return list(self.promotions.store_failures.values())

    def health(self, index: str | None = None) -> ClusterHealth:
        """Green, yellow or red over the members that answer (as :func:`cluster_health`), of one index or all."""
        with self._lock:
            indices = self.indices if index is None else {n: m for n, m in self.indices.items() if n == index}
            if index is not None and not indices:
                raise IndexNotFound(index)
            return cluster_health(indices, self.data_nodes(), frozenset(k for k in self._initializing if k[0] in indices),
                                  {k: v for k, v in self.promotions.causes.items() if k[0] in indices})
