"""The engine's metadata lives in the remote cluster state (issue 6): published on every change, restored
after losing every node, and kept through the loss of the elected cluster manager."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.cluster_state.errors import NoClusterState
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.engine import Cluster
from shardstore.engine.manager.metadata import DATA_CLUSTER_UUID, DURABILITY
from shardstore.segments.mapping import Mapping


def _committed(store_url: str, cluster_uuid: str):
    svc = RemoteClusterStateService(open_store(store_url))
    manifest = svc.latest_manifest(cluster_uuid, committed_only=True)
    assert manifest is not None, f"no committed manifest for {cluster_uuid}"
    return manifest, svc.read_state(manifest)


def test_every_metadata_change_is_published_and_committed(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05)
    cluster.create_index("flights", shards=2, replicas=1, mappings={"delay": "long"}, durability="request")
    cluster.bulk("flights", [{"_id": str(i), "delay": i} for i in range(100)])
    _m, state = _committed(url, cluster.cluster_uuid)
    im = state.indices["flights"]
    meta = cluster.indices["flights"]
    assert (im.uuid, im.shards, im.replicas, Mapping.from_dict(im.mappings)) == (meta.uuid, 2, 1, Mapping.from_dict({"delay": "long"}))
    assert im.settings == {DURABILITY: "request", DATA_CLUSTER_UUID: cluster.cluster_uuid}
    assert im.primary_terms == (1, 1) and all(len(s) == 2 for s in im.in_sync)
    assert state.routing["flights"]["shards"][0][1] == cluster.primary_of("flights", 0)
    # a failover: the promotion's term and the new in-sync sets reach the committed state
    victim = cluster.primary_of("flights", 0)
    cluster.kill_node(victim)
    cluster.wait_for_health("green")
    _m, state = _committed(url, cluster.cluster_uuid)
    im = state.indices["flights"]
    assert im.primary_terms[0] == 2 == cluster.indices["flights"].routing[0].primary_term
    assert victim not in im.in_sync[0] and len(im.in_sync[0]) == 2
    assert cluster.cluster_state().version == state.version  # the master applied what it committed
    cluster.close()


def test_losing_the_elected_cluster_manager_elects_another_and_goes_on(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05)
    cluster.create_index("docs", shards=1, replicas=1)
    first = cluster.manager().name
    term_before = cluster.cluster_state().term
    cluster.kill_node(first)
    victim = cluster.primary_of("docs", 0)
    cluster.kill_node(victim)  # a promotion to publish with the elected manager gone
    cluster.wait_for_health("green")
    second = cluster.manager().name
    assert second not in (None, first) and cluster.cluster_state().term > term_before
    _m, state = _committed(url, cluster.cluster_uuid)
    assert state.indices["docs"].primary_terms == (2,)
    # with two of three managers gone there is no quorum: nothing is promoted, so no write is acknowledged
    # that a majority did not commit (issue 41: a cut-off manager must not decide)
    primary = cluster.primary_of("docs", 0)
    cluster.kill_node(second)
    cluster.kill_node(primary)
    assert not cluster.bulk("docs", [{"_id": "x"}]).acknowledged
    _m, state = _committed(url, cluster.cluster_uuid)
    assert state.indices["docs"].primary_terms == (2,)  # nothing committed without a quorum
    cluster.start_node(first)  # a quorum again: the last in-sync copy is promoted
    cluster.wait_for_health("yellow")
    assert cluster.bulk("docs", [{"_id": "x"}]).acknowledged == ["x"]
    _m, state = _committed(url, cluster.cluster_uuid)
    assert state.indices["docs"].primary_terms == (cluster.indices["docs"].routing[0].primary_term,) == (3,)
    cluster.close()


def test_restore_chains_a_new_cluster_uuid_and_keeps_the_data_where_it_is(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    with pytest.raises(NoClusterState):
        Cluster.restore(store=url, data_dir=str(tmp_path / "empty"), nodes=1)
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05)
    cluster.create_index("docs", shards=2, replicas=1)
    cluster.bulk("docs", [{"_id": str(i), "n": i} for i in range(300)])
    old_uuid = cluster.cluster_uuid
    cluster.close()
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=2, recovery_delay=0.05)
    assert restored.cluster_uuid != old_uuid and restored.restored_indices == ["docs"]
    manifest, state = _committed(url, restored.cluster_uuid)
    assert manifest.previous_cluster_uuid == old_uuid
    assert state.indices["docs"].settings[DATA_CLUSTER_UUID] == old_uuid  # the shards' blobs stay put
    restored.refresh("docs")
    assert restored.count("docs") == 300
    restored.bulk("docs", [{"_id": "new", "n": -1}])
    restored.flush("docs")
    restored.close()
    # and once more: a restore of the restored cluster finds the newest head of the chain
    again = Cluster.restore(store=url, data_dir=str(tmp_path / "c"), nodes=1, recovery_delay=0.05)
    manifest, _state = _committed(url, again.cluster_uuid)
    assert manifest.previous_cluster_uuid == restored.cluster_uuid
    again.refresh("docs")
    assert again.count("docs") == 301 and again.get("docs", "new")["_source"] == {"n": -1}
    again.close()


@pytest.mark.parametrize("kind", ["blocks", "coordination"])
def test_a_node_joins_when_a_shared_cluster_state_blob_is_lost(tmp_path: Path, kind: str) -> None:
    """An entity no publication rewrote since it was written (no twin: a restore replaces it) is lost from the store.
    A node that restarts has no state to apply a diff to and reads the whole state: the manager, told by its failed
    publication which blob is gone, writes the next one whole, so the node joins (process simulator seed 9712: the
    restarted node never applied a state, and reads of the primary it got were refused for good)."""
    url = f"file://{tmp_path / 'remote'}"
    with Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05) as cluster:
        cluster.create_index("docs", shards=1, replicas=2)
        cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(20)])
        manifest, _state = _committed(url, cluster.cluster_uuid)
        key = manifest.cluster[kind].key
        store = open_store(url)
        store.delete([key])
        cluster.kill_node("node-2")
        cluster.start_node("node-2")
        cluster.wait_for_health("green", timeout=30)
        node = cluster.processes["node-2"]
        deadline = time.monotonic() + 20  # it joins again until a publication reaches it
        while node.cm.applied is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.cm.applied is not None and node.cm.master is not None, "the restarted node never applied a state"
        cluster.refresh("docs")
        assert cluster.count("docs") == 20 and cluster.get("docs", "7")["_source"] == {"v": 7}
        # the state in the store reads whole again (no manifest since the repair names the lost blob)
        manifest, state = _committed(url, cluster.cluster_uuid)
        assert manifest.cluster[kind].key != key and "docs" in state.indices
