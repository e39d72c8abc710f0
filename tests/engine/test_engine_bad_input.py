"""Bad input never harms a cluster (issue 15, items 1-6 and the data-directory half of 8).

Each case was reproduced on main before the fix: names like ``'../evil'`` or ``None`` were
accepted, a bad mapping half-created its index, a 600-deep document poisoned its shard, a
513-byte id was applied on the primary only, ``f=1`` and ``f="one"`` were both acknowledged
on two shards (and ``scan`` then raised), NaN/2^63/sets/surrogates were stored or raised raw
Python errors, and a second cluster on the same data directory ran beside the first.

Every test asserts the error class and the message, then that nothing changed: count,
get and scan on the primaries, the replicas, and a restore from the store alone.
Real clusters on the local-filesystem store; no mocks.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.engine.coordinator.validation import MAX_DEPTH, MAX_DOC_FIELDS, MAX_INDEX_FIELDS
from shardstore.engine.errors import DataDirInUse, DocumentRejected, InvalidIndexName, InvalidRequest
from shardstore.errors import InvalidError
from shardstore.segments.mapping import FieldType, Mapping


def _cluster(tmp_path: Path, name: str = "a", nodes: int = 2) -> Cluster:
    return Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / name), nodes=nodes,
                   recovery_delay=0.05)


def _snapshot(cluster: Cluster, index: str) -> dict[str, Any]:
    """Every live doc's source by id, on every copy (primaries and replicas must agree)."""
    cluster.refresh(index)
    meta = cluster.indices[index]
    out: dict[str, Any] = {}
    for sr in meta.routing:
        views = []
        for node in sr.copies:
            copy = cluster.nodes[node].copies[(meta.uuid, sr.shard)]
            rows = pa.Table.from_batches(list(copy.directory.scan(columns=["_id", "_source"]))).to_pylist() \
                if copy.directory.count() else []
            views.append({r["_id"]: json.loads(r["_source"]) for r in rows})
        assert all(v == views[0] for v in views), f"shard {sr.shard}: copies disagree"
        out.update(views[0])
    assert cluster.count(index) == len(out)
    return out


def _restored(tmp_path: Path, index: str, name: str = "restored") -> dict[str, Any]:
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / name), nodes=2,
                               recovery_delay=0.05)
    try:
        return _snapshot(restored, index)
    finally:
        restored.close()


def _ids_on_two_shards(shards: int = 2) -> tuple[str, str]:
    ids = [f"d{i}" for i in range(50)]
    where = shard_ids(pa.array(ids), shards).to_pylist()
    return ids[where.index(0)], ids[where.index(1)]


# -- 1. index names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, rule", [
    ("../evil", "must not contain '.'|must not contain '/'"), ("a/b", "'/'"), ("", "must not be empty"),
    (".", "'.' or '..'"), ("..", "'.' or '..'"), ("tab\tname", "'\\\\t'"), (None, "must be a string, got NoneType"),
    (5, "must be a string, got int"), ("Upper", "lowercase"), ("-x", "must not start"), ("_x", "must not start"),
    ("+x", "must not start"), ("a b", "' '"), ("a,b", "','"), ("a#b", "'#'"), ("a*b", "'\\*'"), ("a:b", "':'"),
    ("x" * 256, "256 bytes, at most 255"), ("é" * 128, "256 bytes"), ("a\ud800", "lone surrogate"),
])
def test_bad_index_names_are_refused_before_anything_is_created(tmp_path: Path, name: object, rule: str) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("kept")
        before_state = set(cluster.cluster_state().indices)
        with pytest.raises(InvalidIndexName, match=rule) as info:
            cluster.create_index(name)  # type: ignore[arg-type]
        assert isinstance(info.value, InvalidError) and not info.value.retryable
        assert "invalid index name" in str(info.value) and "nothing was applied" in str(info.value)
        assert set(cluster.indices) == {"kept"} and set(cluster.cluster_state().indices) == before_state
        assert cluster.health().status == "green"  # replica allocation of the other index goes on
    finally:
        cluster.close()


def test_valid_index_names_are_accepted(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        for name in ("logs-2026.11.25", "a_b", "ünïcode", "x" * 255, "a..b"):
            cluster.create_index(name, replicas=0)
            assert not cluster.bulk(name, [{"_id": "1", "v": 1}]).errors
        assert set(cluster.cluster_state().indices) >= {"logs-2026.11.25", "ünïcode", "a..b"}
    finally:
        cluster.close()


# -- 2. creation is all or nothing -------------------------------------------------------------

@pytest.mark.parametrize("mappings, rule", [
    ({"properties": {"f": {"type": "nope"}}}, "'nope' is not a valid FieldType"),
    ({"a": "long", "a.b": "keyword"}, "conflicts"),
    ({"_id": "keyword"}, "metadata field"),
    ("not a dict", "mappings must be a dict, got str"),
    ({f"f{i}": "long" for i in range(MAX_INDEX_FIELDS + 1)}, f"at most {MAX_INDEX_FIELDS}"),
])
def test_a_bad_mapping_creates_nothing_and_the_retry_works(tmp_path: Path, mappings: Any, rule: str) -> None:
    cluster = _cluster(tmp_path)
    try:
        with pytest.raises(InvalidRequest, match=rule):
            cluster.create_index("docs", mappings=mappings)
        assert "docs" not in cluster.indices and "docs" not in cluster.cluster_state().indices
        cluster.create_index("docs", mappings={"v": "long"})  # not IndexAlreadyExists
        assert not cluster.bulk("docs", [{"_id": "1", "v": 1}]).errors
    finally:
        cluster.close()


@pytest.mark.parametrize("kwargs, rule", [
    ({"shards": "2"}, "shards must be an int from 1 to 1024, got '2'"), ({"shards": 0}, "got 0"),
    ({"shards": True}, "got True"), ({"shards": 2.0}, "got 2.0"), ({"shards": 5000}, "got 5000"),
    ({"replicas": -1}, "replicas must be an int >= 0, got -1"), ({"replicas": "1"}, "got '1'"),
    ({"durability": "sometimes"}, "durability must be"),
])
def test_bad_create_arguments_are_invalid_requests(tmp_path: Path, kwargs: dict, rule: str) -> None:
    cluster = _cluster(tmp_path)
    try:
        with pytest.raises(InvalidRequest, match=rule):
            cluster.create_index("docs", **kwargs)
        assert "docs" not in cluster.indices
    finally:
        cluster.close()


# -- 3, 4, 6. documents: rejected per item, applied nowhere -------------------------------------

def _deep(levels: int) -> dict:
    doc: dict = {}
    cur = doc
    for _ in range(levels):
        cur["a"] = {}
        cur = cur["a"]
    cur["leaf"] = 1
    return doc


BAD_DOCS: list[tuple[dict[str, Any], str | None, str]] = [
    ({"_id": "x" * 513}, "_id", "513 bytes, at most 512"),
    ({"_id": "\ud800"}, "_id", "lone surrogate"),
    ({"_id": 7}, "_id", "must be a string, got int"),
    ({"v": 1}, "_id", "missing"),
    ({"_id": ""}, "_id", "must not be empty"),
    ({"_id": "deep600", **_deep(600)}, "a." * MAX_DEPTH + "a", f"nested deeper than {MAX_DEPTH}"),
    ({"_id": "deep2000", **_deep(2000)}, None, f"nested deeper than {MAX_DEPTH}"),
    ({"_id": "nan", "f": math.nan}, "f", "not a finite number"),
    ({"_id": "inf", "o": {"g": -math.inf}}, "o.g", "not a finite number"),
    ({"_id": "big", "n": 2 ** 63}, "n", "outside the long range"),
    ({"_id": "small", "n": -(2 ** 63) - 1}, "n", "outside the long range"),
    ({"_id": "twice", "o.x": 1, "o": {"x": "s"}}, "o.x", "given twice"),
    ({"_id": "both", "a": 1, "a.b": 2}, "a", "both a value and an object"),
    ({"_id": "sur", "s": "bad \udc80 text"}, "s", "lone surrogate"),
    ({"_id": "bytes", "b": b"\xff\xfe"}, "b", "not UTF-8"),
    ({"_id": "set", "s": {1, 2}}, "s", "type set cannot be stored as JSON"),
    ({"_id": "obj", "s": object()}, "s", "type object cannot be stored"),
    ({"_id": "key", 5: "v"}, None, "field names must be strings"),
    ({"_id": "empty", "": 1}, "", "must not be empty"),
    ({"_id": "dots", "a..b": 1}, "a..b", "empty part"),
    ({"_id": "meta", "_source": "x"}, "_source", "metadata field"),
    ({"_id": "arr", "tags": ["a", "b"]}, "tags", "arrays are not supported"),
    ({"_id": "many", **{f"f{i}": i for i in range(MAX_DOC_FIELDS + 1)}}, None, f"more than {MAX_DOC_FIELDS} fields"),
    ({"_id": "conflict", "delay": "late"}, "delay", "type keyword conflicts with the mapped type long"),
]


def test_every_bad_item_is_rejected_alone_and_exists_nowhere(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1)
        cluster.bulk("docs", [{"_id": f"g{i}", "delay": i} for i in range(20)])
        before = _snapshot(cluster, "docs")
        good = [{"_id": "ok1", "delay": 1, "carrier": "UA"}, {"_id": "ok2", "delay": 2}]
        docs = [good[0], *(d for d, _, _ in BAD_DOCS), good[1]]
        result = cluster.bulk("docs", docs)
        assert sorted(result.acknowledged) == ["ok1", "ok2"]
        errors = [e for e in result.items.column("error").to_pylist() if e is not None]
        assert len(errors) == len(BAD_DOCS) and result.items.num_rows == len(docs)
        for (doc, field, rule), text in zip(BAD_DOCS, errors):
            assert text.startswith("DocumentRejected: document "), text
            assert rule in text and "this item was not applied" in text, (rule, text)
            if field is not None:
                assert f"field {field!r}" in text or f"field {field[:60]}" in text, (field, text)
        after = _snapshot(cluster, "docs")
        assert after == {**before, "ok1": {"delay": 1, "carrier": "UA"}, "ok2": {"delay": 2}}
        for doc, _, _ in BAD_DOCS:
            if isinstance(doc.get("_id"), str) and doc["_id"] and len(doc["_id"]) < 100 and "\ud800" not in doc["_id"]:
                assert cluster.get("docs", doc["_id"]) is None
        # the shard is not poisoned: later bulks, flush and a restore all work
        assert not cluster.bulk("docs", [{"_id": "later", "delay": 3}]).errors
        cluster.flush("docs")
        expected = _snapshot(cluster, "docs")
    finally:
        cluster.close()
    assert _restored(tmp_path, "docs") == expected


def test_single_document_calls_raise_the_typed_error(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        cluster.bulk("docs", [{"_id": "a", "v": 1}])
        before = _snapshot(cluster, "docs")
        with pytest.raises(DocumentRejected, match=r"document 0 \(id 'b'\): field 'v': nan is not a finite") as info:
            cluster.index_doc("docs", {"_id": "b", "v": math.nan})
        assert (info.value.position, info.value.doc_id, info.value.field) == (0, "b", "v")
        with pytest.raises(InvalidRequest, match="if_seq_no must be an int from 0 to 2\\^63-1, got .x."):
            cluster.index_doc("docs", {"_id": "a", "v": 2}, if_seq_no="x", if_primary_term=1)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="go together"):
            cluster.index_doc("docs", {"_id": "a", "v": 2}, if_seq_no=0)
        with pytest.raises(InvalidRequest, match="if_primary_term must be an int from 1 to 2\\^63-1, got 0"):
            cluster.delete("docs", "a", if_seq_no=0, if_primary_term=0)
        for bad_id in (None, 5, "", "x" * 600, "\udc00"):
            with pytest.raises(InvalidRequest, match="document id"):
                cluster.delete("docs", bad_id)  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="document id"):
                cluster.get("docs", bad_id)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="a bulk is a list of documents"):
            cluster.bulk("docs", {"_id": "c"})  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="a bulk is a list of documents"):
            cluster.bulk("docs", 5)  # type: ignore[arg-type]
        assert _snapshot(cluster, "docs") == before
    finally:
        cluster.close()


def test_arrow_table_rows_are_checked_column_by_column(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1)
        table = pa.table({
            "_id": ["a", "b", "c", "x" * 513, None, "f"],
            "d": pa.array([1.5, math.nan, 2.5, 3.5, 4.5, math.inf]),
            "u": pa.array([1, 2, 2 ** 64 - 1, 4, 5, 6], pa.uint64()),
        })
        result = cluster.bulk("docs", table)
        assert sorted(result.acknowledged) == ["a"]
        errors = sorted(e for e in result.items.column("error").to_pylist() if e is not None)
        assert len(errors) == 5 and all(e.startswith("DocumentRejected") for e in errors)
        joined = "\n".join(errors)
        for text in ("document 1 (id 'b'): field 'd': is not a finite number",
                     "document 2 (id 'c'): field 'u': integer is outside the long range",
                     "document 3", "longer than 512 bytes", "document 4: field '_id': missing",
                     "document 5 (id 'f'): field 'd'"):
            assert text in joined, text
        assert _snapshot(cluster, "docs") == {"a": {"d": 1.5, "u": 1}}
        # whole-table problems concern every row: refused as a request, nothing applied
        for bad, rule in ((pa.table({"_id": ["z"], "tags": pa.array([["a"]])}), "arrays are not supported"),
                          (pa.table({"v": [1]}), "no _id column"),
                          (pa.table({"_id": [1]}), "_id column must hold strings"),
                          (pa.table({"_id": ["z"], "_seq_no": [1]}), "metadata field")):
            with pytest.raises(InvalidRequest, match=rule):
                cluster.bulk("docs", bad)
        assert _snapshot(cluster, "docs") == {"a": {"d": 1.5, "u": 1}}
    finally:
        cluster.close()


# -- 5. one mapping per index ------------------------------------------------------------------

def test_a_field_type_is_decided_once_for_the_index_and_published(tmp_path: Path) -> None:
    on0, on1 = _ids_on_two_shards()
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1)
        assert not cluster.bulk("docs", [{"_id": on0, "f": 1}]).errors
        result = cluster.bulk("docs", [{"_id": on1, "f": "one"}])  # routed to the other shard
        assert result.acknowledged == []
        assert "field 'f': a value of type keyword conflicts with the mapped type long" in \
            result.items.column("error")[0].as_py()
        cluster.refresh("docs")
        table = cluster.scan("docs")  # raised ArrowTypeError before: the shards disagreed
        assert table.column("f").to_pylist() == [1] and table.schema.field("f").type == pa.int64()
        published = Mapping.from_dict(cluster.cluster_state().indices["docs"].mappings)
        assert published.get("f") is FieldType.LONG  # was {}: never published
        cluster.flush("docs")
    finally:
        cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=2,
                               recovery_delay=0.05)
    try:
        again = restored.bulk("docs", [{"_id": on1, "f": "one"}])
        assert again.acknowledged == [] and "conflicts with the mapped type long" in again.items.column("error")[0].as_py()
        assert not restored.bulk("docs", [{"_id": on1, "f": 2}]).errors
        restored.refresh("docs")
        assert sorted(restored.scan("docs").column("f").to_pylist()) == [1, 2]
    finally:
        restored.close()


def test_bulks_racing_to_add_one_field_agree_on_its_type(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1)
        results: dict[str, Any] = {}

        def write(kind: str, value: Any) -> None:
            results[kind] = cluster.bulk("docs", [{"_id": f"{kind}{i}", "f": value} for i in range(20)])

        threads = [threading.Thread(target=write, args=("n", 1)), threading.Thread(target=write, args=("s", "x"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        acked = {k: len(r.acknowledged) for k, r in results.items()}
        assert sorted(acked.values()) == [0, 20], acked  # exactly one type won, for every shard
        winner = FieldType.LONG if acked["n"] else FieldType.KEYWORD
        assert Mapping.from_dict(cluster.cluster_state().indices["docs"].mappings).get("f") is winner
        assert len(_snapshot(cluster, "docs")) == 20
        assert cluster.scan("docs").num_rows == 20
    finally:
        cluster.close()


def test_the_index_total_fields_limit_rejects_the_item_that_crosses_it(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=1, replicas=0,
                             mappings={f"f{i}": "long" for i in range(MAX_INDEX_FIELDS - 1)})
        result = cluster.bulk("docs", [{"_id": "a", "new1": 1}, {"_id": "b", "new2": 2}, {"_id": "c", "f0": 3}])
        assert sorted(result.acknowledged) == ["a", "c"]
        assert f"the index mapping would exceed {MAX_INDEX_FIELDS} fields" in \
            [e for e in result.items.column("error").to_pylist() if e][0]
        assert len(Mapping.from_dict(cluster.indices["docs"].mappings)) == MAX_INDEX_FIELDS
    finally:
        cluster.close()


# -- 8. one cluster per data directory ---------------------------------------------------------

def test_a_second_cluster_on_the_same_data_dir_fails_before_writing_to_the_store(tmp_path: Path) -> None:
    first = _cluster(tmp_path)
    try:
        first.create_index("docs", replicas=0)
        first.bulk("docs", [{"_id": "1"}])
        remote = tmp_path / "remote"
        blobs = sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file())
        with pytest.raises(DataDirInUse, match=r"is in use by another cluster \(pid \d+\).*nothing was written"):
            _cluster(tmp_path)
        assert sorted(str(p.relative_to(remote)) for p in remote.rglob("*") if p.is_file()) == blobs
        assert not first.bulk("docs", [{"_id": "2"}]).errors  # the first one is untouched
    finally:
        first.close()
    second = _cluster(tmp_path)  # closing released the directory
    second.close()


def test_a_store_whose_cluster_state_lacks_the_shard_fields_restores_them(tmp_path: Path) -> None:
    """Stores written before mappings were per index hold fields in shard commits only (format compatibility)."""
    from dataclasses import replace

    on0, on1 = _ids_on_two_shards()
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=0)
        assert not cluster.bulk("docs", [{"_id": on0, "f": 1}, {"_id": on1, "g": "x"}]).errors
        cluster.flush("docs")
        # what an older version published: the index with no mappings at all
        cluster.manager().coordination.submit(lambda st: st.with_index(replace(st.indices["docs"], mappings={})))
        assert cluster.cluster_state().indices["docs"].mappings == {}
    finally:
        cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=2,
                               recovery_delay=0.05)
    try:
        published = Mapping.from_dict(restored.cluster_state().indices["docs"].mappings)
        assert (published.get("f"), published.get("g")) == (FieldType.LONG, FieldType.KEYWORD)
        # a conflicting item on the other shard is rejected per item, not guessed anew as keyword there
        result = restored.bulk("docs", [{"_id": on1, "f": "one"}, {"_id": on0, "g": "y"}])
        assert [r["error"] is None for r in result.items.to_pylist()] == [False, True]
        restored.refresh("docs")
        assert restored.scan("docs").num_rows == 2
    finally:
        restored.close()
