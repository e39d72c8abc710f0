"""A read stream wrapper that counts bytes and turns backend errors into typed ones."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from shardstore.blobstores.base import Metrics


class CountingReader(io.RawIOBase):
    """Wraps a backend's binary file: counts bytes read, translates exceptions."""

    def __init__(self, inner: Any, metrics: Metrics, translate: Callable[[BaseException], BaseException]) -> None:
        super().__init__()
        self._inner = inner
        self._metrics = metrics
        self._translate = translate

    def readable(self) -> bool:
        """Always readable."""
        return True

    def seekable(self) -> bool:
        """Seekable when the backend file is."""
        return bool(self._inner.seekable())

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` from the backend file."""
        try:
            n = self._inner.readinto(buffer)
        except Exception as exc:  # translated into a typed BlobStoreError
            raise self._translate(exc) from exc
        self._metrics.add("bytes_in", n or 0)
        return n or 0

    def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (all that is left when negative)."""
        try:
            data = self._inner.read(size)
        except Exception as exc:
            raise self._translate(exc) from exc
        self._metrics.add("bytes_in", len(data))
        return data

    def readall(self) -> bytes:
        """Read to the end."""
        return self.read(-1)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the read position."""
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        """The read position."""
        return self._inner.tell()

    def close(self) -> None:
        """Close the backend file."""
        if not self.closed:
            try:
                self._inner.close()
            finally:
                super().close()


class RangeReader(io.RawIOBase):
    """A seekable reader of a blob of known size, fetching ranges on demand.

    ``fetch(start, length)`` makes one ranged request; the store pins it to the version
    the stream was opened on, so a blob replaced mid-read raises BlobChanged instead of
    yielding a mix of old and new bytes.  Wrap in ``io.BufferedReader`` for small reads.
    """

    def __init__(self, fetch: Callable[[int, int], bytes], size: int, chunk: int) -> None:
        super().__init__()
        self._fetch = fetch
        self._size = size
        self._chunk = chunk
        self._pos = 0

    def readable(self) -> bool:
        """Always readable."""
        return True

    def seekable(self) -> bool:
        """Always seekable."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with one ranged fetch (at most the bytes left)."""
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._fetch(self._pos, n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        """The rest of the blob, fetched ``chunk`` bytes per request."""
        parts = []
        while self._pos < self._size:
            data = self._fetch(self._pos, min(self._chunk, self._size - self._pos))
            if not data:
                break
            parts.append(data)
            self._pos += len(data)
        return b"".join(parts)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move the read position (no request is made)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        """The read position."""
        return self._pos
