"""Restore after losing every cluster-manager node, the seed's UUID race through a real store, and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.cli import main as cli_main
from shardstore.cluster_state import entities as E
from shardstore.cluster_state.coordination import LocalCluster
from shardstore.cluster_state.errors import MultipleClusterUUIDs, NoClusterState
from shardstore.cluster_state.remote import UUID_MARKERS, RemoteClusterStateService
from shardstore.cluster_state.restore import find_latest, restore_cluster_state

REMOTE = pytest.mark.parametrize("backend", ["memory", "file", "s3"], indirect=True)
LOCAL = pytest.mark.parametrize("backend", ["file"], indirect=True)


def build_cluster(store, data_dir: Path) -> tuple[LocalCluster, object]:
    c = LocalCluster(store, str(data_dir), ("n1", "n2", "n3"))
    c.elect("n1")
    for i in range(5):
        c.submit(lambda s, i=i: s.create_index(f"idx{i}", shards=3, replicas=1, mappings={"properties": {}}))
    c.submit(lambda s: s.update_index("idx2", lambda im: im.with_primary_term(1, 7).with_in_sync(1, {"a", "b"})))
    c.submit(lambda s: s.with_settings(persistent={"cluster.name": "prod"}, transient={"t": 1})
             .with_routing("idx0", {"0": ["n1", "n2"]}))
    return c, c.nodes["n1"].applied


@REMOTE
def test_restore_after_losing_every_cluster_manager_node(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    c, before = build_cluster(store, tmp_path / "old")
    for n in list(c.nodes):
        c.stop(n)  # every disk is lost: the new nodes start empty
    res = restore_cluster_state(store, ["m1", "m2", "m3"])
    new = res.state
    assert res.previous_cluster_uuid == before.cluster_uuid and res.chain == [before.cluster_uuid]
    assert new.cluster_uuid != before.cluster_uuid and res.manifest.previous_cluster_uuid == before.cluster_uuid
    assert new.indices == before.indices and new.indices["idx2"].primary_terms == (1, 7, 1)
    assert new.persistent_settings == before.persistent_settings
    assert new.routing == {} and new.transient_settings == {} and new.nodes == {}
    assert new.term == before.term + 1 and new.coordination.last_committed_config.node_ids == ("m1", "m2", "m3")
    assert res.manifest.committed and not res.fell_back
    assert new.metadata_fingerprint() == before.metadata_fingerprint()

    # the new cluster-manager nodes start from it and keep publishing under the new UUID
    c2 = LocalCluster(store, str(tmp_path / "new"), ("m1", "m2", "m3"), initial_state=new,
                      initial_manifest=res.manifest)
    s = c2.elect("m2")
    assert s.cluster_uuid == new.cluster_uuid and s.indices == before.indices and s.term > new.term
    s = c2.submit(lambda st: st.create_index("after"))
    assert find_latest(RemoteClusterStateService(store)) == (new.cluster_uuid, [new.cluster_uuid, before.cluster_uuid])
    # purge: the old UUID is wiped once the new one has a committed state
    report = RemoteClusterStateService(store).purge()
    assert report.wiped_uuids == [before.cluster_uuid]
    assert not list(store.list(E.prefix(before.cluster_uuid))) and not store.exists(UUID_MARKERS + before.cluster_uuid)
    svc = RemoteClusterStateService(store)
    assert svc.restore_latest(new.cluster_uuid).state == s
    assert find_latest(svc)[0] == new.cluster_uuid


def test_restore_refuses_an_empty_store_and_ignores_never_committed_uuids(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    with pytest.raises(NoClusterState, match="bootstrap a new cluster"):
        restore_cluster_state(store, ["m1"])
    c, before = build_cluster(store, tmp_path / "old")
    # a bootstrap that published but never committed (crashed): ignored by the algorithm
    svc = RemoteClusterStateService(store)
    ghost = before.with_settings(persistent={"ghost": True})
    from dataclasses import replace

    svc.write_full(replace(ghost, cluster_uuid="ghost-uuid"), previous_cluster_uuid=before.cluster_uuid)
    res = restore_cluster_state(store, ["m1"])
    assert res.previous_cluster_uuid == before.cluster_uuid and "ghost" not in res.state.persistent_settings


def test_successive_restores_chain_their_uuids_and_purge_keeps_only_the_head(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    c, before = build_cluster(store, tmp_path / "old")
    r2 = restore_cluster_state(store, ["a"], cluster_uuid="uuid2")
    r3 = restore_cluster_state(store, ["b"], cluster_uuid="uuid3")
    assert r2.previous_cluster_uuid == before.cluster_uuid and r3.previous_cluster_uuid == "uuid2"
    svc = RemoteClusterStateService(store)
    assert find_latest(svc) == ("uuid3", ["uuid3", "uuid2", before.cluster_uuid])
    assert r3.state.indices == before.indices
    report = svc.purge()
    assert report.cluster_uuid == "uuid3" and report.wiped_uuids == [before.cluster_uuid, "uuid2"]  # oldest first
    assert svc.cluster_uuids() == ["uuid3"]
    assert svc.restore_latest("uuid3").state.indices == before.indices


def test_seed_race_trims_the_unchanged_restore_and_refuses_two_changed_ones(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    c, before = build_cluster(store, tmp_path / "old")
    svc = RemoteClusterStateService(store)
    old = svc.restore_latest(before.cluster_uuid).state
    from shardstore.cluster_state.restore import restored_state

    def restore_as(uuid: str, change: bool):
        s = restored_state(old, ["x"], cluster_uuid=uuid)
        m = svc.mark_committed(svc.write_full(s, previous_cluster_uuid=before.cluster_uuid))
        if change:
            s2 = s.create_index(f"only-in-{uuid}").successor(s.term)
            svc.mark_committed(svc.write_incremental(s, m, s2))

    restore_as("uuid2", change=False)
    restore_as("uuid3", change=True)
    assert find_latest(svc)[0] == "uuid3"
    assert restore_cluster_state(store, ["m"]).previous_cluster_uuid == "uuid3"
    store2 = open_store(f"file://{tmp_path / 'store2'}")
    c, before = build_cluster(store2, tmp_path / "old2")
    svc = RemoteClusterStateService(store2)
    old = svc.restore_latest(before.cluster_uuid).state
    restore_as("uuid2", change=True)
    restore_as("uuid3", change=True)
    with pytest.raises(MultipleClusterUUIDs) as e:
        restore_cluster_state(store2, ["m"])
    assert e.value.heads == ("uuid2", "uuid3")


@LOCAL
def test_cli_show_prints_the_chain_the_manifest_and_problems(store_factory, tmp_path: Path, capsys) -> None:
    store = store_factory()
    c, before = build_cluster(store, tmp_path / "old")
    url = store_factory.url(store_factory.last_prefix)
    assert cli_main(["cluster-state", "show", url]) == 0
    out = capsys.readouterr().out
    assert f"UUID chain: {before.cluster_uuid}" in out and "problems: none" in out
    assert f"term {before.term}  version {before.version}" in out and "verified=yes" in out
    assert "indices 5 in 1 chunk(s)" in out and "settings" in out
    # an orphan (crashed upload) is reported but not fatal; a missing referenced blob is
    orphan = E.entity_key(before.cluster_uuid, "index", "zz", 1, 2)
    store.put(orphan, b"x")
    assert cli_main(["cluster-state", "show", url]) == 0
    assert f"orphan   {orphan}" in capsys.readouterr().out
    # a flipped bit in an index entity of the latest state: a checksum failure
    from shardstore.cluster_state.purge import referenced_keys

    svc = RemoteClusterStateService(store)
    latest = [n for n in svc.list_manifests(before.cluster_uuid) if n.committed][:1]
    idx = sorted(k for k in referenced_keys(svc, latest) if "/cluster-state/index/" in k)[0]
    good = store.get(idx)
    # one copy: the state still reads (its twin), but the report names the damaged copy
    store.put(idx, good[:-1] + bytes([good[-1] ^ 0x10]))
    assert cli_main(["cluster-state", "show", url]) == 1
    out = capsys.readouterr().out
    assert "degraded" in out and "verified=yes" in out and idx in out and "corrupt (" in out
    # both copies: the state does not read back
    twin = E.twin_key(idx)
    store.put(twin, good[:-1] + bytes([good[-1] ^ 0x10]))
    assert cli_main(["cluster-state", "show", url]) == 1
    out = capsys.readouterr().out
    assert "corrupt" in out and "verified=no" in out and idx in out
    store.put(idx, good)
    store.put(twin, good)
    victim = next(b.key for b in store.list(E.prefix(before.cluster_uuid, "settings")))
    store.delete([victim])
    assert cli_main(["cluster-state", "show", url]) == 1
    out = capsys.readouterr().out
    assert "degraded" in out and victim in out and "missing;" in out and "missing  " not in out
    store.delete([E.twin_key(victim)])
    assert cli_main(["cluster-state", "show", url]) == 1
    out = capsys.readouterr().out
    assert "missing  " in out and victim in out


def test_new_nodes_with_empty_disks_bootstrap_from_the_store_on_election(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    c, before = build_cluster(store, tmp_path / "old")
    for n in list(c.nodes):
        c.stop(n)
    fresh = LocalCluster(store, str(tmp_path / "new"), ("m1", "m2", "m3"))
    s = fresh.elect("m3")
    assert s.cluster_uuid != before.cluster_uuid and s.indices == before.indices
    assert s.indices["idx2"].primary_terms == (1, 7, 1) and s.persistent_settings == {"cluster.name": "prod"}
    svc = RemoteClusterStateService(store)
    assert svc.latest_manifest(s.cluster_uuid).previous_cluster_uuid == before.cluster_uuid
    assert find_latest(svc) == (s.cluster_uuid, [s.cluster_uuid, before.cluster_uuid])
    # a brand-new store bootstraps an empty cluster
    empty = LocalCluster(open_store(f"file://{tmp_path / 'empty'}"), str(tmp_path / "e"), ("e1",))
    assert empty.elect("e1").indices == {}


def test_a_restore_reading_while_the_last_cluster_still_purges_finds_the_one_head(tmp_path: Path) -> None:
    """Chaos seed 636: the previous cluster's manager was stopped while its background purge wiped the UUIDs
    behind its head (oldest first), and the restore read the UUIDs one by one meanwhile: U1 before its wipe, U2
    after its manifests went, so U1 and U3 both looked like heads (MultipleClusterUUIDs).  The restore now reads
    again before refusing.  Real LocalClusters on one memory store; the FaultyStore wrappers only delay a LIST
    each, to fix the interleaving (no real part can be paused on demand there)."""
    from shardstore.cluster_state import tasks
    from shardstore.cluster_state.manifest import manifest_prefix
    from shardstore.testing import FaultyStore

    managers = ("cm-0", "cm-1", "cm-2")
    for attempt in range(20):
        inner = open_store(f"memory://seed636-{attempt}-{tmp_path.name}")
        uuids = []
        for gen in range(3):  # U1 <- U2 <- U3, each a restore on empty disks
            lc = LocalCluster(inner, str(tmp_path / f"a{attempt}-gen{gen}"), managers, purge_every=0)
            uuids.append(lc.elect("cm-0").cluster_uuid)
            lc.submit(tasks.create_index(f"ix{gen}", shards=1))
            for n in managers:
                lc.stop(n)
        u1, u2, u3 = uuids
        if u1 > u2:
            continue  # the UUIDs are read in key order: the race needs U1 read before U2
        old_store = FaultyStore(inner, seed=1)
        old = LocalCluster(old_store, str(tmp_path / f"a{attempt}-gen2"), managers, purge_every=2)
        old.elect("cm-1")
        old_store.inject(op="list", key=UUID_MARKERS + "*", action="delay", delay=0.2, times=1)
        old.submit(tasks.create_index("late", shards=1))  # its 2nd commit: the purge starts in the background
        purge = old.master().purge_task
        for n in managers:
            old.stop(n)  # stopped, its purge still running (as on a manager cut off, not yet dead)
        new_store = FaultyStore(inner, seed=2)
        new_store.inject(op="list", key=manifest_prefix(u2) + "*", action="delay", delay=0.6, times=1)
        new = LocalCluster(new_store, str(tmp_path / f"a{attempt}-gen3"), managers)
        state = new.elect("cm-0")  # MultipleClusterUUIDs before the fix
        report = purge.wait(10)
        assert report.wiped_uuids == [u1, u2]
        head, chain = find_latest(RemoteClusterStateService(inner))
        assert head == state.cluster_uuid and chain == [state.cluster_uuid, u3]
        assert "late" in state.indices  # restored from U3's newest committed state
        return
    pytest.fail("no attempt drew U1 before U2 in key order")
