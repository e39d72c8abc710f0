"""A node as its own process: the roles assembled behind a network transport (issue 29).

``shardstore node --name n1 --data-dir D --store URL --listen 127.0.0.1:9400 --seed-hosts
h1:9400,h2:9400`` runs a :class:`NodeProcess` until SIGTERM (then it flushes its primaries,
leaves the cluster and stops) or SIGKILL.  One process holds:

- the transport (:class:`~shardstore.net.flight.FlightTransport`, Arrow Flight; loopback
  unless TLS and credentials are configured, docs/design/transport.md, "Security");
- the coordination node (:class:`~shardstore.cluster_state.coordination.ClusterManagerNode`):
  votes, accepts and applies published cluster states; master-eligible by default;
- the data role (:class:`~shardstore.engine.node.data_role.NodeService`): shard copies;
- the cluster-manager role (:class:`~shardstore.engine.manager.role.ManagerRole`), active while
  this node is the elected manager;
- the coordinating role (:class:`~shardstore.engine.coordinator.role.Coordinator`): ``client.*``.

A background thread runs, every ``fd.interval`` seconds: discovery (``discovery.hello`` to
the seed hosts, addresses from the applied cluster state), joining the elected manager,
an election when no manager is known, and fault detection
(:mod:`~shardstore.engine.node.fault_detection`): the manager checks its followers, the
followers check the manager.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import random
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state import coordination
from shardstore.cluster_state.coordination import ClusterManagerNode
from shardstore.cluster_state.errors import ClusterStateSuperseded, NoQuorum, NotMaster, StaleTerm
from shardstore.engine.coordinator.role import FAILOVER_WAIT, Coordinator
from shardstore.engine.errors import InvalidRequest, NodeNotReady
from shardstore.engine.manager.metadata import indices_from_state
from shardstore.engine.manager.role import ManagerRole
from shardstore.engine.manager.translog_gc import COLLECT_EVERY, GRACE_SECONDS
from shardstore.engine.node.data_role import NodeService
from shardstore.engine.node.datadir import DataDirLock
from shardstore.engine.node.fault_detection import OK, REFUSED, TIMEOUT, FailureCounter, FaultDetectionSettings
from shardstore.net.flight import ANY_NODE, FlightTransport, split_address
from shardstore.net.security import Security
from shardstore.net.wire import register_dataclass
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.transport import NodeDisconnected

log = logging.getLogger(__name__)
events = logging.getLogger("shardstore.events")  # cluster events at a node's default level (engine/manager/role.py)

for _cls in (coordination.PreVote, coordination.PreVoteGrant, coordination.StartJoin, coordination.Join, coordination.Publish, coordination.PublishAck,
             coordination.Commit):
    register_dataclass(_cls)

ROLES = frozenset({"data", "cluster_manager"})
#: joins a node sends to the manager its peers name before it stands for election itself
JOIN_ATTEMPTS = 10
#: seconds a clean shutdown waits for the calls its server still serves before the process exits without them
SHUTDOWN_SERVER_SECONDS = 5.0


@dataclass(frozen=True)
class NodeSettings:
    """Everything a node process is started with (flags, a settings file or ``SHARDSTORE_NODE_*``)."""

    name: str
    data_dir: str
    store: str
    listen: str = "127.0.0.1:9400"
    #: the address other nodes reach this one at (default: the listening address), e.g. a proxy's
    publish: str | None = None
    #: name -> the address this node reaches that peer at, over the one it publishes (a per-link proxy, a NAT)
    peer_addresses: dict[str, str] = field(default_factory=dict)
    seed_hosts: tuple[str, ...] = ()
    initial_managers: tuple[str, ...] = ()
    roles: frozenset[str] = ROLES
    fault_detection: FaultDetectionSettings = field(default_factory=FaultDetectionSettings)
    security: Security | None = None
    store_options: dict[str, Any] = field(default_factory=dict)
    recovery_delay: float = 0.5
    #: per-request timeout of node-to-node actions that have no setting of their own
    request_timeout: float = 30.0
    #: a primary whose buffered documents reach this many Arrow bytes refreshes during the bulk's upload
    index_buffer_bytes: int = INDEX_BUFFER_BYTES
    #: a rebuild from the store that would lose acknowledged operations restores the rest (else it refuses)
    accept_data_loss: bool = False
    #: how many nodes run in this process and share its open-file limit (embedded: all of them)
    nodes_per_process: int = 1
    #: how long the coordinator waits out a failover (a shard without a primary, an election) before it refuses
    failover_wait: float = FAILOVER_WAIT
    #: the manager's collection of dead translog streams: seconds a stream's process must be gone, seconds between
    #: passes (engine/manager/translog_gc.py)
    translog_gc_grace: float = GRACE_SECONDS
    translog_gc_every: float = COLLECT_EVERY

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InvalidRequest(f"a node needs a name (--name), got {self.name!r}")
        if isinstance(self.index_buffer_bytes, bool) or not isinstance(self.index_buffer_bytes, int) \
                or self.index_buffer_bytes < 1:
            raise InvalidRequest(f"index_buffer_bytes must be an int >= 1, got {self.index_buffer_bytes!r}")
        unknown = set(self.roles) - ROLES
        if unknown or not self.roles:
            raise InvalidRequest(f"node roles must be a non-empty subset of {sorted(ROLES)}, got {sorted(self.roles)}")
        if "cluster_manager" in self.roles and self.initial_managers and self.name not in self.initial_managers:
            raise InvalidRequest(f"node {self.name!r} is cluster-manager-eligible but not in --initial-managers "
                                 f"{list(self.initial_managers)}")


    def action_timeouts(self) -> dict[str, float]:
        """Per-action deadlines of node-to-node calls: checks and discovery within a check's timeout."""
        fd = self.fault_detection
        votes = {"cs/pre_vote": fd.timeout, "cs/start_join": fd.timeout}  # a voter only persists a term: a silent one
        # costs a split vote one check's timeout, not a publication's (docs/design/engine.md, "Split votes")
        return {"fd.*": fd.timeout, "discovery.*": fd.timeout, **votes, "cs/*": max(5.0, 4 * fd.timeout)}


class NodeProcess:
    """The roles of one node, behind one transport (see the module docstring)."""

    def __init__(self, settings: NodeSettings, *, transport: Any = None, store: BlobStore | None = None) -> None:
        """Start the roles of ``settings.name``: over a :class:`FlightTransport` listening on ``settings.listen``,
        or over ``transport`` (a :class:`~shardstore.net.local_link.LocalLink`: the embedded launcher, issue 42)
        with ``store`` shared by the nodes of one process."""
        self.settings = settings
        self.name = settings.name
        self.ephemeral_id = uuid.uuid4().hex  # a restarted process is a new member: its copies are gone
        if transport is None:  # refused before anything is made: no data dir, no store root left behind
            settings.security.check_bind(split_address(settings.listen)[0])
        # the store before the data dir: a store that cannot be opened (a missing root without create=true) leaves none
        self.store = store if store is not None else open_store(settings.store, **settings.store_options)
        self._dir_lock = DataDirLock(settings.data_dir)
        fd = settings.fault_detection
        self.transport = transport if transport is not None else FlightTransport(
            settings.listen, security=settings.security, default_timeout=settings.request_timeout,
            action_timeouts=settings.action_timeouts())
        try:
            eligible = "cluster_manager" in settings.roles
            self.cm = ClusterManagerNode(self.name, self.transport, self.store,
                                         os.path.join(settings.data_dir, "cluster-state"), master_eligible=eligible,
                                         initial_config=settings.initial_managers or (self.name,), register=False,
                                         parallel_publish=True)
            self.node = NodeService(self.name, os.path.join(settings.data_dir, "shards"), self.store, self.send,
                                    lambda: self.cm.master, fault_detection=fd, may_read=self.may_read,
                                    data="data" in settings.roles, owner=self.ephemeral_id)
            self.manager = ManagerRole(self.name, self.cm, self.store, self.send,
                                       recovery_delay=settings.recovery_delay, check_timeout=fd.timeout,
                                       index_buffer_bytes=settings.index_buffer_bytes,
                                       accept_data_loss=settings.accept_data_loss,
                                       nodes_per_process=settings.nodes_per_process,
                                       read_lease=fd.read_lease_seconds, translog_gc_grace=settings.translog_gc_grace,
                                       translog_gc_every=settings.translog_gc_every)
            self.coordinator = Coordinator(self.name, self.cm, self.send, address=settings.publish,
                                           failover_wait=settings.failover_wait, store=self.store)
            self._leader_failures = FailureCounter(fd.retries)
            self._follower_failures = FailureCounter(fd.retries)
            self._seeds: dict[str, str | None] = {a: None for a in settings.seed_hosts}  # address -> name
            self._failed_leader: str | None = None  # the manager whose leader checks failed last
            self._leader_ok_at = 0.0  # when the manager last answered a leader check or committed a state here
            self._quorum_ok_at = 0.0  # manager: when a quorum last answered its follower checks
            self._lease_until = 0.0  # follower: when its read lease ends (monotonic)
            #: manager -> when this node last answered its follower check (monotonic): a new manager's bound on
            #: what its predecessors' leases may still run (engine/node/read_lease.py); before this process started,
            #: none (it may have answered one in an earlier run: its start is the bound then)
            self._answered: dict[str, float] = {}
            self._started_at = time.monotonic()
            self._unleased = 0  # leader checks in a row that named this node a member but renewed no lease
            self._routed: tuple[Any, frozenset[tuple[str, int]]] = (None, frozenset())  # state -> its primaries
            self._checks = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"fd-{self.name}")
            self._join_attempts = 0  # joins sent since this node last knew a manager
            self._failed_elections = 0  # elections this node lost since it last knew a manager (its back-off)
            self._joined: str | None = None  # the manager this node last joined (logged once per manager)
            self._stop = threading.Event()
            self._managing = False
            self._election_after = time.monotonic() + random.uniform(0, 2 * fd.interval)
            self.transport.register(self.name, self.handle)
            self.address = settings.publish or self.transport.address
            self.coordinator._address = self.address
        except BaseException:
            self.transport.close()
            self._dir_lock.release()
            raise
        self._thread = threading.Thread(target=self._run, name=f"node-{self.name}", daemon=True)
        self._thread.start()

    # -- transport ----------------------------------------------------------------------------------

    def send(self, target: str, action: str, request: Any, timeout: float | None = None) -> Any:
        """Send ``request`` to node ``target`` (this node included: the same path, in this process)."""
        if target == self.name:
            return self.handle(action, request)
        return self.transport.send(self.name, target, action, request, timeout=timeout)

    def _set_peer(self, name: str, address: str) -> None:
        """Reach ``name`` at ``address``, or where the settings' ``peer_addresses`` say (a per-link proxy)."""
        self.transport.set_peer(name, self.settings.peer_addresses.get(name, address))

    def handle(self, action: str, req: Any) -> Any:
        """Every action this process answers, by prefix."""
        if action.startswith("cs/"):
            if action in (coordination.START_JOIN, coordination.PRE_VOTE) and self._has_live_leader(req.candidate):
                # as Elasticsearch's pre-vote: no vote while a manager answers our leader checks
                raise NotMaster(self.name, self.cm.master)
            answer = self.cm.handle(action, req)
            if action == coordination.COMMIT and answer is True and req.master == self.cm.master != self.name:
                self._leader_ok_at = time.monotonic()  # its commit: a majority accepted it just now, as a check says
            return answer
        if action.startswith(("shard.", "recovery.", "node.")):
            return self.node.handle(action, req)
        if action.startswith("cm."):
            if action == "cm.join":  # a restarted peer: a fresh connection, not the failing one in backoff
                self._set_peer(req["name"], req["address"])
                self.transport.reconnect(req["name"])
            if action == "cm.leave":
                self.manager._check_active()
                self.manager.node_left(req["name"], "it left (shutdown)", orderly=True)
                return True
            return self.manager.handle(action, req)
        if action.startswith("client."):
            if self.cm.applied is None or (self.cm.master is None and self.cm.superseded is None
                                           and action != "client.cluster"):  # the view says there is no manager
                raise NodeNotReady(self.name)  # (superseded: the coordinator says so where it needs a manager)
            return self.coordinator.handle(action, req)
        if action == "discovery.hello":
            if req.get("name") and req.get("address"):
                self._set_peer(req["name"], req["address"])
            return {"name": self.name, "address": self.address, "master": self.cm.master}
        if action == "fd.follower_check":
            if int(req["term"]) < self.cm.current_term:
                raise StaleTerm(f"node {self.name}: follower check by {req['master']}", int(req["term"]),
                                self.cm.current_term)
            return {"ephemeral_id": self.ephemeral_id, "answered": self._answer_follower_check(req["master"])}
        if action == "fd.manager_leaving":  # an orderly shutdown of the manager: elect another now, said at INFO
            leaving = req.get("master")
            if leaving == self.cm.master and leaving != self.name:
                events.info("%s: the cluster manager %s left (shutdown); electing another", self.name, leaving)
                self._leave_leader(leaving)
            elif leaving == self._failed_leader and leaving != self.name:  # its checks failed first (a loaded host)
                events.info("%s: the cluster manager %s left (shutdown)", self.name, leaving)
            return True
        if action == "fd.leader_check":
            if self.cm.superseded is not None:  # another cluster took the store over: every follower learns it
                raise self.cm.superseded
            if not self.cm.is_master:
                raise NotMaster(self.name, self.cm.master)
            answer = self.manager.leader_check(req["name"], req.get("ephemeral_id", ""), req.get("applied"))
            # a follower's lease never outlasts this manager's own: no quorum answered lately, no lease
            fd = self.settings.fault_detection
            return {**answer, "lease_seconds": max(0.0, self._quorum_ok_at + fd.read_lease_seconds - time.monotonic())}
        raise InvalidRequest(f"node {self.name}: unknown action {action!r}")

    # -- the background loop ------------------------------------------------------------------------

    def _run(self) -> None:
        interval = self.settings.fault_detection.interval
        while not self._stop.wait(0 if not self._managing and self.cm.master is None else interval):
            try:
                self._round()
            except (NoQuorum, NotMaster) as exc:  # a manager that lost its quorum mid-round steps down: expected
                log.warning("%s: node round: %s", self.name, exc)
            except Exception:  # noqa: BLE001 - the loop must survive anything; the next round retries
                log.exception("%s: node round failed", self.name)
            if self.cm.master is None:
                time.sleep(interval / 2)

    def _round(self) -> None:
        self._discover()
        if self.cm.master is not None:
            self._join_attempts = 0
            self._failed_elections = 0
        if self.cm.is_master:
            if not self._managing:
                self._managing = True
                self.manager.activate({self.name: self.address, **self._live_members()},
                                      answered=self._answered_seconds_ago(self.name))
            self._check_followers()
            self.manager.tick()
            return
        if self._managing:
            self._managing = False
            self.manager.deactivate()
        master = self.cm.master
        if master == self.name:  # named manager, yet not one (a publication of its own failed): nobody to check
            log.info("%s: no longer the cluster manager (its last publication failed); electing", self.name)
            self.cm.master = None
            return
        if master is None:
            if self._failed_elections and not self._may_stand():  # after a lost election: its back-off paces the
                return  # asking too (a silent peer holds each ask one timeout: docs/design/engine.md "Split votes")
            if not self._join_known_leader():
                self._maybe_elect()
            return
        self._check_leader(master)

    def _join_known_leader(self) -> bool:
        """Ask the other nodes who leads; join that manager rather than start an election (whether one answered).

        A node that restarts knows no manager; electing at once would depose a healthy one (a new
        term) and churn the cluster.  It joins the one its peers name; the manager's next
        publication makes it a follower.  After ``JOIN_ATTEMPTS`` joins with no publication it
        stands for election once (a manager that never publishes to it: liveness), then tries
        joining again: its pre-vote fails while its peers follow a live manager, and a node
        that stopped joining would stay out of a healed cluster for good (a bridge, issue 41).
        """
        peers = sorted(n for n in self.transport.peers() if not n.startswith(ANY_NODE) and n != self.name)
        asked = [self._checks.submit(self.send, name, "discovery.hello", {"name": self.name, "address": self.address},
                                     timeout=self.settings.fault_detection.timeout) for name in peers]
        for answer in as_completed(asked):  # at once: a silent peer costs one timeout, not one each
            try:
                hello = answer.result()
            except Exception:  # noqa: BLE001 - down, or not up yet
                continue
            leader = hello.get("master")
            if leader and leader != self.name:
                if self._join_attempts >= JOIN_ATTEMPTS:
                    self._join_attempts = 0  # one election now, then joins again
                    return False
                self._join_attempts += 1
                self._join(leader)
                return True
        return False

    def _discover(self) -> None:
        """Resolve seed addresses to names; learn every member's address from the applied state."""
        state = self.cm.applied
        if state is not None:
            for name, address in state.nodes.items():
                if name != self.name and isinstance(address, str):
                    self._set_peer(name, address)
        for address, name in list(self._seeds.items()):
            if name is not None or address == self.address:
                continue
            seed = f"{ANY_NODE}{address}"  # whatever node listens there, until it says its name
            self.transport.set_peer(seed, address)
            try:
                hello = self.transport.send(self.name, seed, "discovery.hello",
                                            {"name": self.name, "address": self.address})
            except Exception:  # noqa: BLE001 - not up yet: the next round tries again
                continue
            finally:
                self.transport.remove_peer(seed)
            self._seeds[address] = hello["name"]
            self._set_peer(hello["name"], hello["address"])
        if self.cm.is_master and self._managing:  # publish to the members only: a removed node costs nothing
            self.cm.peers = tuple(sorted(n for n in self.manager.members if n != self.name))
        else:
            self.cm.peers = tuple(sorted(n for n in self.transport.peers()
                                         if n != self.name and not n.startswith(ANY_NODE)))

    def _live_members(self) -> dict[str, str]:
        state = self.cm.applied
        members = dict(state.nodes) if state is not None else {}
        members.update({n: a for n, a in self.transport.peers().items() if not n.startswith(ANY_NODE)})
        members.pop(self.name, None)
        if self._failed_leader is not None:
            members.pop(self._failed_leader, None)
            self._failed_leader = None
        return members

    def _has_live_leader(self, candidate: str) -> bool:
        """Whether this node follows a manager other than ``candidate`` that answered a check or committed a state
        lately, or manages itself: from the moment its election won the joins, before its role is active (a second
        candidate would depose it mid-publication: docs/design/engine.md, "Split votes")."""
        if self.cm.is_master:
            return candidate != self.name
        master = self.cm.master
        recent = time.monotonic() - self._leader_ok_at < self.settings.fault_detection.worst_case_seconds
        return master is not None and master != candidate and recent

    def _may_stand(self) -> bool:
        """Whether this node's back-off lets it look for a manager and stand (docs/design/engine.md, "Split votes").

        Not within a check's timeout of joining another candidate's election either (that
        candidate is publishing: standing now would depose it with a higher term).
        """
        now = time.monotonic()
        return now >= self._election_after and now >= self.cm.joined_candidate_at + self.settings.fault_detection.timeout

    def _maybe_elect(self) -> None:
        """Stand for election (when :meth:`_may_stand`), then draw the back-off before the next stand.

        A failed pre-vote raised no term and disturbed nobody: it is tried again soon. An election
        lost after raising the term (a split vote, or a voter silent) is tried again after a draw
        from a window that grows by a check's timeout per loss, up to the worst-case detection
        time, plus a check's timeout per voter named before this one: two candidates that split a
        vote stand apart next time.
        """
        fd = self.settings.fault_detection
        if "cluster_manager" not in self.settings.roles or not self._may_stand():
            return
        term = self.cm.current_term
        try:
            state = self.cm.start_election()
            log.info("%s won the election of term %d", self.name, state.term)
        except Exception as exc:  # noqa: BLE001 - no quorum yet, or another candidate won: back off
            log.info("%s: election failed: %s", self.name, exc)
            if self.cm.current_term == term:  # the pre-vote failed: no term raised
                self._election_after = time.monotonic() + random.uniform(fd.interval, 4 * fd.interval)
                return
            self._failed_elections += 1
            voters = self.cm.voters()
            rank = voters.index(self.name) if self.name in voters else len(voters)
            window = min(fd.worst_case_seconds, fd.interval + self._failed_elections * fd.timeout)
            self._election_after = (time.monotonic() + rank * fd.timeout
                                    + random.uniform(fd.interval, max(window, 2 * fd.interval)))

    def _outcome(self, target: str, action: str, request: dict[str, Any]) -> tuple[str, Any]:
        try:
            return OK, self.send(target, action, request, timeout=self.settings.fault_detection.timeout)
        except NodeDisconnected as exc:
            return (REFUSED if exc.delivered is False else TIMEOUT), exc
        except Exception as exc:  # noqa: BLE001 - the peer answered with a refusal
            return TIMEOUT, exc

    def _check_leader(self, master: str) -> None:
        sent = time.monotonic()  # the lease counts from before the manager answered: it ends before the manager's
        applied = self.cm.applied
        outcome, answer = self._outcome(master, "fd.leader_check", {
            "name": self.name, "address": self.address, "ephemeral_id": self.ephemeral_id,
            "applied": None if applied is None else [applied.term, applied.version]})
        if isinstance(answer, ClusterStateSuperseded):
            self.cm.superseded = answer  # its coordinator refuses what needs a manager (index creation, mappings)
        if outcome == OK:
            self._leader_ok_at = time.monotonic()
            self._leader_failures.forget(master)
            if answer.get("lease"):  # the read lease: a member's whose cluster state is current
                fd = self.settings.fault_detection
                self._lease_until = sent + min(fd.read_lease_seconds, float(answer.get("lease_seconds", 0.0)))
                self._unleased = 0
            elif answer["member"]:
                # a member refused a lease missed a publication (commits are not retried): after two such checks
                # it joins again, which has the manager publish to it once more
                self._unleased += 1
                if self._unleased >= 2:
                    self._unleased = 0
                    self._join(master)
            if not answer["member"]:
                self._join(master)
            elif master != self._joined:  # said once per manager, at the default level
                events.info("%s joined the cluster; its manager is %s (term %d)", self.name, master,
                            self.cm.current_term)
                self._joined = master
            return
        if self._leader_failures.record(master, outcome):
            log.warning("%s: the cluster manager %s failed its leader checks (%s); electing another", self.name,
                        master, answer)
            self._leave_leader(master)

    def _leave_leader(self, master: str) -> None:
        """Follow no manager and elect another soon (its checks failed, or it left): ``master`` is no member
        candidate if this node wins, it rejoins once it answers."""
        self.cm.master = None
        self._failed_leader = master
        self._election_after = time.monotonic() + random.uniform(0, self.settings.fault_detection.interval)

    def _join(self, master: str) -> None:
        applied = self.cm.applied
        try:
            self.send(master, "cm.join", {"name": self.name, "address": self.address,
                                          "ephemeral_id": self.ephemeral_id, "follows": self.cm.master,
                                          "data": "data" in self.settings.roles,
                                          "applied": None if applied is None else [applied.term, applied.version]})
        except Exception as exc:  # noqa: BLE001 - retried at the next round
            log.info("%s: joining %s failed: %s", self.name, master, exc)

    def _check_followers(self) -> None:
        """Check every member at once; remove those that failed, or step down if the rest hold no quorum (issue 41).

        In parallel: one round takes one timeout however many members are silent, so a cut-off
        manager steps down within the documented ``retries * (interval + timeout)``.
        """
        members = sorted(m for m in self.manager.members if m != self.name)
        started = time.monotonic()  # the manager's lease counts from before the quorum answered
        request = {"master": self.name, "term": self.cm.current_term}
        outcomes = list(self._checks.map(lambda m: self._outcome(m, "fd.follower_check", request), members))
        failed: dict[str, Any] = {}
        answered = {self.name}
        for member, (outcome, answer) in zip(members, outcomes):
            if isinstance(answer, StaleTerm):  # a newer term exists: this node is no longer the manager
                self.manager.step_down(f"{member} knows a newer term ({answer})")
                return
            if outcome == OK:
                answered.add(member)
            if self._follower_failures.record(member, outcome):
                failed[member] = answer
        if self.cm.has_quorum(answered):
            self._quorum_ok_at = started
        if not failed:
            return
        if not self.cm.has_quorum(set(self.manager.members) - set(failed) | {self.name}):
            # cut off from a majority: a manager that acts now would act on what no majority commits
            self.manager.step_down(f"{sorted(failed)} failed their follower checks, leaving no quorum")
            return
        for member, answer in failed.items():
            self.manager.node_left(member, f"failed its follower checks ({answer})")

    def in_contact(self) -> bool:
        """Whether this node is within its read lease: realtime reads are served only then (issue 41).

        A follower: its manager answered a leader check naming it a member, sent within the lease
        (a node removed while paused or cut off wakes up to a manager that still answers, but no
        longer counts it: its copies may have been promoted elsewhere; process simulator seed 97);
        the manager: a quorum answered a follower-check round started within it.  The lease
        (``fd.read_lease_seconds``, 3 s by default) is waited out by the manager before it promotes
        another copy of a removed node's primary (engine/node/read_lease.py), however fast fault
        detection removed the node (a refused connection: process simulator seed 291), so a
        primary cut off from the majority stops serving before a newer value can be acknowledged.
        """
        lease = self.settings.fault_detection.read_lease_seconds
        now = time.monotonic()
        if self.cm.is_master:
            return now - self._quorum_ok_at < lease
        return self.cm.master is not None and now < self._lease_until

    def _answer_follower_check(self, master: str) -> float:
        """Note a follower check of ``master`` answered now; :meth:`_answered_seconds_ago` for the others."""
        seconds = self._answered_seconds_ago(master)
        self._answered[master] = time.monotonic()
        if len(self._answered) > 8:  # the oldest managers' records are covered by the newer ones
            del self._answered[min(self._answered, key=self._answered.__getitem__)]
        return seconds

    def _answered_seconds_ago(self, master: str) -> float:
        """At least how long ago this node last answered a follower check of a manager other than ``master``
        (or started: an earlier run of it may have answered one just before; or, as a manager itself, began a
        round a quorum answered: its own grants ran from there)."""
        latest = max([self._started_at, self._quorum_ok_at, *(at for m, at in self._answered.items() if m != master)])
        return time.monotonic() - latest

    def may_read(self, index_uuid: str, shard: int) -> bool:
        """Whether this node's primary of the shard may serve a read: within the read lease, and the cluster state
        this node applied still routes the shard's primary here (a grant after a publication that took the
        primary away finds the node knowing it: engine/node/read_lease.py)."""
        if not self.in_contact():
            return False
        state = self.cm.applied
        if state is None:
            return False
        cached_state, primaries = self._routed
        if cached_state is not state:
            primaries = frozenset((meta.uuid, sr.shard) for meta in indices_from_state(state).values()
                                  for sr in meta.routing if sr.primary == self.name)
            self._routed = (state, primaries)
        return (index_uuid, int(shard)) in primaries

    # -- lifecycle ------------------------------------------------------------------------------------

    def stop_deciding(self, timeout: float = 10.0) -> None:
        """End this node's loop (fault detection, elections, discovery) and wait for it: it checks, elects and
        removes nobody from now on.  A cluster stopping all its nodes at once calls this on every node first, so
        no manager outliving its members reports them failed or steps down for want of a majority."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def shutdown(self, *, clean: bool = True) -> None:
        """Stop: with ``clean``, flush the primaries and leave the cluster first (SIGTERM)."""
        if clean:
            self.node.flush_all()
            master = self.cm.master
            if master is not None and master != self.name:
                try:
                    self.send(master, "cm.leave", {"name": self.name}, timeout=5.0)
                except Exception as exc:  # noqa: BLE001 - fault detection notices it anyway
                    log.info("%s: leaving via %s failed: %s", self.name, master, exc)
            elif master == self.name:  # the manager leaves: it decides nothing more, and its members elect another now
                members = [m for m in self.manager.members if m != self.name]
                self._stop.set()  # its own loop first: stepped down, it must not stand for election again
                self._thread.join(timeout=10)
                self.manager.step_down("it shuts down", orderly=True)
                events.info("%s: the cluster manager shuts down; its members elect another", self.name)

                def tell(member: str) -> None:
                    try:
                        self.send(member, "fd.manager_leaving", {"master": self.name}, timeout=1.0)
                    except Exception as exc:  # noqa: BLE001 - fault detection notices it anyway
                        log.info("%s: %s not told of the shutdown: %s", self.name, member, exc)
                list(self._checks.map(tell, members))
        self.stop_deciding()
        # an allocation round waiting on a peer that stopped answering is not waited out: the process exits
        self.manager.close(wait=5.0)
        self._checks.shutdown(wait=False, cancel_futures=True)
        self.cm.close()
        self.coordinator.close()
        #: False when a call was still being served (waiting on a peer that stopped answering): run_node
        #: then exits without waiting for it
        self.stopped = self.transport.close(wait=SHUTDOWN_SERVER_SECONDS)
        self.node.close()
        self._dir_lock.release()


def run_node(settings: NodeSettings) -> int:
    """Run a node process until SIGTERM or SIGINT, then shut down cleanly and end the process with status 0."""
    import signal

    # SIGUSR1 writes every thread's stack to the log (stderr) and the node goes on: what an operator (or the
    # process simulator, on a stuck verdict) reads to see where a node waits
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stopping: list[int] = []  # the handler only appends: it takes no lock the main thread could hold

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    node = NodeProcess(settings)
    print(f"node {node.name} listening on {node.transport.address}", flush=True)
    # Polled: a signal the kernel hands to another thread (gRPC's, a handler's) only sets a flag that the
    # main thread checks when it runs bytecode, so an untimed wait would never wake to run the handler
    # (process simulator: "did not shut down in time" with no "shutting down" logged).
    while not stopping:
        time.sleep(0.2)
    log.info("%s: shutting down", node.name)
    node.shutdown(clean=True)
    if not node.stopped:
        log.warning("%s: exiting with a request still in flight (a peer stopped answering)", node.name)
    # The copies are flushed (or their bulks left to the remote translog) and closed, the data dir released and
    # the cluster left.  Exit now: the interpreter's own exit would join every worker thread still waiting on a
    # peer that stopped answering (concurrent.futures joins its workers at exit), up to a request timeout each
    # (process simulator: "did not shut down in time").
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
