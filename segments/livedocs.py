"""Live docs: which rows of an immutable segment are deleted.

A segment file never changes; deletes and updates of its documents are recorded in a
live-docs file per generation (``<segment>_<generation>.liv``), each a complete
bitmap of the segment's deleted rows, written as a new small file on every change
(the commit point names the generation in force).

:class:`LiveDocs` is immutable: :meth:`LiveDocs.delete` returns a new object.

Byte layout of an encoded live-docs file (every integer little-endian)::

    offset  size  field
    0       4     magic b"SSLD"
    4       2     format version (uint16) = 1
    6       1     encoding: 0 = raw bitmap, 1 = zstd-compressed bitmap
    7       1     reserved, 0
    8       8     doc_count (uint64): rows of the segment
    16      8     deleted_count (uint64): bits set in the bitmap
    24      4     payload length P (uint32)
    28      P     payload: the bitmap, raw or zstd frame
    28+P    4     CRC32C (uint32) of bytes [0, 28+P)

The bitmap has ``ceil(doc_count / 8)`` bytes; bit ``i % 8`` (least significant
first, as Arrow validity bitmaps) of byte ``i // 8`` is set when row ``i`` is
deleted; padding bits are 0.  The payload is zstd-compressed only when that is
smaller.  In every version the last 4 bytes are the CRC32C of all the bytes before
them, so the checksum is verified before the version is read: a damaged version
field is corruption, a well-formed newer version is
:class:`shardstore.errors.UnsupportedFormatVersion`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import zstandard

from shardstore.errors import UnsupportedFormatVersion

from .errors import SegmentCorrupted

__all__ = ["LiveDocs", "livedocs_file_name", "parse_livedocs_file_name", "FORMAT_VERSION", "MAGIC"]

MAGIC = b"SSLD"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sHBBQQI")
_CRC = struct.Struct("<I")
_RAW, _ZSTD = 0, 1
_SUFFIX = ".liv"


def livedocs_file_name(segment_name: str, generation: int) -> str:
    """``<segment>_<generation>.liv``; generations start at 1."""
    if not segment_name or int(generation) < 1:
        raise ValueError(f"bad live-docs file name parts {segment_name!r}, {generation!r}")
    return f"{segment_name}_{int(generation)}{_SUFFIX}"


def parse_livedocs_file_name(file_name: str) -> tuple[str, int]:
    """Inverse of :func:`livedocs_file_name`."""
    if not file_name.endswith(_SUFFIX):
        raise ValueError(f"not a live-docs file name: {file_name!r}")
    segment, _, gen = file_name[: -len(_SUFFIX)].rpartition("_")
    if not segment or not gen.isdigit() or int(gen) < 1:
        raise ValueError(f"not a live-docs file name: {file_name!r}")
    return segment, int(gen)


def _popcount(bitmap: bytes) -> int:
    return int.from_bytes(bitmap, "little").bit_count() if bitmap else 0


@dataclass(frozen=True)
class LiveDocs:
    """The deleted rows of a segment of ``doc_count`` rows, as a packed bitmap."""

    doc_count: int
    deleted: bytes  # ceil(doc_count / 8) bytes, bit set = deleted, LSB first

    def __post_init__(self) -> None:
        if self.doc_count < 0:
            raise ValueError("doc_count < 0")
        if len(self.deleted) != (self.doc_count + 7) // 8:
            raise ValueError(f"bitmap of {len(self.deleted)} bytes for {self.doc_count} docs")
        if self.doc_count % 8 and self.deleted and self.deleted[-1] >> (self.doc_count % 8):
            raise ValueError("padding bits set")
        object.__setattr__(self, "deleted", bytes(self.deleted))

    @classmethod
    def all_live(cls, n: int) -> LiveDocs:
        return cls(n, bytes((n + 7) // 8))

    @classmethod
    def from_mask(cls, live: pa.BooleanArray | pa.ChunkedArray) -> LiveDocs:
        """From a boolean array, True = live (nulls count as deleted)."""
        if isinstance(live, pa.ChunkedArray):
            live = live.combine_chunks()
        bits = ~np.asarray(live.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        return cls(len(live), np.packbits(bits, bitorder="little").tobytes())

    # -- queries --------------------------------------------------------------------
    @property
    def deleted_count(self) -> int:
        c = self.__dict__.get("_deleted_count")
        if c is None:
            c = _popcount(self.deleted)
            object.__setattr__(self, "_deleted_count", c)
        return c

    @property
    def live_count(self) -> int:
        return self.doc_count - self.deleted_count

    def _bits(self) -> np.ndarray:
        return np.unpackbits(np.frombuffer(self.deleted, dtype=np.uint8), count=self.doc_count, bitorder="little")

    def mask(self) -> pa.BooleanArray:
        """One boolean per row, True = live."""
        live = np.bitwise_not(np.frombuffer(self.deleted, dtype=np.uint8))
        return pa.Array.from_buffers(pa.bool_(), self.doc_count, [None, pa.py_buffer(live.tobytes())])

    def deleted_rows(self) -> pa.Array:
        """Row numbers of the deleted rows, ascending (int64)."""
        return pa.array(np.flatnonzero(self._bits()).astype(np.int64))

    def is_live(self, row: int) -> bool:
        if not 0 <= row < self.doc_count:
            raise IndexError(row)
        return not (self.deleted[row >> 3] >> (row & 7)) & 1

    # -- changes --------------------------------------------------------------------
    def delete(self, rows: Any) -> LiveDocs:
        """A new LiveDocs with ``rows`` (row numbers: Arrow array, numpy array or
        sequence; repeats and already-deleted rows are fine) deleted as well."""
        if isinstance(rows, pa.ChunkedArray):
            rows = rows.combine_chunks()
        if isinstance(rows, pa.Array):
            if rows.null_count:
                raise ValueError("null row number")
            idx = rows.to_numpy(zero_copy_only=False)
        else:
            idx = np.asarray(rows)
        idx = idx.astype(np.int64, copy=False)
        if idx.size == 0:
            return self
        if idx.min() < 0 or idx.max() >= self.doc_count:
            raise IndexError(f"row numbers must be in [0, {self.doc_count})")
        bits = self._bits()
        bits[idx] = 1
        return LiveDocs(self.doc_count, np.packbits(bits, bitorder="little").tobytes())

    # -- codec ----------------------------------------------------------------------
    def encode(self) -> bytes:
        payload, encoding = self.deleted, _RAW
        if len(payload) > 64:
            packed = zstandard.ZstdCompressor(level=3).compress(payload)
            if len(packed) < len(payload):
                payload, encoding = packed, _ZSTD
        head = _HEADER.pack(MAGIC, FORMAT_VERSION, encoding, 0, self.doc_count, self.deleted_count, len(payload))
        body = head + payload
        return body + _CRC.pack(google_crc32c.value(body))

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, where: str) -> LiveDocs:
        """Read :meth:`encode`'s bytes; ``where`` (a file name) names them in errors."""
        data = bytes(data)
        if len(data) < _HEADER.size + _CRC.size:
            raise SegmentCorrupted(where, f"live-docs file of {len(data)} bytes is too short")
        if data[:4] != MAGIC:
            raise SegmentCorrupted(where, f"bad live-docs magic {data[:4]!r}")
        (crc,) = _CRC.unpack_from(data, len(data) - 4)
        if google_crc32c.value(data[:-4]) != crc:
            raise SegmentCorrupted(where, "live-docs checksum mismatch")
        magic, version, encoding, _reserved, doc_count, deleted_count, plen = _HEADER.unpack_from(data, 0)
        if version > FORMAT_VERSION:
            raise UnsupportedFormatVersion(where, version, FORMAT_VERSION)
        if version < 1:
            raise SegmentCorrupted(where, f"bad live-docs format version {version}")
        if _HEADER.size + plen + 4 != len(data):
            raise SegmentCorrupted(where, f"live-docs payload length {plen} does not match the file size {len(data)}")
        payload = data[_HEADER.size : _HEADER.size + plen]
        want = (doc_count + 7) // 8
        if encoding == _ZSTD:
            try:
                payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=want)
            except zstandard.ZstdError as exc:
                raise SegmentCorrupted(where, f"live-docs bitmap does not decompress: {exc}") from None
        elif encoding != _RAW:
            raise SegmentCorrupted(where, f"unknown live-docs encoding {encoding}")
        if len(payload) != want:
            raise SegmentCorrupted(where, f"live-docs bitmap of {len(payload)} bytes for {doc_count} docs")
        try:
            out = cls(doc_count, payload)
        except ValueError as exc:
            raise SegmentCorrupted(where, str(exc)) from None
        if out.deleted_count != deleted_count:
            raise SegmentCorrupted(where, f"live-docs bitmap holds {out.deleted_count} deletions, header says {deleted_count}")
        return out

    def __repr__(self) -> str:
        return f"LiveDocs(doc_count={self.doc_count}, deleted={self.deleted_count})"
