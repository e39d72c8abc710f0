"""The checks every framed translog record shares: magic, size, CRC32, then format version.

The CRC is checked before the version is believed, so a flipped bit anywhere (the version
field included) is corruption, and only an intact record from a newer writer is refused
as an unsupported version.
"""

from __future__ import annotations

import struct
import zlib

from shardstore.errors import UnsupportedFormatVersion
from shardstore.translog.errors import TranslogCorruptedError

CRC = struct.Struct("<I")


def check_framing(
    mv: memoryview, *, magic: bytes, min_size: int, crc_at: int, where: str, what: str, report_at: int | None = None
) -> None:
    """Raise TranslogCorruptedError unless ``mv`` has the magic, ``min_size`` bytes and a matching CRC32 at ``crc_at``.

    A CRC mismatch is reported at ``report_at`` (default: the CRC's own offset).
    """
    if len(mv) >= len(magic) and bytes(mv[: len(magic)]) != magic:
        raise TranslogCorruptedError(where, 0, f"bad {what} magic {bytes(mv[: len(magic)])!r} (expected {magic!r})")
    if len(mv) < min_size or len(mv) < crc_at + CRC.size:
        raise TranslogCorruptedError(where, 0, f"short {what}: {len(mv)} bytes")
    (stored,) = CRC.unpack_from(mv, crc_at)
    actual = zlib.crc32(mv[:crc_at])
    if stored != actual:
        raise TranslogCorruptedError(
            where, crc_at if report_at is None else report_at, f"{what} CRC32 mismatch (stored {stored:#010x}, computed {actual:#010x})"
        )


def check_version(version: int, supported: int, *, where: str, what: str) -> None:
    """Refuse a newer format version (UnsupportedFormatVersion) and a version below 1 (corruption)."""
    if version > supported:
        raise UnsupportedFormatVersion(f"{what} {where}", version, supported)
    if version < 1:
        raise TranslogCorruptedError(where, 4, f"invalid {what} format version {version}")
