"""The codec of each segment column (segments/segment_info.py ``column_codecs``; docs/design/segments.md, "Codecs")."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.segments.segment import SegmentReader, write_segment
from shardstore.segments.segment_info import BASE_SCHEMA, DENSE_CODEC, FIXED_WIDTH_CODEC, column_codecs

#: every kind of Arrow field a segment column may hold (mappings make the flat ones), and its codec
FIELDS = {
    "i32": (pa.int32(), 7, FIXED_WIDTH_CODEC),
    "i64": (pa.int64(), 8, FIXED_WIDTH_CODEC),
    "f64": (pa.float64(), 1.5, FIXED_WIDTH_CODEC),
    "flag": (pa.bool_(), True, FIXED_WIDTH_CODEC),
    "day": (pa.date32(), datetime.date(2013, 1, 1), FIXED_WIDTH_CODEC),
    "at": (pa.timestamp("s", tz="UTC"), datetime.datetime(2013, 1, 1, tzinfo=datetime.UTC), FIXED_WIDTH_CODEC),
    "price": (pa.decimal128(9, 2), decimal.Decimal("1.25"), FIXED_WIDTH_CODEC),
    "name": (pa.string(), "x", DENSE_CODEC),
    "blob": (pa.binary(), b"x", DENSE_CODEC),
    "tags": (pa.list_(pa.string()), ["a"], DENSE_CODEC),
    "geo": (pa.struct([("lat", pa.float64())]), {"lat": 1.0}, DENSE_CODEC),
}
BASE = {"_id": DENSE_CODEC, "_seq_no": DENSE_CODEC, "_source": DENSE_CODEC,
        "_primary_term": FIXED_WIDTH_CODEC, "_version": FIXED_WIDTH_CODEC}
#: the Parquet names of the codecs
PARQUET_NAME = {"zstd": "ZSTD", "snappy": "SNAPPY"}


def _table(n: int) -> pa.Table:
    cols = {"_id": pa.array([f"d{i:05d}" for i in range(n)]), "_seq_no": pa.array(range(n), pa.int64()),
            "_primary_term": pa.array([1] * n, pa.int64()), "_version": pa.array([1] * n, pa.int64()),
            "_source": pa.array([b"{}"] * n, pa.binary())}
    for name, (typ, value, _codec) in FIELDS.items():
        cols[name] = pa.array([value] * n, typ)
    return pa.table(cols)


def test_each_column_kind_gets_its_codec() -> None:
    schema = pa.schema(list(BASE_SCHEMA) + [pa.field(n, t) for n, (t, _v, _c) in FIELDS.items()])
    leaf = {"tags": "tags.list.element", "geo": "geo.lat"}  # a codec applies to a Parquet leaf column
    assert column_codecs(schema) == {**BASE, **{leaf.get(n, n): c for n, (_t, _v, c) in FIELDS.items()}}
    assert column_codecs(pa.schema([pa.field("m", pa.map_(pa.string(), pa.int64()))])) == {
        "m.key_value.key": DENSE_CODEC, "m.key_value.value": DENSE_CODEC}
    # the rule goes by name for the base columns only: a field that happens to be called like one keeps its type's codec
    assert column_codecs(pa.schema([pa.field("_version", pa.string())])) == {"_version": DENSE_CODEC}


def test_a_written_segment_carries_those_codecs_and_reads_back_everywhere(tmp_path: Path) -> None:
    table = _table(3000)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, table, name="s", row_group_size=1000)
    want = {**BASE, **{n: c for n, (_t, _v, c) in FIELDS.items()}}
    rows = duckdb.sql(f"SELECT path_in_schema, compression FROM parquet_metadata('{path}')").fetchall()
    assert {p.split(",")[0] for p, _c in rows} == set(want)
    for p, codec in rows:  # every chunk of every row group (nested leaves: list element, struct member)
        assert codec == PARQUET_NAME[want[p.split(",")[0]]], (p, codec)
    assert pq.read_table(path).to_pylist() == table.to_pylist()  # (Parquet keeps seconds as milliseconds)
    got = duckdb.sql(f"SELECT count(*), sum(i64), min(\"at\"), sum(price) FROM '{path}'").fetchall()[0]
    assert got == (3000, 24000, datetime.datetime(2013, 1, 1, tzinfo=datetime.UTC), decimal.Decimal("3750.00"))
    assert SegmentReader(path, info).take([0, 2999]).column("price").to_pylist() == [decimal.Decimal("1.25")] * 2


def test_seq_nos_are_delta_packed_and_read_back_everywhere(tmp_path: Path) -> None:
    """``_seq_no`` is written DELTA_BINARY_PACKED (``DELTA_COLUMNS``): no plain page of it in any row group, the
    other base columns keep their dictionary or plain pages, and pyarrow and DuckDB read the seq#s back exactly,
    ascending (a refresh) or in any order (a merge writes ``_id`` order)."""
    table = _table(3000)
    shuffled = table.set_column(1, "_seq_no", pa.array(list(range(2999, -1, -1)), pa.int64()))
    for i, t in enumerate((table, shuffled)):
        path = str(tmp_path / f"s{i}.parquet")
        write_segment(path, t, name=f"s{i}", row_group_size=1000, sort=False)
        rows = duckdb.sql(f"SELECT path_in_schema, encodings FROM parquet_metadata('{path}')").fetchall()
        seq = [e for p, e in rows if p == "_seq_no"]
        assert len(seq) == 3 and all("DELTA_BINARY_PACKED" in e and "PLAIN" not in e.split(",") for e in seq), seq
        assert all("DELTA" not in e for p, e in rows if p != "_seq_no")
        assert pq.read_table(path).column("_seq_no").to_pylist() == t.column("_seq_no").to_pylist()
        got = duckdb.sql(f"SELECT list(_seq_no ORDER BY _id) FROM '{path}'").fetchall()[0][0]
        assert got == t.column("_seq_no").to_pylist()
