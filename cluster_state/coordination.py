"""In-process coordination: elections, two-phase publication through the remote store, commit, apply.

Nodes talk through :class:`shardstore.transport.Transport` (injectable drops and
partitions).  Every request carries the sender's term; a node refuses a lower term than
the one it knows with :class:`StaleTerm`.

**Persisted per master-eligible node** (``<data_dir>/cluster-state.node``, replaced
atomically): the current term, the last accepted state and its manifest key, and the
(term, version) last committed.  Record magic ``CSLN``, format version 1, body
``{"current_term", "accepted": ClusterState.to_dict()|null, "accepted_manifest": key|null,
"committed": [term, version]|null}``.

**Pre-vote** (issue 41, Raft's PreVote and Elasticsearch's ``PreVoteCollector``): before an
election raises any term, the candidate asks the voters (``cs/pre_vote``) whether they would
vote for it.  A voter grants it unless (node processes) a cluster manager answered its
leader checks lately; it persists nothing.  (A candidate that is behind may win: the
election adopts the highest accepted state among the joins, as below.)  Without grants from a quorum the candidate stops there: a node
cut off from the others never raises the term, so its return deposes nobody.

**Election** (:meth:`ClusterManagerNode.start_election`): the candidate picks a term above
every term it knows and asks each master-eligible node to join it (``cs/start_join``).
A node joins only a term above its current term (so it votes once per term), persists that
term first, and answers with its last accepted (term, version, manifest key).  With
joins from a majority of both the last committed and the last accepted voting
configurations, the candidate adopts the highest accepted state among the joins
(downloading it from the store when it is not its own), becomes master, and republishes
it as the first version of its term.  Every committed state was accepted by a majority,
which intersects the voters, so a committed state is never rolled back.

**Publication** (:meth:`ClusterManagerNode.submit`, one master task at a time):

1. the task computes the new state from the current one; the master uploads it to the
   remote store (changed entities, then the published-only manifest);
2. ``cs/publish`` (term, version, manifest key) to every node: a node refuses a lower term
   or a version not above the one it accepted, downloads the state (only the changed
   entities when its last state is the diff's base), and -- master-eligible nodes --
   persists it as accepted before it acknowledges;
3. with acknowledgements from a majority of master-eligible nodes the master writes the
   committed manifest, then sends ``cs/commit``; each node applies the state.  Without a
   majority nothing is committed: the master steps down and raises :class:`NoQuorum`.
4. every ``purge_every`` commits the master starts a background purge keeping the newest
   ``purge_keep`` states (and wiping older cluster UUIDs behind the committed head).

**Bootstrap with empty disks**: when no voter has an accepted state, the elected master
looks for a cluster state in the store first (seed 000, :mod:`.restore`): if one exists
the new cluster gets a fresh UUID chained to the latest valid one and keeps its metadata;
otherwise it starts empty.  Before reading the old UUID's state it fences that UUID
(:mod:`.fence`, a put-if-absent record).

**Fencing a superseded cluster**: after writing a committed manifest and before it
acknowledges (commits on the nodes, returns), the master GETs its cluster UUID's fence
once.  Fenced: it raises :class:`ClusterStateSuperseded`, stops being master and
remembers it: every later submit or election of that node (and of its :class:`LocalCluster`)
fails the same way without writing.  An election also checks the fence of the UUID it is
about to adopt, before it reads or writes anything in the store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobNotFound
from shardstore.cluster_state.errors import (
    ClusterStateCorrupt,
    ClusterStateSuperseded,
    MissingEntity,
    NoQuorum,
    NotMaster,
    StaleTerm,
)
from shardstore.cluster_state.manifest import Manifest, encode_manifest
from shardstore.cluster_state.model import ClusterState, VotingConfig
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.core.records import RecordCorrupted, decode_record, encode_record
from shardstore.errors import InvalidError, ShardstoreError
from shardstore.fileio import write_atomic
from shardstore.transport import NodeDisconnected, Transport

START_JOIN, PUBLISH, COMMIT, PRE_VOTE = "cs/start_join", "cs/publish", "cs/commit", "cs/pre_vote"
NODE_FILE = "cluster-state.node"
_MAGIC, _VERSION = b"CSLN", 1

Task = Callable[[ClusterState], ClusterState]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreVote:
    """A would-be candidate asks whether it could win, before it raises any term."""

    candidate: str
    term: int


@dataclass(frozen=True)
class PreVoteGrant:
    """A voter would vote for the candidate; its current term (the election goes above it)."""

    voter: str
    current_term: int


@dataclass(frozen=True)
class StartJoin:
    """A candidate asks for votes in ``term``."""

    term: int
    candidate: str


@dataclass(frozen=True)
class Join:
    """A vote: the voter's term and its last accepted state."""

    voter: str
    term: int
    accepted_term: int
    accepted_version: int
    cluster_uuid: str | None
    manifest_key: str | None


@dataclass(frozen=True)
class Publish:
    """Phase one: only (term, version) and where the manifest is; the state is in the store."""

    term: int
    version: int
    manifest_key: str
    master: str


@dataclass(frozen=True)
class PublishAck:
    """A node accepted (and, if master-eligible, persisted) a published state."""

    node: str
    term: int
    version: int
    bytes_downloaded: int
    incremental: bool


@dataclass(frozen=True)
class Commit:
    """Phase two: apply the accepted state (term, version)."""

    term: int
    version: int
    master: str


class PersistedNodeState:
    """The durable part of a master-eligible node (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.current_term = 0
        self.accepted: ClusterState | None = None
        self.accepted_manifest: str | None = None
        self.committed: tuple[int, int] | None = None
        path = os.path.join(directory, NODE_FILE)
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            try:
                _v, body = decode_record(data, magic=_MAGIC, supported=_VERSION, where=path, what="node state")
            except RecordCorrupted as exc:
                raise InvalidError(f"{exc}; the node's cluster-state file is damaged: wipe {directory} and let the "
                                   f"node rejoin (it downloads the state again)") from None
            self.current_term = int(body["current_term"])
            self.accepted = None if body["accepted"] is None else ClusterState.from_dict(body["accepted"])
            self.accepted_manifest = body["accepted_manifest"]
            self.committed = None if body["committed"] is None else tuple(body["committed"])  # type: ignore[assignment]

    def save(self) -> None:
        """Write the whole record atomically (temp file, fsync, rename, fsync of the directory)."""
        body = {
            "current_term": self.current_term,
            "accepted": None if self.accepted is None else self.accepted.to_dict(),
            "accepted_manifest": self.accepted_manifest,
            "committed": None if self.committed is None else list(self.committed),
        }
        write_atomic(self.directory, NODE_FILE, encode_record(_MAGIC, _VERSION, body))


class ClusterManagerNode:
    """One node of the coordination layer (master-eligible or not)."""

    def __init__(self, name: str, transport: Transport, store: BlobStore, data_dir: str, *,
                 master_eligible: bool = True, peers: Iterable[str] = (),
                 initial_config: Iterable[str] = (), initial_state: ClusterState | None = None,
                 initial_manifest: Manifest | None = None, purge_every: int = 10, purge_keep: int = 10,
                 register: bool = True, parallel_publish: bool = False) -> None:
        self.name = name
        #: publish to every node at once and go on at a quorum (see :meth:`_gather_acks`)
        self.parallel_publish = parallel_publish
        self._publisher: ThreadPoolExecutor | None = None
        self.purge_every = purge_every
        self.purge_keep = purge_keep
        self.purge_task: Any = None
        self._commits_since_purge = 0
        self.transport = transport
        self.remote = RemoteClusterStateService(store)
        self.master_eligible = master_eligible
        self.peers = tuple(p for p in peers if p != name)
        self.initial_config = VotingConfig(tuple(initial_config))
        self.disk = PersistedNodeState(data_dir)
        self._lock = threading.RLock()
        self._task_lock = threading.Lock()
        self.is_master = False
        self.master: str | None = None
        self.last_publication: list[PublishAck] = []
        self._pending: tuple[ClusterState, Manifest] | None = None
        #: a node could not read this master's last publication from the store (a blob of it lost or damaged: an
        #: entity with no twin, shared by every manifest since it was written): the next one is written whole
        self._unreadable: BaseException | None = None
        self._repaired: set[str] = set()  # blobs named by a refusal that a whole publication answered (damaged ones)
        #: set once this node found its cluster UUID fenced: it never publishes again
        self.superseded: ClusterStateSuperseded | None = None
        #: when this node last joined another candidate's election (monotonic): its own stand waits a while
        #: (engine/node/process.py, docs/design/engine.md "Split votes")
        self.joined_candidate_at = float("-inf")
        if initial_state is not None and self.disk.accepted is None:
            self.disk.accepted = initial_state
            self.disk.accepted_manifest = initial_manifest.key if initial_manifest else None
            self.disk.committed = (initial_state.term, initial_state.version) if initial_manifest else None
            self.disk.current_term = max(self.disk.current_term, initial_state.term)
            self.disk.save()
        self.accepted_manifest: Manifest | None = None
        self.applied: ClusterState | None = None
        if self.disk.accepted is not None and self.disk.committed == (self.disk.accepted.term,
                                                                       self.disk.accepted.version):
            self.applied = self.disk.accepted
        if register:  # else the owner routes the ``cs/*`` actions of its own handler to :meth:`handle`
            transport.register(name, self.handle)

    # -- views --------------------------------------------------------------------------------

    @property
    def current_term(self) -> int:
        """The highest term this node knows (persisted)."""
        return self.disk.current_term

    @property
    def accepted(self) -> ClusterState | None:
        """The last state this node accepted (persisted on master-eligible nodes)."""
        return self.disk.accepted

    def _configs(self, state: ClusterState | None) -> tuple[VotingConfig, VotingConfig]:
        if state is None or not state.coordination.last_committed_config.node_ids:
            return self.initial_config, self.initial_config
        return state.coordination.last_committed_config, state.coordination.last_accepted_config

    def _quorum(self, votes: set[str], *states: ClusterState | None) -> bool:
        return all(c.has_quorum(votes) for s in states for c in self._configs(s))

    def has_quorum(self, nodes: Iterable[str]) -> bool:
        """Whether ``nodes`` hold a majority of the voting configurations of the last accepted state."""
        return self._quorum(set(nodes), self.disk.accepted)

    def voters(self) -> list[str]:
        """The voters of this node's accepted state (its initial configuration before any), sorted by name."""
        return sorted(self._voters(self.disk.accepted))

    def _voters(self, *states: ClusterState | None) -> set[str]:
        return {n for s in states for c in self._configs(s) for n in c.node_ids}

    # -- message handling ---------------------------------------------------------------------

    def handle(self, action: str, request: Any) -> Any:
        """Transport entry point."""
        if action == PRE_VOTE:
            return self._on_pre_vote(request)
        if action == START_JOIN:
            return self._on_start_join(request)
        if action == PUBLISH:
            return self._on_publish(request)
        if action == COMMIT:
            return self._on_commit(request)
        raise InvalidError(f"node {self.name}: unknown cluster-state action {action!r}")

    def _become_follower(self, term: int) -> None:
        if term > self.disk.current_term:
            self.disk.current_term = term
            if self.master_eligible:
                self.disk.save()
        self.is_master = False

    def _on_pre_vote(self, req: PreVote) -> PreVoteGrant:
        with self._lock:
            if not self.master_eligible:
                raise InvalidError(f"node {self.name} is not master-eligible and does not vote")
            return PreVoteGrant(self.name, self.disk.current_term)

    def _on_start_join(self, req: StartJoin) -> Join:
        with self._lock:
            if not self.master_eligible:
                raise InvalidError(f"node {self.name} is not master-eligible and does not vote")
            if req.term <= self.disk.current_term:
                raise StaleTerm(f"node {self.name}: start-join from {req.candidate}", req.term, self.disk.current_term)
            self._become_follower(req.term)  # persisted before the vote leaves: one vote per term
            self.master = None
            if req.candidate != self.name:
                self.joined_candidate_at = time.monotonic()
            acc = self.disk.accepted
            return Join(self.name, req.term, acc.term if acc else -1, acc.version if acc else -1,
                        acc.cluster_uuid if acc else None, self.disk.accepted_manifest)

    def _on_publish(self, req: Publish) -> PublishAck:
        with self._lock:
            if req.term < self.disk.current_term:
                raise StaleTerm(f"node {self.name}: publication of version {req.version} by {req.master}",
                                req.term, self.disk.current_term)
            if req.master != self.name:
                self._become_follower(req.term)
            acc = self.disk.accepted
            if acc is not None and (req.term, req.version) <= (acc.term, acc.version) and req.master != self.name:
                raise StaleTerm(f"node {self.name}: publication of term {req.term} version {req.version} is not "
                                f"newer than the accepted version {acc.version}", req.term, acc.term)
            pending = self._pending
            if req.master == self.name and pending is not None and pending[1].key == req.manifest_key:
                state, manifest, nbytes, incremental = pending[0], pending[1], 0, True  # the master's own state
            else:
                manifest = self.remote.read_manifest(req.manifest_key)
                base = acc if acc is not None and acc.state_uuid == manifest.diff.base else self.applied
                res = self.remote.read_incremental(manifest, base)
                state, incremental = res.state, res.incremental
                nbytes = res.bytes_downloaded + len(encode_manifest(manifest))  # the manifest's GET included
            self.disk.accepted = state
            self.disk.accepted_manifest = req.manifest_key
            self.accepted_manifest = manifest
            if self.master_eligible:
                self.disk.save()  # persisted before the acknowledgement
            self.master = req.master
            return PublishAck(self.name, req.term, req.version, nbytes, incremental)

    def _on_commit(self, req: Commit) -> bool:
        with self._lock:
            if req.term < self.disk.current_term:
                raise StaleTerm(f"node {self.name}: commit of version {req.version}", req.term, self.disk.current_term)
            acc = self.disk.accepted
            if acc is None or (acc.term, acc.version) != (req.term, req.version):
                return False  # not the state this node accepted: it catches up on the next publication
            self.applied = replace(acc, cluster_uuid_committed=True)
            self.disk.accepted = self.applied
            self.disk.committed = (req.term, req.version)
            if self.master_eligible:
                self.disk.save()
            return True

    def _send(self, target: str, action: str, request: Any) -> Any:
        if target == self.name:
            return self.handle(action, request)
        return self.transport.send(self.name, target, action, request)

    # -- election -----------------------------------------------------------------------------

    def start_election(self) -> ClusterState:
        """Ask for votes in a new term; on a majority adopt the highest accepted state and publish it."""
        if not self.master_eligible:
            raise InvalidError(f"node {self.name} is not master-eligible")
        with self._task_lock:
            self._raise_if_superseded()
            term = self._pre_vote() + 1
            joins, stale = self._gather_joins(StartJoin(term, self.name))
            votes = {j.voter for j in joins}
            if not self._quorum(votes, self.disk.accepted):
                if stale:
                    self._become_follower(stale)
                raise NoQuorum(f"election of {self.name} in term {term}", votes, self._voters(self.disk.accepted))
            with self._lock:
                if self.disk.current_term < term:
                    # a quorum joined without this node's own join (parallel: it is still in flight): the term is
                    # this node's now, so its join, arriving late, is refused as stale instead of making the new
                    # master a follower of its own term (a lost election right after winning it)
                    self.disk.current_term = term
                    self.disk.save()
            best = max(joins, key=lambda j: (j.accepted_term, j.accepted_version), default=None)
            acc = self.disk.accepted
            cluster_uuid = best.cluster_uuid if best is not None and best.cluster_uuid else (
                acc.cluster_uuid if acc is not None else None)
            if cluster_uuid is not None:
                self._check_fence(cluster_uuid)  # one GET: a superseded cluster reads and writes nothing more
            adopted = self._adopt(best)  # the highest accepted state of a majority holds every committed one
            if adopted is not None and not self._quorum(votes, adopted):
                raise NoQuorum(f"election of {self.name} in term {term}", votes, self._voters(adopted))
            previous_uuid = None
            if adopted is None:
                adopted, previous_uuid = self._bootstrap_state()
            self.is_master = True
            self.master = self.name
            return self._publish(adopted.successor(term), previous_cluster_uuid=previous_uuid)

    def _pre_vote(self) -> int:
        """Grants from a quorum of voters, or NoQuorum with no term raised; the highest current term granted."""
        acc = self.disk.accepted
        request = PreVote(self.name, self.disk.current_term)
        voters = sorted(self._voters(acc) | {self.name})
        grants, _higher = self._gather(PRE_VOTE, request, voters,
                                       lambda got, _h: self._quorum({g.voter for g in got}, acc))
        granted = {g.voter for g in grants}
        if not self._quorum(granted, acc):
            raise NoQuorum(f"pre-vote of {self.name} (no term raised)", granted, self._voters(acc))
        return max([self.disk.current_term, *(g.current_term for g in grants)])

    def _gather_joins(self, request: StartJoin) -> tuple[list[Join], int]:
        """Ask every voter (and this node) to join; the joins and the highest term refused with.

        With ``parallel_publish`` the election goes on as soon as the joins make a quorum: the
        highest accepted state of any majority holds every committed state.
        """
        voters = sorted(self._voters(self.disk.accepted) | {self.name})
        return self._gather(START_JOIN, request, voters,
                            lambda joins, _higher: self._quorum({j.voter for j in joins}, self.disk.accepted))

    def _bootstrap_state(self) -> tuple[ClusterState, str | None]:
        """The first state of a cluster whose voters have empty disks: restored from the store if it holds one.

        Seed 000: the latest valid cluster UUID is found in the store; the new cluster gets a
        fresh UUID chained to it and keeps its metadata.  MultipleClusterUUIDs is raised
        (the bootstrap refuses) when the store holds several valid heads.
        """
        from shardstore.cluster_state.errors import NoClusterState
        from shardstore.cluster_state.restore import take_over

        try:
            taken = take_over(self.remote, self.initial_config.node_ids, node=self.name)  # fences, then reads
        except NoClusterState:
            return ClusterState.initial(self.initial_config.node_ids), None
        st = taken.state
        return replace(st, term=0, coordination=replace(st.coordination, term=0)), taken.head

    def _adopt(self, best: Join | None) -> ClusterState | None:
        acc = self.disk.accepted
        if best is None or best.manifest_key is None:
            return acc
        if acc is not None and (acc.term, acc.version) >= (best.accepted_term, best.accepted_version):
            return acc
        try:
            manifest = self.remote.read_manifest(best.manifest_key)
        except MissingEntity:  # its published-only twin may have been purged; the committed one stays
            assert best.cluster_uuid is not None
            manifest = self.remote.manifest_for(best.cluster_uuid, best.accepted_term, best.accepted_version)
        state = self.remote.read_state(manifest)
        with self._lock:
            self.disk.accepted, self.disk.accepted_manifest = state, best.manifest_key
            self.accepted_manifest = manifest
            self.disk.save()
        return state

    # -- publication --------------------------------------------------------------------------

    def submit(self, task: Task) -> ClusterState:
        """Run a master task against the current state and publish its result (one task at a time)."""
        with self._task_lock:
            self._raise_if_superseded()
            if not self.is_master:
                raise NotMaster(self.name, self.master)
            current = self.disk.accepted
            assert current is not None
            new = task(current)
            if new is current:
                return current
            return self._publish(new.successor(self.disk.current_term))

    def _previous_manifest(self) -> Manifest | None:
        acc = self.disk.accepted
        if acc is None or self.disk.accepted_manifest is None:
            return None
        if self.accepted_manifest is None or self.accepted_manifest.key != self.disk.accepted_manifest:
            try:
                self.accepted_manifest = self.remote.read_manifest(self.disk.accepted_manifest)
            except MissingEntity:
                # purged since this node accepted it (a published twin once its state committed): a node restarted
                # on it and then elected could never publish (in-process simulator seed 4017, stuck). Its twin,
                # else none: the next publication then writes the whole state
                try:
                    self.accepted_manifest = self.remote.manifest_for(acc.cluster_uuid, acc.term, acc.version)
                except MissingEntity:
                    self.accepted_manifest = None
                    return None
                self.disk.accepted_manifest = self.accepted_manifest.key
        return self.accepted_manifest

    def _publish(self, new: ClusterState, previous_cluster_uuid: str | None = None) -> ClusterState:
        prev, prev_m = self.disk.accepted, self._previous_manifest()
        with self._lock:
            unreadable, self._unreadable = self._unreadable, None
        try:
            if prev is None or prev_m is None or prev_m.state_uuid != prev.state_uuid or unreadable is not None:
                # whole: every entity uploaded anew, so a reader needs no blob an earlier manifest wrote
                if previous_cluster_uuid is None and prev_m is not None:
                    previous_cluster_uuid = prev_m.previous_cluster_uuid
                manifest = self.remote.write_full(new, previous_cluster_uuid=previous_cluster_uuid)
            else:
                manifest = self.remote.write_incremental(prev, prev_m, new)
        except ShardstoreError:
            self.is_master = False
            with self._lock:
                self._unreadable = self._unreadable or unreadable
            raise
        self._pending = (new, manifest)
        request = Publish(new.term, new.version, manifest.key, self.name)
        acks, higher = self._gather_acks(request, new)
        self.last_publication = acks
        votes = {a.node for a in acks}
        if higher > new.term or not self._quorum(votes, new):
            self._become_follower(max(higher, self.disk.current_term))
            if self.master == self.name:
                self.master = None  # stepped down: no manager known until one is elected or found
            raise NoQuorum(f"publication of term {new.term} version {new.version} by {self.name}",
                           votes & self._voters(new), self._voters(new))
        try:
            committed = self.remote.mark_committed(manifest)
        except ShardstoreError:
            self.is_master = False
            raise
        self._check_fence(new.cluster_uuid)  # one GET, after the commit is durable, before any acknowledgement
        self.accepted_manifest = manifest
        commit = Commit(new.term, new.version, self.name)
        if self.parallel_publish:  # the master applies first; the others in the background, unawaited
            self._send(self.name, COMMIT, commit)
            for node in self.peers:
                self._pool().submit(self._quiet_send, node, COMMIT, commit)
        else:
            for node in (self.name, *self.peers):
                try:
                    self._send(node, COMMIT, commit)
                except (NodeDisconnected, ShardstoreError):
                    continue
        self.accepted_manifest = committed
        with self._lock:
            self.disk.accepted_manifest = committed.key
            if self.master_eligible:
                self.disk.save()
        self._maybe_purge(new.cluster_uuid)
        assert self.applied is not None
        return self.applied

    def _gather_acks(self, request: Publish, new: ClusterState) -> tuple[list[PublishAck], int]:
        """Publish ``request`` to this node and its peers; the acknowledgements and the highest term refused with."""
        return self._gather(PUBLISH, request, [self.name, *self.peers],
                            lambda acks, higher: higher > new.term or self._quorum({a.node for a in acks}, new))

    def _gather(self, action: str, request: Any, nodes: list[str],
                enough: Callable[[list[Any], int], bool]) -> tuple[list[Any], int]:
        """Send ``request`` to ``nodes``; the answers and the highest term a node refused with (StaleTerm).

        In order, one node after the other (the default: an injected fault draws in a fixed order, so
        a fault simulator's seed reproduces); with ``parallel_publish`` to every node at once, returning
        as soon as ``enough(answers, higher)`` holds (a node that does not answer costs nothing once a
        majority did: node processes, issue 29).
        """
        answers: list[Any] = []
        higher = 0
        if not self.parallel_publish:
            for node in nodes:
                try:
                    answers.append(self._send(node, action, request))
                except StaleTerm as exc:
                    higher = max(higher, exc.current)
                except (NodeDisconnected, ShardstoreError) as exc:
                    self._refused(action, node, exc)
            return answers, higher
        futures = []
        for node in nodes:
            future = self._pool().submit(self._send, node, action, request)
            # a refusal is noted when it comes, also after this round went on at a quorum (the slowest node, a
            # restarted one reading the whole state, is the one that cannot read it)
            future.add_done_callback(lambda f, node=node: self._done(action, node, f))
            futures.append(future)
        for future in as_completed(futures):
            try:
                answers.append(future.result())
            except StaleTerm as exc:
                higher = max(higher, exc.current)
            except (NodeDisconnected, ShardstoreError):
                pass  # noted by its callback
            if enough(answers, higher):
                break
        return list(answers), higher

    def _done(self, action: str, node: str, future: Any) -> None:
        """A parallel request ended: a refusal goes to :meth:`_refused`."""
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None and not isinstance(exc, StaleTerm):
            self._refused(action, node, exc)

    def _refused(self, action: str, node: str, exc: BaseException) -> None:
        """A node refused ``action``: if it could not read a publication's blob and the blob is indeed lost or
        damaged in the store, the next publication is written whole (docs/design/cluster_state.md, "A lost
        shared entity").  A blob this node reads fine is the other node's own trouble: no rewrite for it."""
        if action != PUBLISH or not isinstance(exc, (MissingEntity, ClusterStateCorrupt)):
            return
        key = str(getattr(exc, "key", "") or "")
        if not self._damaged(key, exc):
            log.info("%s: %s could not read the published cluster state (%s), which reads fine here", self.name,
                     node, exc)
            return
        with self._lock:
            first = self._unreadable is None
            self._unreadable = exc
            self._repaired.add(key)
        if first:
            log.warning("%s: %s could not read the published cluster state (%s); the next publication uploads "
                        "every entity again", self.name, node, exc)

    def _damaged(self, key: str, exc: BaseException) -> bool:
        """Whether the blob ``key`` a node could not read is gone from the store (or, once per key, damaged)."""
        if not key:
            return True
        try:
            self.remote.store.get(key)
        except BlobNotFound:
            return True
        except ShardstoreError:
            return False  # this node cannot tell now: the refusing node asks again at its next join
        if isinstance(exc, MissingEntity):
            return False  # the blob is there
        with self._lock:
            return key not in self._repaired  # damaged bytes: one whole publication per blob named

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._publisher is None:
                self._publisher = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"publish-{self.name}")
            return self._publisher

    def _quiet_send(self, target: str, action: str, request: Any) -> None:
        try:
            self._send(target, action, request)
        except (NodeDisconnected, ShardstoreError):
            pass

    def _raise_if_superseded(self) -> None:
        if self.superseded is not None:
            raise self.superseded

    def _check_fence(self, cluster_uuid: str) -> None:
        """ClusterStateSuperseded (remembered, and no longer master) if ``cluster_uuid`` was taken over."""
        try:
            self.remote.check_not_superseded(cluster_uuid)
        except ClusterStateSuperseded as exc:
            self.superseded = exc
            self.is_master = False
            self.master = None
            raise

    def close(self) -> None:
        """Stop this node's publisher and state-transfer threads (a node shutting down; a publication in flight
        ends on its own: the pools only take no new work)."""
        with self._lock:
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.shutdown(wait=False, cancel_futures=True)
        self.remote.close()

    def _maybe_purge(self, cluster_uuid: str) -> None:
        """Every ``purge_every`` commits, start a background purge (one at a time) keeping ``purge_keep`` states."""
        self._commits_since_purge += 1
        if self.purge_every <= 0 or self._commits_since_purge < self.purge_every:
            return
        if self.purge_task is not None and not self.purge_task.done():
            return
        self._commits_since_purge = 0
        self.purge_task = self.remote.purge_async(None, self.purge_keep)


class LocalCluster:
    """A set of in-process coordination nodes on one transport and one store (tests, engine, benches)."""

    def __init__(self, store: BlobStore, data_dir: str, master_nodes: Iterable[str] = ("n1", "n2", "n3"),
                 data_nodes: Iterable[str] = (), *, transport: Transport | None = None,
                 initial_state: ClusterState | None = None, initial_manifest: Manifest | None = None,
                 purge_every: int = 10, purge_keep: int = 10) -> None:
        self.store = store
        self.purge = (purge_every, purge_keep)
        self.data_dir = data_dir
        self.transport = transport or Transport()
        self.master_names = tuple(master_nodes)
        self.data_names = tuple(data_nodes)
        self.nodes: dict[str, ClusterManagerNode] = {}
        self._initial = (initial_state, initial_manifest)
        #: set once a node of this cluster found its cluster UUID fenced: nothing is published any more
        self.superseded: ClusterStateSuperseded | None = None
        for name in (*self.master_names, *self.data_names):
            self.start(name)

    def start(self, name: str) -> ClusterManagerNode:
        """Start (or restart, from its data directory) node ``name``."""
        if name in self.nodes and self.transport.is_registered(name):
            raise InvalidError(f"node {name!r} is running; stop it first")
        state, manifest = self._initial
        node = ClusterManagerNode(
            name, self.transport, self.store, os.path.join(self.data_dir, name),
            master_eligible=name in self.master_names, peers=(*self.master_names, *self.data_names),
            initial_config=self.master_names, initial_state=state, initial_manifest=manifest,
            purge_every=self.purge[0], purge_keep=self.purge[1])
        node.superseded = self.superseded
        self.nodes[name] = node
        return node

    def stop(self, name: str) -> None:
        """Kill node ``name`` (its disk stays)."""
        self.transport.unregister(name)
        self.nodes[name].is_master = False

    def await_purges(self, timeout: float = 30.0) -> None:
        """Wait for the background purges the nodes started (a closing cluster must not delete while the
        next one reads the store); a failed or slow purge is logged, never raised."""
        for node in self.nodes.values():
            task = node.purge_task
            if task is None:
                continue
            try:
                task.wait(timeout)
            except Exception as exc:  # noqa: BLE001 - a purge is best effort: the next one redoes it
                log.warning("%s: cluster-state purge did not finish cleanly: %r", node.name, exc)

    def elect(self, name: str) -> ClusterState:
        """Make ``name`` run an election; returns the first state it published."""
        return self._fenced(self.nodes[name].start_election)

    def master(self) -> ClusterManagerNode | None:
        """The running node that believes it is master with the highest term, if any."""
        live = [n for n in self.nodes.values() if n.is_master and self.transport.is_registered(n.name)]
        return max(live, key=lambda n: n.current_term, default=None)

    def submit(self, task: Task) -> ClusterState:
        """Run a task on the current master."""
        if self.superseded is not None:
            raise self.superseded
        m = self.master()
        if m is None:
            raise NotMaster("(any)", None)
        return self._fenced(lambda: m.submit(task))

    def _fenced(self, call: Callable[[], ClusterState]) -> ClusterState:
        """Run ``call``; once a node is found superseded, remember it and fail every later call of every node."""
        if self.superseded is not None:
            raise self.superseded
        try:
            return call()
        except ClusterStateSuperseded as exc:
            self.superseded = exc
            for node in self.nodes.values():
                node.superseded, node.is_master = exc, False
            raise
