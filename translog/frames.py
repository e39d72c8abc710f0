"""The translog generation file: a header, a schema frame, then frames of Arrow operation batches.

A generation file starts with one :class:`GenerationHeader` and one *schema frame*,
written and fsynced together when the file is created, followed by one *batch frame*
per appended batch.  All integers are little-endian.  Checksums are CRC32C
(Castagnoli, ``google_crc32c``) in format version 2; format version 1 files (CRC32 by
:func:`zlib.crc32`, one self-contained Arrow IPC stream per frame) are still read.

Generation header (44 bytes, format version 2):

======  ====  ==========  ====================================================
offset  size  type        field
======  ====  ==========  ====================================================
0       4     bytes       magic ``b"SSTL"``
4       2     u16         format version (2; 1 is still read)
6       2     u16         flags (0; any other value is refused)
8       16    bytes       translog UUID (``uuid.UUID.bytes``)
24      8     i64         primary term of every operation appended to the file
32      8     i64         generation number
40      4     u32         CRC32C of bytes 0..39 (version 1: CRC32 (zlib))
======  ====  ==========  ====================================================

Every later format version keeps these 44 bytes, with a CRC32C, as the prefix of its
header and puts new fields after them.  A reader picks the checksum by the version field
and checks it before believing the version: a flipped bit in the version field is
reported as corruption (:class:`~shardstore.translog.errors.TranslogCorruptedError`),
while a header with a valid CRC and a newer version raises
:class:`~shardstore.errors.UnsupportedFormatVersion`.

Frame (30-byte frame header, then the payload):

======  =======  ==========  =================================================
offset  size     type        field
======  =======  ==========  =================================================
0       2        bytes       magic: the frame kind (below)
2       4        u32         payload length ``n``
6       4        u32         operation count (rows of the batch; 0 for ``FS``)
10      8        i64         min ``seq_no`` of the batch (-1 if none)
18      8        i64         max ``seq_no`` of the batch (-1 if none)
26      4        u32         checksum of bytes 0..25 of the frame, then of the
                             payload (one running checksum): CRC32C for ``FS``
                             and ``FB``, CRC32 (zlib) for ``FR``
30      n        bytes       payload
======  =======  ==========  =================================================

Frame kinds (the magic says which, so a frame is read the same in any file):

- ``b"FS"`` schema frame (version 2): the payload is one Arrow IPC *schema* message
  (``Schema.serialize()``).  It is the first frame of a version 2 file, count 0, seq#
  range (-1, -1).  The batch frames after it are decoded with this schema.
- ``b"FB"`` batch frame (version 2): the payload is one Arrow IPC *record batch*
  message (``RecordBatch.serialize()``, no schema, no end-of-stream marker); buffers
  optionally compressed by Arrow's IPC body compression (the writer LZ4-compresses a
  batch of at least :data:`COMPRESS_MIN_BYTES`; a reader decodes any codec Arrow knows).
- ``b"FR"`` stream frame (version 1 only; never written now): the payload is one
  RecordBatch as a whole Arrow IPC stream (schema message, batch message,
  end-of-stream marker).
- ``b"FT"`` typed frame (version 3): like ``FR`` a whole Arrow IPC stream (schema,
  one batch, end-of-stream marker), but checksummed with CRC32C.  It holds a batch
  whose schema extends the operation schema with a ``fields`` struct column: the
  typed field values of index operations of a synthetic-source index, which carry
  no JSON ``source`` (issue 16; docs/design/translog.md, "Typed operations").
  The frame carries its own schema, so it decodes wherever a reader starts, and the
  generation's schema frame stays the operation schema.  A batch's buffers are
  zstd-compressed (level 1) by Arrow's IPC body compression from :data:`COMPRESS_TYPED_MIN_BYTES`
  (1 MiB; LZ4 until 2026-11-26: a reader decodes either, Arrow names the codec in the message).

Version 3 is version 2 plus ``FT`` frames: a version 2 file holding one is refused as
corrupt, and a reader of version 2 refuses a version 3 file with
:class:`~shardstore.errors.UnsupportedFormatVersion` instead of misreading it.

Version 4 is version 3 plus narrowed integers in large typed frames: in an ``FT`` frame
that is compressed (from :data:`COMPRESS_TYPED_MIN_BYTES`), an ``int64``/``int32``
child of ``fields`` whose values all fit a narrower integer type is written as the
narrowest of ``int8``, ``int16``, ``int32``, with field metadata :data:`WIDE_KEY` naming
the type it had; every reader casts it back (exactly: the values fit) before anything
else sees the batch.  Flights' typed columns are small integers: the 336,776-row frame
shrinks from 62 MB of Arrow buffers to 35 MB before compression, and its LZ4 time from
45 to 28 ms of CPU (issue 16).  A reader of version 3 refuses a version 4 file with
:class:`~shardstore.errors.UnsupportedFormatVersion`; version 3 frames carry no such
metadata and are read as they are.

Version 5 is version 4 plus adopted operations (``op_type`` 3, one per row of a file a
primary adopted as a segment; engine/shard/adopted_ops.py): the frames are unchanged, but
a reader of version 4 would take an adopted row for an unknown operation and skip it, so
it refuses a version 5 file with :class:`~shardstore.errors.UnsupportedFormatVersion`.

Version 6 is version 5 plus narrowed operation columns: in a compressed ``FT`` frame, the
``seq_no``, ``primary_term`` and ``version`` columns (:data:`NARROW_COLUMNS`) are narrowed
like the integers of ``fields``, with :data:`WIDE_KEY` on the top-level field, and widened
back by every reader before anything else sees the batch.  They are int64 columns of 400 KB
per 50,000 operations, all but constant: zstd spent about 1.5 ms on each, a third of a bulk's
frame (scratch: a bulk of 50,000 flights rows, 14.5 ms of zstd CPU, of which 4.4 ms on these
three; narrowed to int32/int8/int8, the frame took 3.3 ms less CPU and 2.6% more bytes).  A
reader of version 5 refuses a version 6 file with
:class:`~shardstore.errors.UnsupportedFormatVersion`: it would hand an int8 term to the engine.

Version 7 is version 6 plus Parquet frames (``b"FP"``, translog/parquet_frames.py: layout and decoding there):
the payload is the term and the stamped segment file a primary wrote for a big part of new documents
(engine/shard/write_once.py); every reader decodes it to the same batch of index operations a typed frame of
them decodes to.  A version 6 file holding one is refused as corrupt, and a reader of version 6 refuses a
version 7 file with :class:`~shardstore.errors.UnsupportedFormatVersion` (it knows no ``FP`` frame).

Writing the schema once per generation instead of once per frame saves ~450 bytes and
an IPC stream writer per append.  :func:`payload_parts` hands a large batch's payload
out as the pieces Arrow writes (message metadata, the batch's own buffers, padding), so
the writer can checksum them and ``writev`` them without copying the payload.  Readers started in the middle of a generation file
(:func:`iter_frames` with a ``start_offset`` past the schema frame) take the schema
from the file's schema frame, or from the ``schema`` argument.

Compression.  A batch below :data:`COMPRESS_MIN_BYTES` (4 MiB of Arrow buffers: a bulk of
1,000 documents of 1 KiB is 1 MiB) is written uncompressed: measured on such a batch, zstd
level 1 shrinks the frame 2.8x but encodes at ~120-170 MB/s against ~1-1.9 GB/s
uncompressed, which alone would take most of a core at the 100k ops/s target.  A larger
batch (a bulk of a whole table) is compressed, columns in parallel: writing, fsyncing
and uploading the bytes saved costs more than the compression (issue 16; 336,776 flights
rows as typed fields: 62 MB -> 22 MB under LZ4, the file-store upload 0.17 s -> 0.06 s).
A typed frame is zstd-compressed at level 1 and a plain one LZ4-compressed: on the 336,776
typed rows, zstd against LZ4 measured the same on the file store (one go 0.185 s against
0.182 s, medians of 6) and 10% faster on moto S3 (0.315 s against 0.351 s), where every
byte goes through an HTTP server on the same cores.
``encode_frame(batch, compress=True)`` (zstd) is there for bandwidth-bound stores.

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
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from shardstore.core.arrays import one_array
from shardstore.core.ops import FIELDS_COLUMN, fields_of
from shardstore.core.ops import NO_OPS as NO_OPS_PERFORMED
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.operations import SCHEMA
from shardstore.translog.parquet_frames import PARQUET_MAGIC, decode_parquet_payload
from shardstore.translog.records import Checksum, check_framing, check_version, checksum_for, crc32c, zlib_crc32

FORMAT_VERSION = 7
#: The first format version whose files may hold typed (``FT``) frames.
TYPED_FRAMES_VERSION = 3
#: The first format version whose typed frames may hold narrowed integer fields (module docstring).
NARROW_INTS_VERSION = 4
#: The first format version whose files may hold adopted operations (op type 3, engine/shard/adopted_ops.py): an
#: older reader refuses the file (UnsupportedFormatVersion) instead of replaying an adopted row as nothing.
ADOPTED_OPS_VERSION = 5
#: The first format version whose large typed frames may hold narrowed operation columns (:data:`NARROW_COLUMNS`).
NARROW_COLUMNS_VERSION = 6
#: The first format version whose files may hold Parquet (``FP``) frames (translog/parquet_frames.py).
PARQUET_FRAMES_VERSION = 7
#: The operation columns a large typed frame narrows like the integers of its ``fields`` (format version 6).
NARROW_COLUMNS = ("seq_no", "primary_term", "version")
#: Field metadata key of a narrowed integer child of ``fields``: the type it is widened back to.
WIDE_KEY = b"shardstore.wide"
_NARROWER = (pa.int8(), pa.int16(), pa.int32())
GENERATION_MAGIC = b"SSTL"
SCHEMA_MAGIC = b"FS"
BATCH_MAGIC = b"FB"
STREAM_MAGIC = b"FR"  # format version 1 frames
TYPED_MAGIC = b"FT"  # format version 3: a whole IPC stream (a batch with its own, extended schema)
FRAME_MAGIC = BATCH_MAGIC

_HEADER = struct.Struct("<4sHH16sqq")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size  # 44

_FRAME_FIELDS = struct.Struct("<2sIIqq")
_FRAME_CRC = struct.Struct("<I")
FRAME_HEADER_SIZE = _FRAME_FIELDS.size + _FRAME_CRC.size  # 30

_U32_MAX = 0xFFFFFFFF
_CHECKSUM: dict[bytes, Checksum] = {SCHEMA_MAGIC: crc32c, BATCH_MAGIC: crc32c, STREAM_MAGIC: zlib_crc32,
                                    TYPED_MAGIC: crc32c, PARQUET_MAGIC: crc32c}

# Built once: making a zstd codec per frame costs more than encoding a small batch.
_PLAIN = ipc.IpcWriteOptions()
_ZSTD_LEVEL_1 = pa.Codec("zstd", compression_level=1)
_ZSTD = ipc.IpcWriteOptions(compression=_ZSTD_LEVEL_1)
_LZ4 = ipc.IpcWriteOptions(compression="lz4", use_threads=True)
#: Large typed frames: zstd level 1, columns in parallel (module docstring, "Compression").
_ZSTD_THREADS = ipc.IpcWriteOptions(compression=_ZSTD_LEVEL_1, use_threads=True)
#: Plain (``FB``) frames of at least this many bytes of Arrow buffers are LZ4-compressed (module docstring).
COMPRESS_MIN_BYTES = 4 << 20
#: Typed (``FT``) frames from this many bytes: typed columns compress on several threads at once.
COMPRESS_TYPED_MIN_BYTES = 1 << 20

Source = Union[bytes, bytearray, memoryview, pa.Buffer, BinaryIO]


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class GenerationHeader:
    """The header that opens every generation file (``version``: the format it was written in)."""

    translog_uuid: uuid.UUID
    primary_term: int
    generation: int
    flags: int = 0
    version: int = field(default=FORMAT_VERSION, compare=False)

    def encode(self) -> bytes:
        """The 44 header bytes, checksum (of the header's version) included."""
        body = _HEADER.pack(
            GENERATION_MAGIC, self.version, self.flags, self.translog_uuid.bytes,
            self.primary_term, self.generation,
        )
        return body + _HEADER_CRC.pack(checksum_for(self.version)(body, 0))

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
        return cls(uuid.UUID(bytes=raw_uuid), term, generation, flags, version)


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True)
class Frame:
    """One batch frame of a generation file; ``batch()`` decodes its payload (once, if scanned with decode)."""

    offset: int  # where the frame starts in the file
    length: int  # total bytes, frame header included
    count: int
    min_seq_no: int
    max_seq_no: int
    path: str = field(repr=False)
    payload: memoryview | bytes = field(repr=False, compare=False)
    decoded: pa.RecordBatch | None = field(default=None, repr=False, compare=False)
    schema: pa.Schema | None = field(default=None, repr=False, compare=False)  # None: a self-contained frame
    kind: bytes = field(default=BATCH_MAGIC, compare=False)  # the frame magic: FB, FR, FT or FP

    @property
    def end(self) -> int:
        """Offset of the byte just after this frame."""
        return self.offset + self.length

    def batch(self) -> pa.RecordBatch:
        """The frame's batch; TranslogCorruptedError if the payload is not the batch the header describes."""
        if self.decoded is not None:
            return self.decoded
        result = _decode_frame(self.kind, self.payload, self.count, self.min_seq_no, self.max_seq_no, self.schema)
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


Part = Union[pa.Buffer, bytes]


def _size(part: Part) -> int:
    return part.size if isinstance(part, pa.Buffer) else len(part)


def frame_header(
    payload: Part | Sequence[Part], count: int, min_seq_no: int, max_seq_no: int, *, magic: bytes = BATCH_MAGIC
) -> bytes:
    """The 30 header bytes of a frame (checksum over the header fields and the payload; CRC32C unless ``FR``).

    ``payload`` is the payload or the list of its parts (see :func:`payload_parts`).
    """
    parts = payload if isinstance(payload, (list, tuple)) else (payload,)
    size = sum(_size(p) for p in parts)
    if size > _U32_MAX or count > _U32_MAX:
        raise ValueError(f"frame too large: {size} payload bytes, {count} operations (limit {_U32_MAX})")
    fields = _FRAME_FIELDS.pack(magic, size, count, min_seq_no, max_seq_no)
    crc = _CHECKSUM[magic]
    value = crc(fields, 0)
    for part in parts:
        value = crc(part, value)
    return fields + _FRAME_CRC.pack(value)


def _pack_frame(payload: pa.Buffer | bytes, count: int, min_seq_no: int, max_seq_no: int,
                magic: bytes = BATCH_MAGIC) -> bytes:
    """Frame bytes for an already serialised payload."""
    return b"".join((frame_header(payload, count, min_seq_no, max_seq_no, magic=magic), payload))


def encode_schema_frame(schema: pa.Schema) -> bytes:
    """The schema frame (``FS``) that opens a version 2 generation file; dictionary columns are refused."""
    if any(pa.types.is_dictionary(f.type) for f in schema):
        raise ValueError("dictionary-encoded columns cannot be framed (no dictionary messages are written)")
    return _pack_frame(schema.serialize(), 0, NO_OPS_PERFORMED, NO_OPS_PERFORMED, SCHEMA_MAGIC)


def encode_payload(batch: pa.RecordBatch, *, compress: bool = False) -> pa.Buffer:
    """Serialise one batch as an Arrow IPC record batch message (no schema; zstd level 1 body compression if asked)."""
    if not compress:
        return batch.serialize()
    return _compressed_payload(batch, _ZSTD)


def _compressed_payload(batch: pa.RecordBatch, options: ipc.IpcWriteOptions) -> pa.Buffer:
    """The record batch message of ``batch`` with its body compressed as ``options`` say (no schema message)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    stream = sink.getvalue()
    reader = pa.BufferReader(stream)
    ipc.read_message(reader)  # skip the schema message
    start = reader.tell()
    ipc.read_message(reader)
    return stream.slice(start, reader.tell() - start)  # zero copy


#: Above this many bytes of Arrow buffers, :func:`payload_parts` hands out the batch's own
#: buffers instead of a serialised copy (the copy costs ~75 µs per MB; collecting the
#: parts a constant ~20 µs).
ZERO_COPY_MIN_BYTES = 256 * 1024


class _Capture:
    """A write-only file for Arrow that keeps what it is given (Arrow's own buffers: zero copy)."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[Part] = []

    def write(self, data: Part) -> int:
        self.parts.append(data)
        return _size(data)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True


class _PartsWriter:
    """An IPC stream writer whose schema is out of the way: each batch written yields its message's parts."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._sink = _Capture()
        self._writer = ipc.new_stream(pa.PythonFile(self._sink, mode="w"), schema)
        self._writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema))  # the schema message goes out now
        self._sink.parts = []

    def parts(self, batch: pa.RecordBatch) -> list[Part]:
        """The record batch message of ``batch``, as the pieces Arrow wrote (batch buffers among them)."""
        self._writer.write_batch(batch)
        parts, self._sink.parts = self._sink.parts, []
        return parts


_WRITERS = threading.local()  # one parts writer per thread (the last schema used)


def payload_parts(batch: pa.RecordBatch) -> list[Part]:
    """The uncompressed payload of ``batch`` (as :func:`encode_payload`) as parts to write in order.

    A small batch is one serialised buffer; a large one is the message metadata plus the
    batch's own Arrow buffers and padding, so the payload is not copied before it reaches
    the file.  The bytes are the same either way.
    """
    if not at_least(batch, ZERO_COPY_MIN_BYTES):
        return [batch.serialize()]
    writer: _PartsWriter | None = getattr(_WRITERS, "writer", None)
    if writer is None or not writer.schema.equals(batch.schema):
        writer = _WRITERS.writer = _PartsWriter(batch.schema)
    return writer.parts(batch)


def stream_payload_parts(batch: pa.RecordBatch) -> list[Part]:
    """The payload of a typed frame (``FT``): ``batch`` as a whole IPC stream, as the pieces Arrow wrote.

    A batch of at least :data:`COMPRESS_TYPED_MIN_BYTES` has its integers narrowed and its buffers
    zstd-compressed at level 1 (Arrow's IPC body compression, columns in parallel): less than
    the write and fsync of the bytes saved, locally and again in the upload.
    """
    big = at_least(batch, COMPRESS_TYPED_MIN_BYTES)
    if not big:
        schema_message = _schema_message(batch.schema)
        if schema_message is not None:  # the stream's three messages, without a stream writer per frame
            return [schema_message, batch.serialize(), _EOS]
    sink = _Capture()
    if big:
        batch = narrowed(batch)
    options = _ZSTD_THREADS if big else _PLAIN
    with ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.parts


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the IPC stream's end-of-stream marker (continuation, length 0)
_SCHEMA_MESSAGES = threading.local()  # per thread: (the last schema, its serialised message or None)


def _schema_message(schema: pa.Schema) -> pa.Buffer | None:
    """The serialised schema message of an uncompressed stream of ``schema`` (the last one per thread kept), or
    None when a stream of it needs more than schema + batch messages (a dictionary type: its batches)."""
    last = getattr(_SCHEMA_MESSAGES, "last", None)
    if last is not None and (last[0] is schema or last[0].equals(schema, check_metadata=True)):
        return last[1]
    message = None if _has_dictionary(schema) else schema.serialize()
    _SCHEMA_MESSAGES.last = (schema, message)
    return message


def _has_dictionary(schema: pa.Schema) -> bool:
    """Whether a field of ``schema``, or a child of one, is dictionary-encoded."""
    def walk(t: pa.DataType) -> bool:
        return pa.types.is_dictionary(t) or any(walk(t.field(i).type) for i in range(t.num_fields))
    return any(walk(f.type) for f in schema)


def narrowed(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each int64/int32 child of ``fields`` and each of :data:`NARROW_COLUMNS` cast to the narrowest
    integer type holding its values, marked with :data:`WIDE_KEY` (format versions 4 and 6; :func:`widened` undoes
    it exactly)."""

    def narrow(f: pa.Field, child: pa.Array) -> tuple[pa.Field, pa.Array] | None:
        target = _narrowest(child) if f.type in (pa.int64(), pa.int32()) else None
        if target is None:
            return None
        return pa.field(f.name, target, f.nullable, {**(f.metadata or {}), WIDE_KEY: str(f.type).encode()}), \
            child.cast(target)

    return _recast_columns(_recast_fields(batch, narrow), narrow, NARROW_COLUMNS)


def _recast_columns(batch: pa.RecordBatch, recast: Callable[[pa.Field, pa.Array], tuple[pa.Field, pa.Array] | None],
                    names: Sequence[str]) -> pa.RecordBatch:
    """``batch`` with each top-level column of ``names`` that ``recast`` gives a new (field, values) for replaced."""
    for name in names:
        i = batch.schema.get_field_index(name)
        if i < 0:
            continue
        new = recast(batch.schema.field(i), one_array(batch.column(i)))
        if new is not None:
            batch = batch.set_column(i, *new)
    return batch


def _recast_fields(batch: pa.RecordBatch,
                   recast: Callable[[pa.Field, pa.Array], tuple[pa.Field, pa.Array] | None]) -> pa.RecordBatch:
    """``batch`` with each ``fields`` child that ``recast`` gives a new (field, values) for replaced, the struct's
    own nulls kept; ``batch`` itself when none is."""
    i = batch.schema.get_field_index(FIELDS_COLUMN)
    struct = one_array(batch.column(i))
    children = fields_of(batch)  # the struct's offset and validity applied to each child
    assert children is not None
    out, fields, changed = [], [], False
    for f, child in zip(struct.type, children.columns):
        new = recast(f, one_array(child))
        changed = changed or new is not None
        f, values = new if new is not None else (f, one_array(child))
        out.append(values)
        fields.append(f)
    if not changed:
        return batch
    rebuilt = pa.StructArray.from_arrays(out, fields=fields, mask=pc.is_null(struct) if struct.null_count else None)
    return batch.set_column(i, batch.schema.field(i).with_type(rebuilt.type), rebuilt)


def _narrowest(col: pa.Array) -> pa.DataType | None:
    """The narrowest integer type narrower than ``col``'s holding all its values (None: none, or all null)."""
    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None:
        return None
    for t in _NARROWER:
        if t.bit_width >= col.type.bit_width:
            return None
        bound = 1 << (t.bit_width - 1)
        if -bound <= lo and hi < bound:
            return t
    return None


def widened(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A typed batch with its narrowed ``fields`` children and operation columns (:data:`WIDE_KEY`) cast back to
    their own types."""
    i = batch.schema.get_field_index(FIELDS_COLUMN)
    narrow_columns = [f.name for f in batch.schema if f.metadata and WIDE_KEY in f.metadata]
    narrow_fields = i >= 0 and any(f.metadata and WIDE_KEY in f.metadata for f in batch.schema.field(i).type)
    if not (narrow_columns or narrow_fields):
        return batch

    def widen(f: pa.Field, child: pa.Array) -> tuple[pa.Field, pa.Array] | None:
        wide = (f.metadata or {}).get(WIDE_KEY)
        if wide is None:
            return None
        target = _WIDE_TYPES.get(wide)
        if target is None:
            raise ValueError(f"field {f.name!r} of a typed frame names an unknown integer type {wide!r}")
        meta = {k: v for k, v in f.metadata.items() if k != WIDE_KEY}
        return pa.field(f.name, target, f.nullable, meta or None), child.cast(target)

    return _recast_columns(_recast_fields(batch, widen) if narrow_fields else batch, widen, narrow_columns)


_WIDE_TYPES = {b"int64": pa.int64(), b"int32": pa.int32()}


def at_least(batch: pa.RecordBatch, limit: int) -> bool:
    """Whether ``batch.nbytes >= limit``, its whole buffers' size (never below nbytes, 30x cheaper) asked first:
    ``nbytes`` of a slice costs ~14 us, paid per frame by a bulk's many small parts."""
    return batch.get_total_buffer_size() >= limit and batch.nbytes >= limit


def frame_parts(batch: pa.RecordBatch) -> tuple[bytes, list[Part]]:
    """(magic, payload parts) of the frame that holds ``batch``: ``FB`` for the operation schema, else ``FT``."""
    if batch.schema.names[-1] == FIELDS_COLUMN:
        return TYPED_MAGIC, stream_payload_parts(batch)
    if at_least(batch, COMPRESS_MIN_BYTES):  # JSON sources shrink ~4x under LZ4: less to write, fsync and upload
        return BATCH_MAGIC, [_compressed_payload(batch, _LZ4)]
    return BATCH_MAGIC, payload_parts(batch)


def encode_frame(batch: pa.RecordBatch, *, compress: bool = False) -> bytes:
    """The bytes of one batch frame (``FB``) holding ``batch`` (min/max seq_no from its ``seq_no`` column)."""
    lo, hi = _seq_no_range(batch)
    return _pack_frame(encode_payload(batch, compress=compress), batch.num_rows, lo, hi)


def _one_message(payload: memoryview | bytes, kind: str) -> pa.Message | str:
    """The single IPC message of type ``kind`` filling ``payload``, or why it is not."""
    buf = pa.py_buffer(payload)
    reader = pa.BufferReader(buf)
    try:
        msg = ipc.read_message(reader)
    except (pa.ArrowException, ValueError, OSError) as exc:  # Arrow raises OSError for bad IPC messages
        return f"undecodable payload: {exc}"
    if msg.type != kind:
        return f"payload holds a {msg.type} message (expected a {kind})"
    if reader.tell() != buf.size:
        return f"payload has {buf.size - reader.tell()} bytes after its {kind} message"
    return msg


def _decode_schema(payload: memoryview | bytes) -> pa.Schema | str:
    """The schema of a schema frame's payload, or the reason there is none."""
    msg = _one_message(payload, "schema")
    if isinstance(msg, str):
        return msg
    try:
        return ipc.read_schema(msg)
    except (pa.ArrowException, ValueError, OSError) as exc:
        return f"undecodable schema: {exc}"


def _decode_payload(payload: memoryview | bytes, count: int, schema: pa.Schema | None,
                    typed: bool = False) -> pa.RecordBatch | str:
    """The one batch of a payload, or the reason it is not the batch its frame header describes.

    ``schema`` None means a whole IPC stream (a version 1 ``FR`` or a typed ``FT`` payload).  The row count is
    checked against the header; the header's seq_no range is not recomputed here (the
    CRC already ties it to the payload the writer produced).
    """
    try:
        if schema is None:
            batches = list(ipc.open_stream(pa.py_buffer(payload)))  # one per frame, not per operation
            if len(batches) != 1:
                return f"payload holds {len(batches)} record batches (expected 1)"
            batch = batches[0]
        else:
            msg = _one_message(payload, "record batch")
            if isinstance(msg, str):
                return msg
            batch = ipc.read_record_batch(msg, schema)
        batch.validate()
    except (pa.ArrowException, ValueError, OSError) as exc:  # Arrow raises OSError for bad IPC messages
        return f"undecodable payload: {exc}"
    if batch.num_rows != count:
        return f"payload holds {batch.num_rows} operations, frame header says {count}"
    if typed and not _typed_operations(batch.schema):
        return f"typed frame holds no typed operations (schema {batch.schema.names})"
    if typed:
        try:
            batch = widened(batch)
        except (pa.ArrowException, ValueError) as exc:
            return f"undecodable typed fields: {exc}"
    return batch


def _decode_frame(kind: bytes, payload: memoryview | bytes, count: int, lo: int, hi: int,
                  schema: pa.Schema | None) -> pa.RecordBatch | str:
    """The batch of a frame of ``kind`` (FB, FR, FT or FP), or the reason it is not the batch its header describes."""
    if kind == PARQUET_MAGIC:
        return decode_parquet_payload(payload, count, lo, hi)
    return _decode_payload(payload, count, schema, typed=kind == TYPED_MAGIC)


def _typed_operations(schema: pa.Schema) -> bool:
    """Whether ``schema`` is the operation schema plus a last ``fields`` struct column (what an FT frame holds)."""
    return (len(schema) == len(SCHEMA) + 1 and schema.names[:-1] == SCHEMA.names
            and schema.names[-1] == FIELDS_COLUMN and pa.types.is_struct(schema.field(FIELDS_COLUMN).type))


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


@dataclass(frozen=True)
class _SchemaFrame:
    """A parsed schema frame: where it ends and the schema it holds."""

    end: int
    schema: pa.Schema


class _Parser:
    """Reads frames one after another, carrying the schema of the last schema frame."""

    def __init__(self, reader: _Reader, path: str, decode: bool, schema: pa.Schema | None) -> None:
        self.reader = reader
        self.path = path
        self.decode = decode
        self.schema = schema

    def frame(self, offset: int, limit: int) -> Frame | _SchemaFrame | str:
        """The frame at ``offset`` ending at or before ``limit``, or the reason there is none."""
        reader = self.reader
        room = limit - offset
        head = reader.read(offset, min(FRAME_HEADER_SIZE, max(room, 0)))
        magic = bytes(head[:2])
        if len(head) < 2:
            return f"short frame header: {len(head)} of {FRAME_HEADER_SIZE} bytes"
        crc = _CHECKSUM.get(magic)
        if crc is None:
            return (f"bad frame magic {magic!r} (expected {BATCH_MAGIC!r}, {SCHEMA_MAGIC!r}, {TYPED_MAGIC!r}, "
                    f"{PARQUET_MAGIC!r} or {STREAM_MAGIC!r})")
        if len(head) < FRAME_HEADER_SIZE:
            return f"short frame header: {len(head)} of {FRAME_HEADER_SIZE} bytes"
        _magic, size, count, lo, hi = _FRAME_FIELDS.unpack_from(head, 0)
        (stored,) = _FRAME_CRC.unpack_from(head, _FRAME_FIELDS.size)
        if size > room - FRAME_HEADER_SIZE:
            return f"short frame: payload of {size} bytes, {room - FRAME_HEADER_SIZE} available"
        payload = reader.read(offset + FRAME_HEADER_SIZE, size)
        if len(payload) != size:
            return f"short frame: payload of {size} bytes, {len(payload)} read"
        actual = crc(payload, crc(head[: _FRAME_FIELDS.size], 0))
        if stored != actual:
            kind = "CRC32" if magic == STREAM_MAGIC else "CRC32C"
            return f"frame {kind} mismatch (stored {stored:#010x}, computed {actual:#010x})"
        if magic == SCHEMA_MAGIC:
            if (count, lo, hi) != (0, NO_OPS_PERFORMED, NO_OPS_PERFORMED):
                return f"schema frame with count {count} and seq_no range [{lo}, {hi}]"
            schema = _decode_schema(payload)
            if isinstance(schema, str):
                return schema
            self.schema = schema
            return _SchemaFrame(offset + FRAME_HEADER_SIZE + size, schema)
        schema = None  # FR, FT and FP frames carry their own schema
        if magic in (TYPED_MAGIC, PARQUET_MAGIC):
            first = TYPED_FRAMES_VERSION if magic == TYPED_MAGIC else PARQUET_FRAMES_VERSION
            version = self._file_version()
            if version is not None and version < first:
                return f"version {first} frame ({magic.decode()}) in a version {version} file"
        if magic == BATCH_MAGIC:
            schema = self.schema if self.schema is not None else self._leading_schema()
            if schema is None:
                return "batch frame without a schema frame before it"
        decoded = None
        if self.decode:
            decoded = _decode_frame(magic, payload, count, lo, hi, schema)
            if isinstance(decoded, str):
                return decoded
        return Frame(offset, FRAME_HEADER_SIZE + size, count, lo, hi, self.path, payload, decoded, schema, magic)

    def _file_version(self) -> int | None:
        """The format version in the generation header the source starts with, or None (no header there)."""
        if bytes(self.reader.read(0, len(GENERATION_MAGIC))) != GENERATION_MAGIC:
            return None
        raw = bytes(self.reader.read(len(GENERATION_MAGIC), 2))
        return int.from_bytes(raw, "little") if len(raw) == 2 else None

    def _leading_schema(self) -> pa.Schema | None:
        """The schema frame right after the header, if the source is a whole generation file."""
        if bytes(self.reader.read(0, len(GENERATION_MAGIC))) != GENERATION_MAGIC:
            return None
        if bytes(self.reader.read(HEADER_SIZE, len(SCHEMA_MAGIC))) != SCHEMA_MAGIC:
            return None
        first = _Parser(self.reader, self.path, False, None).frame(HEADER_SIZE, self.reader.size)
        if isinstance(first, _SchemaFrame):
            self.schema = first.schema
            return first.schema
        return None


def iter_frames(
    source: Source,
    start_offset: int,
    end_offset: int | None,
    path: str | os.PathLike[str],
    *,
    decode: bool = False,
    schema: pa.Schema | None = None,
) -> Iterator[Frame]:
    """Yield the batch frames from ``start_offset`` to ``end_offset`` (None: end of source); any flaw raises.

    The CRC of every frame is checked; with ``decode`` the payload is decoded too (and
    kept).  Schema frames are checked and followed, not yielded.  Batch frames met before
    any schema frame use ``schema``, else the schema frame of the generation file the
    source holds (when it starts with a generation header).
    """
    where = os.fspath(path)
    reader = _Reader(source)
    limit = reader.size if end_offset is None else end_offset
    if limit > reader.size:
        raise TranslogCorruptedError(where, reader.size, f"short file: ends at {reader.size}, expected frames up to {limit}")
    parser = _Parser(reader, where, decode, schema)
    offset = start_offset
    while offset < limit:
        frame = parser.frame(offset, limit)
        if isinstance(frame, str):
            raise TranslogCorruptedError(where, offset, frame)
        if isinstance(frame, Frame):
            yield frame
        offset = frame.end


# --------------------------------------------------------------------------- scan


@dataclass(frozen=True)
class ScanResult:
    """What :func:`scan` found in a generation file."""

    header: GenerationHeader
    frames: tuple[Frame, ...]  # the batch frames (schema frames are not listed)
    valid_end: int  # truncate the file here: the end of the last good frame
    file_size: int
    torn: str | None = None  # why the tail past valid_end was rejected; None if there is none
    schema: pa.Schema | None = field(default=None, compare=False)  # of the schema frame; None for version 1

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
    of the file's bytes, read once.  ``expected`` also demands that exact header.  A
    version 1 file holds only ``FR`` frames; a version 2 file holds ``FS``/``FB`` frames.
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
    parser = _Parser(_Reader(data), where, decode, None)
    v1 = header.version == 1
    frames: list[Frame] = []
    offset = HEADER_SIZE
    torn: str | None = None
    while offset < len(data):
        durable = offset < checkpoint_offset  # inside the checkpointed range every flaw is corruption
        frame = parser.frame(offset, len(data))
        if isinstance(frame, (Frame, _SchemaFrame)):
            kind = frame.kind if isinstance(frame, Frame) else SCHEMA_MAGIC
            if (kind == STREAM_MAGIC) != v1:
                frame = f"{'version 2' if v1 else 'version 1'} frame in a version {header.version} file"
            elif kind == TYPED_MAGIC and header.version < TYPED_FRAMES_VERSION:
                frame = f"version {TYPED_FRAMES_VERSION} frame (FT) in a version {header.version} file"
        if isinstance(frame, str):
            if durable:
                raise TranslogCorruptedError(where, offset, f"{frame} (inside the checkpointed range, up to {checkpoint_offset})")
            torn = frame
            break
        if durable and frame.end > checkpoint_offset:
            raise TranslogCorruptedError(
                where, offset, f"frame ends at {frame.end}, past the checkpoint offset {checkpoint_offset}"
            )
        if isinstance(frame, Frame):
            frames.append(frame)
        offset = frame.end
    return ScanResult(header, tuple(frames), offset, len(data), torn, parser.schema)
