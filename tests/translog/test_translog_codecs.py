"""Codecs of the local translog: generation header, frames, torn tails, checkpoint file.

Format version 2 (CRC32C, schema frame + schema-less batch frames) is what is written;
format version 1 files (zlib CRC32, one whole IPC stream per frame) are built here by
hand from the documented layout and must still read.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import uuid
import zlib
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.errors import CorruptError, UnsupportedFormatVersion
from shardstore.translog import checkpoint as ckp
from shardstore.translog import frames as fr
from shardstore.translog import operations as ops
from shardstore.translog.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.frames import HEADER_SIZE, GenerationHeader, encode_frame, iter_frames, scan

TL_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")
HEADER = GenerationHeader(TL_UUID, primary_term=3, generation=7)
PREAMBLE = HEADER.encode() + fr.encode_schema_frame(ops.SCHEMA)  # what a new generation file starts with
FIRST = len(PREAMBLE)  # where its first batch frame starts


def crc32c(data: bytes) -> int:
    """CRC32C, computed independently of the code under test."""
    return google_crc32c.value(bytes(data))


def make_batch(first_seq_no: int, n: int, source_size: int = 64, seed: int = 0, term: int = 3) -> pa.RecordBatch:
    """A stamped batch of n index operations with random sources."""
    rnd = random.Random(seed)
    sources = [rnd.randbytes(source_size) for _ in range(n)]
    return ops.stamp(ops.index_batch([f"doc-{first_seq_no + i}" for i in range(n)], sources), first_seq_no, term)


def write_generation(path: Path, batches: list[pa.RecordBatch], *, compress: bool = False) -> list[int]:
    """Write a generation file; return the frame boundaries (header end, then each frame's end)."""
    data = bytearray(PREAMBLE)
    bounds = [len(data)]
    for b in batches:
        data += encode_frame(b, compress=compress)
        bounds.append(len(data))
    path.write_bytes(bytes(data))
    return bounds


def flip(data: bytes, bit: int) -> bytes:
    """data with one bit inverted."""
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --------------------------------------------------------------------------- header


@given(st.uuids(), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_generation_header_round_trip(u: uuid.UUID, term: int, gen: int) -> None:
    h = GenerationHeader(u, term, gen)
    raw = h.encode()
    assert len(raw) == HEADER_SIZE
    assert GenerationHeader.decode(raw + b"trailing frames", "g") == h


def test_generation_header_every_bit_flip_is_corruption() -> None:
    raw = HEADER.encode()
    for bit in range(len(raw) * 8):
        with pytest.raises(TranslogCorruptedError) as exc:
            GenerationHeader.decode(flip(raw, bit), "gen-7.tlog")
        assert exc.value.path == "gen-7.tlog" and exc.value.offset in (0, 4, 6)


@pytest.mark.parametrize("cut", range(HEADER_SIZE))
def test_generation_header_short(cut: int) -> None:
    with pytest.raises(TranslogCorruptedError, match="gen-7.tlog"):
        GenerationHeader.decode(HEADER.encode()[:cut], "gen-7.tlog")


def _reseal_header(body: bytes) -> bytes:
    return body + struct.pack("<I", crc32c(body))


def test_generation_header_newer_version_is_unsupported() -> None:
    body = bytearray(HEADER.encode()[:40])
    struct.pack_into("<H", body, 4, fr.FORMAT_VERSION + 1)
    with pytest.raises(UnsupportedFormatVersion) as exc:
        GenerationHeader.decode(_reseal_header(bytes(body)) + b"v3 fields", "gen-7.tlog")
    assert exc.value.found == fr.FORMAT_VERSION + 1 and exc.value.supported == fr.FORMAT_VERSION
    assert "gen-7.tlog" in str(exc.value)


def test_generation_header_version_zero_and_flags_refused() -> None:
    body = bytearray(HEADER.encode()[:40])
    struct.pack_into("<H", body, 4, 0)
    with pytest.raises(TranslogCorruptedError, match="version 0"):
        GenerationHeader.decode(_reseal_header(bytes(body)), "g")
    body = bytearray(HEADER.encode()[:40])
    struct.pack_into("<H", body, 6, 1)
    with pytest.raises(TranslogCorruptedError, match="flags"):
        GenerationHeader.decode(_reseal_header(bytes(body)), "g")


def test_header_is_documented_layout() -> None:
    raw = HEADER.encode()
    assert raw[:4] == b"SSTL"
    assert struct.unpack_from("<HH16sqq", raw, 4) == (fr.FORMAT_VERSION, 0, TL_UUID.bytes, 3, 7)
    assert struct.unpack_from("<I", raw, 40)[0] == crc32c(raw[:40])


# --------------------------------------------------------------------------- frames


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    source_size=st.integers(0, 3000),
    first=st.integers(0, 2**40),
    compress=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_frames_round_trip(
    sizes: list[int], source_size: int, first: int, compress: bool, shuffle: bool, seed: int
) -> None:
    batches, seq = [], first
    for i, n in enumerate(sizes):
        b = make_batch(seq, n, source_size, seed + i)
        if shuffle and n:  # a replica appends seq#s out of order
            perm = list(range(n))
            random.Random(seed).shuffle(perm)
            b = b.take(pa.array(perm))
        batches.append(b)
        seq += n
    data = PREAMBLE + b"".join(encode_frame(b, compress=compress) for b in batches)
    got = list(iter_frames(data, HEADER_SIZE, None, "mem"))  # the schema frame is followed, not yielded
    assert [f.count for f in got] == sizes
    assert got[0].offset == FIRST and got[-1].end == len(data)
    for f, b in zip(got, batches):
        assert f.batch().equals(b)
        seqs = b.column("seq_no").to_pylist()
        assert (f.min_seq_no, f.max_seq_no) == ((min(seqs), max(seqs)) if seqs else (-1, -1))


def test_frame_layout_and_seq_no_range() -> None:
    b = make_batch(10, 5).take(pa.array([3, 0, 4, 2, 1]))
    raw = encode_frame(b, compress=False)
    magic, size, count, lo, hi, crc = struct.unpack_from("<2sIIqqI", raw, 0)
    assert (magic, size, count, lo, hi) == (b"FB", len(raw) - 30, 5, 10, 14)
    assert crc == crc32c(raw[:26] + raw[30:])
    assert pa.ipc.read_message(raw[30:]).type == "record batch"  # no schema in the frame
    assert pa.ipc.read_record_batch(pa.py_buffer(raw[30:]), ops.SCHEMA).equals(b)


def test_schema_frame_layout() -> None:
    raw = fr.encode_schema_frame(ops.SCHEMA)
    magic, size, count, lo, hi, crc = struct.unpack_from("<2sIIqqI", raw, 0)
    assert (magic, size, count, lo, hi) == (b"FS", len(raw) - 30, 0, -1, -1)
    assert crc == crc32c(raw[:26] + raw[30:])
    assert pa.ipc.read_schema(pa.py_buffer(raw[30:])).equals(ops.SCHEMA)
    assert PREAMBLE[HEADER_SIZE:] == raw


def test_batch_frames_are_smaller_than_version_1_frames() -> None:
    b = make_batch(0, 1, 64)
    assert len(encode_frame(b)) + 400 < len(_v1_frame(b))


def test_frame_of_any_schema() -> None:
    b = pa.RecordBatch.from_pydict({"x": [1, 2, 3]})
    data = fr.encode_schema_frame(b.schema) + encode_frame(b, compress=True)
    (f,) = iter_frames(data, 0, None, "mem")
    assert (f.count, f.min_seq_no, f.max_seq_no) == (3, -1, -1)
    assert f.batch().equals(b)
    with pytest.raises(ValueError, match="dictionary"):
        fr.encode_schema_frame(pa.schema([pa.field("d", pa.dictionary(pa.int8(), pa.string()))]))


def test_batch_frame_without_a_schema_frame() -> None:
    raw = encode_frame(make_batch(0, 2))
    with pytest.raises(TranslogCorruptedError, match="without a schema frame"):
        list(iter_frames(raw, 0, None, "mem"))
    (f,) = iter_frames(raw, 0, None, "mem", schema=ops.SCHEMA)
    assert f.batch().equals(make_batch(0, 2))


def test_compressed_frames_are_smaller_for_json() -> None:
    sources = [(b'{"message": "the quick brown fox jumps over the lazy dog", "n": %d}' % i) * 16 for i in range(200)]
    b = ops.stamp(ops.index_batch([str(i) for i in range(200)], sources), 0, 1)
    assert len(encode_frame(b, compress=True)) * 3 < len(encode_frame(b, compress=False))


def test_iter_frames_from_file_object(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    batches = [make_batch(0, 3), make_batch(3, 4)]
    bounds = write_generation(p, batches, compress=True)
    with open(p, "rb") as f:
        got = list(iter_frames(f, HEADER_SIZE, bounds[-1], p))
    assert [g.batch() for g in got] == batches
    with open(p, "rb") as f:  # only the second frame: the schema comes from the file's schema frame
        (second,) = iter_frames(f, bounds[1], None, p)
    assert second.batch().equals(batches[1])


def test_iter_frames_refuses_a_frame_crossing_the_end(tmp_path: Path) -> None:
    data = PREAMBLE + encode_frame(make_batch(0, 3), compress=False)
    with pytest.raises(TranslogCorruptedError) as exc:
        list(iter_frames(data, HEADER_SIZE, len(data) - 1, "mem"))
    assert exc.value.offset == FIRST
    with pytest.raises(TranslogCorruptedError, match="short file"):
        list(iter_frames(data, HEADER_SIZE, len(data) + 1, "mem"))


def test_bit_flip_in_any_frame_bit_is_corruption_naming_the_offset() -> None:
    first = encode_frame(make_batch(0, 2, 8), compress=False)
    second = encode_frame(make_batch(2, 2, 8), compress=False)
    data = PREAMBLE + first + second
    at = FIRST + len(first)
    for bit in range(len(second) * 8):
        bad = flip(data, at * 8 + bit)
        with pytest.raises(TranslogCorruptedError) as exc:
            for f in iter_frames(bad, HEADER_SIZE, len(data), "gen-7.tlog"):
                f.batch()
        assert exc.value.offset == at, bit


def test_bit_flip_inside_checkpointed_frame_names_path_and_offset(tmp_path: Path) -> None:
    p = tmp_path / "translog-7.tlog"
    bounds = write_generation(p, [make_batch(0, 3), make_batch(3, 3, seed=1), make_batch(6, 3, seed=2)])
    clean = p.read_bytes()
    rnd = random.Random(7)
    for _ in range(80):
        frame = rnd.randrange(3)
        byte = rnd.randrange(bounds[frame], bounds[frame + 1])
        p.write_bytes(flip(clean, byte * 8 + rnd.randrange(8)))
        with pytest.raises(TranslogCorruptedError) as exc:
            scan(p, bounds[-1])
        assert exc.value.path == str(p) and exc.value.offset == bounds[frame]
        assert str(p) in str(exc.value) and f"offset {bounds[frame]}" in str(exc.value)


@pytest.mark.parametrize("compress", [False, True])
def test_truncation_at_every_byte_of_the_uncheckpointed_frame(tmp_path: Path, compress: bool) -> None:
    p = tmp_path / "g.tlog"
    batches = [make_batch(0, 3), make_batch(3, 4, seed=1), make_batch(7, 5, seed=2)]
    bounds = write_generation(p, batches, compress=compress)
    clean = p.read_bytes()
    checkpointed = bounds[2]  # the first two frames are durable, the third is not
    for cut in range(bounds[2], bounds[3] + 1):
        p.write_bytes(clean[:cut])
        r = scan(p, checkpointed)
        if cut == bounds[3]:
            assert r.valid_end == bounds[3] and r.torn is None and len(r.frames) == 3
            continue
        assert r.valid_end == bounds[2], cut
        assert [f.batch() for f in r.frames] == batches[:2]
        assert r.file_size == cut and r.torn_bytes == cut - bounds[2]
        assert (r.torn is None) == (cut == bounds[2])


def test_truncation_inside_a_second_uncheckpointed_frame_keeps_the_first(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 2), make_batch(2, 2, seed=1), make_batch(4, 2, seed=2)])
    clean = p.read_bytes()
    p.write_bytes(clean[: bounds[3] - 1])
    r = scan(p, bounds[1])
    assert r.valid_end == bounds[2] and [f.offset for f in r.frames] == bounds[:2]


def test_bad_uncheckpointed_frame_cuts_everything_after_it(tmp_path: Path) -> None:
    """A flipped bit past the checkpoint ends the good part; intact frames after it are not returned."""
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 2), make_batch(2, 2, seed=1), make_batch(4, 2, seed=2)])
    p.write_bytes(flip(p.read_bytes(), (bounds[1] + 40) * 8))
    r = scan(p, bounds[1])
    assert r.valid_end == bounds[1] and len(r.frames) == 1
    assert r.torn is not None and "CRC32C" in r.torn
    assert r.torn_bytes == bounds[3] - bounds[1]


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 2)])
    with open(p, "ab") as f:
        f.write(b"\0" * 4096)
    r = scan(p, bounds[1])
    assert r.valid_end == bounds[1] and "magic" in (r.torn or "")


def test_truncation_inside_the_checkpointed_range_is_corruption(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 3), make_batch(3, 3, seed=1)])
    clean = p.read_bytes()
    for cut in range(bounds[2]):
        p.write_bytes(clean[:cut])
        with pytest.raises(TranslogCorruptedError) as exc:
            scan(p, bounds[2])
        assert exc.value.path == str(p)
        assert exc.value.offset == (0 if cut < HEADER_SIZE else cut)


def test_checkpoint_offset_inside_a_frame_is_corruption(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 3), make_batch(3, 3, seed=1)])
    with pytest.raises(TranslogCorruptedError, match="past the checkpoint offset") as exc:
        scan(p, bounds[1] + 10)
    assert exc.value.offset == bounds[1]
    with pytest.raises(ValueError):
        scan(p, HEADER_SIZE - 1)


def test_checkpoint_at_header_end_means_nothing_durable(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 3)])
    assert scan(p, FIRST).valid_end == bounds[1]
    p.write_bytes(p.read_bytes()[: bounds[1] - 3])
    r = scan(p, FIRST)
    assert r.valid_end == FIRST and r.frames == () and r.header == HEADER and r.schema == ops.SCHEMA


def _frame_with_payload(payload: bytes, count: int = 1) -> bytes:
    return fr._pack_frame(payload, count, 0, 0)


def test_undecodable_payload_with_good_crc(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    good = encode_frame(make_batch(0, 1), compress=False)
    for payload in (
        b"not an arrow stream",
        good[30:-8] + b"\xff" * 8,
        fr.encode_payload(make_batch(0, 2)).to_pybytes(),  # 2 rows, the header says 1
        ops.SCHEMA.serialize().to_pybytes(),  # a schema message in a batch frame
        good[30:] + b"\0" * 8,  # trailing bytes after the message
    ):
        p.write_bytes(PREAMBLE + good + _frame_with_payload(payload))
        end = FIRST + len(good) + 30 + len(payload)
        with pytest.raises(TranslogCorruptedError) as exc:
            scan(p, end)
        assert exc.value.offset == FIRST + len(good)
        r = scan(p, FIRST + len(good))  # past the checkpoint: a torn tail
        assert r.valid_end == FIRST + len(good) and len(r.frames) == 1


def test_scan_checks_the_expected_header(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 1)])
    assert scan(p, bounds[1], expected=HEADER).header == HEADER
    with pytest.raises(TranslogCorruptedError, match="expected"):
        scan(p, bounds[1], expected=GenerationHeader(TL_UUID, 3, 8))


def test_scan_of_a_newer_generation_file_is_unsupported(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    body = bytearray(HEADER.encode()[:40])
    struct.pack_into("<H", body, 4, 9)
    p.write_bytes(_reseal_header(bytes(body)))
    with pytest.raises(UnsupportedFormatVersion):
        scan(p, HEADER_SIZE)


# --------------------------------------------------------------------------- checkpoint


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    i64 = st.integers(0, 2**63 - 1)
    gen = draw(i64)
    num_ops = draw(i64)
    if num_ops:
        lo = draw(i64)
        hi = draw(st.integers(lo, 2**63 - 1))
    else:
        lo = hi = ckp.NO_OPS_PERFORMED
    return Checkpoint(
        generation=gen,
        offset=draw(i64),
        num_ops=num_ops,
        min_seq_no=lo,
        max_seq_no=hi,
        global_checkpoint=draw(st.integers(ckp.UNASSIGNED, 2**63 - 1)),
        min_translog_generation=draw(st.integers(0, gen)),
        trimmed_above_seq_no=draw(st.integers(ckp.UNASSIGNED, 2**63 - 1)),
        translog_uuid=draw(st.uuids()),
        primary_term=draw(i64),
    )


CP = Checkpoint(7, 4096, 12, 100, 111, 95, 5, ckp.UNASSIGNED, TL_UUID, 3)


@given(checkpoints())
def test_checkpoint_round_trip(cp: Checkpoint) -> None:
    raw = cp.encode()
    assert len(raw) == ckp.SIZE
    assert Checkpoint.decode(raw, "translog.ckp") == cp


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(checkpoints())
def test_checkpoint_file_round_trip(tmp_path: Path, cp: Checkpoint) -> None:
    write_checkpoint(tmp_path, cp)
    assert read_checkpoint(tmp_path) == cp


def test_checkpoint_layout() -> None:
    raw = CP.encode()
    assert raw[:4] == b"SSCK"
    assert struct.unpack_from("<H8q16sq", raw, 4) == (2, 7, 4096, 12, 100, 111, 95, 5, -2, TL_UUID.bytes, 3)
    assert struct.unpack_from("<I", raw, 94)[0] == crc32c(raw[:94])


def test_every_bit_flip_in_a_checkpoint_is_corruption() -> None:
    raw = CP.encode()
    for bit in range(len(raw) * 8):
        with pytest.raises(TranslogCorruptedError) as exc:
            Checkpoint.decode(flip(raw, bit), "/data/translog.ckp")
        assert exc.value.path == "/data/translog.ckp", bit


def test_short_and_long_checkpoint_is_corruption() -> None:
    raw = CP.encode()
    for cut in range(len(raw)):
        with pytest.raises(TranslogCorruptedError):
            Checkpoint.decode(raw[:cut], "translog.ckp")
    longer = raw[:-4] + b"\0\0"
    with pytest.raises(TranslogCorruptedError, match="98"):
        Checkpoint.decode(longer + struct.pack("<I", crc32c(longer)), "translog.ckp")


def test_newer_checkpoint_version_is_unsupported(tmp_path: Path) -> None:
    body = bytearray(CP.encode()[:-4]) + b"a v3 field"
    struct.pack_into("<H", body, 4, 3)
    (tmp_path / "translog.ckp").write_bytes(bytes(body) + struct.pack("<I", crc32c(body)))
    with pytest.raises(UnsupportedFormatVersion) as exc:
        read_checkpoint(tmp_path)
    assert isinstance(exc.value, CorruptError) and str(tmp_path / "translog.ckp") in str(exc.value)


def test_checkpoint_with_good_crc_but_impossible_fields_is_corruption() -> None:
    body = bytearray(CP.encode()[:-4])
    struct.pack_into("<q", body, 54, 8)  # min_translog_generation above generation
    with pytest.raises(TranslogCorruptedError, match="min_translog_generation"):
        Checkpoint.decode(bytes(body) + struct.pack("<I", crc32c(body)), "translog.ckp")


@pytest.mark.parametrize(
    "changes",
    [{"num_ops": 0}, {"min_seq_no": 200}, {"offset": -1}, {"global_checkpoint": -3},
     {"trimmed_above_seq_no": -3}, {"min_translog_generation": 8}, {"primary_term": -1}],
)
def test_checkpoint_refuses_impossible_values(changes: dict[str, int]) -> None:
    fields = {**CP.__dict__, **changes}
    with pytest.raises(ValueError):
        Checkpoint(**fields)


def test_read_checkpoint_names_the_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CP)
    path = tmp_path / "translog.ckp"
    path.write_bytes(flip(path.read_bytes(), 100))
    with pytest.raises(TranslogCorruptedError) as exc:
        read_checkpoint(tmp_path)
    assert exc.value.path == str(path) and str(path) in str(exc.value)
    path.write_bytes(b"")
    with pytest.raises(TranslogCorruptedError, match="short"):
        read_checkpoint(tmp_path)
    path.unlink()
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path)


def test_write_checkpoint_replaces_atomically_and_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_checkpoint(tmp_path, CP)
    newer = Checkpoint(8, 44, 0, -1, -1, 111, 5, ckp.UNASSIGNED, TL_UUID, 4)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    write_checkpoint(tmp_path, newer)
    assert len(synced) == 2  # the temp file, then the directory
    assert read_checkpoint(tmp_path) == newer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["translog.ckp"]
    synced.clear()
    write_checkpoint(tmp_path, CP, fsync=False)
    assert synced == [] and read_checkpoint(tmp_path) == CP


def test_failed_write_keeps_the_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_checkpoint(tmp_path, CP)

    def crash(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_checkpoint(tmp_path, Checkpoint(8, 44, 0, -1, -1, 111, 5, ckp.UNASSIGNED, TL_UUID, 4))
    assert read_checkpoint(tmp_path) == CP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["translog.ckp"]


def test_stale_temp_files_are_found(tmp_path: Path) -> None:
    (tmp_path / "translog.ckp.abc123.tmp").write_bytes(b"partial")
    write_checkpoint(tmp_path, CP)
    assert [p.name for p in ckp.stale_temp_files(tmp_path)] == ["translog.ckp.abc123.tmp"]
    assert read_checkpoint(tmp_path) == CP


def test_readers_never_see_a_partial_checkpoint(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CP)
    stop = threading.Event()
    seen: list[Checkpoint] = []
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(read_checkpoint(tmp_path))
            except BaseException as exc:  # noqa: BLE001 - any failure fails the test
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(400):
            write_checkpoint(tmp_path, Checkpoint(7 + i, 44 + i, i, 0 if i else -1, i - 1 if i else -1,
                                                  i - 1, 5, ckp.UNASSIGNED, TL_UUID, 3), fsync=False)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert len(seen) > 0 and all(cp == CP or cp.offset - cp.generation == 37 for cp in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["translog.ckp"]


def test_named_checkpoint_files(tmp_path: Path) -> None:
    """Sealed generations keep their own checkpoint next to translog.ckp."""
    sealed = Checkpoint(6, 900, 3, 1, 3, 0, 5, ckp.UNASSIGNED, TL_UUID, 3)
    write_checkpoint(tmp_path, CP)
    write_checkpoint(tmp_path, sealed, name="translog-6.ckp")
    assert read_checkpoint(tmp_path) == CP
    assert read_checkpoint(tmp_path, "translog-6.ckp") == sealed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["translog-6.ckp", "translog.ckp"]
    (tmp_path / "translog-6.ckp.x1y2.tmp").write_bytes(b"")
    assert [p.name for p in ckp.stale_temp_files(tmp_path)] == ["translog-6.ckp.x1y2.tmp"]


def test_scan_keeps_decoded_batches_or_decodes_later(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    batches = [make_batch(0, 3), make_batch(3, 2, seed=1)]
    bounds = write_generation(p, batches, compress=True)
    decoded = scan(p, bounds[-1])
    assert all(f.decoded is not None for f in decoded.frames)
    lazy = scan(p, bounds[-1], decode=False)
    assert all(f.decoded is None for f in lazy.frames)
    assert [f.batch() for f in lazy.frames] == [f.batch() for f in decoded.frames] == batches
    assert [(f.min_seq_no, f.max_seq_no, f.count) for f in lazy.frames] == [(0, 2, 3), (3, 4, 2)]


# --------------------------------------------------------------------------- format version 1


def _v1_frame(batch: pa.RecordBatch) -> bytes:
    """A format version 1 frame: magic FR, a whole IPC stream as payload, zlib CRC32."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    seqs = batch.column("seq_no").to_pylist()
    fields = struct.pack("<2sIIqq", b"FR", len(payload), batch.num_rows, min(seqs), max(seqs))
    return fields + struct.pack("<I", zlib.crc32(payload, zlib.crc32(fields))) + payload


def _v1_header(term: int = 3, generation: int = 7) -> bytes:
    body = struct.pack("<4sHH16sqq", b"SSTL", 1, 0, TL_UUID.bytes, term, generation)
    return body + struct.pack("<I", zlib.crc32(body))


def _v1_checkpoint(cp: Checkpoint) -> bytes:
    body = struct.pack(
        "<4sHqqqqqqqq16sq", b"SSCK", 1, cp.generation, cp.offset, cp.num_ops, cp.min_seq_no, cp.max_seq_no,
        cp.global_checkpoint, cp.min_translog_generation, cp.trimmed_above_seq_no, cp.translog_uuid.bytes,
        cp.primary_term,
    )
    return body + struct.pack("<I", zlib.crc32(body))


def test_version_1_generation_file_still_reads(tmp_path: Path) -> None:
    batches = [make_batch(0, 3), make_batch(3, 2, seed=1)]
    frames = [_v1_frame(b) for b in batches]
    data = _v1_header() + b"".join(frames)
    p = tmp_path / "translog-7.tlog"
    p.write_bytes(data)
    r = scan(p, len(data))
    assert r.header == HEADER and r.header.version == 1 and r.schema is None
    assert [f.batch() for f in r.frames] == batches
    assert [f.batch() for f in iter_frames(data, HEADER_SIZE, None, "mem")] == batches
    assert [f.batch() for f in scan(p, len(data), decode=False).frames] == batches


def test_bit_flip_in_a_version_1_frame_is_corruption() -> None:
    first, second = _v1_frame(make_batch(0, 2, 8)), _v1_frame(make_batch(2, 2, 8, seed=1))
    data = _v1_header() + first + second
    at = HEADER_SIZE + len(first)
    for bit in range(0, len(second) * 8, 7):
        with pytest.raises(TranslogCorruptedError) as exc:
            for f in iter_frames(flip(data, at * 8 + bit), HEADER_SIZE, len(data), "gen-7.tlog"):
                f.batch()
        assert exc.value.offset == at, bit


def test_frames_of_the_other_version_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    b = make_batch(0, 2)
    for data, start in ((_v1_header() + encode_frame(b), HEADER_SIZE), (PREAMBLE + _v1_frame(b), FIRST)):
        p.write_bytes(data)
        with pytest.raises(TranslogCorruptedError, match="version 1 frame|without a schema frame") as exc:
            scan(p, len(data))
        assert exc.value.offset == start
    p.write_bytes(_v1_header() + fr.encode_schema_frame(ops.SCHEMA))
    with pytest.raises(TranslogCorruptedError, match="version 2 frame in a version 1 file"):
        scan(p, p.stat().st_size)


def test_version_1_header_and_checkpoint_still_read() -> None:
    assert GenerationHeader.decode(_v1_header(), "g") == HEADER
    assert GenerationHeader(TL_UUID, 3, 7, version=1).encode() == _v1_header()
    assert Checkpoint.decode(_v1_checkpoint(CP), "translog.ckp") == CP
    for bit in (0, 33, 40, 700, 760):  # zlib CRC32 still guards version 1 records
        with pytest.raises(TranslogCorruptedError):
            Checkpoint.decode(flip(_v1_checkpoint(CP), bit), "translog.ckp")


def test_every_bit_flip_in_the_schema_frame_is_corruption(tmp_path: Path) -> None:
    p = tmp_path / "g.tlog"
    bounds = write_generation(p, [make_batch(0, 2)])
    clean = p.read_bytes()
    for bit in range(HEADER_SIZE * 8, FIRST * 8, 3):
        p.write_bytes(flip(clean, bit))
        with pytest.raises(TranslogCorruptedError) as exc:
            scan(p, bounds[-1])
        assert exc.value.offset == HEADER_SIZE and exc.value.path == str(p), bit


def test_remote_metadata_versions() -> None:
    from shardstore.translog import remote_metadata as rm

    md = rm.RemoteTranslogMetadata(3, 7, TL_UUID, 0, 9, 5, 6, (rm.RemoteGeneration(7, 3, "k/7", 100, 1, 0, 9, 10, -2),))
    raw = md.encode()
    assert struct.unpack_from("<H", raw, 4)[0] == 3 and struct.unpack_from("<I", raw, len(raw) - 4)[0] == crc32c(raw[:-4])
    v1 = bytearray(raw[:-4])
    struct.pack_into("<H", v1, 4, 1)
    assert rm.decode_metadata(bytes(v1) + struct.pack("<I", zlib.crc32(v1)), "k") == md  # version 1 still reads
    v2 = bytearray(raw[:-4])
    struct.pack_into("<H", v2, 4, 2)
    assert rm.decode_metadata(bytes(v2) + struct.pack("<I", crc32c(v2)), "k") == md  # version 2 still reads
    v4 = bytearray(raw[:-4])
    struct.pack_into("<H", v4, 4, 4)
    with pytest.raises(UnsupportedFormatVersion):
        rm.decode_metadata(bytes(v4) + struct.pack("<I", crc32c(v4)), "k")
    with pytest.raises(TranslogCorruptedError, match="CRC32C"):
        rm.decode_metadata(raw[:-4] + struct.pack("<I", zlib.crc32(raw[:-4])), "k")


def test_remote_metadata_version_3_carries_sections_and_streams() -> None:
    from shardstore.translog import remote_metadata as rm

    section = rm.RemoteGeneration(8, 3, "c/node_translog/s/data/x.ntl", 50, 2, 10, 19, 10, -2, offset=120)
    md = rm.RemoteTranslogMetadata(3, 8, TL_UUID, 0, 19, 5, 7,
                                   (rm.RemoteGeneration(7, 3, "k/7", 100, 1, 0, 9, 10, -2), section),
                                   streams=(("c/node_translog/s", 4, "idx", 0),))
    raw = md.encode()
    assert rm.decode_metadata(raw, "k") == md
    # a version 2 body never holds a section's offset: refused as corrupt, not misread as a whole blob
    v2 = bytearray(raw[:-4])
    struct.pack_into("<H", v2, 4, 2)
    with pytest.raises(TranslogCorruptedError, match="wrong number of fields"):
        rm.decode_metadata(bytes(v2) + struct.pack("<I", crc32c(v2)), "k")


def test_generation_checksum_follows_the_generation_format() -> None:
    from shardstore.translog.remote_metadata import generation_checksum

    v2 = PREAMBLE + encode_frame(make_batch(0, 2))
    v1 = _v1_header() + _v1_frame(make_batch(0, 2))
    assert generation_checksum(v2) == crc32c(v2)
    assert generation_checksum(v1) == zlib.crc32(v1)
    assert generation_checksum(memoryview(v2)) == crc32c(v2)
