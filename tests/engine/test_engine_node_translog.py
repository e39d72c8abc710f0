"""The engine on the node-level translog (issue 30): a bulk over many shards costs one upload round per node,
a stale primary is fenced by the claim log with no LIST of its term markers, and everything restores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.engine.errors import StalePrimary
from shardstore.engine.node.remote import NodeRemote
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.testing.faulty import FaultyStore
from shardstore.translog.operations import index_batch


def _requests(store) -> dict[str, int]:
    return dict(store.metrics()["requests"])


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


@pytest.mark.parametrize("backend", ["file", "s3"], indirect=True)
def test_a_bulk_over_many_shards_is_one_round_and_restores(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=1)
    try:
        cluster.create_index("docs", shards=20, replicas=0)
        assert not cluster.bulk("docs", [{"_id": f"w{i}", "v": i} for i in range(200)]).errors
        for round_no in range(3):
            before = _requests(store)
            res = cluster.bulk("docs", [{"_id": f"{round_no}-{i}", "v": i} for i in range(500)])
            assert not res.errors
            got = _delta(before, _requests(store))
            assert got.get("put", 0) <= 3 and got.get("list", 0) <= 1, got  # was 40 PUT + 20 LIST
        cluster.refresh("docs")
        assert cluster.count("docs") == 1700
    finally:
        cluster.close()
    restored = Cluster.restore(store=store_factory(prefix=store_factory.last_prefix), data_dir=str(tmp_path / "b"),
                               nodes=1)
    try:
        restored.refresh("docs")
        assert restored.count("docs") == 1700
        assert restored.get("docs", "2-499")["_source"] == {"v": 499}
    finally:
        restored.close()


def test_three_nodes_with_a_replica_pay_one_round_per_node(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'remote'}")
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=3)
    try:
        cluster.create_index("docs", shards=12, replicas=1)
        assert not cluster.bulk("docs", [{"_id": f"w{i}", "v": i} for i in range(100)]).errors
        before = _requests(store)
        assert not cluster.bulk("docs", [{"_id": f"x{i}", "v": i} for i in range(600)]).errors
        got = _delta(before, _requests(store))
        assert got.get("put", 0) <= 3 * 3, got  # one round (2 PUT) per node, never one per shard (24)
        cluster.refresh("docs")
        assert cluster.count("docs") == 700
    finally:
        cluster.close()


def _ops(ids: list[str]):
    return index_batch(ids, [json.dumps({"v": i}).encode() for i in ids])


def test_a_stale_primary_is_fenced_by_the_claim_log_without_listing_its_markers(tmp_path: Path) -> None:
    """Two primaries of one shard on two nodes; the older one must never acknowledge once the newer claimed.
    FaultyStore only counts requests here (no fault is injected)."""
    store = FaultyStore(open_store(f"file://{tmp_path / 'remote'}"))
    spec = ShardSpec("cluster-f", "index-f", 0)
    old = ShardCopy(spec, str(tmp_path / "n1"), store, primary_term=1, primary=True, node_remote=NodeRemote(store, "n1"))
    try:
        old.primary_apply(_ops(["a", "b"]))
        store.reset_metrics()
        old.primary_apply(_ops(["c"]))
        counts = store.metrics()["requests"]
        assert counts.get("list", 0) == 1, counts  # the claim log, not the term markers
        new = ShardCopy(spec, str(tmp_path / "n2"), store, primary_term=2, primary=True,
                        node_remote=NodeRemote(store, "n2"))
        try:
            with pytest.raises(StalePrimary):
                old.primary_apply(_ops(["d"]))
            assert not old.primary
            new.primary_apply(_ops(["e"]))
        finally:
            new.close()
    finally:
        old.close()
