"""Parquet frames (``FP``, format version 7): a part written once is logged as its stamped segment file, and every
reader gets back exactly the operations a typed frame of them holds (translog/parquet_frames.py)."""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstore.core.ops import fields_of, with_fields
from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments.segment_writer import encode_stamped
from shardstore.translog import frames as fr
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.local import LocalTranslog, generation_file
from shardstore.translog.operations import OpType, stamp, unstamped_batch
from shardstore.translog.parquet_frames import PARQUET_MAGIC, decode_parquet_payload, parquet_payload_parts

UTC = dt.timezone.utc


def new_docs(first: int, n: int, term: int = 1, offset: int = 0) -> pa.RecordBatch:
    """n index operations of new ids at seq#s first.., version 1, no source: every flat type a part may hold, with
    nulls; ``offset``: the batch is a slice of a bigger one (its columns start past their buffers' start)."""
    m = n + offset
    ids = [f"w{first + i - offset}" for i in range(m)]
    base = unstamped_batch([OpType.INDEX] * m, ids, [1] * m, [None] * m)
    fields = pa.table({
        "n": pa.array(range(m), pa.int64()),
        "small": pa.array([i % 100 for i in range(m)], pa.int32()),
        "carrier": pa.array([None if i % 7 == 0 else f"c{i % 3}" for i in range(m)], pa.string()),
        "when": pa.array([dt.datetime(2013, 1, 1, i % 24, tzinfo=UTC) for i in range(m)], pa.timestamp("ms", "UTC")),
        "day": pa.array([dt.date(2013, 1, 1 + i % 28) for i in range(m)], pa.date32()),
        "o.x": pa.array([None if i % 2 else i / 4 for i in range(m)], pa.float64()),
        "ok": pa.array([i % 3 == 0 for i in range(m)], pa.bool_()),
    })
    return stamp(with_fields(base, fields), first - offset, term).slice(offset, n)


def fp_frame(batch: pa.RecordBatch, term: int) -> tuple[bytes, list]:
    fields = fields_of(batch)
    assert fields is not None
    return PARQUET_MAGIC, parquet_payload_parts(term, encode_stamped(batch.column("id"), fields))


def logged(tmp_path: Path, batch: pa.RecordBatch, *, parquet: bool, term: int = 1) -> pa.Table:
    """``batch`` appended to a fresh local translog (as a Parquet frame or the usual one), read back reopened."""
    with LocalTranslog(str(tmp_path), primary_term=term) as log:
        log.add(batch, frame=fp_frame(batch, term) if parquet else None)
    with LocalTranslog(str(tmp_path), primary_term=term) as log:
        return pa.Table.from_batches(list(log.read_operations(0)))


@pytest.mark.parametrize("first,n,term,offset", [(0, 1, 1, 0), (0, 300, 1, 0), (1_000, 2_500, 3, 0),
                                                 (2**33, 40, 2**31, 0), (10, 200, 2, 57)])
def test_a_parquet_frame_reads_back_as_the_typed_frame_of_the_same_operations(tmp_path: Path, first: int, n: int,
                                                                              term: int, offset: int) -> None:
    batch = new_docs(first, n, term, offset)
    got = logged(tmp_path / "fp", batch, parquet=True, term=term)
    want = logged(tmp_path / "ft", batch, parquet=False, term=term)
    assert [f.kind for f in fr.iter_frames((tmp_path / "fp" / generation_file(1)).read_bytes(), fr.HEADER_SIZE,
                                           None, tmp_path / "fp")] == [PARQUET_MAGIC]
    assert got.schema == want.schema
    assert got.equals(want)
    assert got.column("seq_no").to_pylist() == list(range(first, first + n))
    assert set(got.column("primary_term").to_pylist()) == {term}
    assert fields_of(got).column("carrier").null_count == fields_of(batch).column("carrier").null_count


def test_the_payload_is_the_term_then_the_segment_file(tmp_path: Path) -> None:
    batch = new_docs(5, 30, term=4)
    _magic, parts = fp_frame(batch, 4)
    payload = b"".join(bytes(p) for p in parts)
    assert struct.unpack_from("<q", payload, 0) == (4,)
    table = pq.read_table(pa.BufferReader(payload[8:]))
    assert table.column_names[0] == "_id" and table.column("_id").to_pylist() == [f"w{5 + i}" for i in range(30)]
    assert "_seq_no" not in table.column_names and "_version" not in table.column_names


@pytest.mark.parametrize("mutate,reason", [
    (lambda p, c, lo, hi: (p[:5], c, lo, hi), "at least 8"),
    (lambda p, c, lo, hi: (struct.pack("<q", 0) + p[8:], c, lo, hi), "primary term 0"),
    (lambda p, c, lo, hi: (p, c, lo, hi + 1), "seq# range"),
    (lambda p, c, lo, hi: (p, c + 1, lo, hi + 1), "holds 30 rows"),
    (lambda p, c, lo, hi: (p[:8] + b"not a parquet file", c, lo, hi), "undecodable Parquet payload"),
    (lambda p, c, lo, hi: (p[:-20] + bytes(20), c, lo, hi), "undecodable Parquet payload"),
])
def test_a_payload_that_is_not_what_its_header_says_is_refused_with_the_reason(mutate, reason: str) -> None:
    batch = new_docs(0, 30)
    payload = b"".join(bytes(p) for p in fp_frame(batch, 1)[1])
    got = decode_parquet_payload(*mutate(payload, 30, 0, 29))
    assert isinstance(got, str) and reason in got


@pytest.mark.parametrize("table,reason", [
    (pa.table({"v": ["a"], "_id": ["x"]}), "does not start with a string _id"),
    (pa.table({"_id": pa.array([1], pa.int64())}), "does not start with a string _id"),
    (pa.table({"_id": pa.array([None], pa.string()), "v": [1]}), "without an _id"),
])
def test_a_file_without_ids_first_is_refused(table: pa.Table, reason: str) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    got = decode_parquet_payload(struct.pack("<q", 1) + sink.getvalue().to_pybytes(), 1, 0, 0)
    assert isinstance(got, str) and reason in got


def test_a_corrupt_parquet_frame_is_refused_naming_the_file(tmp_path: Path) -> None:
    batch = new_docs(0, 50)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(batch, frame=fp_frame(batch, 1))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF  # a byte of the Parquet file inside the checkpointed range
    path.write_bytes(bytes(raw))
    with pytest.raises(TranslogCorruptedError, match="CRC32C mismatch") as exc:
        fr.scan(path, len(raw))
    assert str(path) in str(exc.value)


def test_a_parquet_frame_in_a_version_6_file_is_refused(tmp_path: Path) -> None:
    batch = new_docs(0, 3)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(batch, frame=fp_frame(batch, 1))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 4, 6)  # claim format version 6, with a valid header checksum
    struct.pack_into("<I", raw, 40, fr.checksum_for(6)(bytes(raw[:40]), 0))
    path.write_bytes(bytes(raw))
    with pytest.raises(TranslogCorruptedError, match=r"version 7 frame \(FP\) in a version 6 file"):
        fr.scan(path, len(raw))


def test_a_version_7_file_is_refused_by_a_version_6_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = new_docs(0, 3)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(batch, frame=fp_frame(batch, 1))
    assert fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE).header.version == fr.PARQUET_FRAMES_VERSION == 7
    monkeypatch.setattr(fr, "FORMAT_VERSION", fr.NARROW_COLUMNS_VERSION)
    with pytest.raises(UnsupportedFormatVersion):
        fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE)


def test_a_parquet_frame_needs_a_term() -> None:
    with pytest.raises(ValueError, match="primary term >= 1"):
        parquet_payload_parts(0, pa.py_buffer(b"x"))
