"""The remote cluster-state service on real stores: incremental writes, chunk reuse, crashes, fallback, purge."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from shardstore.cluster_state import entities as E
from shardstore.cluster_state.errors import ManifestConflict, NoClusterState
from shardstore.cluster_state.manifest import manifest_prefix
from shardstore.cluster_state.model import ClusterState, IndexMetadata
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.testing import FaultyStore, SimulatedCrash

REMOTE = pytest.mark.parametrize("backend", ["memory", "file", "s3"], indirect=True)
LOCAL = pytest.mark.parametrize("backend", ["memory", "file"], indirect=True)
MEMORY = pytest.mark.parametrize("backend", ["memory"], indirect=True)


def make_state(n: int, cluster_uuid: str = "cu") -> ClusterState:
    s = ClusterState.initial(["n1", "n2", "n3"], cluster_uuid=cluster_uuid).successor(1)
    s = replace(s, cluster_uuid_committed=True)  # as after the cluster's first commit
    s = s.with_indices([IndexMetadata.create(f"idx-{i:05d}", shards=2, replicas=1,
                                             settings={"refresh_interval": "1s"},
                                             mappings={"properties": {"f": {"type": "keyword"}}})
                        for i in range(n)])
    s = s.with_routing("idx-00000", {"0": ["n1"], "1": ["n2"]})
    return s.with_settings(persistent={"a": 1}).with_nodes({"n1": {}, "n2": {}})


def bump(s: ClusterState, name: str, term: int | None = None) -> ClusterState:
    return s.update_index(name, lambda im: im.with_primary_term(0, im.primary_terms[0] + 1)).successor(term or s.term)


def reqs(store) -> dict[str, int]:
    return store.metrics()["requests"]


@REMOTE
def test_write_read_full_and_incremental_round_trip(store_factory) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s1 = make_state(20)
    m1 = svc.mark_committed(svc.write_full(s1))
    assert svc.latest_manifest("cu").state_uuid == s1.state_uuid
    s2 = bump(s1, "idx-00003").with_routing("idx-00004", {"0": ["n3"]}).with_settings(transient={"t": 2})
    s2 = s2.without_index("idx-00007").create_index("fresh")
    m2 = svc.write_incremental(s1, m1, s2)
    assert m2.diff.base == s1.state_uuid and m2.diff.removed == ("idx-00007",)
    assert set(m2.diff.indices) == {"idx-00003", "fresh"} and m2.diff.cluster == ("transient",)
    # published-only: the committed latest is still s1
    assert svc.latest_manifest("cu").state_uuid == s1.state_uuid
    assert svc.latest_manifest("cu", committed_only=False).state_uuid == s2.state_uuid
    svc.mark_committed(m2)

    reader = RemoteClusterStateService(store)  # a follower: a fresh service, no cache
    latest = reader.latest_manifest("cu")
    assert reader.read_state(latest) == s2
    inc = reader.read_incremental(latest, s1)
    assert inc.incremental and inc.state == s2
    full = reader.read_incremental(latest, make_state(3, "cu"))  # not the diff base: full download
    assert not full.incremental and full.state == s2 and full.bytes_downloaded > inc.bytes_downloaded
    svc.close()


@MEMORY
def test_one_index_change_at_1000_indices_costs_constant_puts_and_reuses_chunks(store_factory) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s = make_state(1000)
    m = svc.mark_committed(svc.write_full(s))
    assert m.chunk_count == 4 and sum(c.count for c in m.chunks.values()) == 1000
    for name in ("idx-00010", "idx-00500", "idx-00999"):
        store.reset_metrics()
        s2 = bump(s, name)
        m2 = svc.write_incremental(s, m, s2)
        r = reqs(store)
        # the index entity and its one chunk, each with its twin, then the manifest; nothing read
        # (the chunk was cached)
        assert (r["put"], r["get"], r["list"]) == (5, 0, 0), r
        assert len(set(m2.chunks.values()) - set(m.chunks.values())) == 1
        assert store.metrics()["bytes_out"] < 4 * (m2.cluster["settings"].size + 64 * 1024)
        s, m = s2, svc.mark_committed(m2)
    # a cold writer (no cache) reads only the one chunk it rewrites
    cold = RemoteClusterStateService(store)
    store.reset_metrics()
    s2 = bump(s, "idx-00042")
    cold.write_incremental(s, m, s2)
    assert (reqs(store)["put"], reqs(store)["get"]) == (5, 1)
    # a follower applying it downloads the manifest, one chunk and one index entity
    follower = RemoteClusterStateService(store)
    res = follower.read_published("cu", s2.term, s2.version, s)
    assert res.incremental and res.gets == 3 and res.state == s2
    # growing past the chunk target re-chunks once, and the state still reads back
    big = s2.with_indices([IndexMetadata.create(f"more-{i}") for i in range(100)]).successor(1)
    mb = svc.write_incremental(s2, svc.manifest_for("cu", s2.term, s2.version), big)
    assert mb.chunk_count == 8 and RemoteClusterStateService(store).read_state(mb) == big


def _faulty(store_factory) -> tuple[FaultyStore, RemoteClusterStateService]:
    inner = store_factory()
    store = FaultyStore(inner)
    return store, RemoteClusterStateService(store, workers=2)


CRASH_POINTS = [
    ("first entity", "*/cluster-state/index/*", "crash_before", 0),
    ("second entity", "*/cluster-state/index/*", "crash_after", 1),
    ("chunk", "*/cluster-state/chunk/*", "crash_before", 0),
    ("manifest lost", "*__P__*", "crash_before", 0),
    ("manifest landed", "*__P__*", "crash_after", 0),
    ("commit lost", "*__C__*", "crash_before", 0),
    ("commit landed", "*__C__*", "crash_after", 0),
]


@REMOTE
@pytest.mark.parametrize("point", CRASH_POINTS, ids=[p[0] for p in CRASH_POINTS])
def test_a_crash_anywhere_never_shows_a_half_written_state(store_factory, point) -> None:
    _name, pattern, action, after = point
    store, svc = _faulty(store_factory)
    s1 = make_state(12)
    m1 = svc.mark_committed(svc.write_full(s1))
    s2 = bump(bump(s1, "idx-00001"), "idx-00002")
    store.inject(op="put", key=pattern, action=action, after=after)
    with pytest.raises(SimulatedCrash):
        svc.mark_committed(svc.write_incremental(s1, m1, s2))
    store.clear()
    fresh = RemoteClusterStateService(store.inner)
    # every manifest in the store describes a complete state
    for name in fresh.list_manifests("cu"):
        m = fresh.read_manifest(name.key)
        assert fresh.read_state(m) in (s1, s2)
    landed = {n.version for n in fresh.list_manifests("cu")}
    assert (s2.version in landed) == (point[0] in ("manifest landed", "commit lost", "commit landed"))
    restored = fresh.restore_latest("cu")
    expected = s2 if point[0] == "commit landed" else s1
    assert restored.state == expected and not restored.fell_back
    # the writer can retry the same publication after the crash (ambiguous replies included)
    svc.mark_committed(svc.write_incremental(s1, m1, s2)) if point[0] not in (
        "manifest landed", "commit lost", "commit landed") else svc.mark_committed(
        svc.manifest_for("cu", s2.term, s2.version))
    assert fresh.restore_latest("cu").state == s2


@LOCAL
@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_corrupt_or_missing_entity_falls_back_to_an_older_complete_manifest(store_factory, damage) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s1 = make_state(8)
    m1 = svc.mark_committed(svc.write_full(s1))
    s2 = bump(s1, "idx-00005")
    m2 = svc.mark_committed(svc.write_incremental(s1, m1, s2))
    s3 = s2.with_settings(persistent={"a": 3}).successor(1)
    svc.mark_committed(svc.write_incremental(s2, m2, s3))
    # damage the index entity only s2 and s3 reference
    key = next(b.key for b in store.list(E.prefix("cu", "index")) if E.key_term_version(b.key) == (1, s2.version))

    def hit(k: str) -> None:
        if damage == "corrupt":
            data = bytearray(store.get(k))
            data[20] ^= 0xFF
            store.put(k, bytes(data))
        else:
            store.delete([k])

    # one copy damaged: its twin is read, nothing falls back
    hit(key)
    res = RemoteClusterStateService(store).restore_latest("cu")
    assert res.state == s3 and not res.fell_back
    # both copies damaged: the states that reference the entity are skipped
    hit(E.twin_key(key))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = RemoteClusterStateService(store).restore_latest("cu")
    assert res.state == s1 and res.manifest.version == s1.version
    assert res.fell_back and [k for k, _ in res.skipped] == [
        n.key for n in svc.list_manifests("cu") if n.committed and n.version > s1.version]
    assert any(key in reason for _, reason in res.skipped)
    assert any("falling back" in str(w.message) for w in caught)


@MEMORY
def test_manifest_conflict_fences_a_second_writer_of_the_same_term_and_version(store_factory) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s1 = make_state(3)
    m1 = svc.mark_committed(svc.write_full(s1))
    a, b = bump(s1, "idx-00001"), bump(s1, "idx-00002")
    svc.write_incremental(s1, m1, a)
    with pytest.raises(ManifestConflict, match="step down"):
        RemoteClusterStateService(store).write_incremental(s1, m1, b)
    # the same state again (an ambiguous retry) is accepted
    svc.write_incremental(s1, m1, a)
    with pytest.raises(NoClusterState):
        svc.restore_latest("nobody")


@LOCAL
def test_purge_keeps_the_newest_states_and_everything_they_reference(store_factory) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s = make_state(300)
    m = svc.mark_committed(svc.write_full(s))
    states = [s]
    for i in range(14):
        s2 = bump(s, f"idx-{i * 20:05d}")
        m = svc.mark_committed(svc.write_incremental(s, m, s2))
        s = s2
        states.append(s)
    # leftovers: an orphan from a crashed older upload, and an entity of a publication in flight
    orphan = E.entity_key("cu", "index", "zzz", 1, 3)
    in_flight = E.entity_key("cu", "index", "zzz", 1, s.version + 1)
    store.put(orphan, b"x")
    store.put(in_flight, b"y")
    task = svc.purge_async(keep=5)
    report = task.wait(60)
    assert task.done() and report.cluster_uuid == "cu"
    names = svc.list_manifests("cu")
    assert [n.version for n in names if n.committed] == [st.version for st in reversed(states[-5:])]
    assert len(report.kept_manifests) == 10 and orphan in report.deleted and in_flight not in report.deleted
    assert not store.exists(orphan) and store.exists(in_flight)
    reader = RemoteClusterStateService(store)
    for n in names:  # every kept state is still complete
        assert reader.read_state(reader.read_manifest(n.key)) in states[-5:]
    # the very first full write's index entities that are still referenced survived
    assert reader.read_state(reader.latest_manifest("cu")) == s
    assert svc.purge(keep=5).deleted == []
    assert all(E.key_term_version(k) is not None or "manifest" in k for k in report.deleted)
    assert len([b for b in store.list(manifest_prefix("cu"))]) == 10


@MEMORY
def test_recreated_index_shrinking_cluster_and_routing_changes_read_back(store_factory) -> None:
    store = store_factory()
    svc = RemoteClusterStateService(store)
    s = make_state(600)
    m = svc.mark_committed(svc.write_full(s))
    assert m.chunk_count == 4
    # delete and re-create one name with a new UUID (it may move to another chunk), move a routing table
    old_uuid = s.indices["idx-00001"].uuid
    s2 = s.without_index("idx-00001").create_index("idx-00001", shards=5)
    s2 = s2.with_routing("idx-00000", None).with_routing("idx-00002", {"0": ["n9"]}).successor(1)
    m2 = svc.mark_committed(svc.write_incremental(s, m, s2))
    follower = RemoteClusterStateService(store)
    res = follower.read_incremental(m2, s)
    assert res.incremental and res.state == s2 and res.state.indices["idx-00001"].uuid != old_uuid
    assert follower.read_state(m2) == s2
    # shrinking below a quarter of the chunk capacity halves the chunk count and re-chunks everything
    s3 = s2.successor(1)
    for name in sorted(s2.indices)[:560]:
        s3 = s3.without_index(name)
    m3 = svc.mark_committed(svc.write_incremental(s2, m2, s3))
    assert m3.chunk_count == 1 and m3.index_count == 40 and sum(c.count for c in m3.chunks.values()) == 40
    assert RemoteClusterStateService(store).read_state(m3) == s3
    res = RemoteClusterStateService(store).read_incremental(m3, s2)
    assert res.incremental and res.state == s3
    # the previous manifest must be the one of the previous state
    from shardstore.errors import InvalidError

    with pytest.raises(InvalidError, match="pass the manifest"):
        svc.write_incremental(s, m3, s3.successor(1))
    with pytest.raises(InvalidError, match="not newer"):
        svc.write_incremental(s3, m3, s3)
