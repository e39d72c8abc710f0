"""The translog checkpoint file ``translog.ckp``: what of the translog is durable.

The checkpoint names the current generation and how many of its bytes are durable
(``offset``, counted from the start of the generation file, its header included), and
carries the seq# bookkeeping the translog needs on reopen.  It is one fixed-size
record; all integers are little-endian; the checksum is CRC32C (Castagnoli).

Checkpoint record (98 bytes, format version 2; version 1 has the same layout with a
CRC32 (zlib) and is still read):

======  ====  ====  ============================================================
offset  size  type  field
======  ====  ====  ============================================================
0       4     -     magic ``b"SSCK"``
4       2     u16   format version (2; 1 is still read)
6       8     i64   generation (the current one)
14      8     i64   offset: bytes of the current generation file covered
22      8     i64   num_ops: operations in the current generation
30      8     i64   min_seq_no of the current generation (-1: none)
38      8     i64   max_seq_no of the current generation (-1: none)
46      8     i64   global checkpoint (-2: unassigned)
54      8     i64   min_translog_generation: oldest generation retained
62      8     i64   trimmed_above_seq_no (-2: no trim)
70      16    -     translog UUID (``uuid.UUID.bytes``)
86      8     i64   primary term
94      4     u32   CRC32C of bytes 0..93 (version 1: CRC32 (zlib))
======  ====  ====  ============================================================

In every format version the record is the whole file and its last 4 bytes are the
checksum of all the bytes before them: CRC32 (zlib) in version 1, CRC32C in every later
version.  A reader picks the checksum by the version field and checks magic and CRC
before believing the version, so any flipped bit, the version field's included, is reported as
:class:`~shardstore.translog.errors.TranslogCorruptedError`; a record whose CRC holds
and whose version is newer raises :class:`~shardstore.errors.UnsupportedFormatVersion`.

The file is replaced atomically (:func:`write_checkpoint`): a temp file in the same
directory (``<name>.<random>.tmp``) is written and fsynced, renamed over
``translog.ckp`` (or another ``name``, e.g. a sealed generation's checkpoint) with
``os.replace``, and the directory is fsynced.  A reader sees the old record or the new one, never a
mix.
"""

from __future__ import annotations

import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

from shardstore.core.ops import NO_OPS as NO_OPS_PERFORMED
from shardstore.fileio import write_atomic
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.records import check_framing, check_version, checksum_for

FORMAT_VERSION = 2
MAGIC = b"SSCK"
CHECKPOINT_FILE = "translog.ckp"
UNASSIGNED = -2

_PREFIX = struct.Struct("<4sH")
_FIELDS = struct.Struct("<4sHqqqqqqqq16sq")
_CRC = struct.Struct("<I")
SIZE = _FIELDS.size + _CRC.size  # 98

_TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Checkpoint:
    """The durable state of a translog, as recorded in ``translog.ckp``."""

    generation: int
    offset: int
    num_ops: int
    min_seq_no: int
    max_seq_no: int
    global_checkpoint: int
    min_translog_generation: int
    trimmed_above_seq_no: int
    translog_uuid: uuid.UUID
    primary_term: int

    def __post_init__(self) -> None:
        """Refuse values no translog can be in (ValueError)."""
        problems = []
        if self.generation < 0:
            problems.append(f"generation {self.generation} < 0")
        if not 0 <= self.min_translog_generation <= self.generation:
            problems.append(f"min_translog_generation {self.min_translog_generation} not in [0, {self.generation}]")
        if self.offset < 0:
            problems.append(f"offset {self.offset} < 0")
        if self.num_ops < 0:
            problems.append(f"num_ops {self.num_ops} < 0")
        if self.num_ops == 0 and (self.min_seq_no, self.max_seq_no) != (NO_OPS_PERFORMED, NO_OPS_PERFORMED):
            problems.append(f"no operations but seq_no range [{self.min_seq_no}, {self.max_seq_no}]")
        if self.num_ops > 0 and not 0 <= self.min_seq_no <= self.max_seq_no:
            problems.append(f"seq_no range [{self.min_seq_no}, {self.max_seq_no}] is not 0 <= min <= max")
        if self.global_checkpoint < UNASSIGNED:
            problems.append(f"global_checkpoint {self.global_checkpoint} < {UNASSIGNED}")
        if self.trimmed_above_seq_no < UNASSIGNED:
            problems.append(f"trimmed_above_seq_no {self.trimmed_above_seq_no} < {UNASSIGNED}")
        if self.primary_term < 0:
            problems.append(f"primary_term {self.primary_term} < 0")
        if problems:
            raise ValueError("invalid checkpoint: " + "; ".join(problems))

    def encode(self) -> bytes:
        """The 98 bytes of the record, CRC included."""
        body = _FIELDS.pack(
            MAGIC, FORMAT_VERSION, self.generation, self.offset, self.num_ops, self.min_seq_no,
            self.max_seq_no, self.global_checkpoint, self.min_translog_generation,
            self.trimmed_above_seq_no, self.translog_uuid.bytes, self.primary_term,
        )
        return body + _CRC.pack(checksum_for(FORMAT_VERSION)(body, 0))

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview, path: str | os.PathLike[str]) -> Checkpoint:
        """Parse a whole checkpoint file's bytes; ``path`` names the file in errors."""
        where = os.fspath(path)
        mv = memoryview(buf)
        version = check_framing(mv, magic=MAGIC, min_size=_PREFIX.size + _CRC.size, crc_at=len(mv) - _CRC.size,
                                where=where, what="checkpoint")
        check_version(version, FORMAT_VERSION, where=where, what="translog checkpoint")
        if len(mv) != SIZE:
            raise TranslogCorruptedError(where, 0, f"checkpoint file of {len(mv)} bytes (version {version} has {SIZE})")
        f = _FIELDS.unpack_from(mv, 0)
        try:
            return cls(f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], uuid.UUID(bytes=f[10]), f[11])
        except ValueError as exc:
            raise TranslogCorruptedError(where, 0, str(exc)) from None


def write_checkpoint(
    dir_path: str | os.PathLike[str], cp: Checkpoint, *, fsync: bool = True, name: str = CHECKPOINT_FILE
) -> None:
    """Replace ``dir_path/name`` atomically: temp file, fsync, rename, fsync of the directory."""
    directory = os.fspath(dir_path)
    data = cp.encode()
    write_atomic(directory, name, data, fsync=fsync, temp_suffix=_TEMP_SUFFIX)


def read_checkpoint(dir_path: str | os.PathLike[str], name: str = CHECKPOINT_FILE) -> Checkpoint:
    """Read ``dir_path/name`` (default ``translog.ckp``); FileNotFoundError if there is none."""
    path = Path(dir_path) / name
    with open(path, "rb") as f:
        data = f.read()
    return Checkpoint.decode(data, path)


def stale_temp_files(dir_path: str | os.PathLike[str]) -> list[Path]:
    """Temp files a crashed :func:`write_checkpoint` left behind (``<name>.<random>.tmp``; safe to delete on open)."""
    return sorted(p for p in Path(dir_path).iterdir() if ".ckp." in p.name and p.name.endswith(_TEMP_SUFFIX))
