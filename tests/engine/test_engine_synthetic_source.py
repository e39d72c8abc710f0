"""Synthetic ``_source`` (issue 16): an index that stores each document once, as its typed columns.

No JSON copy goes to the translog (typed ``FT`` frames carry the fields) or to the segments
(a null ``_source``); ``get`` rebuilds the document, and a restore from the store alone
brings every acknowledged document back the same.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.core.address import ShardAddress
from shardstore.core.ops import fields_of
from shardstore.datasets import flights as load_flights
from shardstore.engine.cluster import Cluster
from shardstore.engine.errors import InvalidRequest
from shardstore.segments import open_commit
from shardstore.translog.remote import RemoteTranslog

UTC = dt.timezone.utc


def _cluster(tmp_path: Path, name: str = "a", nodes: int = 2) -> Cluster:
    return Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / name), nodes=nodes,
                   recovery_delay=0.05)


def _address(cluster: Cluster, index: str, shard: int) -> ShardAddress:
    meta = cluster.indices[index]
    return ShardAddress(cluster.cluster_uuid, meta.uuid, shard, meta.strategy)


def _table(n: int) -> pa.Table:
    rng = random.Random(5)
    return pa.table({
        "_id": [f"d{i}" for i in range(n)],
        "n": pa.array([rng.randrange(-10**12, 10**12) for _ in range(n)], pa.int64()),
        "x": pa.array([None if i % 7 == 0 else rng.random() * 100 for i in range(n)], pa.float64()),
        "whole": pa.array([float(i) for i in range(n)], pa.float64()),
        "carrier": pa.array([rng.choice(["AA", "DL", 'q"uote', "ünï"]) for _ in range(n)], pa.string()),
        "ok": pa.array([i % 3 == 0 for i in range(n)], pa.bool_()),
        "when": pa.array([dt.datetime(2013, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=i) for i in range(n)],
                         pa.timestamp("ms", "UTC")),
    })


def test_a_synthetic_index_gets_back_what_a_stored_one_does(tmp_path: Path) -> None:
    """Side by side on real flights rows and on typed columns of every kind: get's _source is the same."""
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("stored", shards=2, replicas=1)
        cluster.create_index("synth", shards=2, replicas=1, source="synthetic")
        for table in (load_flights(3000), _table(500)):
            for index in ("stored", "synth"):
                assert not cluster.bulk(index, table).errors
        docs = [{"_id": "nested", "o": {"a": 1, "b": {"c": "deep"}}, "flag": True, "t": "text"},
                {"_id": "d3", "n": 5, "carrier": "AA"}]  # an update of a table row, through the dict path
        for index in ("stored", "synth"):
            assert not cluster.bulk(index, docs).errors
        ids = ["nested", "d3", "d0", "d7", "d499", *(str(i) for i in random.Random(1).sample(range(3000), 40))]
        for when in ("buffered", "refreshed", "flushed"):
            if when == "refreshed":
                cluster.refresh("stored"), cluster.refresh("synth")
            if when == "flushed":
                cluster.flush("stored"), cluster.flush("synth")
            for doc_id in ids:
                a, b = cluster.get("stored", doc_id), cluster.get("synth", doc_id)
                assert a is not None and b is not None, doc_id
                assert b["_source"] == a["_source"], (when, doc_id)
                assert (b["_seq_no"], b["_version"]) == (a["_seq_no"], a["_version"])
        assert cluster.get("synth", "d3")["_version"] == 2 and cluster.get("synth", "d3")["_source"] == {
            "n": 5, "carrier": "AA"}
        assert cluster.count("synth") == cluster.count("stored") == 3501
    finally:
        cluster.close()


def test_no_json_copy_reaches_the_store(tmp_path: Path) -> None:
    """The remote translog holds typed fields and null sources; the committed segments a null _source."""
    cluster = _cluster(tmp_path, nodes=1)
    try:
        cluster.create_index("stored", shards=1, replicas=0)
        cluster.create_index("synth", shards=1, replicas=0, source="synthetic")
        flights = load_flights(20_000)
        for index in ("stored", "synth"):
            assert not cluster.bulk(index, flights).errors
        addr = _address(cluster, "synth", 0)
        ops = pa.Table.from_batches(list(RemoteTranslog.read_operations(
            cluster.store, [addr.translog_prefix(1)], 0, None)))
        assert ops.num_rows == 20_000 and ops.column("source").null_count == 20_000
        fields = fields_of(ops)
        assert fields is not None and fields.column("dep_delay").to_pylist() == flights.column("dep_delay").to_pylist()
        for index in ("stored", "synth"):
            cluster.flush(index)
        scanned = {}
        for index in ("stored", "synth"):
            reader = open_commit(cluster.store, _address(cluster, index, 0))
            got = pa.Table.from_batches(list(reader.scan(columns=["_id", "_source", "dep_delay"])))
            assert got.num_rows == 20_000 and got.column("_source").null_count == 0  # rebuilt when asked for
            scanned[index] = got.sort_by("_id")
        # a stored-source index keeps no JSON its typed columns rebuild either (issue 31; every flights row is):
        # the rebuilt sources are the same, and so are the bytes (below)
        assert scanned["stored"].column("_source").equals(scanned["synth"].column("_source"))
        root = tmp_path / "remote"

        def stored_bytes(index: str, part: str = "") -> int:
            return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(root) for f in fs
                       if cluster.indices[index].uuid in d and part in d)

        # the same bytes either way (issue 31: before, the stored index held twice the segment bytes)
        assert stored_bytes("stored", "/segments/") < 1.05 * stored_bytes("synth", "/segments/")
        assert stored_bytes("stored") < 1.05 * stored_bytes("synth")  # translog included
    finally:
        cluster.close()


def test_a_restore_brings_back_flushed_and_unflushed_documents(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    cluster.create_index("synth", shards=2, replicas=1, source="synthetic")
    table = _table(400)
    assert not cluster.bulk("synth", table.slice(0, 300)).errors
    cluster.flush("synth")
    assert not cluster.bulk("synth", table.slice(300)).errors  # only in the remote translog
    assert not cluster.bulk("synth", [{"_id": "d1", "carrier": "ZZ"}]).errors
    cluster.delete("synth", "d2")
    expected = {doc_id: cluster.get("synth", doc_id) for doc_id in ("d0", "d1", "d299", "d300", "d399")}
    cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=2)
    try:
        assert restored.indices["synth"].source == "synthetic"
        restored.refresh("synth")
        assert restored.count("synth") == 399
        assert restored.get("synth", "d2") is None
        for doc_id, doc in expected.items():
            assert restored.get("synth", doc_id)["_source"] == doc["_source"], doc_id
        assert restored.get("synth", "d1")["_source"] == {"carrier": "ZZ"}
        # later writes stay synthetic
        assert not restored.bulk("synth", [{"_id": "late", "n": 1}]).errors
        restored.flush("synth")
        assert restored.get("synth", "late")["_source"] == {"n": 1}
    finally:
        restored.close()


def test_a_bad_item_is_rejected_alone(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, nodes=1)
    try:
        cluster.create_index("synth", shards=1, replicas=0, source="synthetic")
        assert not cluster.bulk("synth", [{"_id": "a", "n": 1}]).errors
        result = cluster.bulk("synth", [{"_id": "b", "n": 2}, {"_id": "c", "n": "not a number"}])
        assert result.acknowledged == ["b"]
        assert "n" in result.items.column("error")[1].as_py()
        assert cluster.get("synth", "c") is None and cluster.get("synth", "b")["_source"] == {"n": 2}
    finally:
        cluster.close()


def test_an_unknown_source_mode_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, nodes=1)
    try:
        with pytest.raises(InvalidRequest, match="source must be one of 'stored', 'synthetic', not 'json'"):
            cluster.create_index("x", source="json")
        assert "x" not in cluster.indices
    finally:
        cluster.close()
