"""The checks every framed translog record shares: magic, size, checksum, then format version.

Every record (generation header, checkpoint, remote metadata blob) carries a u16 format
version at byte 4 and a u32 checksum.  Format version 1 used CRC32 (zlib); every later
version uses CRC32C (Castagnoli, :mod:`google_crc32c`).  The checksum function is chosen
by the version field, and the CRC is checked before the version is believed, so a
flipped bit anywhere (the version field included) is corruption, and only an intact
record from a newer writer is refused as an unsupported version.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import google_crc32c
import pyarrow as pa

from shardstore.errors import UnsupportedFormatVersion
from shardstore.translog.errors import TranslogCorruptedError

CRC = struct.Struct("<I")
VERSION = struct.Struct("<H")
VERSION_AT = 4  # every record keeps its u16 format version at byte 4
ZLIB_CRC_VERSION = 1  # the only format version with CRC32 (zlib) checksums

Bytes = bytes | bytearray | memoryview | pa.Buffer
Checksum = Callable[[Bytes, int], int]


def crc32c(data: Bytes, crc: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``crc`` (0 to start); no copy of ``data``."""
    if not isinstance(data, (bytes, pa.Buffer)):  # the C extension takes read-only buffers only
        data = pa.py_buffer(data)
    return google_crc32c.extend(crc, data)


def zlib_crc32(data: Bytes, crc: int = 0) -> int:
    """CRC32 (zlib) of ``data``, continuing from ``crc``: the checksum of format version 1."""
    return zlib.crc32(data, crc)


def checksum_for(version: int) -> Checksum:
    """The checksum function of a format version: zlib CRC32 for version 1, CRC32C for every other."""
    return zlib_crc32 if version == ZLIB_CRC_VERSION else crc32c


def check_framing(
    mv: memoryview, *, magic: bytes, min_size: int, crc_at: int, where: str, what: str, report_at: int | None = None
) -> int:
    """Check magic, size and the checksum at ``crc_at`` (function chosen by the version at byte 4); return the version.

    Raises TranslogCorruptedError for any flaw; a CRC mismatch is reported at
    ``report_at`` (default: the CRC's own offset).  The version returned is not checked yet
    (see :func:`check_version`).
    """
    if len(mv) >= len(magic) and bytes(mv[: len(magic)]) != magic:
        raise TranslogCorruptedError(where, 0, f"bad {what} magic {bytes(mv[: len(magic)])!r} (expected {magic!r})")
    if len(mv) < min_size or len(mv) < crc_at + CRC.size or len(mv) < VERSION_AT + VERSION.size:
        raise TranslogCorruptedError(where, 0, f"short {what}: {len(mv)} bytes")
    (version,) = VERSION.unpack_from(mv, VERSION_AT)
    (stored,) = CRC.unpack_from(mv, crc_at)
    actual = checksum_for(version)(mv[:crc_at], 0)
    if stored != actual:
        kind = "CRC32" if version == ZLIB_CRC_VERSION else "CRC32C"
        raise TranslogCorruptedError(
            where, crc_at if report_at is None else report_at,
            f"{what} {kind} mismatch (stored {stored:#010x}, computed {actual:#010x})",
        )
    return version


def check_version(version: int, supported: int, *, where: str, what: str) -> None:
    """Refuse a newer format version (UnsupportedFormatVersion) and a version below 1 (corruption)."""
    if version > supported:
        raise UnsupportedFormatVersion(f"{what} {where}", version, supported)
    if version < 1:
        raise TranslogCorruptedError(where, 4, f"invalid {what} format version {version}")
