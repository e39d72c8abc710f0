"""A stored-source index gives every document back byte for byte, and keeps no JSON it can rebuild (issue 31).

A real one-node cluster on the file store.  The given bytes are what the index stored before
issue 31: a table bulk's JSON (``sources_from_table``), a dict's ``json.dumps``.  Each is
checked, key order included, through ``get`` (buffered, refreshed, flushed, restored) and
``scan``; the segments in the store must hold a null ``_source`` for every row its fields
rebuild and the JSON of every row they do not.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.datasets import flights
from shardstore.engine import Cluster
from shardstore.segments.source_json import sources_from_table

DOCS = [
    {"_id": "d1", "x": 1, "b": "s", "c": 2.5},  # the order the index first saw: rebuilt
    {"_id": "d2", "c": 5.0, "x": 2},  # another order: kept
    {"_id": "d3", "x": 3, "b": "t"},  # a subset, in order: rebuilt
    {"_id": "d4", "x": 4, "c": 5},  # an integer in a double field: kept
    {"_id": "d5", "x": 5, "o": {"p": 1}},  # an object: kept
    {"_id": "d6", "x": 6, "b": "caf\u00e9 \"q\" \\ \n"},  # escapes: rebuilt
]
REBUILT = {"d1", "d3", "d6"}


def _json(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _segment_sources(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in glob.glob(str(root / "**" / "segments" / "data" / "seg_*"), recursive=True):
        t = pq.read_table(path, columns=["_id", "_source"])
        out.update(zip(t.column("_id").to_pylist(), t.column("_source").to_pylist()))
    return out


def _check(cluster: Cluster, given: dict[str, dict[str, bytes]], stage: str) -> None:
    for index, docs in given.items():
        for doc_id, raw in docs.items():
            got = cluster.get(index, doc_id)
            assert got is not None, f"{stage}: {index}/{doc_id} is missing"
            assert _json(got["_source"]) == raw, f"{stage}: {index}/{doc_id}"
        if stage != "buffered":  # a scan reads what was refreshed
            scanned = cluster.scan(index, columns=["_id", "_source"])
            assert dict(zip(scanned.column("_id").to_pylist(), scanned.column("_source").to_pylist())) == docs, stage


def test_documents_come_back_byte_for_byte_and_only_what_cannot_be_rebuilt_is_stored(tmp_path: Path) -> None:
    table = flights(3_000)
    ids, sources = sources_from_table(table)
    given = {"flights": dict(zip(ids.to_pylist(), sources.to_pylist())),
             "dicts": {d["_id"]: _json({k: v for k, v in d.items() if k != "_id"}) for d in DOCS}}
    store = tmp_path / "remote"
    cluster = Cluster(store=f"file://{store}", data_dir=str(tmp_path / "a"), nodes=1)
    try:
        for index in given:
            cluster.create_index(index, shards=1, replicas=0)
        assert not cluster.bulk("flights", table).errors
        assert not cluster.bulk("dicts", DOCS).errors
        _check(cluster, given, "buffered")
        for index in given:
            cluster.refresh(index)
        _check(cluster, given, "refreshed")
        for index in given:
            cluster.flush(index)
        _check(cluster, given, "flushed")
    finally:
        cluster.close()
    stored = _segment_sources(store)
    assert len(stored) == table.num_rows + len(DOCS)
    assert all(stored[i] is None for i in given["flights"])  # a flights row is rebuilt: no JSON kept
    for doc_id, raw in given["dicts"].items():
        assert stored[doc_id] == (None if doc_id in REBUILT else raw), doc_id
    restored = Cluster.restore(store=f"file://{store}", data_dir=str(tmp_path / "b"), nodes=1)
    try:
        _check(restored, given, "restored")
    finally:
        restored.close()


def test_a_later_bulk_in_another_column_order_keeps_its_json(tmp_path: Path) -> None:
    table = flights(200)
    other = table.slice(100).select(["_id", *reversed(table.column_names[1:])])
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=1)
    try:
        cluster.create_index("f", shards=1, replicas=0)
        assert not cluster.bulk("f", table.slice(0, 100)).errors
        assert not cluster.bulk("f", other).errors
        cluster.flush("f")
        ids, sources = sources_from_table(other)
        for doc_id, raw in zip(ids.to_pylist(), sources.to_pylist()):
            assert _json(cluster.get("f", doc_id)["_source"]) == raw  # reversed keys, as given
    finally:
        cluster.close()
    stored = _segment_sources(tmp_path / "remote")
    assert sum(v is None for v in stored.values()) == 100 and len(stored) == 200
    assert pa.array(list(stored.values())).null_count == 100
