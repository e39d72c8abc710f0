"""The repository interface every blob store implements, and the records it returns.

A store is rooted at a location (``scheme://bucket/prefix``); every key is relative to
that root and validated by :func:`shardstore.blobstores.keys.validate_key` before any
request is made.  See ``docs/design/blobstores.md`` for the contract in full.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

#: Metadata name under which a writer's token is stored with a blob (where the service
#: keeps user metadata).  It lets an ambiguous retry of a conditional put tell whether
#: the blob that is there now is its own earlier attempt.
WRITER_METADATA = "shardstore-writer"

REQUEST_KINDS = ("put", "get", "list", "delete", "head")


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """What a store knows of one blob: key (relative to the root), size and version tag."""

    key: str
    size: int
    etag_or_generation: str | None = None
    writer: str | None = field(default=None, compare=False)


class Metrics:
    """Thread-safe request and byte counters of one store (per process)."""

    __slots__ = ("_lock", "_requests", "_counters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = dict.fromkeys(REQUEST_KINDS, 0)
        self._counters = {"bytes_in": 0, "bytes_out": 0, "retries": 0, "throttles": 0}

    def request(self, kind: str, n: int = 1) -> None:
        """Count ``n`` real requests of ``kind`` (put/get/list/delete/head)."""
        with self._lock:
            self._requests[kind] += n

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to one of bytes_in, bytes_out, retries, throttles."""
        with self._lock:
            self._counters[counter] += n

    def snapshot(self) -> dict[str, Any]:
        """A copy of the counters: ``{"requests": {kind: n}, "bytes_in": ..., ...}``."""
        with self._lock:
            return {"requests": dict(self._requests), **self._counters}

    def reset(self) -> None:
        """Set every counter back to zero."""
        with self._lock:
            self._requests = dict.fromkeys(REQUEST_KINDS, 0)
            self._counters = dict.fromkeys(self._counters, 0)


class BlobStore(abc.ABC):
    """A flat key space of immutable-by-convention blobs under one root.

    Implementations are thread-safe and cheap to pickle (they pickle their location and
    options, never a live client), so Spark can ship them to executors.
    """

    #: URL scheme this class serves (set by each plugin).
    scheme: str = ""
    #: Whether the store keeps a put's writer token with the blob (``BlobInfo.writer``).
    keeps_writer_tokens: bool = True

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """``scheme://bucket/prefix`` of the root: safe to print, holds no credential."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Write ``data`` at ``key``; with ``if_absent`` raise BlobAlreadyExists if it exists.

        ``token`` is stored with the blob where the service keeps metadata, so that an
        ambiguous retry can recognise its own write (see ``conditional.py``).
        """

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole blob; BlobNotFound if missing."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Return up to ``length`` bytes from offset ``start`` (short at the end of the blob)."""

    @abc.abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """Open the blob for streaming reads (a seekable binary file object)."""

    @abc.abstractmethod
    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Write everything ``readable.read()`` yields at ``key`` without holding it in memory."""

    @abc.abstractmethod
    def stat(self, key: str) -> BlobInfo:
        """Return the blob's size and version tag; BlobNotFound if missing."""

    def exists(self, key: str) -> bool:
        """True if the key exists."""
        from shardstore.blobstores.errors import BlobNotFound

        try:
            self.stat(key)
        except BlobNotFound:
            return False
        return True

    @abc.abstractmethod
    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Yield blobs whose key starts with ``prefix``, in lexicographic key order."""

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete the keys (missing ones are ignored), batched per the service's limit."""

    @abc.abstractmethod
    def metrics(self) -> dict[str, Any]:
        """Requests by kind, bytes in/out, retries and throttles seen by this store object."""

    def reset_metrics(self) -> None:
        """Zero the counters returned by :meth:`metrics`."""

    def close(self) -> None:
        """Release clients and sessions (the store may be used again; it reconnects)."""

    def __enter__(self) -> BlobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"
