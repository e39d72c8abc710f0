"""The ``shardstore-changes`` feed: batch equals what the engine acknowledged, failover, streaming restart."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from shardstore.engine import BulkResult, Cluster

INDEX = "events"
COLS = ["shard", "_seq_no", "_primary_term", "op_type", "_id", "_version", "_source"]


def _acked(res: BulkResult, op: str, sources: dict[str, dict] | None = None) -> list[tuple]:
    """The acknowledged items of a bulk/delete as feed rows (shard, seq#, term, op, id, version, source)."""
    out = []
    for r in res.items.to_pylist():
        if r["error"] is None:
            src = sources[r["_id"]] if sources is not None else None
            out.append((r["shard"], r["seq_no"], r["primary_term"], op, r["_id"], r["version"], src))
    return out


def _index(cluster: Cluster, docs: list[dict]) -> list[tuple]:
    sources = {d["_id"]: {k: v for k, v in d.items() if k != "_id"} for d in docs}
    res = cluster.bulk(INDEX, docs)
    assert not res.errors
    return _acked(res, "index", sources)


def _feed(spark, url: str, **options: str) -> list[tuple]:
    reader = spark.read.format("shardstore-changes").option("store", url).option("index", INDEX)
    for k, v in options.items():
        reader = reader.option(k, v)
    return _rows(reader.load().collect())


def _rows(rows) -> list[tuple]:
    out = [tuple(r[c] for c in COLS) for r in rows]
    out = [t[:6] + (json.loads(t[6]) if t[6] is not None else None,) for t in out]
    return sorted(out)


def test_feed_equals_the_acknowledged_operations_through_failover(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=0.05)
    try:
        cluster.create_index(INDEX, shards=2, replicas=1, mappings={"n": "long"})
        expected = _index(cluster, [{"_id": f"d{i}", "n": i} for i in range(30)])
        expected += _index(cluster, [{"_id": f"d{i}", "n": 100 + i} for i in range(5)])  # updates
        for doc_id in ("d7", "d8", "d1"):
            expected += _acked(cluster.delete(INDEX, doc_id), "delete")
        assert _feed(spark, url) == sorted(expected)  # seq# order per shard, deletes included
        # a seq# window per shard
        window = _feed(spark, url, fromSeqNo="3", toSeqNo="6")
        assert window == sorted(e for e in expected if 3 <= e[1] <= 6)

        # failover: the primaries' node dies, replicas are promoted with term 2 (the old term's
        # unacknowledged tail is trimmed; the feed keeps the highest term per seq#)
        primary = cluster.primary_of(INDEX, 0)
        cluster.kill_node(primary)
        expected += _index(cluster, [{"_id": f"f{i}", "n": -i} for i in range(20)])
        got = _feed(spark, url)
        assert got == sorted(expected)
        terms = {(e[0], e[2]) for e in got}
        assert any(term == 2 for _s, term in terms)
        assert len({(e[0], e[1]) for e in got}) == len(got)  # one operation per seq# and shard

        # below the translog's retained range, the newest commit's live documents come back as index ops
        cluster.flush(INDEX)
        flushed = _feed(spark, url)
        live = {}
        for e in sorted(expected, key=lambda e: (e[0], e[1])):
            if e[3] == "delete":
                live.pop(e[4], None)
            else:
                live[e[4]] = e
        key = lambda e: e[:6] + (json.dumps(e[6], sort_keys=True),)  # noqa: E731
        assert {key(e) for e in flushed} >= {key(e) for e in live.values()}
        assert {key(e) for e in flushed} <= {key(e) for e in expected}  # never an op nobody acknowledged
    finally:
        cluster.close()


def test_streaming_follows_the_index_and_restarts_from_its_checkpoint(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=2, recovery_delay=0.05)

    def run_stream() -> None:
        stream = (spark.readStream.format("shardstore-changes").option("store", url).option("index", INDEX).load()
                  .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                  .trigger(availableNow=True).start())
        stream.awaitTermination(120)
        assert stream.exception() is None

    try:
        cluster.create_index(INDEX, shards=2, replicas=0)
        first = _index(cluster, [{"_id": f"a{i}", "n": i} for i in range(25)])
        run_stream()
        got = _rows(spark.read.parquet(out).collect())
        assert got == sorted(first)

        second = _index(cluster, [{"_id": f"b{i}", "n": i} for i in range(10)])
        second += _acked(cluster.delete(INDEX, "a3"), "delete")
        run_stream()  # restarted from the checkpoint: only the new operations
        got = _rows(spark.read.parquet(out).collect())
        assert got == sorted(first + second)
        assert len({(g[0], g[1]) for g in got}) == len(got)  # nothing read twice
    finally:
        cluster.close()


def test_spark_written_documents_appear_in_the_feed(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index(INDEX, shards=1, replicas=0, mappings={"n": "long"})
        expected = _index(cluster, [{"_id": f"e{i}", "n": i} for i in range(5)])
    finally:
        cluster.close()
    df = spark.createDataFrame([(f"s{i}", i) for i in range(7)], "_id string, n long")
    df.write.format("shardstore").option("store", url).option("index", INDEX).mode("append").save()
    got = _feed(spark, url)
    assert [g for g in got if g[4].startswith("e")] == sorted(expected)  # from the translog (C0 keeps it)
    spark_ops = [g for g in got if g[4].startswith("s")]
    assert [g[1] for g in spark_ops] == list(range(5, 12)) and {g[3] for g in spark_ops} == {"index"}
    assert {g[4]: g[6] for g in spark_ops} == {f"s{i}": {"n": i} for i in range(7)}
    assert pa.array([g[2] for g in spark_ops]).unique().to_pylist() == [3]  # the job's claimed term (1 + a free term)


def test_an_idle_stream_polls_with_lists_only(tmp_path: Path) -> None:
    """latestOffset re-reads a shard's translog only when its newest commit or translog metadata key moved."""
    from shardstore.blobstores import open_store
    from shardstore.spark.catalog import resolve_index
    from shardstore.spark.changes import ShardstoreChangesStreamReader, shard_checkpoint

    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index(INDEX, shards=2, replicas=0)
        _index(cluster, [{"_id": f"a{i}", "n": i} for i in range(20)])
        reader = ShardstoreChangesStreamReader({"store": url, "index": INDEX})
        first = reader._latest()
        assert sum(first.values()) == 20 - 2  # seq#s 0.. per shard: checkpoints sum to docs - shards
        reader._store.reset_metrics()
        assert reader._latest() == first
        requests = reader._store.metrics()["requests"]
        assert requests["get"] == 0 and requests["list"] > 0, requests

        _index(cluster, [{"_id": f"b{i}", "n": i} for i in range(6)])
        moved = reader._latest()
        store = open_store(url)
        loc = resolve_index(store, INDEX)
        assert moved == {str(s): shard_checkpoint(store, loc.address(s)) for s in range(2)}
        assert sum(moved.values()) == 26 - 2
        cluster.flush(INDEX)  # a new commit (and a purged translog): the checkpoint stays put
        assert reader._latest() == moved
    finally:
        cluster.close()
