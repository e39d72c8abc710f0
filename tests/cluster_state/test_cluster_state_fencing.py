"""Two clusters on one store (issue 15, item 8): a superseded cluster's publications are fenced.

A bootstrap/restore that takes over the latest cluster UUID writes the fence record
``cluster-state-superseded/<old uuid>`` (put-if-absent) before it reads the old state; a
cluster manager GETs its UUID's fence after writing a committed manifest and before it
acknowledges.  Either the stale manager sees the fence (and does not acknowledge), or the
restore's read sees its commit (docs/design/cluster_state.md, "Fencing a superseded cluster").
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.cluster_state.coordination import LocalCluster
from shardstore.cluster_state.errors import ClusterStateSuperseded
from shardstore.cluster_state.fence import FENCES, fence_key, read_fence
from shardstore.cluster_state.model import ClusterState
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.cluster_state.restore import find_latest, restore_cluster_state
from shardstore.engine import Cluster
from shardstore.testing import FaultyStore

A_NODES, B_NODES = ("a1", "a2", "a3"), ("b1", "b2", "b3")


@pytest.fixture
def store(request: pytest.FixtureRequest):
    name = f"fence-{request.node.name[:40]}"
    s = open_store(f"memory://{name}/root")
    yield s
    from shardstore.plugins.memory import MemoryStore

    MemoryStore.drop(name)


def create(name: str) -> Callable[[ClusterState], ClusterState]:
    return lambda s: s.create_index(name, shards=1)


def committed_state(store, cluster_uuid: str) -> ClusterState:
    svc = RemoteClusterStateService(store)
    return svc.read_state(svc.latest_manifest(cluster_uuid))


def puts(store) -> int:
    return store.metrics()["requests"]["put"]


# -- (1) the scenario through the engine ------------------------------------------------


def test_second_cluster_on_the_store_fences_the_first_one(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    a = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=2, recovery_delay=0.05)
    b = None
    try:
        a.create_index("one")
        assert not a.bulk("one", [{"_id": str(i), "v": i} for i in range(5)]).errors
        b = Cluster(store=url, data_dir=str(tmp_path / "b"), nodes=2, recovery_delay=0.05)
        assert b.cluster_uuid != a.cluster_uuid and "one" in b.indices

        with pytest.raises(ClusterStateSuperseded) as info:  # raised as is: not retryable, unlike IndexNotCreated
            a.create_index("two")
        cause = info.value
        # b's managers may bootstrap twice (a first election whose publication found no quorum fenced a with
        # one UUID, the next one took over with another: issue 42's note, "left"); a is fenced either way
        assert cause.cluster_uuid == a.cluster_uuid and cause.superseded_by not in (None, a.cluster_uuid)
        assert a.cluster_uuid in str(cause) and cause.superseded_by in str(cause) and "stop" in str(cause)
        assert not cause.retryable
        assert "two" not in a.indices

        # remembered: a later creation fails the same way and writes no manifest under the old UUID
        manifests = RemoteClusterStateService(a.store).list_manifests(a.cluster_uuid)
        with pytest.raises(ClusterStateSuperseded):
            a.create_index("three")
        with pytest.raises(ClusterStateSuperseded):  # nor may a bulk add fields to the old cluster's mapping
            a.bulk("one", [{"_id": "new-field", "w": 1}])
        assert RemoteClusterStateService(a.store).list_manifests(a.cluster_uuid) == manifests

        # writes of the old cluster are not acknowledged either (the shard's term was claimed by b)
        res = a.bulk("one", [{"_id": "late", "v": 99}])
        assert res.errors and all(row["seq_no"] is None for row in res.items.to_pylist())

        b.create_index("bee")
        assert not b.bulk("bee", [{"_id": "x", "v": 1}]).errors
        assert not b.bulk("one", [{"_id": "from-b", "v": 7}]).errors
    finally:
        a.close()
        if b is not None:
            b.close()

    c = Cluster.restore(url, data_dir=str(tmp_path / "c"), nodes=2, recovery_delay=0.05)
    try:
        assert set(c.indices) == {"one", "bee"}
        assert c.get("one", "3")["_source"]["v"] == 3 and c.get("one", "from-b")["_source"]["v"] == 7
        assert c.get("one", "late") is None and c.get("bee", "x")["_source"]["v"] == 1
    finally:
        c.close()


# -- (2) the ordering, at every point of a stale manager's publication --------------------------


class HookStore(FaultyStore):
    """Runs ``hook`` once, before or after the first put/get whose key matches ``pattern``."""

    def __init__(self, inner, op: str, pattern: str, when: str, hook: Callable[[], None]) -> None:
        super().__init__(inner)
        self.op, self.pattern, self.when, self.hook = op, pattern, when, hook
        self.fired = False

    def _fire(self, op: str, key: str, when: str) -> None:
        if not self.fired and op == self.op and when == self.when and fnmatch.fnmatchcase(key, self.pattern):
            self.fired = True
            self.hook()

    def put(self, key, data, *, if_absent=False, token=None):
        self._fire("put", key, "before")
        try:
            return super().put(key, data, if_absent=if_absent, token=token)
        finally:
            self._fire("put", key, "after")

    def get(self, key):
        self._fire("get", key, "before")
        try:
            return super().get(key)
        finally:
            self._fire("get", key, "after")


#: (where in the stale master's publication the takeover runs, whether the master may acknowledge)
POINTS = [
    ("put", "*/manifest/*__P__*", "before", False),  # before its state is persisted
    ("put", "*/manifest/*__P__*", "after", False),  # persisted, not committed
    ("put", "*/manifest/*__C__*", "before", False),
    ("put", "*/manifest/*__C__*", "after", False),  # committed, its fence not checked yet
    ("get", FENCES + "*", "before", False),
    ("get", FENCES + "*", "after", True),  # the fence was checked: it acknowledges
]


IDS = [f"{w}-{o}-{p.split('__')[-2] if '__' in p else 'fence'}" for o, p, w, _ in POINTS]


@pytest.mark.parametrize("op,pattern,when,may_ack", POINTS, ids=IDS)
def test_acknowledged_publication_is_in_the_takeover_or_fenced(
        store, tmp_path: Path, op: str, pattern: str, when: str, may_ack: bool) -> None:
    a = LocalCluster(store, str(tmp_path / "a"), A_NODES)
    a.elect("a1")
    a.submit(create("first"))
    old_uuid = a.master().applied.cluster_uuid
    b = LocalCluster(store, str(tmp_path / "b"), B_NODES)
    taken: list[ClusterState] = []
    hooked = HookStore(store, op, pattern.replace("*/manifest", f"{old_uuid}/*/manifest"), when,
                       lambda: taken.append(b.elect("b1")))
    for node in a.nodes.values():
        node.remote = RemoteClusterStateService(hooked)

    try:
        a.submit(create("second"))
        acked = True
    except ClusterStateSuperseded as exc:
        assert (exc.cluster_uuid, exc.superseded_by) == (old_uuid, taken[0].cluster_uuid)
        acked = False
    assert hooked.fired and len(taken) == 1
    new = taken[0]
    assert new.cluster_uuid != old_uuid and "first" in new.indices
    assert acked == may_ack
    if acked:  # the invariant: an acknowledged index is in the state that took over
        assert "second" in new.indices
    else:
        assert a.master() is None and a.superseded is not None
    # the takeover's own state is committed and is what a restore finds
    assert find_latest(RemoteClusterStateService(store))[0] == new.cluster_uuid
    assert "first" in committed_state(store, new.cluster_uuid).indices


def test_fenced_cluster_stops_for_good_and_writes_nothing(store, tmp_path: Path) -> None:
    a = LocalCluster(store, str(tmp_path / "a"), A_NODES)
    a.elect("a1")
    a.submit(create("first"))
    old = a.master()
    b = LocalCluster(store, str(tmp_path / "b"), B_NODES)
    new = b.elect("b1")

    with pytest.raises(ClusterStateSuperseded):
        a.submit(create("second"))
    assert not old.is_master and a.master() is None
    before = puts(store)
    for call in (lambda: a.submit(create("third")), lambda: a.elect("a2"), lambda: old.submit(create("x")),
                 lambda: old.start_election()):
        with pytest.raises(ClusterStateSuperseded):
            call()
    # a node restarted from its disk, in a fresh LocalCluster (another process): the election checks first
    again = LocalCluster(store, str(tmp_path / "a"), A_NODES)
    with pytest.raises(ClusterStateSuperseded):
        again.elect("a3")
    assert puts(store) == before, "a superseded cluster wrote to the store"
    assert set(committed_state(store, new.cluster_uuid).indices) == {"first"}
    b.submit(create("b-index"))  # the cluster that took over goes on
    fence = read_fence(store, old.applied.cluster_uuid)
    assert fence is not None and (fence.cluster_uuid, fence.superseded_by, fence.node) == (
        old.applied.cluster_uuid, new.cluster_uuid, "b1")


def test_one_fence_get_per_publication_and_no_extra_put(store, tmp_path: Path) -> None:
    counted: dict[str, int] = {}

    class Counting(FaultyStore):
        def get(self, key):
            if key.startswith(FENCES):
                counted[key] = counted.get(key, 0) + 1
            return super().get(key)

        def put(self, key, data, *, if_absent=False, token=None):
            if key.startswith(FENCES):
                counted["put " + key] = counted.get("put " + key, 0) + 1
            return super().put(key, data, if_absent=if_absent, token=token)

    c = LocalCluster(Counting(store), str(tmp_path), A_NODES)
    c.elect("a1")
    cu = c.master().applied.cluster_uuid
    counted.clear()
    for i in range(3):
        c.submit(create(f"i{i}"))
    assert counted == {fence_key(cu): 3}  # the master's one GET each; followers and PUTs: none


# -- (3) restore with fence records in the store ---------------------------------------------------


def test_restore_and_purge_ignore_fences_and_a_wiped_uuid_cannot_come_back(store, tmp_path: Path) -> None:
    a = LocalCluster(store, str(tmp_path / "a"), A_NODES)
    a.elect("a1")
    a.submit(create("a-index"))
    ua = a.master().applied.cluster_uuid
    b = LocalCluster(store, str(tmp_path / "b"), B_NODES)
    ub = b.elect("b1").cluster_uuid
    b.submit(create("b-index"))
    svc = RemoteClusterStateService(store)
    assert svc.purge().wiped_uuids == [ua]
    c = restore_cluster_state(store, ("c1", "c2", "c3"))  # the function path fences too
    uc = c.state.cluster_uuid
    assert c.previous_cluster_uuid == ub
    assert svc.purge().wiped_uuids == [ub]
    assert sorted(svc.cluster_uuids()) == [uc]

    # the old managers, still running or restarted from their disks, cannot resurrect their UUID
    with pytest.raises(ClusterStateSuperseded):
        a.submit(create("late"))
    with pytest.raises(ClusterStateSuperseded):
        LocalCluster(store, str(tmp_path / "a"), A_NODES).elect("a2")
    with pytest.raises(ClusterStateSuperseded):
        LocalCluster(store, str(tmp_path / "b"), B_NODES).elect("b2")
    assert sorted(svc.cluster_uuids()) == [uc]
    # the fences outlive the wiped cluster states; they are neither UUIDs nor manifests
    assert sorted(k.key for k in store.list(FENCES)) == sorted([fence_key(ua), fence_key(ub)])
    assert read_fence(store, ub).superseded_by == uc

    head, chain = find_latest(svc)
    assert head == uc and chain == [uc]
    d = restore_cluster_state(store, ("d1",))
    assert d.previous_cluster_uuid == uc and set(d.state.indices) == {"a-index", "b-index"}
    assert read_fence(store, uc).superseded_by == d.state.cluster_uuid


def test_unreadable_fence_still_fences_and_restore_works(store, tmp_path: Path) -> None:
    a = LocalCluster(store, str(tmp_path / "a"), A_NODES)
    a.elect("a1")
    a.submit(create("first"))
    ua = a.master().applied.cluster_uuid
    b = LocalCluster(store, str(tmp_path / "b"), B_NODES)
    b.elect("b1")
    store.put(fence_key(ua), b"garbage")  # damaged record: the key's existence is the fence
    with pytest.raises(ClusterStateSuperseded) as info:
        a.submit(create("second"))
    assert "unreadable" in info.value.superseded_by
    assert set(restore_cluster_state(store, ("c1",)).state.indices) == {"first"}
