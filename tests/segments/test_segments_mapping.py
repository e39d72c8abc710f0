"""Mappings and the columnar JSON source parser (shardstore.segments.mapping)."""

from __future__ import annotations

import datetime as dt
import json
import pickle
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.segments.errors import InvalidDocument, MappingConflict
from shardstore.segments.mapping import (
    FieldType,
    Mapping,
    _parse_python,
    parse_sources,
    sources_from_pylist,
    sources_from_table,
)

UTC = dt.timezone.utc


def parse(docs, mapping=Mapping(), **kw):
    ids, src = sources_from_pylist(docs)
    return parse_sources(ids, src, mapping, **kw)


def raw(pairs, mapping=Mapping(), **kw):
    ids = pa.array([i for i, _ in pairs], pa.string())
    src = pa.array([s for _, s in pairs], pa.binary())
    return parse_sources(ids, src, mapping, **kw)


# -- Mapping ----------------------------------------------------------------------------

def test_field_types_and_arrow_types():
    assert FieldType("keyword").arrow_type == pa.string()
    assert FieldType.TEXT.arrow_type == pa.string()
    assert FieldType.LONG.arrow_type == pa.int64()
    assert FieldType.INTEGER.arrow_type == pa.int32()
    assert FieldType.DOUBLE.arrow_type == pa.float64()
    assert FieldType.BOOLEAN.arrow_type == pa.bool_()
    assert FieldType.DATE.arrow_type == pa.timestamp("ms", tz="UTC")


def test_mapping_from_dict_opensearch_and_flat_styles():
    nested = Mapping.from_dict(
        {"properties": {"a": {"type": "long"}, "o": {"properties": {"b": {"type": "keyword"}, "p": {"type": "object", "properties": {"c": {"type": "date"}}}}}}}
    )
    flat = Mapping.from_dict({"a": "long", "o.b": "keyword", "o.p.c": {"type": "date"}})
    assert nested == flat
    assert dict(nested.items()) == {"a": FieldType.LONG, "o.b": FieldType.KEYWORD, "o.p.c": FieldType.DATE}
    assert Mapping.from_dict(nested.to_dict()) == nested
    assert nested.to_dict()["properties"]["o"]["properties"]["p"]["properties"]["c"] == {"type": "date"}
    assert nested.arrow_schema() == pa.schema([("a", pa.int64()), ("o.b", pa.string()), ("o.p.c", pa.timestamp("ms", tz="UTC"))])
    assert "o.b" in nested and "o" not in nested and "o" in nested.object_paths
    assert pickle.loads(pickle.dumps(nested)) == nested
    with pytest.raises(ValueError):
        Mapping.from_dict({"a": "geo_point"})


def test_mapping_refuses_a_field_that_is_also_an_object():
    with pytest.raises(MappingConflict):
        Mapping.from_dict({"a": "long", "a.b": "long"})


# -- inference and flattening -------------------------------------------------------------

def test_dynamic_inference_and_flattening():
    table, m = parse(
        [
            {"_id": "1", "n": 1, "f": 1.5, "b": True, "s": "hello", "d": "2024-01-02", "o": {"x": 1, "y": {"z": "deep"}}, "nul": None},
            {"_id": "2", "n": 2, "f": 2, "b": False, "s": "bye", "d": "2024-01-02T03:04:05.678Z", "o": {"x": 2}},
        ]
    )
    assert dict(m.items()) == {
        "n": FieldType.LONG, "f": FieldType.DOUBLE, "b": FieldType.BOOLEAN, "s": FieldType.KEYWORD,
        "d": FieldType.DATE, "o.x": FieldType.LONG, "o.y.z": FieldType.KEYWORD,
    }
    assert table.schema == m.arrow_schema()
    assert table.column("n").to_pylist() == [1, 2]
    assert table.column("f").to_pylist() == [1.5, 2.0]
    assert table.column("o.y.z").to_pylist() == ["deep", None]
    assert table.column("d").to_pylist() == [
        dt.datetime(2024, 1, 2, tzinfo=UTC),
        dt.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    ]


def test_known_fields_absent_are_null_and_mapping_kept():
    m = Mapping.from_dict({"a": "long", "k": "keyword", "i": "integer", "t": "text"})
    table, m2 = parse([{"_id": "1", "a": 5}, {"_id": "2", "k": "x", "i": 7, "t": "some words"}], m)
    assert m2 == m
    assert table.to_pylist() == [{"a": 5, "i": None, "k": None, "t": None}, {"a": None, "i": 7, "k": "x", "t": "some words"}]
    assert table.schema.field("i").type == pa.int32()


def test_mixed_strings_and_dates_make_keyword_mixed_numbers_make_double():
    _, m = parse([{"_id": "1", "s": "2024-01-01", "n": 1}, {"_id": "2", "s": "not a date", "n": 2.5}])
    assert m["s"] is FieldType.KEYWORD and m["n"] is FieldType.DOUBLE


def test_dynamic_false_ignores_unknown_fields():
    m = Mapping.from_dict({"a": "long"})
    table, m2 = parse([{"_id": "1", "a": 1, "new": "x", "o": {"p": 1}}], m, dynamic=False)
    assert m2 == m and table.column_names == ["a"]


def test_dotted_keys_are_object_paths():
    table, m = raw([("1", b'{"o.a": 1}'), ("2", b'{"o": {"a": 2}}')])
    assert dict(m.items()) == {"o.a": FieldType.LONG}
    assert table.column("o.a").to_pylist() == [1, 2]


def test_pretty_printed_sources_with_raw_newlines():
    docs = [{"a": 1, "s": "line\nbreak", "o": {"x": [][:0] or 1}}, {"a": 2, "s": "two"}]
    pairs = [(str(i), json.dumps(d, indent=2).replace("\n", "\r\n").encode()) for i, d in enumerate(docs)]
    table, m = raw(pairs)
    assert table.column("a").to_pylist() == [1, 2]
    assert table.column("s").to_pylist() == ["line\nbreak", "two"]
    assert table.column("o.x").to_pylist() == [1, None]


def test_unicode_values_and_names():
    table, m = parse([{"_id": "ü-1", "名前": "値", "emoji": "🙂 \u2028", "o": {"ß": "é"}}])
    assert table.to_pylist() == [{"emoji": "🙂 \u2028", "o.ß": "é", "名前": "値"}]


def test_large_document_above_the_block_size():
    big = "x" * (3 << 20)
    table, _ = parse([{"_id": "1", "big": big}, {"_id": "2", "big": "y"}])
    assert table.column("big").to_pylist() == [big, "y"]


def test_empty_batch():
    m = Mapping.from_dict({"a": "long"})
    table, m2 = parse_sources(pa.array([], pa.string()), pa.array([], pa.binary()), m)
    assert table.num_rows == 0 and m2 == m and table.schema == m.arrow_schema()


# -- arrays ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [[1, 2], [], ["a"], [{"x": 1}]])
def test_arrays_are_refused_naming_field_and_document(value):
    with pytest.raises(MappingConflict) as err:
        parse([{"_id": "ok", "a": 1}, {"_id": "bad", "tags": value}])
    assert err.value.field == "tags" and err.value.doc_id == "bad" and err.value.found == "array"
    m = Mapping.from_dict({"tags": "keyword"})
    with pytest.raises(MappingConflict) as err:
        parse([{"_id": "ok", "tags": "x"}, {"_id": "bad", "tags": value}], m)
    assert (err.value.field, err.value.doc_id, err.value.mapped, err.value.found) == ("tags", "bad", "keyword", "array")


# -- conflicts -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "mapping, doc, field, mapped, found",
    [
        ({"a": "long"}, {"a": "abc"}, "a", "long", "keyword"),
        ({"a": "long"}, {"a": 1.5}, "a", "long", "double"),
        ({"a": "long"}, {"a": "12"}, "a", "long", "keyword"),
        ({"a": "long"}, {"a": {"b": 1}}, "a", "long", "object"),
        ({"a": "integer"}, {"a": 2**40}, "a", "integer", "long"),
        ({"a": "keyword"}, {"a": 5}, "a", "keyword", "long"),
        ({"a": "boolean"}, {"a": "true"}, "a", "boolean", "keyword"),
        ({"a": "date"}, {"a": "yesterday"}, "a", "date", "keyword"),
        ({"a": "date"}, {"a": 1700000000000}, "a", "date", "long"),
        ({"o.x": "long"}, {"o": 5}, "o", "object", "long"),
        ({"o.x": "long"}, {"o": {"x": True}}, "o.x", "long", "boolean"),
    ],
)
def test_conflicts_name_field_document_and_both_types(mapping, doc, field, mapped, found):
    m = Mapping.from_dict(mapping)
    with pytest.raises(MappingConflict) as err:
        parse([{"_id": "good"}, {"_id": "bad-doc", **doc}, {"_id": "later", "zzz": 1}], m)
    e = err.value
    assert (e.field, e.doc_id, e.mapped, e.found) == (field, "bad-doc", mapped, found)
    assert field in str(e) and "bad-doc" in str(e) and mapped in str(e) and found in str(e)


def test_conflict_between_new_fields_of_one_batch():
    with pytest.raises(MappingConflict) as err:
        parse([{"_id": "1", "n": 1}, {"_id": "2", "n": "x"}])
    assert (err.value.field, err.value.doc_id, err.value.mapped, err.value.found) == ("n", "2", "long", "keyword")
    with pytest.raises(MappingConflict) as err:
        parse([{"_id": "1", "n": 1}, {"_id": "2", "n": {"x": 1}}])
    assert err.value.field == "n"


def test_a_conflicting_batch_applies_nothing():
    m = Mapping.from_dict({"a": "long"})
    with pytest.raises(MappingConflict):
        parse([{"_id": "1", "newfield": "x", "a": 1}, {"_id": "2", "a": "bad"}], m)
    # the mapping object is immutable and the caller still holds the old one
    assert dict(m.items()) == {"a": FieldType.LONG}


# -- invalid documents -----------------------------------------------------------------------

@pytest.mark.parametrize(
    "source, reason",
    [(b"[1, 2]", "not an object"), (b"5", "not an object"), (b'{"a": 1', "invalid JSON"), (b"", "invalid JSON"),
     (b"   ", "invalid JSON"), (b'{"a": 1}{"a": 2}', "invalid JSON"), (b'{"_id": "x"}', "metadata"), (b"\xff\xfe", "invalid JSON")],
)
def test_invalid_sources_name_index_and_id(source, reason):
    with pytest.raises(InvalidDocument) as err:
        raw([("first", b'{"a": 1}'), ("second", source)])
    assert err.value.index == 1 and err.value.doc_id == "second" and reason in str(err.value)


def test_missing_or_empty_ids():
    with pytest.raises(InvalidDocument) as err:
        parse_sources(pa.array(["a", ""]), pa.array([b"{}", b"{}"]), Mapping())
    assert err.value.index == 1
    with pytest.raises(InvalidDocument) as err:
        parse_sources(pa.array(["a", None]), pa.array([b"{}", b"{}"]), Mapping())
    assert err.value.index == 1
    with pytest.raises(InvalidDocument):
        parse_sources(pa.array(["a"]), pa.array([b"{}", b"{}"]), Mapping())
    with pytest.raises(InvalidDocument):
        sources_from_pylist([{"a": 1}])


# -- sources from tables -------------------------------------------------------------------

def test_sources_from_table_round_trip():
    t = pa.table(
        {
            "_id": ["1", "2", "3"],
            "n": pa.array([1, None, -3], pa.int64()),
            "f": [0.5, float("nan"), 1e300],
            "b": [True, False, None],
            "s": ['quote " back \\ nl \n tab \t ctl \x01 ü', None, ""],
            "d": pa.array([0, 1_700_000_000_123, None], pa.timestamp("ms", tz="UTC")),
            "o.x": [1, 2, None],
            "o.y": ["a", None, None],
        }
    )
    ids, src = sources_from_table(t)
    assert ids.to_pylist() == ["1", "2", "3"]
    docs = [json.loads(s) for s in src.to_pylist()]
    assert docs[0] == {"n": 1, "f": 0.5, "b": True, "s": 'quote " back \\ nl \n tab \t ctl \x01 ü', "d": "1970-01-01T00:00:00.000Z", "o": {"x": 1, "y": "a"}}
    assert docs[1] == {"b": False, "d": "2023-11-14T22:13:20.123Z", "o": {"x": 2}}  # NaN left out
    assert docs[2] == {"n": -3, "f": 1e300, "s": "", "o": {}}
    m = Mapping.from_dict({"n": "long", "f": "double", "b": "boolean", "s": "keyword", "d": "date", "o.x": "long", "o.y": "keyword"})
    table, _ = parse_sources(ids, src, m)
    assert table.column("d").to_pylist()[1] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert table.column("s").to_pylist()[0] == t.column("s")[0].as_py()


@pytest.mark.parametrize("chunked", [False, True])
def test_sources_from_table_long_keyword_columns_escape_through_their_dictionary(chunked):
    """A long column of few distinct strings (the dictionary route) gives the same JSON as the direct one."""
    from shardstore.segments import source_json as mp

    words = ['a "q"', "back \\ slash", "nl \n tab \t ctl \x01", "ü", "", "plain", None]
    n = mp._DICT_MIN_ROWS * 2
    col = pa.array([words[i % len(words)] for i in range(n)])
    if chunked:
        col = pa.chunked_array([col.slice(0, 1000), col.slice(1000)])
    t = pa.table({"_id": [str(i) for i in range(n)], "s": col})
    _ids, src = sources_from_table(t)
    docs = [json.loads(x) for x in src.to_pylist()]
    assert docs == [{} if words[i % len(words)] is None else {"s": words[i % len(words)]} for i in range(n)]
    direct = mp._escape(t.column("s").slice(0, mp._DICT_MIN_ROWS - 1))  # below the threshold: no dictionary
    via_dict = mp._escape(t.column("s"))
    assert via_dict.slice(0, mp._DICT_MIN_ROWS - 1).to_pylist() == direct.to_pylist()


def test_sources_from_table_needs_id():
    with pytest.raises(InvalidDocument):
        sources_from_table(pa.table({"a": [1]}))


@pytest.mark.parametrize("rows", [7, 8, 9, 31])
def test_a_large_table_built_by_slices_on_threads_gives_the_same_bytes(monkeypatch, rows):
    """Cut into slices (one per core, here 3 of ~rows/3), built on worker threads: the same sources, byte for
    byte, in row order, as the whole table on the caller's thread; a bad column is still refused."""
    import os

    from shardstore.segments import source_json

    words = ['a "q"', "nl \n", None, "ü", "plain"]
    t = pa.table({
        "_id": [f"id{i}" for i in range(rows)],
        "n": pa.array([None if i % 4 == 0 else i * 7 for i in range(rows)], pa.int64()),
        "s": [words[i % len(words)] for i in range(rows)],
        "f": [i / 3 for i in range(rows)],
        "d": pa.array([1_700_000_000_000 + i for i in range(rows)], pa.timestamp("ms", tz="UTC")),
        "o.x": [None if i % 3 else i for i in range(rows)],
        "o.y": [f"y{i}" for i in range(rows)],
    })
    calls: list[str] = []  # the thread of each build of an object (the row's, and the nested "o")
    build = source_json._object_json

    def spy(items, n, **kw):
        calls.append(threading.current_thread().name)
        return build(items, n, **kw)

    monkeypatch.setattr(source_json, "_object_json", spy)
    whole_ids, whole = sources_from_table(t)
    on_caller = list(calls)
    assert on_caller == [threading.current_thread().name] * 2  # below 2 x PARALLEL_ROWS: no thread
    calls.clear()
    monkeypatch.setattr(source_json, "PARALLEL_ROWS", rows // 3)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    ids, src = sources_from_table(t)
    assert src.equals(whole) and ids.equals(whole_ids) and len(src) == rows
    assert len(calls) == 3 * len(on_caller)  # each of the 3 slices built its objects...
    assert all(name.startswith("source-json") for name in calls)  # ...on a worker thread
    with pytest.raises(InvalidDocument, match="sits below"):
        sources_from_table(t.append_column("n.z", pa.array(range(rows))))


# -- the fast path agrees with the Python reference path --------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(max_size=8), st.sampled_from(["2024-01-01", "2024-02-03T04:05:06Z", "2024-02-03T04:05:06.789+02:00"]),
)
_docs = st.lists(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(_scalars, st.dictionaries(st.sampled_from(["x", "y"]), _scalars, max_size=2)), max_size=3),
    min_size=1, max_size=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_docs)
def test_fast_path_matches_reference(docs):
    ids = pa.array([f"d{i}" for i in range(len(docs))])
    src = pa.array([json.dumps(d).encode() for d in docs], pa.binary())
    try:
        ref = _parse_python(ids, src, Mapping(), True)
    except MappingConflict as exc:
        with pytest.raises(MappingConflict) as err:
            parse_sources(ids, src, Mapping())
        assert err.value.field == exc.field and err.value.doc_id == exc.doc_id
        return
    got = parse_sources(ids, src, Mapping())
    assert got[1] == ref[1]
    assert got[0].equals(ref[0]), (got[0].to_pylist(), ref[0].to_pylist())
    # and parsing again with the learned mapping gives the same columns
    again, m2 = parse_sources(ids, src, got[1])
    assert m2 == got[1] and again.equals(got[0])


@pytest.mark.parametrize("seed", range(12))
def test_sources_from_table_any_null_pattern(seed):
    """Every mix of always-present and optional members (first, middle, last, none) gives each row's exact object."""
    import random

    rng = random.Random(seed)
    n = 40
    cols: dict[str, pa.Array] = {"_id": pa.array([str(i) for i in range(n)])}
    for c in range(rng.randint(1, 6)):
        p_null = rng.choice([0.0, 0.0, 0.3, 1.0])
        kind = rng.choice(["long", "str", "nested"])
        vals = [None if rng.random() < p_null else rng.randint(-5, 5) for _ in range(n)]
        name = f"c{c}" if kind != "nested" else f"o{c % 2}.k{c}"
        cols[name] = pa.array([None if v is None else f"s{v}" for v in vals]) if kind == "str" else pa.array(vals, pa.int64())
    t = pa.table(cols)
    _ids, src = sources_from_table(t)
    for i, text in enumerate(src.to_pylist()):
        want: dict = {}
        for name in t.column_names[1:]:
            v = t.column(name)[i].as_py()
            head, _, leaf = name.rpartition(".")
            node = want.setdefault(head, {}) if head else want
            if v is not None:
                node[leaf] = v
        assert json.loads(text) == want, (seed, i, text)
        assert list(json.loads(text)) == list(want)  # the columns' order
