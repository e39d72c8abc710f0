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
