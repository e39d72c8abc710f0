"""The translog generation file: a header, then frames of Arrow operation batches.

A generation file starts with one :class:`GenerationHeader`, written and fsynced when
the file is created, followed by frames appended one per batch.  All integers are
little-endian; checksums are CRC32 (zlib), as computed by :func:`zlib.crc32`.

Generation header (44 bytes, format version 1):

======  ====  ==========  ====================================================
offset  size  type        field
======  ====  ==========  ====================================================
0       4     bytes       magic ``b"SSTL"``
4       2     u16         format version (1)
6       2     u16         flags (0; any other value is refused)
8       16    bytes       translog UUID (``uuid.UUID.bytes``)
24      8     i64         primary term of every operation appended to the file
32      8     i64         generation number
40      4     u32         CRC32 (zlib) of bytes 0..39
======  ====  ==========  ====================================================

Every later format version keeps these 44 bytes, CRC included, as the prefix of its
header and puts new fields after them.  A reader therefore checks the CRC before the
version: a flipped bit in the version field is reported as corruption
(:class:`~shardstore.translog.errors.TranslogCorruptedError`), while a header with a
valid CRC and a newer version raises
:class:`~shardstore.errors.UnsupportedFormatVersion`.  Frames have no version of
their own: the header's version governs the whole file.

Frame (30-byte header, then the payload):

======  =======  ==========  =================================================
offset  size     type        field
======  =======  ==========  =================================================
0       2        bytes       magic ``b"FR"``
2       4        u32         payload length ``n``
6       4        u32         operation count (rows of the batch)
10      8        i64         min ``seq_no`` of the batch (-1 if none)
18      8        i64         max ``seq_no`` of the batch (-1 if none)
26      4        u32         CRC32 (zlib) of bytes 0..25 of the frame, then of
                             the payload (one running checksum)
30      n        bytes       payload: one RecordBatch as an Arrow IPC stream
                             (schema message, batch message, end-of-stream
                             marker); buffers optionally zstd-compressed by
                             Arrow's IPC body compression
======  =======  ==========  =================================================

Compression is off by default.  Measured on a 1,000-operation batch of 1 KiB JSON
sources, zstd level 1 shrinks the frame 2.8x but encodes at ~120-170 MB/s against
~1-1.9 GB/s uncompressed, which alone would take most of a core at the 100k ops/s
target; ``encode_frame(batch, compress=True)`` is there for bandwidth-bound stores.

Torn tails.  The checkpoint file records how many bytes of the current generation
are durable (``Checkpoint.offset``).  :func:`scan` demands that every frame up to that
offset is intact and raises ``TranslogCorruptedError(path, offset, reason)`` otherwise.
Past it, the first frame that is short, has a bad magic or CRC, or does not decode
marks a torn tail: the scan stops there and reports ``valid_end`` so the writer can
truncate the file back to it.  Frames after a bad one are cut with the tail, never
skipped over, so no frame is returned out of the middle of a damaged region.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from shardstore.translog.records import check_framing, check_version
from shardstore.translog.errors import TranslogCorruptedError

FORMAT_VERSION = 1
GENERATION_MAGIC = b"SSTL"
FRAME_MAGIC = b"FR"
NO_OPS_PERFORMED = -1

_HEADER = struct.Struct("<4sHH16sqq")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size  # 44

_FRAME_FIELDS = struct.Struct("<2sIIqq")
_FRAME_CRC = struct.Struct("<I")
FRAME_HEADER_SIZE = _FRAME_FIELDS.size + _FRAME_CRC.size  # 30

_U32_MAX = 0xFFFFFFFF

# Built once: making a zstd codec per frame costs more than encoding a small batch.
_PLAIN = ipc.IpcWriteOptions()
_ZSTD = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))

Source = Union[bytes, bytearray, memoryview, pa.Buffer, BinaryIO]


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class GenerationHeader:
    """The header that opens every generation file."""

    translog_uuid: uuid.UUID
    primary_term: int
    generation: int
    flags: int = 0

    def encode(self) -> bytes:
        """The 44 header bytes, CRC included."""
        body = _HEADER.pack(
            GENERATION_MAGIC, FORMAT_VERSION, self.flags, self.translog_uuid.bytes,
            self.primary_term, self.generation,
        )
        return body + _HEADER_CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, path: str | os.PathLike[str]) -> GenerationHeader:
        """Parse the header at the start of ``buf`` (the first bytes of the file at ``path``)."""
        where = os.fspath(path)
        mv = memoryview(buf)
        check_framing(mv, magic=GENERATION_MAGIC, min_size=HEADER_SIZE, crc_at=_HEADER.size,
                      where=where, what="generation header", report_at=0)
        _magic, version, flags, raw_uuid, term, generation = _HEADER.unpack_from(mv, 0)
        check_version(version, FORMAT_VERSION, where=where, what="translog generation file")
        if flags != 0:
            raise TranslogCorruptedError(where, 6, f"unknown header flags {flags:#06x}")
        return cls(uuid.UUID(bytes=raw_uuid), term, generation, flags)


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True)
class Frame:
    """One frame of a generation file; ``batch()`` decodes its payload (once, if scanned with decode)."""

    offset: int  # where the frame starts in the file
    length: int  # total bytes, frame header included
    count: int
    min_seq_no: int
    max_seq_no: int
    path: str = field(repr=False)
    payload: memoryview | bytes = field(repr=False, compare=False)
    decoded: pa.RecordBatch | None = field(default=None, repr=False, compare=False)

    @property
    def end(self) -> int:
        """Offset of the byte just after this frame."""
        return self.offset + self.length

    def batch(self) -> pa.RecordBatch:
        """The frame's batch; TranslogCorruptedError if the payload is not the batch the header describes."""
        if self.decoded is not None:
            return self.decoded
        result = _decode_payload(self.payload, self.count)
        if isinstance(result, str):
            raise TranslogCorruptedError(self.path, self.offset, result)
        return result


def _seq_no_range(batch: pa.RecordBatch) -> tuple[int, int]:
    """(min, max) of the batch's ``seq_no`` column, or (-1, -1) without rows or column."""
    idx = batch.schema.get_field_index("seq_no")
    if idx < 0 or batch.num_rows == 0:
        return NO_OPS_PERFORMED, NO_OPS_PERFORMED
    mm = pc.min_max(batch.column(idx))
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None:
        return NO_OPS_PERFORMED, NO_OPS_PERFORMED
    return int(lo), int(hi)


def frame_header(payload: pa.Buffer | bytes, count: int, min_seq_no: int, max_seq_no: int) -> bytes:
    """The 30 header bytes (CRC32 over the header fields and the payload) of a frame."""
    size = len(payload) if not isinstance(payload, pa.Buffer) else payload.size
    if size > _U32_MAX or count > _U32_MAX:
        raise ValueError(f"frame too large: {size} payload bytes, {count} operations (limit {_U32_MAX})")
    fields = _FRAME_FIELDS.pack(FRAME_MAGIC, size, count, min_seq_no, max_seq_no)
    return fields + _FRAME_CRC.pack(zlib.crc32(payload, zlib.crc32(fields)))


def _pack_frame(payload: pa.Buffer | bytes, count: int, min_seq_no: int, max_seq_no: int) -> bytes:
    """Frame bytes for an already serialised payload."""
    return b"".join((frame_header(payload, count, min_seq_no, max_seq_no), payload))


def encode_payload(batch: pa.RecordBatch, *, compress: bool = False) -> pa.Buffer:
    """Serialise one batch as an Arrow IPC stream (zstd level 1 body compression if asked)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=_ZSTD if compress else _PLAIN) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def encode_frame(batch: pa.RecordBatch, *, compress: bool = False) -> bytes:
    """The bytes of one frame holding ``batch`` (min/max seq_no from its ``seq_no`` column)."""
    lo, hi = _seq_no_range(batch)
    return _pack_frame(encode_payload(batch, compress=compress), batch.num_rows, lo, hi)


def _decode_payload(payload: memoryview | bytes, count: int) -> pa.RecordBatch | str:
    """The one batch of a payload, or the reason it is not the batch its frame header describes.

    The row count is checked against the header; the header's seq_no range is not
    recomputed here (the CRC already ties it to the payload the writer produced).
    """
    try:
        reader = ipc.open_stream(pa.py_buffer(payload))
        batches = list(reader)  # one per frame: this loop is per frame, not per operation
    except (pa.ArrowException, ValueError, OSError) as exc:  # Arrow raises OSError for bad IPC messages
        return f"undecodable payload: {exc}"
    if len(batches) != 1:
        return f"payload holds {len(batches)} record batches (expected 1)"
    batch = batches[0]
    try:
        batch.validate()
    except (pa.ArrowException, ValueError) as exc:
        return f"invalid record batch in payload: {exc}"
    if batch.num_rows != count:
        return f"payload holds {batch.num_rows} operations, frame header says {count}"
    return batch


class _Reader:
    """Random access to a buffer (zero copy) or a binary file (seek and read)."""

    def __init__(self, source: Source) -> None:
        if isinstance(source, (bytes, bytearray, memoryview, pa.Buffer)):
            self._mv: memoryview | None = memoryview(source).cast("B")
            self._file: BinaryIO | None = None
            self.size = len(self._mv)
        else:
            self._mv = None
            self._file = source
            self.size = source.seek(0, os.SEEK_END)

    def read(self, offset: int, n: int) -> memoryview | bytes:
        """Up to ``n`` bytes at ``offset`` (fewer at the end of the source)."""
        if self._mv is not None:
            return self._mv[offset : offset + n]
        assert self._file is not None
        self._file.seek(offset)
        return self._file.read(n)


def _parse_frame(reader: _Reader, offset: int, limit: int, path: str, decode: bool) -> Frame | str:
    """The frame at ``offset`` ending at or before ``limit``, or the reason there is none."""
    room = limit - offset
    head = reader.read(offset, min(FRAME_HEADER_SIZE, max(room, 0)))
    if len(head) < 2 or bytes(head[:2]) != FRAME_MAGIC:
        if len(head) < 2:
            return f"short frame header: {len(head)} of {FRAME_HEADER_SIZE} bytes"
        return f"bad frame magic {bytes(head[:2])!r} (expected {FRAME_MAGIC!r})"
    if len(head) < FRAME_HEADER_SIZE:
        return f"short frame header: {len(head)} of {FRAME_HEADER_SIZE} bytes"
    _magic, size, count, lo, hi = _FRAME_FIELDS.unpack_from(head, 0)
    (stored,) = _FRAME_CRC.unpack_from(head, _FRAME_FIELDS.size)
    if size > room - FRAME_HEADER_SIZE:
        return f"short frame: payload of {size} bytes, {room - FRAME_HEADER_SIZE} available"
    payload = reader.read(offset + FRAME_HEADER_SIZE, size)
    if len(payload) != size:
        return f"short frame: payload of {size} bytes, {len(payload)} read"
    actual = zlib.crc32(payload, zlib.crc32(head[: _FRAME_FIELDS.size]))
    if stored != actual:
        return f"frame CRC32 mismatch (stored {stored:#010x}, computed {actual:#010x})"
    decoded = None
    if decode:
        decoded = _decode_payload(payload, count)
        if isinstance(decoded, str):
            return decoded
    return Frame(offset, FRAME_HEADER_SIZE + size, count, lo, hi, path, payload, decoded)


def iter_frames(
    source: Source,
    start_offset: int,
    end_offset: int | None,
    path: str | os.PathLike[str],
    *,
    decode: bool = False,
) -> Iterator[Frame]:
    """Yield the frames from ``start_offset`` to ``end_offset`` (None: end of source); any flaw raises.

    The CRC of every frame is checked; with ``decode`` the payload is decoded too (and kept).
    """
    where = os.fspath(path)
    reader = _Reader(source)
    limit = reader.size if end_offset is None else end_offset
    if limit > reader.size:
        raise TranslogCorruptedError(where, reader.size, f"short file: ends at {reader.size}, expected frames up to {limit}")
    offset = start_offset
    while offset < limit:
        frame = _parse_frame(reader, offset, limit, where, decode)
        if isinstance(frame, str):
            raise TranslogCorruptedError(where, offset, frame)
        yield frame
        offset = frame.end


# --------------------------------------------------------------------------- scan


@dataclass(frozen=True)
class ScanResult:
    """What :func:`scan` found in a generation file."""

    header: GenerationHeader
    frames: tuple[Frame, ...]
    valid_end: int  # truncate the file here: the end of the last good frame
    file_size: int
    torn: str | None = None  # why the tail past valid_end was rejected; None if there is none

    @property
    def torn_bytes(self) -> int:
        """How many bytes past ``valid_end`` are to be cut."""
        return self.file_size - self.valid_end


def scan(
    path: str | os.PathLike[str],
    checkpoint_offset: int,
    *,
    decode: bool = True,
    expected: GenerationHeader | None = None,
) -> ScanResult:
    """Check a generation file: intact up to ``checkpoint_offset``, torn tail located after it.

    With ``decode`` (the default) every frame's payload is decoded as part of the check
    and kept on the frame, so ``frame.batch()`` costs nothing more; the frames hold views
    of the file's bytes, read once.  ``expected`` also demands that exact header.
    """
    where = os.fspath(path)
    with open(where, "rb") as f:
        data = f.read()
    header = GenerationHeader.decode(data, where)
    if expected is not None and header != expected:
        raise TranslogCorruptedError(where, 0, f"generation header {header} does not match the expected {expected}")
    if checkpoint_offset < HEADER_SIZE:
        raise ValueError(f"{where}: checkpoint offset {checkpoint_offset} lies inside the {HEADER_SIZE}-byte header")
    if len(data) < checkpoint_offset:
        raise TranslogCorruptedError(
            where, len(data), f"short file: ends at {len(data)} but the checkpoint covers {checkpoint_offset} bytes"
        )
    reader = _Reader(data)
    frames: list[Frame] = []
    offset = HEADER_SIZE
    while offset < checkpoint_offset:  # the durable part: every flaw is corruption
        frame = _parse_frame(reader, offset, len(data), where, decode)
        if isinstance(frame, str):
            raise TranslogCorruptedError(where, offset, f"{frame} (inside the checkpointed range, up to {checkpoint_offset})")
        if frame.end > checkpoint_offset:
            raise TranslogCorruptedError(
                where, offset, f"frame ends at {frame.end}, past the checkpoint offset {checkpoint_offset}"
            )
        frames.append(frame)
        offset = frame.end
    torn: str | None = None
    while offset < len(data):  # not yet checkpointed: the first flaw is the torn tail
        frame = _parse_frame(reader, offset, len(data), where, decode)
        if isinstance(frame, str):
            torn = frame
            break
        frames.append(frame)
        offset = frame.end
    return ScanResult(header, tuple(frames), offset, len(data), torn)
