"""Issue 15, second round: what an adversarial review found after the first fixes (each seen failing first).

* One date grammar: the Arrow reader (fast path) took ``2024-03-01T10:00:00+05`` and
  ``2020-01-01T10`` where the Python path refused them; which path ran depended on the rest
  of the batch (a dotted key sends it to Python), so the coordinator, a replica and a
  translog replay decided differently.  Two acknowledged docs then made ``Cluster.restore``
  raise ``MappingConflict``, and an item reported as rejected stayed on the primary.
* A replica that refuses what the primary applied is failed (rebuilt), not left in sync.
* Year 0 dates, invalid UTF-8 in an Arrow column, two spellings of one struct field,
  whole-number float columns turning ``long``, sub-millisecond timestamps, hostile index
  names and mappings: each now a clean error or an exact round trip.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.errors import InvalidRequest
from shardstore.segments.errors import MappingConflict
from shardstore.segments.mapping import FieldType, Mapping
from tests.engine.test_engine_bad_input import _cluster, _ids_on_two_shards, _restored, _snapshot


def _rebuild_a_replica(cluster: Cluster) -> None:
    """Wipe the node of shard 0's replica and wait until the copy is rebuilt (it replays every acknowledged op)."""
    routing = cluster.indices["docs"].routing[0]
    replica = next(n for n in routing.copies if n != routing.primary)
    cluster.kill_node(replica, wipe_disk=True)
    cluster.start_node(replica)
    cluster.wait_for_health("green", timeout=60)


def test_dates_are_decided_alike_whatever_else_is_in_the_batch(tmp_path: Path) -> None:
    on0, on1 = _ids_on_two_shards()
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1, mappings={"d": "date", "a.b": "double"})
        # x alone on shard 0 (the replica parses it without the dotted y beside it)
        result = cluster.bulk("docs", [{"_id": on0, "a.b": 1, "d": "2020-01-01T10"}, {"_id": on1, "a.b": 1.5}])
        assert result.acknowledged == [on0, on1] or sorted(result.acknowledged) == sorted([on0, on1])
        # a new date field with an hour-only offset, then the same field spelled dotted
        assert not cluster.bulk("docs", [{"_id": "x", "event": {"time": "2024-03-01T10:00:00+05"}}]).errors
        assert not cluster.bulk("docs", [{"_id": "y", "event.time": "2024-03-02T10:00:00Z"}]).errors
        expected = _snapshot(cluster, "docs")  # primaries and replicas agree
        assert expected[on0] == {"a.b": 1, "d": "2020-01-01T10"} and len(expected) == 4
        _rebuild_a_replica(cluster)  # the rebuilt replica replays every acknowledged op
        assert _snapshot(cluster, "docs") == expected
        cluster.flush("docs")
    finally:
        cluster.close()
    assert _restored(tmp_path, "docs") == expected  # raised MappingConflict before


def test_dates_outside_years_1_to_9999_are_refused_and_reads_keep_working(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=1, replicas=1, mappings={"d": "date"})
        result = cluster.bulk("docs", [{"_id": "a", "d": "0000-01-01"}, {"_id": "b", "d": "2024-01-01"}])
        rows = result.items.to_pylist()
        assert rows[0]["error"].startswith("DocumentRejected") and "'d'" in rows[0]["error"]
        assert rows[1]["error"] is None
        assert not cluster.bulk("docs", [{"_id": "c", "e": "0000-01-01"}]).errors  # unmapped: a keyword
        assert Mapping.from_dict(cluster.indices["docs"].mappings).get("e") is FieldType.KEYWORD
        cluster.refresh("docs")
        assert sorted(r["_id"] for r in cluster.scan("docs").to_pylist()) == ["b", "c"]  # raised OverflowError
        table = pa.table({"_id": ["t"], "k": pa.array([dt.datetime(1, 1, 1)], pa.timestamp("ms"))})
        assert not cluster.bulk("docs", table).errors
        early = pa.table({"_id": ["u"], "k": pa.array([-62135596800001], pa.timestamp("ms"))})
        assert "outside years 1 to 9999" in cluster.bulk("docs", early).items.column("error")[0].as_py()
    finally:
        cluster.close()


def test_arrow_tables_keep_one_spelling_valid_text_and_float_types(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=2, replicas=1)
        bad_text = pa.array([b"ok", b"\xff"], pa.binary()).view(pa.string())
        # all-ASCII bytes but offsets that run backwards: the one-pass UTF-8 check must not wave it through
        backwards = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 2, 1], np.int32).tobytes()),
                                                            pa.py_buffer(b"ab")])
        for table, rule in (
            (pa.table({"_id": ["a", "b"], "s": bad_text}), "not valid Arrow data.*UTF8"),
            (pa.table({"_id": ["a", "b"], "s": backwards}), "not valid Arrow data.*ffset"),
            (pa.table({"_id": pa.chunked_array([["a"], bad_text.slice(1)]), "n": [1, 2]}), "not valid Arrow data.*UTF8"),
            (pa.table({"_id": ["a"], "o": pa.array([{"x": 1, "y": 2}]).cast(
                pa.struct([("x", pa.int64()), ("x", pa.int64())]))}), "given twice"),
            (pa.table({"_id": ["a"], "o.a.b": [1], "o": pa.array([{"a": {"b": "s"}}])}), "given twice"),
        ):
            with pytest.raises(InvalidRequest, match=rule):
                cluster.bulk("docs", table)
        assert _snapshot(cluster, "docs") == {}  # nothing applied, the shards not poisoned
        floats = pa.table({"_id": ["f1", "f2"], "f": pa.array([1.0, -0.0])})
        assert not cluster.bulk("docs", floats).errors
        assert Mapping.from_dict(cluster.indices["docs"].mappings).get("f") is FieldType.DOUBLE  # was long
        assert not cluster.bulk("docs", [{"_id": "f3", "f": 1.5}]).errors
        assert cluster.get("docs", "f1")["_source"] == {"f": 1.0}
        ns = pa.table({"_id": ["n1", "n2"], "k": pa.array([1_000_000, 1_000_001], pa.timestamp("ns"))})
        rows = cluster.bulk("docs", ns).items.to_pylist()
        assert rows[0]["error"] is None and "sub-millisecond" in rows[1]["error"]
        assert not cluster.bulk("docs", pa.record_batch({"_id": ["rb"], "f": [2.5]})).errors  # a RecordBatch
    finally:
        cluster.close()


def test_hostile_index_names_mappings_and_arguments(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        for name in (["docs"], {"a": 1}):
            for call in (lambda: cluster.get(name, "a"), lambda: cluster.bulk(name, [{"_id": "a"}]),  # noqa: B023
                         lambda: cluster.count(name)):  # noqa: B023
                with pytest.raises(InvalidRequest, match="an index name is a string"):
                    call()
        deep: dict = {}
        cur = deep
        for _ in range(3000):
            cur["properties"] = {"a": {}}
            cur = cur["properties"]["a"]
        with pytest.raises(InvalidRequest, match="mappings"):
            cluster.create_index("deep", mappings=deep)
        for bad in ({"a\x00b": "long"}, {".".join(["a"] * 22): "long"}, {"a\ud800": "long"}):
            with pytest.raises(InvalidRequest, match="mappings: field"):
                cluster.create_index("bad", mappings=bad)
        assert set(cluster.indices) == {"docs"}
        result = cluster.bulk("docs", [{"_id": "a", "__shardstore_live__": 1}])
        assert "metadata field" in result.items.column("error")[0].as_py()
        with pytest.raises(InvalidRequest, match="if_seq_no must be an int from 0 to 2\\^63-1"):
            cluster.delete("docs", "a", if_seq_no=2 ** 70, if_primary_term=1)
    finally:
        cluster.close()


def test_mappings_merge_strictly() -> None:
    a = Mapping.from_dict({"f": "long"})
    assert a.merged(Mapping.from_dict({"g": "keyword"})).get("g") is FieldType.KEYWORD
    with pytest.raises(MappingConflict, match="'f'"):
        a.merged(Mapping.from_dict({"f": "keyword"}))  # with_fields retyped silently


@pytest.mark.parametrize("first", [
    [{"_id": "a", "o": {}}],  # dicts: an empty object
    [{"_id": "a", "o": {"x": None}}],  # an object holding only null
    pa.table({"_id": ["a"], "o": pa.array([{}], pa.struct([]))}),  # a table: an empty struct
    pa.table({"_id": ["a"], "o": pa.array([{"x": None}], pa.struct([("x", pa.int64())]))}),
])
def test_an_object_holding_no_value_never_blocks_a_replay(tmp_path: Path, first: Any) -> None:
    """Review of issues 15/16: ``{"o": {}}`` then ``{"o": "x"}`` were both acknowledged, and then no replica
    could be rebuilt and ``Cluster.restore`` raised MappingConflict (the replay saw an object where the
    mapping had gained a keyword).  An object holding no value is absent, as null is, on every path."""
    cluster = _cluster(tmp_path)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        assert not cluster.bulk("docs", first).errors
        assert not cluster.bulk("docs", [{"_id": "b", "o": "x"}]).errors
        assert not cluster.bulk("docs", first if isinstance(first, pa.Table) else [{"_id": "c", **{
            k: v for k, v in first[0].items() if k != "_id"}}]).errors
        expected = _snapshot(cluster, "docs")
        _rebuild_a_replica(cluster)
        assert _snapshot(cluster, "docs") == expected
    finally:
        cluster.close()
    assert _restored(tmp_path, "docs") == expected  # no flush: the restore replays the translog
