"""The Cluster API: indices, documents, optimistic concurrency, restarts and replica rebuilds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine import Cluster, IndexAlreadyExists, IndexNotFound, VersionConflict
from shardstore.engine.errors import InvalidRequest
from shardstore.segments.errors import MappingConflict


def _index_op(doc_id: str, source: bytes) -> pa.RecordBatch:
    from shardstore.translog.operations import index_batch

    return index_batch([doc_id], [source])


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=3)
    yield c
    c.close()


def test_index_get_delete_and_errors(cluster: Cluster) -> None:
    cluster.create_index("flights", shards=2, replicas=1, mappings={"delay": "long"})
    with pytest.raises(IndexAlreadyExists):
        cluster.create_index("flights")
    with pytest.raises(IndexNotFound, match="nope"):
        cluster.bulk("nope", [{"_id": "1"}])
    with pytest.raises(InvalidRequest, match="durability"):
        cluster.create_index("x", durability="sometimes")
    table = pa.table({"_id": [str(i) for i in range(100)], "delay": list(range(100)), "carrier": ["UA", "AA"] * 50})
    result = cluster.bulk("flights", table)
    assert not result.errors and sorted(result.acknowledged, key=int) == [str(i) for i in range(100)]
    assert set(result.items.column("shard").to_pylist()) == {0, 1}
    assert cluster.get("flights", "7")["_source"] == {"delay": 7, "carrier": "AA"}  # realtime, before refresh
    cluster.refresh("flights")
    assert cluster.count("flights") == 100
    cluster.delete("flights", "7")
    cluster.refresh("flights")
    assert cluster.get("flights", "7") is None and cluster.count("flights") == 99
    # a mapping conflict rejects that item at the door (decided once for the index), and says why
    bad = cluster.bulk("flights", [{"_id": "200", "delay": "late"}])
    assert bad.errors and "DocumentRejected" in bad.items.column("error")[0].as_py()
    assert "'delay': a value of type keyword conflicts with the mapped type long" in bad.items.column("error")[0].as_py()
    assert cluster.get("flights", "200") is None
    primary = cluster.primary_copy("flights", 0)
    before = primary.max_seq_no
    with pytest.raises(MappingConflict, match="delay"):  # the shard applies nothing, with the typed error
        primary.primary_apply(_index_op("200", b'{"delay": "late"}'))
    assert primary.max_seq_no == before and primary.local_checkpoint == before  # no seq# consumed, no gap


def test_optimistic_concurrency(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=1, replicas=1)
    cluster.bulk("docs", [{"_id": "a", "v": 1}])
    cur = cluster.get("docs", "a")
    cluster.index_doc("docs", {"_id": "a", "v": 2}, if_seq_no=cur["_seq_no"], if_primary_term=cur["_primary_term"])
    with pytest.raises(VersionConflict) as err:
        cluster.index_doc("docs", {"_id": "a", "v": 3}, if_seq_no=cur["_seq_no"], if_primary_term=cur["_primary_term"])
    assert "not applied" in str(err.value)
    assert cluster.get("docs", "a")["_source"]["v"] == 2
    with pytest.raises(VersionConflict):
        cluster.delete("docs", "a", if_seq_no=0, if_primary_term=7)


def test_versions_count_per_id_on_primary_and_replica_and_survive_failover(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=1, replicas=1)
    first = cluster.bulk("docs", [{"_id": "a", "v": 1}, {"_id": "b", "v": 1}, {"_id": "a", "v": 2}])
    assert first.items.column("version").to_pylist() == [1, 1, 2]  # repeats within one bulk count on
    cluster.refresh("docs")
    again = cluster.bulk("docs", [{"_id": "a", "v": 3}, {"_id": "c", "v": 1}])
    assert again.items.column("version").to_pylist() == [3, 1]  # from the refreshed segment and the buffer
    assert cluster.delete("docs", "b").items.column("version").to_pylist() == [2]
    assert cluster.get("docs", "a")["_version"] == 3
    meta = cluster.indices["docs"]
    replica = next(n for n in meta.routing[0].in_sync if n != cluster.primary_of("docs", 0))
    assert cluster.nodes[replica].copies[(meta.uuid, 0)].directory.get("a")["_version"] == 3  # replicated as stamped
    cluster.kill_node(cluster.primary_of("docs", 0))
    after = cluster.index_doc("docs", {"_id": "a", "v": 4})
    assert after.items.column("version").to_pylist() == [4]
    assert after.items.column("primary_term").to_pylist() == [2]


def test_racing_conditional_writes_let_exactly_one_through(cluster: Cluster) -> None:
    """The if_seq_no check runs on the primary under its write lock: of N writers holding the same seq#, one wins."""
    import threading

    cluster.create_index("docs", shards=1, replicas=1)
    cluster.bulk("docs", [{"_id": "k", "v": 0}])
    cur = cluster.get("docs", "k")
    wins, conflicts = [], []

    def writer(n: int) -> None:
        try:
            cluster.index_doc("docs", {"_id": "k", "v": n}, if_seq_no=cur["_seq_no"],
                              if_primary_term=cur["_primary_term"])
            wins.append(n)
        except VersionConflict:
            conflicts.append(n)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(conflicts) == 5
    doc = cluster.get("docs", "k")
    assert doc["_source"]["v"] == wins[0] and doc["_version"] == 2


def test_a_restarted_node_gets_a_replica_back_and_can_take_over(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=1, replicas=1)
    cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(500)])
    cluster.flush("docs")
    first = cluster.primary_of("docs", 0)
    cluster.kill_node(first)
    second = cluster.primary_of("docs", 0)
    assert second != first
    cluster.bulk("docs", [{"_id": str(i), "v": -i} for i in range(500, 600)])
    cluster.start_node(first)  # comes back with a wiped view: rebuilt as a replica by peer recovery
    cluster.wait_for_health("green")  # replicas are rebuilt in the background
    routing = cluster.indices["docs"].routing[0]
    assert len(routing.in_sync) == 2
    for name in [n for n in cluster.live_nodes() if n not in routing.in_sync]:
        cluster.kill_node(name)
    cluster.kill_node(second)
    assert cluster.primary_of("docs", 0) in routing.in_sync and cluster.indices["docs"].routing[0].primary_term == 3
    cluster.refresh("docs")
    assert cluster.count("docs") == 600 and cluster.get("docs", "550")["_source"]["v"] == -550


def test_failovers_without_flushes_then_restore(cluster: Cluster, tmp_path: Path) -> None:
    """Replay across term changes: two failovers with no flush since, a third, then a restore from the store."""
    cluster.create_index("docs", shards=1, replicas=1)
    cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(100)])
    cluster.flush("docs")
    for k in range(3):
        cluster.wait_for_health("green")  # the last failover's replica rebuild (background) is done
        victim = cluster.primary_of("docs", 0)
        cluster.kill_node(victim)
        assert not cluster.bulk("docs", [{"_id": f"k{k}", "v": k}]).errors
        cluster.start_node(victim)
    cluster.refresh("docs")
    assert cluster.count("docs") == 103
    cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "again"), nodes=2)
    restored.refresh("docs")
    assert restored.count("docs") == 103 and restored.get("docs", "k2")["_source"] == {"v": 2}
    restored.close()
