"""A stored-source row drops its JSON only when its fields rebuild it byte for byte (issue 31).

``table_rebuilds_exactly`` decides from a table's schema alone; Hypothesis generates tables of
every handled type, nulls, dotted names, column orders and mappings (with their own field
orders), and every table it accepts must rebuild to exactly the bytes its JSON sources have.
``kept_sources`` compares row by row: a dropped source must rebuild to the given bytes even when
the row is read back beside other columns (the segment's), and a row the rebuild would change
keeps its JSON.
"""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.segments.mapping import FieldType, Mapping, sources_from_table
from shardstore.segments.source_keep import kept_sources, table_rebuilds_exactly
from shardstore.segments.synthetic import conform_fields, synthesize_sources
from shardstore.segments.table_fields import fields_from_table
from tests.segments.test_segments_table_fields import tables


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.randoms(use_true_random=False))
def test_a_table_accepted_by_its_schema_rebuilds_to_the_same_bytes(drawn, rnd) -> None:
    table, mapping = drawn
    names = [n for n in table.column_names if n != "_id"]
    rnd.shuffle(names)  # columns in any order
    table = table.select(["_id", *names])
    order = list(mapping.order)
    rnd.shuffle(order)
    mapping = Mapping(mapping.fields, order=tuple(order))
    direct = fields_from_table(table, mapping)
    if direct is None:
        return
    fields, extended = direct
    if not table_rebuilds_exactly(table, extended):
        return
    given_json = sources_from_table(table)[1]
    # read back beside columns of other rows: a wider table, columns in the segment's (sorted) order
    wide, _ = conform_fields(fields, extended.with_fields({"zz.other": FieldType.LONG, "a0": FieldType.KEYWORD}),
                             table.num_rows)
    assert synthesize_sources(wide, table.num_rows, extended.order).to_pylist() == given_json.to_pylist()


def test_the_schema_rule_declines_what_would_change() -> None:
    m = Mapping((("year", FieldType.LONG), ("dest", FieldType.KEYWORD), ("delay", FieldType.DOUBLE)),
                order=("year", "dest", "delay"))
    ok = pa.table({"_id": ["1"], "year": [2013], "dest": ["IAH"], "delay": [1.5]})
    assert table_rebuilds_exactly(ok, m)
    assert not table_rebuilds_exactly(ok.select(["_id", "dest", "year", "delay"]), m)  # another order
    assert not table_rebuilds_exactly(pa.table({"_id": ["1"], "delay": [5]}), m)  # 5 would come back 5.0
    assert not table_rebuilds_exactly(pa.table({"_id": ["1"], "new": [5]}), m)  # not mapped (dynamic: false)
    dotted = Mapping((("o.x", FieldType.LONG),))
    assert not table_rebuilds_exactly(pa.table({"_id": ["1"], "o.x": [1]}), dotted)
    # a column without any value writes nothing on either side, wherever it stands
    assert table_rebuilds_exactly(pa.table({"_id": ["1"], "delay": pa.nulls(1, pa.float64()), "year": [1]}), m)


def _fields(docs: list[dict], mapping: Mapping) -> tuple[pa.Array, pa.Table, Mapping]:
    from shardstore.segments.mapping import parse_sources

    sources = pa.array([json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode() for d in docs], pa.binary())
    fields, mapping = parse_sources(pa.array([str(i) for i in range(len(docs))]), sources, mapping)
    return sources, fields, mapping


def test_rows_keep_their_json_unless_the_rebuild_gives_the_same_bytes() -> None:
    docs = [
        {"x": 1, "b": "s", "c": 2.5},  # the mapping's order: dropped
        {"c": 5.0, "x": 2},  # another order: kept
        {"x": 3, "b": "t"},  # a subset in order: dropped
        {"x": 4, "c": 5},  # 5 in a double field comes back 5.0: kept
        {"x": 5, "o": {"p": 1}},  # an object: kept
        {"b": "2013-01-01", "x": 6},  # kept (order)
        {"x": 7, "b": "caf\u00e9 \"q\" \\"},  # escapes as the rebuild writes them: dropped
    ]
    sources, fields, mapping = _fields(docs, Mapping(()))
    assert mapping.order[:3] == ("x", "b", "c")
    kept = kept_sources(sources, fields, mapping).to_pylist()
    assert [k is None for k in kept] == [True, False, True, False, False, False, True]
    rebuilt = synthesize_sources(fields, len(docs), mapping.order).to_pylist()
    for i, k in enumerate(kept):
        assert (k if k is not None else rebuilt[i]) == sources[i].as_py()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c", "n", "o.x"]),
                                st.one_of(st.none(), st.integers(-5, 5), st.floats(-10, 10, allow_nan=False),
                                          st.text(max_size=3), st.booleans()), max_size=4),
                min_size=1, max_size=6))
def test_every_dropped_source_rebuilds_beside_any_other_columns(docs) -> None:
    try:
        sources, fields, mapping = _fields(docs, Mapping(()))
    except Exception:  # noqa: BLE001 - documents the parse refuses never reach source_keep
        return
    kept = kept_sources(sources, fields, mapping)
    wide, _ = conform_fields(fields, mapping.with_fields({"q.zz": FieldType.LONG, "r.s": FieldType.LONG}), len(docs))
    rebuilt = synthesize_sources(wide, len(docs), mapping.order)
    for i in range(len(docs)):
        if kept[i].as_py() is None:
            assert rebuilt[i].as_py() == sources[i].as_py()


def test_a_rebuilt_row_has_no_empty_object_for_dotted_fields_it_never_had() -> None:
    t = pa.table({"a.b": pa.array([1, None], pa.int64()), "c": pa.array([1, 2], pa.int64())})
    assert synthesize_sources(t).to_pylist() == [b'{"a":{"b":1},"c":1}', b'{"c":2}']
    # a table bulk's own JSON keeps writing "a":{} (what it stored before)
    assert sources_from_table(t.add_column(0, "_id", pa.array(["1", "2"])))[1].to_pylist()[1] == b'{"a":{},"c":2}'


def test_the_mapping_keeps_the_order_fields_came_in() -> None:
    m = Mapping(()).with_fields({"year": FieldType.LONG, "month": FieldType.LONG})
    m = m.with_fields({"dest": FieldType.KEYWORD})
    assert m.order == ("year", "month", "dest") and [n for n, _ in m.items()] == ["dest", "month", "year"]
    back = Mapping.from_dict(json.loads(json.dumps(m.to_dict(), sort_keys=True)))
    assert back == m and back.order == m.order
    assert m.merged(Mapping((("a", FieldType.LONG), ("z", FieldType.LONG)), order=("z", "a"))).order[-2:] == ("z", "a")
    assert "_order" not in Mapping((("a", FieldType.LONG), ("b", FieldType.LONG))).to_dict()  # sorted: no word
    try:
        Mapping((("a", FieldType.LONG),), order=("b",))
    except ValueError as exc:
        assert "does not list its fields" in str(exc)
    else:
        raise AssertionError("an order naming other fields was taken")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), st.randoms(use_true_random=False))
def test_a_point_read_rebuilds_one_row_as_the_columnar_writer_does(drawn, rnd) -> None:
    from shardstore.segments.synthetic import row_source

    table, mapping = drawn
    direct = fields_from_table(table, mapping)
    if direct is None:
        return
    fields, extended = direct
    order = list(extended.order)
    rnd.shuffle(order)
    extended = Mapping(extended.fields, order=tuple(order))
    for i, row in enumerate(fields.to_pylist()):
        columnar = synthesize_sources(fields.slice(i, 1), 1, extended.order)[0].as_py()  # a get reads one row
        row = {"_id": str(i), "_seq_no": i, "_source": None, **row}
        # the same document, members in the same order (json.loads keeps the order; dumps shows it)
        assert json.dumps(json.loads(row_source(row, extended.order))) == json.dumps(json.loads(columnar))


def test_a_point_reads_member_plan_follows_the_row_shape_and_the_order() -> None:
    """``row_source`` reuses its member plan per (row shape, order): two orders, or two shapes, never share one."""
    from shardstore.segments.synthetic import row_source

    row = {"_id": "a", "_seq_no": 1, "b": 2, "o.x": 1, "a": "s"}
    assert row_source(row, ["a", "b", "o.x"]) == b'{"a":"s","b":2,"o":{"x":1}}'
    assert row_source(row, ["o.x", "b", "a"]) == b'{"o":{"x":1},"b":2,"a":"s"}'
    assert row_source({"_id": "a", "b": 2, "o.y": None, "o.x": 3}, ["o.x", "b", "a"]) == b'{"o":{"x":3},"b":2}'
    assert row_source(row) == b'{"b":2,"o":{"x":1},"a":"s"}'  # no order: the row's own
