"""Commit points ``segments_N``: which segments (and which of their live docs) a commit holds.

A commit point is one framed record (:mod:`shardstore.core.records`, magic
``b"SSCP"``, format version 1) whose JSON body holds:

- ``generation`` N (the file is ``segments_N``), ``primary_term``, ``history_uuid``;
- ``segments``: per segment its :class:`~shardstore.segments.segment.SegmentInfo` (file
  name, size, CRC32C, doc count, seq# and column stats) and its live-docs generation,
  file, size, CRC32C and deleted count (generation 0: no deletions, no file);
- ``max_seq_no``, ``local_checkpoint``; the translog UUID and generation the commit
  continues from (replay starts there); the index ``mapping``; ``user_data``.

The footer CRC32C covers everything before it.  Commit points are immutable: a new
commit is a new file, written atomically (temp file, fsync, rename, fsync of the
directory), so a crash leaves the old commit or the new one, never a torn one.
See docs/design/segments.md, "Commit points".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from typing import Any

from shardstore.core.records import decode_record, encode_record
from shardstore.fileio import write_atomic
from shardstore.segments.errors import SegmentCorrupted
from shardstore.segments.segment import SegmentInfo

MAGIC = b"SSCP"
FORMAT_VERSION = 1
COMMIT_PREFIX = "segments_"
_COMMIT_RE = re.compile(r"^segments_(\d+)$")


@dataclass(frozen=True, slots=True)
class CommittedSegment:
    """One segment as a commit sees it: its file plus the live-docs generation in force."""

    info: SegmentInfo
    livedocs_generation: int = 0  # 0: every document is live, no file
    livedocs_file: str | None = None
    livedocs_size: int = 0
    livedocs_checksum: int = 0
    deleted_count: int = 0

    @property
    def live_count(self) -> int:
        """Documents of the segment still live in this commit."""
        return self.info.doc_count - self.deleted_count

    def files(self) -> dict[str, tuple[int, int]]:
        """File name -> (size, CRC32C) of every file this segment needs."""
        out = {self.info.file_name: (self.info.size, self.info.checksum)}
        if self.livedocs_file is not None:
            out[self.livedocs_file] = (self.livedocs_size, self.livedocs_checksum)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "info": self.info.to_dict(),
            "livedocs": [self.livedocs_generation, self.livedocs_file, self.livedocs_size,
                         self.livedocs_checksum, self.deleted_count],
        }

    @classmethod
    def from_dict(cls, d: MappingABC[str, Any]) -> CommittedSegment:
        """Inverse of :meth:`to_dict`."""
        gen, file, size, checksum, deleted = d["livedocs"]
        return cls(SegmentInfo.from_dict(d["info"], "commit point"), int(gen), file, int(size), int(checksum), int(deleted))


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """What ``segments_N`` records."""

    generation: int
    primary_term: int
    segments: tuple[CommittedSegment, ...]
    max_seq_no: int
    local_checkpoint: int
    translog_uuid: str
    translog_generation: int
    history_uuid: str
    mapping: dict[str, Any] = field(default_factory=dict)
    user_data: dict[str, str] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        """``segments_<generation>``."""
        return commit_file_name(self.generation)

    @property
    def doc_count(self) -> int:
        """Live documents in the commit."""
        return sum(s.live_count for s in self.segments)

    def files(self) -> dict[str, tuple[int, int]]:
        """Every segment and live-docs file the commit references -> (size, CRC32C)."""
        out: dict[str, tuple[int, int]] = {}
        for s in self.segments:
            out.update(s.files())
        return out

    def encode(self) -> bytes:
        """The framed bytes of ``segments_N``."""
        return encode_record(MAGIC, FORMAT_VERSION, self.to_body())

    def to_body(self) -> dict[str, Any]:
        """The JSON body of the record (also embedded in remote commit metadata)."""
        return {
            "generation": self.generation,
            "primary_term": self.primary_term,
            "segments": [s.to_dict() for s in self.segments],
            "max_seq_no": self.max_seq_no,
            "local_checkpoint": self.local_checkpoint,
            "translog_uuid": self.translog_uuid,
            "translog_generation": self.translog_generation,
            "history_uuid": self.history_uuid,
            "mapping": self.mapping,
            "user_data": self.user_data,
        }

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, where: str) -> CommitPoint:
        """Parse ``segments_N`` bytes read from ``where`` (SegmentCorrupted names it)."""
        _version, body = decode_record(data, magic=MAGIC, supported=FORMAT_VERSION, where=where, what="commit point",
                                       corrupt=SegmentCorrupted)
        return cls.from_body(body, where)

    @classmethod
    def from_body(cls, body: MappingABC[str, Any], where: str) -> CommitPoint:
        """Inverse of :meth:`to_body`; a missing or mistyped field raises SegmentCorrupted naming ``where``."""
        try:
            return cls(
                generation=int(body["generation"]),
                primary_term=int(body["primary_term"]),
                segments=tuple(CommittedSegment.from_dict(s) for s in body["segments"]),
                max_seq_no=int(body["max_seq_no"]),
                local_checkpoint=int(body["local_checkpoint"]),
                translog_uuid=str(body["translog_uuid"]),
                translog_generation=int(body["translog_generation"]),
                history_uuid=str(body["history_uuid"]),
                mapping=dict(body.get("mapping", {})),
                user_data={str(k): str(v) for k, v in body.get("user_data", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SegmentCorrupted(where, f"commit point body is missing or mistypes a field: {exc!r}") from None


def commit_file_name(generation: int) -> str:
    """``segments_<generation>``."""
    if generation < 1:
        raise ValueError(f"commit generation must be >= 1, got {generation}")
    return f"{COMMIT_PREFIX}{generation}"


def parse_commit_file_name(name: str) -> int | None:
    """The generation of a ``segments_N`` name, or None for any other file."""
    m = _COMMIT_RE.match(name)
    return int(m.group(1)) if m else None


def write_commit(directory: str, commit: CommitPoint) -> str:
    """Write ``segments_N`` atomically into ``directory``; returns its path."""
    write_atomic(directory, commit.file_name, commit.encode())
    return os.path.join(directory, commit.file_name)


def read_commit(directory: str, generation: int) -> CommitPoint:
    """Read and verify ``segments_<generation>`` of ``directory``."""
    path = os.path.join(directory, commit_file_name(generation))
    with open(path, "rb") as f:
        data = f.read()
    commit = CommitPoint.decode(data, path)
    if commit.generation != generation:
        raise SegmentCorrupted(path, f"file name says generation {generation}, the record says {commit.generation}")
    return commit


def list_commit_generations(directory: str) -> list[int]:
    """Generations of the ``segments_N`` files in ``directory``, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(g for g in (parse_commit_file_name(n) for n in names) if g is not None)
