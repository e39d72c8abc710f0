"""A wrapper that refuses every write: what ``open_store(url, read_only=True)`` returns.

One behaviour per wrapper: reads pass through unchanged; ``put``, ``put_stream`` and
``delete`` raise AccessDenied before any request is made.  That the open itself creates
nothing is the plugin's part (the local store's ``read_only`` option).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from shardstore.blobstores.base import BlobInfo, BlobStore
from shardstore.blobstores.errors import AccessDenied


class ReadOnlyStore(BlobStore):
    """Serves an inner store's reads and refuses its writes."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self.scheme = inner.scheme
        self.keeps_writer_tokens = inner.keeps_writer_tokens

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadOnlyStore, (self.inner,))

    @property
    def location(self) -> str:
        """The inner store's location."""
        return self.inner.location

    def _refuse(self, op: str, key: str | None) -> AccessDenied:
        return AccessDenied(f"{op} refused: the store was opened read-only", location=self.location, key=key)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Refused: AccessDenied."""
        raise self._refuse("put", key)

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Refused: AccessDenied."""
        raise self._refuse("put", key)

    def delete(self, keys: Iterable[str]) -> None:
        """Refused: AccessDenied."""
        raise self._refuse("delete", None)

    def get(self, key: str) -> bytes:
        """The inner store's get."""
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """The inner store's get_range."""
        return self.inner.get_range(key, start, length)

    def open_read(self, key: str) -> BinaryIO:
        """The inner store's open_read."""
        return self.inner.open_read(key)

    def stat(self, key: str) -> BlobInfo:
        """The inner store's stat."""
        return self.inner.stat(key)

    def exists(self, key: str) -> bool:
        """The inner store's exists."""
        return self.inner.exists(key)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """The inner store's listing."""
        return self.inner.list(prefix, start_after=start_after)

    def metrics(self) -> dict[str, Any]:
        """The inner store's counters."""
        return self.inner.metrics()

    def reset_metrics(self) -> None:
        """Zero the inner store's counters."""
        self.inner.reset_metrics()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
