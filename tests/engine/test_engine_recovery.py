"""Background work after a failover: replica allocation (pure), two-phase peer recovery while writes go on,
the new primary's re-upload under its term, concurrent clients, and a stale primary's requests."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.blobstores import open_store
from shardstore.core.path_strategy import PlainPathStrategy
from shardstore.engine import Cluster, StalePrimary
from shardstore.engine.manager.allocation import cluster_health, plan_replicas, wanted_copies
from shardstore.engine.manager.metadata import IndexMeta, ShardRouting
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.segments.errors import UploadCancelled
from shardstore.segments.remote_store import RemoteSegmentStore, list_commit_keys
from shardstore.testing.partition_campaign import wait_until
from shardstore.translog.operations import index_batch


def _meta(name: str, replicas: int, routing: list[tuple[str | None, list[str], list[str]]]) -> IndexMeta:
    return IndexMeta(name, f"u-{name}", len(routing), replicas, {}, "request", PlainPathStrategy(),
                     tuple(ShardRouting(i, p, 1, tuple(c), tuple(s)) for i, (p, c, s) in enumerate(routing)))


# -- pure decisions ---------------------------------------------------------------------------


def test_plan_replicas_fills_missing_copies_least_loaded_first_one_per_shard() -> None:
    live = ["n0", "n1", "n2"]
    idx = {"a": _meta("a", 1, [("n0", ["n0"], ["n0"]), ("n1", ["n1", "n2"], ["n1", "n2"]), (None, [], [])])}
    plan = plan_replicas(idx, live, {"n0": 1, "n1": 2, "n2": 1})
    # shard 0 lacks its replica: n2 (load 1, before n1's 2); shard 1 is complete; shard 2 has no primary
    assert [(p.index, p.shard, p.target) for p in plan] == [("a", 0, "n2")]
    assert plan_replicas(idx, live, {}, frozenset({("a", 0)})) == []  # already recovering
    # two replicas wanted but only two nodes live: one replica is all there can be
    two = {"b": _meta("b", 2, [("n0", ["n0"], ["n0"])])}
    assert wanted_copies(two["b"], 2) == 2
    assert [(p.shard, p.target) for p in plan_replicas(two, ["n0", "n1"], {})] == [(0, "n1")]
    # each planned copy counts toward the load of the next decision
    many = {"c": _meta("c", 1, [("n0", ["n0"], ["n0"]), ("n0", ["n0"], ["n0"])])}
    assert sorted(p.target for p in plan_replicas(many, ["n0", "n1", "n2"], {})) == ["n1", "n2"]


def test_cluster_health_traffic_light() -> None:
    live = ["n0", "n1"]
    green = {"a": _meta("a", 1, [("n0", ["n0", "n1"], ["n0", "n1"])])}
    assert cluster_health(green, live).status == "green"
    yellow = {"a": _meta("a", 1, [("n0", ["n0"], ["n0"])])}
    h = cluster_health(yellow, live)
    assert (h.status, h.unassigned_shards, h.active_shards) == ("yellow", 1, 1)
    h = cluster_health(yellow, live, frozenset({("a", 0)}))
    assert (h.status, h.initializing_shards, h.unassigned_shards) == ("yellow", 1, 0)
    red = {"a": _meta("a", 1, [(None, [], []), ("n0", ["n0", "n1"], ["n0", "n1"])])}
    h = cluster_health(red, live)
    assert h.status == "red" and h.red_shards == ("a/0",) and h.active_primaries == 1


def test_cluster_health_says_when_allocation_settled_and_whether_green_is_possible() -> None:
    """What ``Client.wait_for_allocation`` and ``wait_for_health`` wait on (issue 42): one answer from the manager
    for the embedded cluster and for node processes alike."""
    two = ["n0", "n1"]
    done = {"a": _meta("a", 1, [("n0", ["n0", "n1"], ["n0", "n1"])])}
    h = cluster_health(done, two)
    assert (h.settled, h.green_possible, h.data_nodes) == (True, True, 2)
    missing = {"a": _meta("a", 1, [("n0", ["n0"], ["n0"])])}
    assert not cluster_health(missing, two).settled  # a replica the second node can hold is not there yet
    assert not cluster_health(missing, two, frozenset({("a", 0)})).settled  # recovering
    # one data node: yellow is all there can be; allocation settled, green impossible
    h = cluster_health(missing, ["n0"])
    assert (h.status, h.settled, h.green_possible) == ("yellow", True, False)
    # two replicas wanted, two nodes: settled with one replica, green impossible
    wide = {"b": _meta("b", 2, [("n0", ["n0", "n1"], ["n0", "n1"])])}
    h = cluster_health(wide, two)
    assert (h.status, h.settled, h.green_possible) == ("yellow", True, False)
    red = {"a": _meta("a", 1, [(None, [], [])])}
    assert not cluster_health(red, two).settled
    assert cluster_health({}, two).settled  # nothing to allocate


# -- peer recovery ----------------------------------------------------------------------------


def _docs(prefix: str, n: int, tag: str) -> pa.RecordBatch:
    return index_batch([f"{prefix}{i}" for i in range(n)], [json.dumps({"tag": tag}).encode()] * n)


def _state(copy: ShardCopy) -> dict[str, tuple[int, int]]:
    copy.directory.refresh()
    out: dict[str, tuple[int, int]] = {}
    for b in copy.directory.scan(columns=["_id", "_seq_no", "_version"]):
        out.update(zip(b.column("_id").to_pylist(), zip(b.column("_seq_no").to_pylist(),
                                                         b.column("_version").to_pylist())))
    return out


def test_a_closing_copy_cancels_its_upload_before_the_commit_metadata(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'remote'}")
    spec = ShardSpec("c", "i", 0)
    copy = ShardCopy(spec, str(tmp_path / "p"), None, primary_term=1, primary=True)
    copy.primary_apply(_docs("a", 100, "x"))
    copy.flush()
    commit = copy.directory.last_commit
    remote = RemoteSegmentStore(store, spec.address, 1)
    stop = threading.Event()
    stop.set()
    with pytest.raises(UploadCancelled, match="cancelled"):
        remote.upload(copy.directory.path, commit, cancel=stop)
    assert list_commit_keys(store, spec.address, 1) == []  # no metadata: nothing half-visible
    remote.upload(copy.directory.path, commit)  # a later upload finishes the job
    assert len(list_commit_keys(store, spec.address, 1)) == 1
    copy.close()


# -- through the cluster ----------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=3)
    yield c
    c.close()


def test_after_failover_the_new_primary_has_a_commit_of_its_term_before_any_flush(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=1, replicas=1)
    cluster.bulk("docs", pa.table({"_id": [str(i) for i in range(2000)], "n": list(range(2000))}))
    cluster.flush("docs")
    cluster.kill_node(cluster.primary_of("docs", 0))
    new = cluster.primary_copy("docs", 0)
    assert new.primary_term == 2
    assert new.wait_background_upload(timeout=60)
    assert len(list_commit_keys(cluster.store, new.spec.address, 2)) == 1  # uploaded under term 2, no flush yet
    before = cluster.store.metrics()["bytes_out"]
    cluster.flush("docs")
    first_flush = cluster.store.metrics()["bytes_out"] - before
    shard_bytes = sum(size for size, _crc in new.directory.last_commit.files().values())
    assert first_flush < shard_bytes / 10, (first_flush, shard_bytes)  # not the whole shard again
    # the old term's copy of the shard is collected as soon as term 2 has two commits (re-upload + flush)
    assert list(cluster.store.list(new.spec.address.segments_prefix(1) + "/")) == []
    assert list_commit_keys(cluster.store, new.spec.address, 2)
    assert cluster.wait_for_health("green").status == "green"


def test_concurrent_clients_through_a_failover_lose_and_duplicate_nothing(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=3, replicas=1)
    acked: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def client(c: int) -> None:
        for b in range(20):
            ids = [f"c{c}-{b}-{i}" for i in range(50)] + [f"shared-{b}-{i}" for i in range(5)]
            docs = [{"_id": d, "who": c} for d in ids]
            for _ in range(5):
                result = cluster.bulk("docs", docs)
                ok = set(result.acknowledged)
                with lock:
                    for d in docs:
                        if d["_id"] in ok:
                            acked[d["_id"]] = c  # last ack wins for the shared ids...
                docs = [d for d in docs if d["_id"] not in ok]
                if not docs:
                    break
            if docs:
                errors.append(f"client {c} bulk {b}: {len(docs)} never acknowledged")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    cluster.kill_node(cluster.primary_of("docs", 1))
    for t in threads:
        t.join()
    assert not errors
    cluster.wait_for_health("green")
    cluster.refresh("docs")
    table = cluster.scan("docs", columns=["_id", "who"])
    got = table.column("_id").to_pylist()
    assert len(got) == len(set(got)) == len(acked) == cluster.count("docs")
    assert set(got) == set(acked)
    # ...but two clients racing on a shared id: the copy kept is one of theirs, the same on every copy
    meta = cluster.indices["docs"]
    for sr in meta.routing:
        states = [_state(cluster.nodes[n].copies[(meta.uuid, sr.shard)]) for n in sr.in_sync]
        assert len(states) == 2 and states[0] == states[1]


def test_a_stale_primary_cannot_fail_a_replica_and_so_never_acknowledges(cluster: Cluster) -> None:
    cluster.create_index("docs", shards=1, replicas=1)
    meta = cluster.indices["docs"]
    sr = meta.routing[0]
    replica = next(n for n in sr.in_sync if n != sr.primary)

    def fail_replica(term: int) -> None:  # what the shard's primary sends the manager when a replica is lost
        cluster.transport.send(sr.primary, cluster.manager().name, "cm.fail_replica",
                               {"index_uuid": meta.uuid, "shard": 0, "node": replica, "term": term,
                                "reason": "lost the replica"})

    with pytest.raises(StalePrimary, match="NOT acknowledged"):
        fail_replica(sr.primary_term - 1)
    assert replica in cluster.indices["docs"].routing[0].in_sync  # nothing changed
    fail_replica(sr.primary_term)
    assert replica not in cluster.indices["docs"].routing[0].in_sync
    assert cluster.wait_for_health("green").status == "green"  # rebuilt in the background


def test_with_two_replicas_the_lagging_one_is_resynced_in_place_not_rebuilt(cluster: Cluster) -> None:
    """The primary dies after replicating a bulk to one replica and before the other: resync sends that bulk."""
    cluster.create_index("docs", shards=1, replicas=2)
    first = cluster.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(200)])
    assert not first.errors
    meta = cluster.indices["docs"]
    primary = cluster.primary_of("docs", 0)
    ahead, behind = [n for n in meta.routing[0].in_sync if n != primary]
    # the primary replicates to both at once: hold the copy to ``behind`` until the primary is dead
    held = cluster.transport.delay(60.0, "shard.replicate", sender=primary, target=behind, times=1)
    answers: list = []
    writer = threading.Thread(target=lambda: answers.append(
        cluster.bulk("docs", [{"_id": f"b{i}", "v": i} for i in range(50)])))
    writer.start()
    wait_until(lambda: cluster.nodes[ahead].copies[(meta.uuid, 0)].local_checkpoint == 249, what="ahead's copy")
    cluster.kill_node(primary)
    held.remove()  # what the dead primary had sent is dropped, never delivered
    writer.join()
    # the answer died with the primary; the coordinator sent the bulk again under its request id, and the
    # promoted replica, which had applied it, answered its first outcome: acknowledged, applied once (issue 45)
    rode_through = answers[0]
    assert not rode_through.errors and set(rode_through.items.column("version").to_pylist()) == {1}
    assert cluster.primary_of("docs", 0) == ahead  # the replica that had the bulk
    lagging = cluster.nodes[behind].copies[(meta.uuid, 0)]
    routing = cluster.indices["docs"].routing[0]
    assert set(routing.in_sync) == {ahead, behind}  # kept in sync at once: no rebuild, no yellow
    h = cluster.health()  # yellow as in Elasticsearch: the third copy has no third node to live on
    assert (h.status, h.active_shards, h.initializing_shards, h.unassigned_shards) == ("yellow", 2, 0, 1)
    assert lagging.local_checkpoint == cluster.primary_copy("docs", 0).local_checkpoint == 249
    assert lagging.primary_term == 2
    # a new bulk of the same ids updates them (versions 2) on both copies
    retry = cluster.bulk("docs", [{"_id": f"b{i}", "v": -i} for i in range(50)])
    assert not retry.errors and set(retry.items.column("version").to_pylist()) == {2}
    assert cluster.nodes[behind].copies[(meta.uuid, 0)] is lagging  # the same copy, resynced in place
    assert _state(lagging) == _state(cluster.primary_copy("docs", 0))
    cluster.refresh("docs")
    assert cluster.count("docs") == 250
