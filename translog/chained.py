"""A round's data blob as one seekable stream over bytes in memory and regions of local files (issue 46).

A node round's data blob is its sections one after the other, then the index and trailer.
A section read back from a sealed local generation file need not be read into memory: the
stream reads it from the file as the store's ``put_stream`` asks, in chunks, so uploading a
1 GB sealed generation holds a chunk at a time.  Seekable (to its start, or anywhere): a
retried upload (``RetryingStore.put_stream``) reads it again from the beginning.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardstore.blobstores.fsspec_store import read_full
from shardstore.translog.records import crc32c

#: bytes read from a file per call (checksums, frame checks and uploads alike)
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileRegion:
    """``length`` bytes of the file at ``path`` from offset 0."""

    path: str
    length: int


Part = bytes | bytearray | memoryview | FileRegion


def part_size(part: Part) -> int:
    """How many bytes a part holds."""
    return part.length if isinstance(part, FileRegion) else len(part)


def file_crc32c(path: str, length: int) -> int:
    """The CRC32C of the first ``length`` bytes of ``path``, read a chunk at a time (OSError if it is shorter)."""
    crc = 0
    with open(path, "rb") as f:
        left = length
        while left:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                raise OSError(f"{path}: ends {left} bytes before the {length} expected")
            crc = crc32c(chunk, crc)
            left -= len(chunk)
    return crc


class ChainedReader(io.RawIOBase):
    """The concatenation of ``parts`` as a read-only, seekable binary stream."""

    def __init__(self, parts: Sequence[Part]) -> None:
        super().__init__()
        self._parts = list(parts)
        self._starts: list[int] = []
        total = 0
        for p in self._parts:
            self._starts.append(total)
            total += part_size(p)
        self.size = total
        self._pos = 0
        self._files: dict[str, Any] = {}

    def readable(self) -> bool:
        """Always."""
        return True

    def seekable(self) -> bool:
        """Always."""
        return True

    def tell(self) -> int:
        """The current position."""
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to ``offset`` (from the start, the current position or the end)."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the part holding the current position (at most that part's rest)."""
        view = memoryview(buffer).cast("B")
        data = self._read_part(len(view))
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        """Exactly ``size`` bytes (fewer only at the end), across parts: an SDK that announces a length and reads it
        in one call (Azure's upload_blob) must get all of it, or the request waits for bytes that never come.  One
        copy of the bytes read (a 1 GB upload holds a chunk at a time)."""
        left = self.size - self._pos
        return read_full(_PartReader(self._read_part), left if size is None or size < 0 else min(size, left))

    def _read_part(self, n: int) -> bytes:
        """Up to ``n`` bytes of the part holding the current position."""
        if self._pos >= self.size or n <= 0:
            return b""
        i = self._index(self._pos)
        part, within = self._parts[i], self._pos - self._starts[i]
        k = min(n, part_size(part) - within)
        if isinstance(part, FileRegion):
            f = self._files.get(part.path)
            if f is None:
                f = self._files[part.path] = open(part.path, "rb")  # noqa: SIM115 - closed by close()
            f.seek(within)
            data = f.read(k)
            if not data:
                raise OSError(f"{part.path}: ends at {within}, {part.length} bytes expected")
        else:
            data = bytes(memoryview(part).cast("B")[within : within + k])
        self._pos += len(data)
        return data

    def _index(self, pos: int) -> int:
        lo, hi = 0, len(self._starts) - 1
        while lo < hi:  # the last part starting at or before pos (parts of size 0 are skipped over)
            mid = (lo + hi + 1) // 2
            if self._starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        while part_size(self._parts[lo]) == 0 or pos - self._starts[lo] >= part_size(self._parts[lo]):
            lo += 1
        return lo

    def close(self) -> None:
        """Close the files opened for reading."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        super().close()


class _PartReader:
    """``read(n)``: one part's bytes at most (what :func:`read_full` loops over)."""

    def __init__(self, read: Any) -> None:
        self.read = read


__all__ = ["CHUNK", "ChainedReader", "FileRegion", "Part", "file_crc32c", "part_size"]
