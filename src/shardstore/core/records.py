"""The framing every JSON-bodied record shares (segments, cluster state): magic, version, length, body, CRC32C.

Byte layout (all integers little-endian):

======  ====  ======  ==========================================================
offset  size  type    field
======  ====  ======  ==========================================================
0       4     bytes   magic (per record kind, e.g. ``b"SSCP"`` for a commit point)
4       2     u16     format version of the record kind
6       2     u16     flags: bit 0 set = the body is zstd-compressed; other bits refused
8       4     u32     body length ``n`` (as stored)
12      n     bytes   body: UTF-8 JSON object (zstd frame of it when flag bit 0 is set)
12+n    4     u32     CRC32C (Castagnoli) of bytes 0..12+n-1
======  ====  ======  ==========================================================

Bodies over :data:`COMPRESS_OVER` bytes are stored compressed (commit metadata of a
shard with many segments shrinks several times).  The CRC covers the stored bytes and
is checked before the version is believed: a flipped bit anywhere (the version
field included) is :class:`RecordCorrupted` (or the subclass a caller passes as ``corrupt``,
e.g. ``SegmentCorrupted``); an intact record of a newer version raises
:class:`~shardstore.errors.UnsupportedFormatVersion`.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import google_crc32c
import pyarrow as pa
import zstandard

from shardstore.errors import CorruptError, UnsupportedFormatVersion

_HEAD = struct.Struct("<4sHHI")
ZSTD_BODY = 0x1
COMPRESS_OVER = 4096
#: Decompressed bodies larger than this are refused as corrupt (a record is metadata, not data).
MAX_BODY = 256 * 1024 * 1024
_CRC = struct.Struct("<I")


class RecordCorrupted(CorruptError):
    """A framed record failed its magic, length, CRC32C or body check; ``where`` names the blob or file."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``crc`` (no copy of ``data``)."""
    if not isinstance(data, (bytes, pa.Buffer)):  # the C extension takes read-only buffers only: wrapped, not copied
        data = pa.py_buffer(data)
    return google_crc32c.extend(crc, data) if crc else google_crc32c.value(data)


def encode_record(magic: bytes, version: int, body: dict[str, Any]) -> bytes:
    """Frame a JSON ``body`` as a record of kind ``magic`` in format ``version``."""
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    flags = 0
    if len(raw) > COMPRESS_OVER:
        raw, flags = zstandard.ZstdCompressor(level=3).compress(raw), ZSTD_BODY
    head = _HEAD.pack(magic, version, flags, len(raw)) + raw
    return head + _CRC.pack(crc32c(head))


def decode_record(
    data: bytes | bytearray | memoryview, *, magic: bytes, supported: int, where: str, what: str,
    corrupt: type[RecordCorrupted] = RecordCorrupted,
) -> tuple[int, dict[str, Any]]:
    """(version, body) of a framed record read from ``where``; any flaw raises ``corrupt`` naming it."""
    mv = memoryview(data)
    if len(mv) < _HEAD.size + _CRC.size:
        raise corrupt(where, f"{what} is {len(mv)} bytes, shorter than its framing")
    found, version, flags, n = _HEAD.unpack_from(mv, 0)
    if found != magic:
        raise corrupt(where, f"bad {what} magic {found!r} (expected {magic!r})")
    if _HEAD.size + n + _CRC.size != len(mv):
        raise corrupt(where, f"{what} body length {n} does not match its size {len(mv)} (truncated?)")
    end = len(mv) - _CRC.size
    (stored,) = _CRC.unpack_from(mv, end)
    actual = crc32c(mv[:end])
    if stored != actual:
        raise corrupt(where, f"{what} CRC32C mismatch (stored {stored:#010x}, computed {actual:#010x})")
    if version > supported:
        raise UnsupportedFormatVersion(f"{what} {where}", version, supported)
    if version < 1 or flags & ~ZSTD_BODY:
        raise corrupt(where, f"invalid {what} version {version} / flags {flags:#06x}")
    payload = bytes(mv[_HEAD.size:end])
    try:
        if flags & ZSTD_BODY:
            payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_BODY)
        body = json.loads(payload)
    except (ValueError, zstandard.ZstdError) as exc:
        raise corrupt(where, f"undecodable {what} body: {exc}") from None
    if not isinstance(body, dict):
        raise corrupt(where, f"{what} body is not a JSON object")
    return version, body
