"""Shared plumbing of the cloud backends built on fsspec filesystems (s3fs, gcsfs, adlfs).

Each backend supplies the filesystem, its error classification and the operations whose
native form matters (conditional put with a writer token, stat with metadata, paged
listing with ``start_after``, batched delete).  The SDKs' own retry loops are turned
off by each backend so that :class:`~shardstore.blobstores.retrying.RetryingStore` is
the one place that decides about retries, and sees every throttle.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, BinaryIO, TypeVar

from fsspec.asyn import sync

from shardstore.blobstores.backend import BackendStore
from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.errors import (
    AccessDenied,
    BlobAlreadyExists,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    Throttled,
    TransientError,
)
from shardstore.blobstores.keys import check_range
from shardstore.blobstores.streams import CountingReader

T = TypeVar("T")

#: Block size of streamed reads and writes (multipart part size for writes).
STREAM_BLOCK = 16 * 1024 * 1024


class RangeNotSatisfiable(Exception):
    """Internal marker: the service answered 416 (start at or past the end)."""


#: What an HTTP status means when the service's own error code says nothing more.
KIND_BY_STATUS = {
    401: "denied", 403: "denied", 404: "not_found", 408: "transient", 412: "exists", 416: "range",
    429: "throttled", 500: "transient", 502: "transient", 503: "throttled", 504: "transient",
}


class FsspecStore(BackendStore):
    """Base of stores that talk to a service through an fsspec filesystem."""

    #: Extra ``cat_file`` arguments that make a whole-object get one request.
    _whole_get_kwargs: dict[str, Any] = {}
    #: Requests a streamed upload makes besides one per part (initiate, complete).
    _stream_extra_requests = 2

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._fs: Any = None
        self._fs_lock = threading.Lock()

    # -- to be provided by each backend --------------------------------------------------

    @abc.abstractmethod
    def _make_fs(self) -> Any:
        """Build the fsspec filesystem (SDK retries off)."""

    @abc.abstractmethod
    def _classify(self, exc: BaseException, key: str | None) -> BlobStoreError | type[RangeNotSatisfiable] | None:
        """Map a service-specific exception to a typed error (None: not recognised)."""

    # -- plumbing -----------------------------------------------------------------------

    @property
    def fs(self) -> Any:
        """The filesystem, created on first use (stores pickle without it)."""
        if self._fs is None:
            with self._fs_lock:
                if self._fs is None:
                    self._fs = self._make_fs()
        return self._fs

    def _run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Run a coroutine function on the filesystem's event loop."""
        return sync(self.fs.loop, fn, *args, **kwargs)

    def _path(self, key: str) -> str:
        """``bucket/root/key`` for a validated key."""
        return f"{self.url.bucket}/{self._full(self._check(key))}"

    def _error(self, exc: BaseException, key: str | None) -> BaseException:
        """Translate any exception raised by the SDK or fsspec into a typed error."""
        if isinstance(exc, BlobStoreError):
            return exc
        for cause in _chain(exc):
            found = self._classify(cause, key)
            if found is not None:
                return found if isinstance(found, BaseException) else found()
        where = {"location": self.location, "key": key}
        if isinstance(exc, FileNotFoundError):
            return BlobNotFound("no such blob", **where)
        if isinstance(exc, FileExistsError):
            return BlobAlreadyExists("the key already exists", **where)
        if isinstance(exc, PermissionError):
            return AccessDenied(f"access denied: {_short(exc)}", **where)
        if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return TransientError(f"connection problem: {_short(exc)}", **where)
        if _is_transport_error(exc):
            return TransientError(f"transport error: {_short(exc)}", **where)
        return BlobStoreError(f"{type(exc).__name__}: {_short(exc)}", **where)

    def _typed(self, kind: str | None, status: int | None, detail: str, key: str | None) -> Any:
        """The typed error for a service answer: ``kind`` from its error code, else from its status."""
        kind = kind or KIND_BY_STATUS.get(status or 0)
        where = {"location": self.location, "key": key}
        if kind == "range":
            return RangeNotSatisfiable
        if kind == "bucket_missing":
            return ConfigError(f"the bucket/container {self.url.bucket!r} does not exist ({detail})", **where)
        make = {
            "not_found": lambda: BlobNotFound("no such blob", **where),
            "exists": lambda: BlobAlreadyExists(f"the key already exists ({detail})", **where),
            "throttled": lambda: Throttled(f"throttled by the service ({detail})", **where),
            "transient": lambda: TransientError(f"transient service error ({detail})", **where),
            "denied": lambda: AccessDenied(f"access denied ({detail})", **where),
        }.get(kind or "", lambda: BlobStoreError(f"request failed ({detail})", **where))
        return make()

    def _call(self, key: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` and translate what it raises."""
        try:
            return fn(*args, **kwargs)
        except BlobStoreError:
            raise
        except Exception as exc:
            raise self._error(exc, key) from exc

    # -- shared operations ----------------------------------------------------------------

    def _read(self, key: str, start: int | None, length: int | None) -> bytes:
        """One GET of the object or of a range of it (backends may override)."""
        path = self._path(key)
        self._metrics.request("get")
        if start is None:
            data = self._call(key, self.fs.cat_file, path, **self._whole_get_kwargs)
        else:
            data = self._call(key, self.fs.cat_file, path, start=start, end=start + (length or 0))
        self._metrics.add("bytes_in", len(data))
        return data

    def get(self, key: str) -> bytes:
        """One GET of the whole object."""
        return self._read(self._check(key), None, None)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """One ranged GET; a start past the end yields b""."""
        self._check(key)
        check_range(start, length, location=self.location, key=key)
        if length == 0:
            self.stat(key)  # existence still matters: BlobNotFound for a missing key
            return b""
        try:
            return self._read(key, start, length)
        except RangeNotSatisfiable:
            return b""

    def open_read(self, key: str) -> BinaryIO:
        """A seekable stream reading ``STREAM_BLOCK`` bytes per ranged GET.

        The stat up front makes a missing key (or a bare prefix) fail here with
        BlobNotFound, and hands the size to fsspec so it does not look the object up again.
        """
        info = self.stat(key)
        f = self._call(
            key, self.fs.open, self._path(key), "rb", block_size=STREAM_BLOCK, cache_type="readahead", size=info.size
        )
        self._metrics.request("get")
        return CountingReader(f, self._metrics, lambda e: self._error(e, key))  # type: ignore[return-value]

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Stream into a multipart/resumable upload; small streams become one conditional put."""
        path = self._path(key)
        first = readable.read(STREAM_BLOCK)
        if len(first) < STREAM_BLOCK:
            # Small enough to hold: the native conditional put, with the writer token.
            # (This also avoids the s3fs trap where an empty "xb" upload truncates.)
            return self.put(key, first, if_absent=if_absent, token=token)
        mode = "xb" if if_absent else "wb"
        size = 0
        try:
            with self.fs.open(path, mode, block_size=STREAM_BLOCK, **self._stream_kwargs(token)) as f:
                chunk = first
                while chunk:
                    f.write(chunk)
                    size += len(chunk)
                    self._metrics.request("put")
                    chunk = readable.read(STREAM_BLOCK)
        except Exception as exc:
            raise self._error(exc, key) from exc
        finally:
            self._metrics.request("put", self._stream_extra_requests)
        self._metrics.add("bytes_out", size)
        return self.stat(key)

    def _stream_kwargs(self, token: str | None) -> dict[str, Any]:
        """Extra keyword arguments for ``fs.open`` in write mode (metadata, where supported)."""
        return {}

    def close(self) -> None:
        """Forget the filesystem (the next call makes a new one)."""
        self._fs = None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _is_transport_error(exc: BaseException) -> bool:
    """aiohttp/botocore/azure-core connection-level failures, recognised by module and name."""
    mod = type(exc).__module__
    name = type(exc).__name__
    if mod.startswith("aiohttp") and ("Connect" in name or "Disconnect" in name or "Payload" in name
                                       or name in ("ClientOSError", "ServerTimeoutError")):
        return True
    if mod.startswith("botocore") and name in (
        "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
        "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
    ):
        return True
    if mod.startswith("azure.core") and name in ("ServiceRequestError", "ServiceResponseError", "IncompleteReadError"):
        return True
    return False
