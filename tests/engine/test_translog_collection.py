"""The store-side collection of dead node-translog streams (issue 46), on the production roles.

The issue's scenario on the embedded cluster (every role as a node process runs it, over the
in-process transport): 3 nodes, an index of 2 shards with 1 replica, rounds of bulks each
ending with a SIGKILL of a primary's node and its restart.  Every restart leaves the killed
process's stream behind; the cluster manager's collection (engine/manager/translog_gc.py)
deletes it once the shards' remote commits cover it, and nothing acknowledged is lost.
"""

from __future__ import annotations

import time
from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.core.address import ShardAddress
from shardstore.engine import Cluster
from shardstore.engine.manager.translog_gc import list_streams
from shardstore.engine.shard.restore_audit import audit
from shardstore.segments.remote_store import list_terms
from shardstore.translog.node_format import stream_owner
from shardstore.translog.node_read import StreamCatalog


def _manager_gc(cluster: Cluster):
    manager = cluster.manager()
    assert manager is not None
    return manager.translog_gc


def _streams(cluster: Cluster) -> tuple[int, int, set[str]]:
    """(streams, bytes, owners) of the cluster's node-translog streams in the store."""
    listing = list_streams(cluster.store, cluster.cluster_uuid)
    return len(listing.rounds), listing.total_bytes, {stream_owner(s) or "" for s in listing.rounds}


def _live_owners(cluster: Cluster) -> set[str]:
    return {p.ephemeral_id for p in cluster.processes.values()}


def test_the_streams_of_killed_processes_are_collected_once_commits_cover_them(tmp_path: Path) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=3,
                      recovery_delay=0.05)
    try:
        cluster.create_index("live", shards=2, replicas=1)
        cluster.wait_for_health("green", timeout=30)
        ids: list[str] = []
        seen: list[tuple[int, int]] = []
        for round_ in range(4):
            for b in range(20):
                batch = [f"r{round_}-{b}-{k}" for k in range(200)]
                assert not cluster.bulk("live", [{"_id": i, "v": round_} for i in batch]).errors
                ids += batch
            victim = cluster.primary_of("live", round_ % 2)
            cluster.kill_node(victim)
            cluster.start_node(victim)
            cluster.wait_for_health("green", timeout=60)
            streams, size, _ = _streams(cluster)
            seen.append((streams, size))
        assert seen[-1][0] >= 4, seen  # every killed process left its stream behind
        gc = _manager_gc(cluster)
        gc.collector.grace = 0.0
        for k in range(4):
            batch = [f"after-{k}-{j}" for j in range(200)]
            assert not cluster.bulk("live", [{"_id": i, "v": 9} for i in batch]).errors
            ids += batch
            cluster.flush("live")
        cluster.flush("live")
        cluster.flush("live")
        gc.run_once()
        streams, size, owners = _streams(cluster)
        live = _live_owners(cluster)
        dead_left = owners - live
        assert not dead_left, (seen, streams, size, owners, live)  # 0 bytes of dead streams
        assert streams <= len(live)
        # nothing acknowledged is lost, live or restored from the store alone
        cluster.refresh("live")
        assert cluster.count("live") == len(ids)
        for doc_id in ids[::997]:
            assert cluster.get("live", doc_id) is not None, doc_id
        # Spark's changes reader, from seq# 0: the translog that is left plus the newest commit's documents
        from shardstore.spark.changes import shard_operations

        meta = cluster.index_meta("live")
        changed: set[str] = set()
        for shard in range(2):
            address = ShardAddress(meta.data_cluster_uuid, meta.uuid, shard, meta.strategy)
            changed |= set(shard_operations(cluster.store, address, shard, 0).column("_id").to_pylist())
        assert changed == set(ids)
    finally:
        cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "restored"), nodes=3)
    try:
        restored.refresh("live")
        assert restored.count("live") == len(ids)
    finally:
        restored.close()


def test_a_dead_stream_the_commits_do_not_cover_yet_is_kept(tmp_path: Path) -> None:
    """No flush after the kill: the killed primary's sections are above every commit, so they stay (a restore needs
    them), and a restore finds every acknowledged write."""
    cluster = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=3,
                      recovery_delay=0.05)
    try:
        cluster.create_index("live", shards=1, replicas=1)
        cluster.wait_for_health("green", timeout=30)
        cluster.flush("live")
        ids = [f"d{k}" for k in range(500)]
        assert not cluster.bulk("live", [{"_id": i} for i in ids]).errors
        victim = cluster.primary_of("live", 0)
        killed_owner = cluster.processes[victim].ephemeral_id
        cluster.kill_node(victim)
        gc = _manager_gc(cluster)
        gc.collector.grace = 0.0
        reports = gc.run_once()
        assert reports and reports[0].dead >= 1 and reports[0].rounds_deleted == 0, reports
        assert killed_owner in _streams(cluster)[2]
    finally:
        cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "restored"), nodes=1)
    try:
        restored.refresh("live")
        assert restored.count("live") == len(ids)
    finally:
        restored.close()


class _Recording:
    """A store that records the prefix of every LIST (and delegates everything else)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lists: list[str] = []

    def list(self, prefix: str, *args, **kwargs):
        self.lists.append(prefix)
        return self.inner.list(prefix, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_restore_lists_the_streams_once_however_many_died(tmp_path: Path) -> None:
    """The restore audit reads the cluster's streams from one listing per shard (or one per restore, shared), however
    many dead streams the store holds: the same LISTs under node_translog/ as with one stream."""
    store = open_store(f"file://{tmp_path / 'store'}")
    cluster = Cluster(store=store, data_dir=str(tmp_path / "nodes"), nodes=3, recovery_delay=0.05)
    try:
        cluster.create_index("live", shards=2, replicas=1)
        cluster.wait_for_health("green", timeout=30)
        meta = cluster.index_meta("live")
        addresses = [ShardAddress(meta.data_cluster_uuid, meta.uuid, s, meta.strategy) for s in range(2)]

        def node_translog_lists(catalog: StreamCatalog | None = None) -> int:
            recording = _Recording(store)
            for address in addresses:
                audit(recording, address, list_terms(store, address), streams=catalog)
            return sum(1 for p in recording.lists if "/node_translog" in p)

        assert not cluster.bulk("live", [{"_id": f"first-{k}"} for k in range(300)]).errors
        one_stream = node_translog_lists()
        for round_ in range(3):
            assert not cluster.bulk("live", [{"_id": f"{round_}-{k}"} for k in range(300)]).errors
            victim = cluster.primary_of("live", 0)
            cluster.kill_node(victim)
            cluster.start_node(victim)
            cluster.wait_for_health("green", timeout=60)
        assert len(list_streams(store, meta.data_cluster_uuid).rounds) >= 3
        assert node_translog_lists() == one_stream == len(addresses)  # one LIST per shard, not 2 per stream
        catalog = StreamCatalog(store, meta.data_cluster_uuid)
        assert node_translog_lists(catalog) == 0  # a restore of several shards shares one listing
    finally:
        cluster.close()


def test_node_processes_collect_the_streams_of_killed_processes(tmp_path: Path) -> None:
    """The issue's scenario on `shardstore node` processes (2 rounds of it): each round bulks, SIGKILLs a primary's
    process and restarts it; then bulks each with a flush, and two flushes: no byte of a dead stream is left."""
    from shardstore.testing.node_processes import ProcessCluster

    store_url = f"file://{tmp_path / 'store'}?create=true"
    procs = ProcessCluster(str(tmp_path / "nodes"), store_url, 3,
                           env={"SHARDSTORE_NODE_TRANSLOG_GC_GRACE": "0", "SHARDSTORE_NODE_TRANSLOG_GC_EVERY": "1"})
    try:
        client = procs.client()
        client.create_index("live", shards=2, replicas=1)
        client.wait_for_health("green", timeout=60)
        store = open_store(f"file://{tmp_path / 'store'}")
        ids: list[str] = []
        killed: list[str] = []
        for round_ in range(2):
            for b in range(10):
                batch = [f"r{round_}-{b}-{k}" for k in range(200)]
                assert not client.bulk("live", [{"_id": i} for i in batch]).errors
                ids += batch
            victim = client.cluster()["shards"][0]["node"] if round_ == 0 else next(
                s["node"] for s in client.cluster()["shards"] if s["role"] == "primary" and s["shard"] == 1)
            killed.append(victim)
            procs.kill(victim)
            procs.restart(victim)
            client.wait_for_health("green", timeout=90)
        cluster_uuid = next(p.name for p in (tmp_path / "store").iterdir() if (p / "node_translog").is_dir())
        before = list_streams(store, cluster_uuid)
        assert len(before.rounds) >= 2, before.rounds.keys()
        for k in range(4):
            batch = [f"after-{k}-{j}" for j in range(100)]
            assert not client.bulk("live", [{"_id": i} for i in batch]).errors
            ids += batch
            client.flush("live")
        client.flush("live")
        client.flush("live")
        live_owners: set[str] = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listing = list_streams(store, cluster_uuid)
            live_owners = {procs.call(n, "node.stats", {})["process"] for n in procs.names}
            dead = [s for s in listing.rounds if stream_owner(s) not in live_owners]
            if not dead:
                break
            time.sleep(0.5)
        assert not dead, (dead, live_owners)
        dead_bytes = sum(size for key, size in listing.sizes.items()
                         if stream_owner(key.split("/node_translog/")[1].split("/")[0]) not in live_owners)
        assert dead_bytes == 0
        client.refresh("live")
        assert client.count("live") == len(ids)
    finally:
        procs.close()


def test_a_manager_that_stops_managing_forgets_how_long_streams_were_dead() -> None:
    """A stream seen dead by this node while it managed counts afresh when it manages again (a node slow to rejoin
    under the next manager is not collected at once when this one is re-elected), and a deposed manager deletes
    nothing (review of issue 46)."""
    from shardstore.engine.manager.translog_gc import CollectionWorker, StreamCollector
    from shardstore.translog.node_format import index_key

    store = open_store("memory://gc-forget")
    stream = "c/node_translog/gone.0001"
    store.put(index_key(stream, 0), b"not an index")  # a round of a stream whose owner is no member
    now = [0.0]
    collector = StreamCollector(store, grace=10.0, clock=lambda: now[0])
    managing = [True]
    worker = CollectionWorker(collector, lambda: (frozenset({"alive"}), {"c": {}}) if managing[0] else None,
                              every=3600.0)
    try:
        assert worker.run_once()[0].dead == 0  # first seen now: the grace starts
        now[0] = 11.0
        assert worker.run_once()[0].dead == 1
        managing[0] = False
        assert worker.run_once() == []  # not managing: forgets
        managing[0] = True
        assert worker.run_once()[0].dead == 0  # counts afresh
    finally:
        worker.close()


def test_the_chained_reader_answers_an_empty_read_with_nothing(tmp_path: Path) -> None:
    from shardstore.translog.chained import ChainedReader, FileRegion

    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    reader = ChainedReader([FileRegion(str(path), 3), b"xyz"])
    assert reader.read(5) == b"abcxy"  # a read is whole across parts (Azure's SDK reads what it announced at once)
    reader.seek(0)
    assert reader.read(0) == b"" and reader.read() == b"abcxyz"
    reader.seek(3)
    assert reader.read(0) == b"" and reader.read(2) == b"xy"
    reader.close()
