"""Spark on every cloud store: store options pass through ``.option(...)`` to the executors.

Real emulators (moto S3 and OCI, fake-gcs-server, Azurite) started by the session fixtures,
a real engine writing the index, and the shared local Spark session reading, writing and
following it with nothing but data-source options.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardstore.blobstores import open_store
from shardstore.engine.cluster import Cluster
from shardstore.segments.reader import open_commit
from shardstore.spark.catalog import resolve_index
from tests.conftest import CLOUD

INDEX = "trips"


def _options(reader_or_writer: Any, url: str, options: dict[str, Any]) -> Any:
    out = reader_or_writer.option("store", url).option("index", INDEX)
    for key, value in options.items():
        out = out.option(key, str(value))
    return out


def _oracle(url: str, options: dict[str, Any]) -> list[tuple]:
    """(id, n) of every live document of the newest commits, through the segments reading API."""
    store = open_store(url, **options)
    try:
        loc = resolve_index(store, INDEX)
        rows: list[tuple] = []
        for s in range(loc.shards):
            reader = open_commit(store, loc.address(s))
            t = pa.Table.from_batches(list(reader.scan(columns=["_id", "n"])), schema=reader.schema(["_id", "n"]))
            rows += list(zip(t.column("_id").to_pylist(), t.column("n").to_pylist()))
        return sorted(rows)
    finally:
        store.close()


@pytest.mark.parametrize("backend", CLOUD)
def test_read_write_and_changes_through_store_options(spark, store_factory, tmp_path: Path) -> None:
    store_factory()  # starts the emulator, makes the bucket
    url = store_factory.url(store_factory.new_prefix())
    options = store_factory.options()
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, recovery_delay=0.05, **options)
    try:
        cluster.create_index(INDEX, shards=2, replicas=0, mappings={"n": "long", "city": "keyword"})
        assert not cluster.bulk(INDEX, [{"_id": f"e{i}", "n": i, "city": "oslo"} for i in range(30)]).errors
        cluster.delete(INDEX, "e4")
        cluster.flush(INDEX)
        assert not cluster.bulk(INDEX, [{"_id": "e5", "n": 500, "city": "rome"}]).errors  # only in the translog
    finally:
        cluster.close()

    # read: the newest commits, and with the translog every acknowledged write
    df = _options(spark.read.format("shardstore"), url, options).load()
    got = sorted((r["_id"], r["n"]) for r in df.select("_id", "n").collect())
    assert got == _oracle(url, options)
    assert len(got) == 29 and ("e5", 5) in got and ("e4", 4) not in got
    tail = _options(spark.read.format("shardstore"), url, options).option("includeTranslog", "true").load()
    assert tail.filter("_id = 'e5'").select("n").collect()[0]["n"] == 500
    assert tail.filter("city = 'oslo'").count() == 28  # pushed filter, e5 moved to rome

    # write: appended through the sink, visible to the oracle and to a restored engine
    rows = spark.createDataFrame([(f"s{i}", 1000 + i, "lima") for i in range(12)], "_id string, n long, city string")
    _options(rows.write.format("shardstore"), url, options).mode("append").save()
    after = dict(_oracle(url, options))
    assert len(after) == 29 + 12 and after["s3"] == 1003 and after["e5"] == 500  # C0 kept the translog tail

    # changes: the translog's operations where it still holds them (the purge keeps the tail above the
    # commit before the newest, issue 14: here all of it, so e4's index and delete), below that the
    # commit's live documents (a flushed delete collapsed away, docs/design/spark.md), then the
    # translog's e5 and the Spark-written ones
    feed = _options(spark.read.format("shardstore-changes"), url, options).load().collect()
    ops = {(r["_id"], r["op_type"]) for r in feed}
    assert ("s11", "index") in ops and ("e5", "index") in ops
    assert {op for i, op in ops if i == "e4"} in (set(), {"index", "delete"})
    assert len(feed) == len({(r["shard"], r["_seq_no"]) for r in feed})  # each seq# once
    by_id = {r["_id"]: json.loads(r["_source"]) for r in feed if r["op_type"] == "index" and r["_id"] == "s7"}
    assert by_id == {"s7": {"n": 1007, "city": "lima"}}

    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=1, recovery_delay=0.05, **options)
    try:
        restored.refresh(INDEX)
        assert restored.count(INDEX) == 41
        assert restored.get(INDEX, "s7")["_source"] == {"n": 1007, "city": "lima"}
    finally:
        restored.close()


def test_a_wrong_store_option_is_named(spark, s3_emulator, tmp_path: Path) -> None:
    """A bad credential surfaces through Spark as an error that names the store, not as an empty result."""
    url = s3_emulator.store_url("no-such-bucket-for-spark", "p")
    options = {**s3_emulator.store_options(), "secret": "wrong"}
    with pytest.raises(Exception) as info:
        _options(spark.read.format("shardstore"), url, options).load().collect()
    text = str(info.value)
    assert "no-such-bucket-for-spark" in text or "trips" in text
