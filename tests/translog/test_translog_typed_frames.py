"""Typed operations (issue 16): index operations that carry their fields instead of a JSON source.

They are written as ``FT`` frames (a whole Arrow IPC stream, CRC32C) in format version 3
generation files, read back with their ``fields`` column, checked like any frame, and
merged with plain operations by every reader (docs/design/translog.md, "Typed operations").
"""

from __future__ import annotations

import datetime as dt
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.core.ops import FIELDS_COLUMN, fields_of, with_fields
from shardstore.translog import frames as fr
from shardstore.translog.errors import InvalidOperation, TranslogCorruptedError
from shardstore.translog.local import LocalTranslog, generation_file
from shardstore.translog.operations import OpType, index_batch, stamp, unstamped_batch
from shardstore.translog.replay import resolve

UTC = dt.timezone.utc


def typed_ops(first: int, n: int, term: int = 1) -> pa.RecordBatch:
    """n index operations with seq#s first.., null sources and typed fields (long, keyword, date, nested name)."""
    ids = [f"t{first + i}" for i in range(n)]
    base = unstamped_batch([OpType.INDEX] * n, ids, [1] * n, [None] * n)
    fields = pa.table({
        "n": pa.array(range(first, first + n), pa.int64()),
        "carrier": pa.array([f"c{i % 3}" for i in range(n)], pa.string()),
        "when": pa.array([dt.datetime(2013, 1, 1, tzinfo=UTC)] * n, pa.timestamp("ms", "UTC")),
        "o.x": pa.array([None if i % 2 else 1.5 for i in range(n)], pa.float64()),
    })
    return stamp(with_fields(base, fields), first, term)


def plain_ops(first: int, n: int, term: int = 1) -> pa.RecordBatch:
    ids = [f"p{first + i}" for i in range(n)]
    return stamp(index_batch(ids, [f'{{"n":{first + i}}}'.encode() for i in range(n)]), first, term)


def frame_kinds(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [f.kind for f in fr.iter_frames(data, fr.HEADER_SIZE, None, path)]


def test_typed_operations_round_trip_through_the_local_translog(tmp_path: Path) -> None:
    batch = typed_ops(0, 50)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(batch)
        log.add(plain_ops(50, 5))
        log.add(typed_ops(55, 10))
    assert frame_kinds(tmp_path / generation_file(1)) == [fr.TYPED_MAGIC, fr.BATCH_MAGIC, fr.TYPED_MAGIC]
    assert fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE).header.version == fr.FORMAT_VERSION == fr.PARQUET_FRAMES_VERSION
    with LocalTranslog(str(tmp_path), primary_term=1) as log:  # reopened: recovered from disk
        got = pa.Table.from_batches(list(log.read_operations(0)))
    assert got.num_rows == 65 and got.column("seq_no").to_pylist() == list(range(65))
    fields = fields_of(got)
    assert fields is not None
    assert fields.column("n").to_pylist()[:50] == list(range(50))
    assert fields.column("n").to_pylist()[50:55] == [None] * 5  # the plain operations carry no fields
    assert fields.column("o.x").to_pylist()[:4] == [1.5, None, 1.5, None]
    assert got.column("source").to_pylist()[50] == b'{"n":50}'
    assert got.column("source").null_count == 60


def test_a_corrupt_typed_frame_is_refused_naming_the_file(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(typed_ops(0, 20))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0xFF  # a payload byte of the typed frame, inside the checkpointed range
    path.write_bytes(bytes(raw))
    with pytest.raises(TranslogCorruptedError, match="CRC32C mismatch") as exc:
        fr.scan(path, len(raw))
    assert str(path) in str(exc.value)


def test_a_typed_frame_in_a_version_2_file_is_refused(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(typed_ops(0, 3))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 4, 2)  # claim format version 2, with a valid header checksum
    struct.pack_into("<I", raw, 40, fr.checksum_for(2)(bytes(raw[:40]), 0))
    path.write_bytes(bytes(raw))
    with pytest.raises(TranslogCorruptedError, match=r"version 3 frame \(FT\) in a version 2 file"):
        fr.scan(path, len(raw))


def test_an_index_operation_with_neither_source_nor_fields_is_refused(tmp_path: Path) -> None:
    batch = typed_ops(0, 4)
    fields = batch.column(FIELDS_COLUMN)
    holed = pa.StructArray.from_arrays([fields.field(i) for i in range(fields.type.num_fields)],
                                       fields=list(fields.type), mask=pa.array([False, False, True, False]))
    bad = batch.set_column(batch.schema.get_field_index(FIELDS_COLUMN), FIELDS_COLUMN, holed)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        with pytest.raises(InvalidOperation, match="index operation without source or fields") as exc:
            log.add(bad)
        assert exc.value.doc_id == "t2"
        assert list(log.read_operations(0)) == []  # nothing of the batch was written


def test_a_fields_column_that_is_not_a_struct_is_refused(tmp_path: Path) -> None:
    batch = plain_ops(0, 2).append_column(FIELDS_COLUMN, pa.array([1, 2]))
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        with pytest.raises(InvalidOperation, match="not a struct"):
            log.add(batch)


def test_resolve_merges_plain_and_typed_operations_with_growing_fields() -> None:
    a = typed_ops(0, 3)
    b = plain_ops(3, 2)
    narrow = stamp(with_fields(unstamped_batch([OpType.INDEX], ["z"], [1], [None]),
                               pa.table({"n": pa.array([99], pa.int64())})), 5, 1)
    newer = typed_ops(1, 1, term=2)  # seq# 1 again, a higher term: it wins
    out = pa.Table.from_batches(list(resolve([a, b, narrow, newer])))
    assert out.column("seq_no").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert out.column("primary_term").to_pylist() == [1, 2, 1, 1, 1, 1]
    fields = fields_of(out)
    assert fields.column_names == ["n", "carrier", "when", "o.x"]
    assert fields.column("n").to_pylist() == [0, 1, 2, None, None, 99]
    assert fields.column("carrier").to_pylist() == ["c0", "c0", "c2", None, None, None]


def test_a_version_2_generation_is_read_and_new_frames_go_to_a_version_3_file(tmp_path: Path) -> None:
    """A log written by the previous format (v2: FS/FB frames only) opens, reads back, and rolls before appending."""
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(plain_ops(0, 10))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 4, 2)  # what the previous release wrote: the same bytes, version 2
    struct.pack_into("<I", raw, 40, fr.checksum_for(2)(bytes(raw[:40]), 0))
    path.write_bytes(bytes(raw))
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert [s for b in log.read_operations(0) for s in b.column("seq_no").to_pylist()] == list(range(10))
        log.add(typed_ops(10, 5))
        gen = log.generation
    assert gen == 2
    assert fr.scan(path, len(raw)).header.version == 2  # sealed as it was
    assert frame_kinds(tmp_path / generation_file(2)) == [fr.TYPED_MAGIC]
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert [s for b in log.read_operations(0) for s in b.column("seq_no").to_pylist()] == list(range(15))


def test_large_batches_are_compressed_small_ones_are_not(tmp_path: Path) -> None:
    """A batch of at least COMPRESS_MIN_BYTES (plain) is LZ4-compressed, a typed one of COMPRESS_TYPED_MIN_BYTES
    zstd-compressed (each codec's frames in the payload); every frame reads back the same."""
    n = 6000
    body = b'{"text":"' + b"abcdefgh" * 120 + b'"}'  # ~1 KiB of JSON, compressible as real documents are
    big = stamp(index_batch([f"b{i}" for i in range(n)], [body] * n), 0, 1)
    assert big.nbytes >= fr.COMPRESS_MIN_BYTES
    small = plain_ops(n, 100)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(big)
        log.add(small)
        log.add(typed_ops(n + 100, 30_000))
        back = pa.Table.from_batches(list(log.read_operations(0)))
    frames = list(fr.iter_frames((tmp_path / generation_file(1)).read_bytes(), fr.HEADER_SIZE, None, "gen"))
    assert [f.kind for f in frames] == [fr.BATCH_MAGIC, fr.BATCH_MAGIC, fr.TYPED_MAGIC]
    assert frames[0].length < big.nbytes / 4  # compressed
    assert frames[1].length > small.nbytes  # not compressed (the frame carries the buffers as they are)
    lz4, zstd = b"\x04\x22\x4d\x18", b"\x28\xb5\x2f\xfd"  # the LZ4 frame and zstd frame magic numbers
    assert lz4 in bytes(frames[0].payload) and zstd not in bytes(frames[0].payload)
    assert zstd in bytes(frames[2].payload) and lz4 not in bytes(frames[2].payload)
    assert back.num_rows == n + 100 + 30_000
    assert back.column("source").to_pylist()[:n] == [body] * n
    assert fields_of(back).column("n").to_pylist()[n + 100:] == list(range(n + 100, n + 30_100))


def test_a_typed_document_larger_than_the_source_limit_is_refused(tmp_path: Path) -> None:
    """The source size limit holds for typed documents too: their string values count (review finding)."""
    base = unstamped_batch([OpType.INDEX] * 3, ["a", "b", "c"], [1] * 3, [None] * 3)
    fields = pa.table({"k": pa.array(["x" * 10, "y" * 3000, None]), "m": pa.array(["z" * 10, "w" * 3000, "v"])})
    with LocalTranslog(str(tmp_path), primary_term=1, max_source_bytes=5000) as log:
        with pytest.raises(InvalidOperation, match="typed fields larger than 5000 bytes") as exc:
            log.add(stamp(with_fields(base, fields), 0, 1))
        assert exc.value.doc_id == "b"
        log.add(stamp(with_fields(base, fields.slice(0, 1).append_column("n", pa.array([1])).select(["k", "n"])
                                  .take([0, 0, 0])), 0, 1))  # within the limit: written
        assert sum(b.num_rows for b in log.read_operations(0)) == 3


def test_every_reader_refuses_a_typed_frame_in_a_version_2_file(tmp_path: Path) -> None:
    """iter_frames (the remote translog's upload check and reads, the restore audit) applies the rule scan does."""
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(typed_ops(0, 3))
    raw = bytearray((tmp_path / generation_file(1)).read_bytes())
    struct.pack_into("<H", raw, 4, 2)
    struct.pack_into("<I", raw, 40, fr.checksum_for(2)(bytes(raw[:40]), 0))
    with pytest.raises(TranslogCorruptedError, match=r"version 3 frame \(FT\) in a version 2 file"):
        list(fr.iter_frames(bytes(raw), fr.HEADER_SIZE, None, "gen-1.tlog", decode=True))


def test_a_typed_frame_must_hold_typed_operations() -> None:
    """An FT frame whose intact payload is some other stream (not operations + fields) is refused when decoded."""
    other = pa.record_batch({"x": pa.array([1, 2])})
    parts = fr.stream_payload_parts(other)
    header = fr.frame_header(parts, 2, 0, 1, magic=fr.TYPED_MAGIC)
    data = header + b"".join(p.to_pybytes() if isinstance(p, pa.Buffer) else bytes(p) for p in parts)
    with pytest.raises(TranslogCorruptedError, match="typed frame holds no typed operations"):
        list(fr.iter_frames(data, 0, None, "frame", decode=True))
    ok = typed_ops(0, 2)
    parts = fr.stream_payload_parts(ok)
    data = fr.frame_header(parts, 2, 0, 1, magic=fr.TYPED_MAGIC) + b"".join(
        p.to_pybytes() if isinstance(p, pa.Buffer) else bytes(p) for p in parts)
    assert [f.batch().num_rows for f in fr.iter_frames(data, 0, None, "frame", decode=True)] == [2]


def _wide_ops(first: int, n: int) -> pa.RecordBatch:
    """A typed batch big enough to be compressed (and narrowed), with integers of every width and nulls."""
    ids = [f"w{first + i}" for i in range(n)]
    base = unstamped_batch([OpType.INDEX] * n, ids, [1] * n, [None] * n)
    fields = pa.table({
        "tiny": pa.array([i % 100 - 50 for i in range(n)], pa.int64()),
        "small": pa.array([None if i % 7 == 0 else i % 30_000 for i in range(n)], pa.int64()),
        "mid": pa.array([i * 40_000 - 2**31 + 1 for i in range(n)], pa.int64()),
        "big": pa.array([2**40 + i for i in range(n)], pa.int64()),
        "int32": pa.array([i % 120 for i in range(n)], pa.int32()),
        "edge": pa.array([-(2**15) if i % 2 else 2**15 - 1 for i in range(n)], pa.int64()),
        "none": pa.nulls(n, pa.int64()),
        "f": pa.array([i / 4 for i in range(n)], pa.float64()),
        "k": pa.array([f"k{i % 9}" for i in range(n)], pa.string()),
    })
    return stamp(with_fields(base, fields), first, 1)


def test_large_typed_frames_narrow_their_integers_and_read_back_exactly(tmp_path: Path) -> None:
    """Format version 4: the integers of a compressed typed frame are stored in the narrowest type holding them,
    marked with their own type, and every reader gets the batch back exactly as it was written."""
    batch = _wide_ops(0, 60_000)
    assert batch.nbytes >= fr.COMPRESS_TYPED_MIN_BYTES
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(batch)
        log.add(typed_ops(60_000, 5))  # small: neither compressed nor narrowed
    data = (tmp_path / generation_file(1)).read_bytes()
    frames = list(fr.iter_frames(data, fr.HEADER_SIZE, None, tmp_path))
    stored = pa.ipc.open_stream(pa.py_buffer(frames[0].payload)).schema.field(FIELDS_COLUMN).type
    narrow = {f.name: (f.type, (f.metadata or {}).get(fr.WIDE_KEY)) for f in stored}
    assert narrow["tiny"] == (pa.int8(), b"int64") and narrow["small"] == (pa.int16(), b"int64")
    assert narrow["mid"] == (pa.int32(), b"int64") and narrow["int32"] == (pa.int8(), b"int32")
    assert narrow["edge"] == (pa.int16(), b"int64")
    assert narrow["big"] == (pa.int64(), None) and narrow["none"] == (pa.int64(), None)  # nothing narrower holds them
    top = pa.ipc.open_stream(pa.py_buffer(frames[0].payload)).schema  # format version 6: the operation columns too
    assert [(top.field(c).type, (top.field(c).metadata or {}).get(fr.WIDE_KEY)) for c in fr.NARROW_COLUMNS] == [
        (pa.int32(), b"int64"), (pa.int8(), b"int64"), (pa.int8(), b"int64")]
    assert top.field("id").type == pa.string() and not top.field("id").metadata
    decoded = next(fr.iter_frames(data, fr.HEADER_SIZE, None, tmp_path, decode=True)).batch()
    lazy = next(fr.iter_frames(data, fr.HEADER_SIZE, None, tmp_path)).batch()  # decoded on first use
    assert lazy.schema.equals(batch.schema, check_metadata=True) and lazy.equals(batch)
    assert decoded.schema.equals(batch.schema, check_metadata=True) and decoded.equals(batch)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:  # the log's own reader (merging both frames)
        got = pa.Table.from_batches(list(log.read_operations(0)))
    back = fields_of(got)
    assert back is not None and got.num_rows == 60_005
    for name in ("tiny", "small", "mid", "big", "int32", "edge", "none"):
        assert back.column(name).type == fields_of(batch).column(name).type
        assert back.column(name).slice(0, 60_000).to_pylist() == fields_of(batch).column(name).to_pylist()
    sliced = batch.slice(1000, 30_000)  # a struct with an offset, some rows null as a whole
    sliced = sliced.set_column(sliced.schema.get_field_index(FIELDS_COLUMN), FIELDS_COLUMN,
                               pa.StructArray.from_arrays(
                                   sliced.column(FIELDS_COLUMN).flatten(), fields=list(sliced.schema.field(FIELDS_COLUMN).type),
                                   mask=pa.array([i % 11 == 0 for i in range(30_000)])))
    assert fr.widened(fr.narrowed(sliced)).equals(sliced)


def test_a_version_4_file_is_refused_by_a_version_3_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardstore.errors import UnsupportedFormatVersion

    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(_wide_ops(0, 40_000))
    monkeypatch.setattr(fr, "FORMAT_VERSION", 3)
    with pytest.raises(UnsupportedFormatVersion):
        fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE)


def test_a_version_6_file_is_refused_by_a_version_5_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Narrowed operation columns (an int8 term) must never reach a reader that would not widen them."""
    from shardstore.errors import UnsupportedFormatVersion

    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(_wide_ops(0, 40_000))
    assert fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE).header.version >= fr.NARROW_COLUMNS_VERSION == 6
    monkeypatch.setattr(fr, "FORMAT_VERSION", fr.ADOPTED_OPS_VERSION)
    with pytest.raises(UnsupportedFormatVersion):
        fr.scan(tmp_path / generation_file(1), fr.HEADER_SIZE)


@pytest.mark.parametrize("first,term,version,want", [
    (0, 1, 1, (pa.int16(), pa.int8(), pa.int8())),
    (2**31 - 10, 300, 2**15, (pa.int64(), pa.int16(), pa.int32())),
    (2**40, 2**33, 7, (pa.int64(), pa.int64(), pa.int8())),
])
def test_narrowed_operation_columns_read_back_exactly_at_any_width(first: int, term: int, version: int,
                                                                   want: tuple) -> None:
    """seq#s past int32, terms past int8 and versions past int16 keep the widths they need; each comes back int64."""
    batch = stamp(_wide_ops(0, 30_000), first, term)
    batch = batch.set_column(batch.schema.get_field_index("version"), batch.schema.field("version"),
                             pa.array([version] * 30_000, pa.int64()))
    narrow = fr.narrowed(batch)
    assert tuple(narrow.schema.field(c).type for c in fr.NARROW_COLUMNS) == want
    back = fr.widened(narrow)
    assert back.schema.equals(batch.schema, check_metadata=True) and back.equals(batch)


def test_narrowed_operation_columns_are_widened_without_a_fields_column() -> None:
    """``widened`` undoes the operation columns' narrowing on its own: a batch with no ``fields`` column keeps none."""
    batch = stamp(_wide_ops(0, 1000), 5, 2).drop_columns([FIELDS_COLUMN])
    narrow = pa.record_batch([batch.column(c).cast(pa.int16()) if c == "seq_no" else batch.column(c)
                              for c in batch.schema.names],
                             schema=batch.schema.set(0, pa.field("seq_no", pa.int16(), False, {fr.WIDE_KEY: b"int64"})))
    assert fr.widened(narrow).equals(batch) and fr.widened(narrow).schema.equals(batch.schema, check_metadata=True)


def test_a_narrowed_field_naming_an_unknown_type_is_refused() -> None:
    batch = fr.narrowed(_wide_ops(0, 40_000))
    i = batch.schema.get_field_index(FIELDS_COLUMN)
    ftype = batch.schema.field(i).type
    forged = pa.struct([f.with_metadata({fr.WIDE_KEY: b"int128"}) if f.name == "tiny" else f for f in ftype])
    bad = batch.set_column(i, pa.field(FIELDS_COLUMN, forged), batch.column(i).cast(forged))
    with pytest.raises(ValueError, match="tiny.*int128"):
        fr.widened(bad)


def test_a_version_3_generation_is_sealed_and_narrowed_frames_go_to_a_new_file(tmp_path: Path) -> None:
    """Reopening a log whose current generation is version 3 rolls it: no narrowed (version 4) frame is ever
    appended to a file a version 3 reader would read without widening."""
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(typed_ops(0, 5))
    path = tmp_path / generation_file(1)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 4, 3)  # the file as version 3 wrote it (the same bytes, version 3 in the header)
    struct.pack_into("<I", raw, 40, fr.checksum_for(3)(bytes(raw[:40]), 0))
    path.write_bytes(bytes(raw))
    big = _wide_ops(5, 40_000)
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(big)
        got = pa.Table.from_batches(list(log.read_operations(0)))
    assert fr.scan(path, fr.HEADER_SIZE).header.version == 3
    assert fr.scan(tmp_path / generation_file(2), fr.HEADER_SIZE).header.version == fr.FORMAT_VERSION
    assert got.num_rows == 40_005 and got.column("seq_no").to_pylist() == list(range(40_005))
    assert fields_of(got).column("tiny").type == pa.int64()


def _stream_written(batch: pa.RecordBatch) -> bytes:
    """``batch`` as Arrow's own stream writer writes it (what a typed frame's payload has always been)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("offset,length", [(0, 7), (1, 5), (3, 4), (6, 1), (0, 0)])
def test_a_small_typed_payload_is_byte_for_byte_arrows_own_stream(offset: int, length: int) -> None:
    # the payload is assembled from the cached schema message and the batch's own message: the bytes
    # (and so every CRC and every reader) are those of the stream writer, for slices at odd offsets too
    fields = pa.StructArray.from_arrays(
        [pa.array([1, None, 3, 4, 5, 6, 7], pa.int64()), pa.array([True, None, False, True, True, False, True]),
         pa.array(["a", "bb", None, "dddd", "", "f", "g"]), pa.array([[1], [], None, [2, 3], [4], [5], [6]]),
         pa.array([dt.datetime(2024, 1, i + 1) for i in range(7)], pa.timestamp("ms"))],
        names=["n", "b", "s", "l", "t"], mask=pa.array([False, False, True, False, False, False, False]))
    batch = stamp(index_batch([f"d{i}" for i in range(7)], [b"{}"] * 7), 0, 1).append_column(FIELDS_COLUMN, fields)
    part = batch.slice(offset, length)
    assert b"".join(bytes(p) for p in fr.stream_payload_parts(part)) == _stream_written(part)


def test_a_typed_payload_with_a_dictionary_field_is_written_by_the_stream_writer() -> None:
    # a dictionary needs its own message between the schema and the batch: no shortcut is taken
    fields = pa.StructArray.from_arrays([pa.array(["x", "y", "x"]).dictionary_encode()], names=["k"])
    batch = stamp(index_batch(["a", "b", "c"], [b"{}"] * 3), 0, 1).append_column(FIELDS_COLUMN, fields)
    payload = b"".join(bytes(p) for p in fr.stream_payload_parts(batch))
    assert payload == _stream_written(batch)
    assert pa.ipc.open_stream(payload).read_all().column(FIELDS_COLUMN).to_pylist() == fields.to_pylist()


def test_a_typed_payload_carries_its_own_schemas_metadata() -> None:
    # two schemas equal but for a field's metadata: each payload names its own (no stale cached message)
    fields = pa.StructArray.from_arrays([pa.array([1, 2])], names=["n"])
    batch = stamp(index_batch(["a", "b"], [b"{}"] * 2), 0, 1).append_column(FIELDS_COLUMN, fields)
    tagged = batch.schema.set(batch.schema.get_field_index("id"),
                              batch.schema.field("id").with_metadata({"k": "v"}))
    other = pa.RecordBatch.from_arrays(batch.columns, schema=tagged)
    for b in (batch, other, batch):
        payload = b"".join(bytes(p) for p in fr.stream_payload_parts(b))
        assert pa.ipc.open_stream(payload).schema.equals(b.schema, check_metadata=True)
