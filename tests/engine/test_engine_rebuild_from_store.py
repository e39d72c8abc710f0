"""A shard that lost every copy is rebuilt from the store without ever returning less than it acknowledged.

The rebuild used to trust the store's account alone: with the newest remote translog
metadata blob damaged (the one destroyed blob) and a listing of the translog data that lagged
(an eventually consistent LIST hid the orphan data blob that held the newest operations),
it returned normally without them, and new writes of the next term took their seq#s: the
acknowledged documents were lost for good (found by the fault simulator, seed 20033).  Now the
cluster passes the highest seq# it acknowledged for the shard: the rebuild refuses, the shard
stays red naming the blob and the range, and the retry recovers everything once the listing
has settled.

The lagging listing is injected with FaultyStore (no real service lags on demand); the damaged
metadata is a real truncated blob in a real file store.
"""

from __future__ import annotations

from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.testing import FaultyStore


def test_a_rebuild_under_a_lagging_listing_refuses_then_recovers_everything(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    store = FaultyStore(open_store(url))
    cluster = Cluster(store=store, data_dir=str(tmp_path / "nodes"), nodes=2, recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "v": 1} for i in range(10)]).errors
        assert not cluster.bulk("docs", [{"_id": "a", "v": 2}, {"_id": "b", "v": 2}]).errors
        inner = open_store(url)
        newest = next(i.key for i in inner.list("") if "/translog/metadata/" in i.key)  # newest sorts first
        inner.put(newest, inner.get(newest)[:20])
        store.inject(op="list", key="*translog/data*", action="stale_list", lag=1)
        cluster.kill_node(cluster.primary_of("docs", 0))  # the only copy: rebuilt from the store
        cluster.wait_for_health("yellow", timeout=60)
        assert store.fired_total == 1, "the lagging listing must have been seen by the rebuild"
        cluster.refresh("docs")
        docs = {d["_id"]: d["v"] for d in cluster.scan("docs", columns=["_id", "v"]).to_pylist()}
        assert docs == {**{str(i): 1 for i in range(10)}, "a": 2, "b": 2}
        assert not cluster.bulk("docs", [{"_id": "c", "v": 3}]).errors
    finally:
        cluster.close()
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "fresh"), nodes=1)
    try:
        restored.refresh("docs")
        assert restored.count("docs") == 13
    finally:
        restored.close()
