"""A write that failed half-way, then a failover: the shard stays restorable (issue 14, case 2).

A bulk that the primary applied and uploaded but could not acknowledge (here: its fencing
check's LIST of the claim log keeps failing until the upload times out) may not be replicated.  The next bulk is, so the
replica holds a gap at the failed op's seq#.  When that replica is promoted it fills the gap
with a no-op of the new term, below the older-term op above it: history in seq# order no
longer has non-decreasing terms.  Restore and peer recovery used to refuse that history
(``InvalidOperation: primary term lower than the log's current term``), leaving acknowledged
documents unrestorable and the shard yellow for good.

The LIST failures are injected with FaultyStore: a real store cannot fail chosen LISTs on
demand (a mock of exactly one fault, as the project's rules allow).  The node-level translog
retries a failed fence listing until the upload timeout, so the test shortens it.
"""

from __future__ import annotations

from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.testing import FaultyStore


def test_failed_write_then_failover_restores_and_recovers(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    store = FaultyStore(open_store(url))
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        assert not cluster.bulk("docs", [{"_id": "a", "v": 1}, {"_id": "b", "v": 1}]).errors
        primary = cluster.nodes[cluster.primary_of("docs", 0)].copies[(cluster.indices["docs"].uuid, 0)]
        primary.remote_translog.upload_timeout = 0.5
        store.inject(op="list", key="*claims*", action="fail", times=1000)
        failed = cluster.bulk("docs", [{"_id": "c", "v": 1}])
        store.clear()
        primary.remote_translog.upload_timeout = 30.0
        assert failed.errors, "the injected LIST failures must fail the bulk"
        assert not cluster.bulk("docs", [{"_id": "d", "v": 1}, {"_id": "e", "v": 1}]).errors
        cluster.kill_node(cluster.primary_of("docs", 0))
        assert not cluster.bulk("docs", [{"_id": "f", "v": 2}]).errors
        # peer recovery of a new replica replays that history from the new primary
        cluster.wait_for_health("green", timeout=60)
        cluster.refresh("docs")
        acked = {"a", "b", "d", "e", "f"}
        got = {d["_id"] for d in cluster.scan("docs", columns=["_id"]).to_pylist()}
        assert acked <= got <= acked | {"c"}
    finally:
        cluster.close()
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=2)
    try:
        restored.refresh("docs")
        got = {d["_id"] for d in restored.scan("docs", columns=["_id"]).to_pylist()}
        assert acked <= got <= acked | {"c"}
        assert restored.get("docs", "f")["_source"] == {"v": 2}
    finally:
        restored.close()
