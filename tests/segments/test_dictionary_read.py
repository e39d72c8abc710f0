"""Dictionary-encoded string columns read through their dictionaries (segments/dictionary_read.py; issue 44)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstore.segments import stamp as stamp_mod
from shardstore.segments.dictionary_read import dense, dense_schema, dictionary_strings, open_segment_file
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.segment import SegmentReader, write_segment
from shardstore.segments.stamp import read_groups


def _table(n: int, *, unique_text: bool = False) -> pa.Table:
    """Base columns, a low-cardinality string, a nullable one, an int, and a string too varied for a dictionary."""
    text = [f"{i:07d}-" + "x" * 200 for i in range(n)] if unique_text else [f"t{i % 5}" for i in range(n)]
    return pa.table({
        "_id": pa.array([f"d{i:06d}" for i in range(n)]),
        "_seq_no": pa.array(range(n), pa.int64()),
        "_primary_term": pa.array([1] * n, pa.int64()),
        "_version": pa.array([1] * n, pa.int64()),
        "_source": pa.array([None] * n, pa.binary()),
        "carrier": pa.array([["UA", "AA", "B6"][i % 3] for i in range(n)]),
        "tail": pa.array([None if i % 7 == 0 else f"N{i % 50}" for i in range(n)]),
        "n": pa.array(range(n), pa.int64()),
        "text": pa.array(text),
    })


def test_only_string_columns_dictionary_encoded_in_every_row_group_are_chosen(tmp_path: Path) -> None:
    path = str(tmp_path / "s.parquet")
    write_segment(path, _table(40_000, unique_text=True), name="s", row_group_size=20_000)
    md = pq.ParquetFile(path).metadata
    chosen = dictionary_strings(md, pq.ParquetFile(path).schema_arrow)
    # _id and _source are written without a dictionary, n is no string, and text (4 MB of distinct values per group) outgrew
    # the dictionary page: its writer fell back to plain pages, which a dictionary read would hash value by value
    assert chosen == ["carrier", "tail"]
    assert "text" not in dictionary_strings(md, pq.ParquetFile(path).schema_arrow)


def test_a_small_unique_column_still_dictionary_encoded_is_chosen(tmp_path: Path) -> None:
    path = str(tmp_path / "s.parquet")
    write_segment(path, _table(2_000), name="s", row_group_size=1_000)
    pf = pq.ParquetFile(path)
    assert dictionary_strings(pf.metadata, pf.schema_arrow) == ["carrier", "tail", "text"]


def test_dense_casts_every_dictionary_column_back_and_keeps_the_rest() -> None:
    t = pa.table({"a": pa.array(["x", None, "y"]).dictionary_encode(), "b": pa.array([1, 2, 3])})
    got = dense(t)
    assert got.schema == pa.schema([("a", pa.string()), ("b", pa.int64())])
    assert got.column("a").to_pylist() == ["x", None, "y"]
    plain = pa.table({"b": pa.array([1])})
    assert dense(plain) is plain
    schema = pa.schema([pa.field("a", pa.dictionary(pa.int32(), pa.string()), nullable=False)], metadata={"k": "v"})
    assert dense_schema(schema) == pa.schema([pa.field("a", pa.string(), nullable=False)], metadata={"k": "v"})
    assert dense_schema(schema).metadata == {b"k": b"v"}


@pytest.mark.parametrize("unique_text", [False, True])
def test_every_read_of_a_segment_equals_the_plain_read(tmp_path: Path, unique_text: bool) -> None:
    """Scans, takes, point reads and the schema give what a file opened without dictionaries gives."""
    table = _table(12_000, unique_text=unique_text)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, table, name="s", row_group_size=4_000)
    reader = SegmentReader(path, info)
    plain = pq.ParquetFile(path)
    assert reader._file().schema_arrow.field("carrier").type == pa.dictionary(pa.int32(), pa.string())
    assert reader.schema == plain.schema_arrow
    scanned = pa.Table.from_batches(list(reader.scan()))
    assert scanned.schema == plain.schema_arrow
    assert scanned.equals(plain.read())
    rows = [0, 4_001, 11_999, 7]
    assert reader.take(rows).equals(plain.read().take(rows))
    assert reader.take(rows, ["carrier", "tail"]).equals(plain.read(columns=["carrier", "tail"]).take(rows))
    assert reader.row(8_000) == plain.read().slice(8_000, 1).to_pylist()[0]
    for groups in ([1], [0, 2]):
        assert read_groups(reader._file(), None, groups).equals(plain.read_row_groups(groups))


def test_a_stamped_segments_read_casts_back_before_its_virtual_columns_are_made(tmp_path: Path) -> None:
    table = _table(3_000).drop_columns(["_seq_no", "_primary_term", "_version"])
    path = str(tmp_path / "a.parquet")
    pq.write_table(table, path, row_group_size=1_000)
    pf = pq.ParquetFile(path, read_dictionary=["carrier", "tail"])
    st = stamp_mod.Stamp(100, 3)
    got = read_groups(pf, st, [1, 2], ["_id", "carrier", "_seq_no", "tail"])
    assert got.schema.field("carrier").type == pa.string()
    assert got.column("carrier").to_pylist() == table.column("carrier").to_pylist()[1_000:]
    assert got.column("_seq_no").to_pylist() == list(range(1_100, 3_100))
    assert got.column("tail").to_pylist() == table.column("tail").to_pylist()[1_000:]


def test_open_segment_file_reads_only_the_chosen_columns_as_dictionaries(tmp_path: Path) -> None:
    """The opener the segment reader and the read plan's tasks share (segments/read_plan.py ``ReadTask.read``)."""
    path = str(tmp_path / "s.parquet")
    write_segment(path, _table(40_000, unique_text=True), name="s", row_group_size=20_000)
    pf = open_segment_file(path)
    kinds = {f.name: pa.types.is_dictionary(f.type) for f in pf.schema_arrow}
    assert [n for n, d in kinds.items() if d] == ["carrier", "tail"]
    assert read_groups(pf, None, [0, 1]).equals(pq.read_table(path))
    plain = str(tmp_path / "p.parquet")
    pq.write_table(pa.table({"n": [1, 2]}), plain)
    assert not any(pa.types.is_dictionary(f.type) for f in open_segment_file(plain).schema_arrow)


def test_no_large_string_no_unique_column_and_no_name_a_nested_leaf_shares_is_chosen(tmp_path: Path) -> None:
    """A dictionary read gives int32-indexed strings and picks leaves by path: those columns stay plain."""
    path = str(tmp_path / "w.parquet")
    table = pa.table({
        "_id": pa.array(["a", "b"] * 50),  # pq.write_table dictionary-encodes it (a staged file does)
        "wide": pa.array(["x", "y"] * 50, pa.large_string()),
        "a.b": pa.array(["p", "q"] * 50),
        "a": pa.array([{"b": "r"}] * 100, pa.struct([("b", pa.string())])),
        "ok": pa.array(["u", "v"] * 50),
    })
    pq.write_table(table, path)
    pf = pq.ParquetFile(path)
    assert dictionary_strings(pf.metadata, pf.schema_arrow) == ["ok"]
    assert read_groups(open_segment_file(path), None, [0]).equals(pq.read_table(path))


def test_a_scan_with_deletions_takes_the_dictionary_path_and_equals_the_plain_read(tmp_path: Path) -> None:
    """Deletions send a scan through the segment's own row-group runs (not a pyarrow dataset)."""
    table = _table(12_000)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, table, name="s", row_group_size=4_000)
    live = LiveDocs.all_live(12_000).delete(list(range(0, 12_000, 3)))
    got = pa.Table.from_batches(list(SegmentReader(path, info).scan(live=live)))
    plain = pq.read_table(path)
    assert got.schema == plain.schema
    assert got.equals(plain.filter(live.mask()))
