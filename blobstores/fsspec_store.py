"""Shared plumbing of the cloud backends built on fsspec filesystems (s3fs, gcsfs, adlfs).

Each backend supplies the filesystem, its error classification, a hook that reports
every HTTP request (so metrics count what went on the wire), and the operations whose
native form matters (conditional put with a writer token, stat with metadata, paged
listing with ``start_after``, batched delete, version-pinned ranged reads).  The SDKs'
own retry loops are turned off by each backend so that
:class:`~shardstore.blobstores.retrying.RetryingStore` is the one place that decides
about retries, and sees every throttle.  Each store owns its filesystem (no fsspec
instance cache), so ``close()`` really closes its sessions.

Typed errors name no credential: their text is redacted (the store's secret options in
every form, every registered secret, credentials known by name such as ``sig=``) before
it is shortened, and they chain the SDK's exception only when no link of its chain names
one; otherwise a :class:`~shardstore.blobstores.redact.RedactedException` summing it up
stands in for it, and nothing else is chained (see :meth:`FsspecStore._translate`).
"""

from __future__ import annotations

import abc
import asyncio
import io
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, BinaryIO, TypeVar

from fsspec.asyn import sync

from shardstore.blobstores import redact
from shardstore.blobstores.backend import BackendStore
from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.errors import (
    AccessDenied,
    BlobAlreadyExists,
    BlobChanged,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    RequestRejected,
    Throttled,
    TransientError,
    Unreachable,
)
from shardstore.blobstores.keys import check_full_length, check_range
from shardstore.blobstores.request_kinds import classify_request
from shardstore.blobstores.streams import RangeReader

T = TypeVar("T")

#: Block size of streamed reads and writes (multipart part size for writes).
STREAM_BLOCK = 16 * 1024 * 1024
#: A stream of at most this many bytes is sent as one conditional PUT, not a multipart/resumable upload
#: (3+ requests, one after the other): 64 MiB, the Azure SDK's single-put limit and the size above which
#: the segment store streams a file instead of holding it (a 22 MB translog generation of a whole-table
#: bulk took 4 requests on moto S3 as a multipart upload).
SINGLE_PUT_MAX = 64 * 1024 * 1024


class RangeNotSatisfiable(Exception):
    """Internal marker: the service answered 416 (start at or past the end)."""


#: What an HTTP status means when the service's own error code says nothing more.
KIND_BY_STATUS = {
    401: "denied", 403: "denied", 404: "not_found", 408: "transient", 412: "exists", 416: "range",
    429: "throttled", 500: "transient", 502: "transient", 503: "throttled", 504: "transient",
}


class FsspecStore(BackendStore):
    """Base of stores that talk to a service through an fsspec filesystem."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._fs: Any = None
        self._fs_lock = threading.Lock()

    # -- to be provided by each backend --------------------------------------------------

    @abc.abstractmethod
    def _make_fs(self) -> Any:
        """Build this store's own filesystem (SDK retries off, request hook installed)."""

    @abc.abstractmethod
    def _classify(self, exc: BaseException, key: str | None) -> Any:
        """Map a service-specific exception to a typed error (None: not recognised)."""

    def _read(self, key: str, start: int | None, length: int | None, version: str | None = None) -> bytes:
        """One GET of the object or a range of it, pinned to ``version`` when given."""
        path = self._path(key)
        extra = self._pin_kwargs(version) if version else {}
        if start is None:
            data = self._call(key, self.fs.cat_file, path, **extra)
        else:
            data = self._call(key, self.fs.cat_file, path, start=start, end=start + (length or 0), **extra)
        self._metrics.add("bytes_in", len(data))
        return data

    def _pin_kwargs(self, version: str) -> dict[str, Any]:
        """``cat_file`` arguments that make a read fail if the blob is no longer ``version``."""
        return {}

    def _stream_kwargs(self, token: str | None) -> dict[str, Any]:
        """Extra keyword arguments for ``fs.open`` in write mode (metadata, where supported)."""
        return {}

    def _close_fs(self, fs: Any) -> None:
        """Close the filesystem's HTTP sessions (best effort)."""

    # -- plumbing -----------------------------------------------------------------------

    @property
    def fs(self) -> Any:
        """The filesystem, created on first use (stores pickle without it)."""
        if self._fs is None:
            with self._fs_lock:
                if self._fs is None:
                    # A failure: a ConfigError redacted before it is shortened, chaining nothing.
                    self._fs = redact.set_up_client(self, self._make_fs, self._extra_secrets())
        return self._fs

    def _extra_secrets(self) -> list[str]:
        """Secrets a plugin derives from its options beyond the option values (Azure: parts of a SAS)."""
        return []

    @property
    def _secrets(self) -> list[str]:
        """This store's secret option values (computed once: the options never change)."""
        cached = self.__dict__.get("_secret_values")
        if cached is None:
            cached = self.__dict__["_secret_values"] = redact.store_secrets(self)
        return cached

    def _on_request(self, method: str, url: str) -> None:
        """Count one HTTP request the SDK is about to send."""
        self._metrics.request(classify_request(method, url))

    def _run(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """Run a coroutine function on the filesystem's event loop."""
        return sync(self.fs.loop, fn, *args, **kwargs)

    def _path(self, key: str) -> str:
        """``bucket/root/key`` for a validated key."""
        self._check(key)
        check_full_length(self.url.prefix, key, location=self.location)
        return f"{self.url.bucket}/{self._full(key)}"

    def _redact(self, text: str, *, cut: bool = False) -> str:
        """``text`` with every secret (this store's options, registered ones, named ones) replaced.

        Any form of them: as given and URL-encoded.  ``cut``: ``text`` may have been cut
        short already, so a tail that starts a secret goes too.
        """
        return redact.redact(text, self._secrets, cut=cut)

    def _translate(self, exc: BaseException, key: str | None) -> BaseException:
        """The typed error for ``exc``, its ``__cause__`` ``exc`` or, if its chain names a secret, a redacted summary.

        Raise the result outside the ``except`` block that caught ``exc``, so ``exc`` does
        not become its ``__context__`` either.
        """
        err = self._error(exc, key)
        if err is not exc:
            err.__cause__ = redact.safe_cause(exc, self._secrets)  # also suppresses __context__
        return err

    def _error(self, exc: BaseException, key: str | None) -> BaseException:
        """Translate any exception raised by the SDK or fsspec into a typed error."""
        if isinstance(exc, (BlobStoreError, RangeNotSatisfiable)):
            return exc
        for cause in _chain(exc):
            found = self._classify(cause, key)
            if found is not None:
                return found if isinstance(found, BaseException) else found()
        where = {"location": self.location, "key": key}
        text = redact.shorten(self._redact(redact.text_of(exc))) or type(exc).__name__  # redacted before cut
        if isinstance(exc, FileNotFoundError):
            return BlobNotFound("no such blob", **where)
        if isinstance(exc, FileExistsError):
            return BlobAlreadyExists("the key already exists", **where)
        if isinstance(exc, PermissionError) or any(type(c).__name__ == "NoCredentialsError" for c in _chain(exc)):
            # botocore's NoCredentialsError: no credentials anywhere in the SDK's chain (one line: the store check)
            return AccessDenied(f"access denied: {text}", **where)
        if any(isinstance(cause, ConnectionRefusedError) for cause in _chain(exc)):
            return Unreachable(f"nothing answers at the endpoint (connection refused): {text}", **where)
        if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError)) or _is_transport_error(exc):
            return TransientError(f"connection problem: {type(exc).__name__}: {text}", **where)
        return RequestRejected(f"{type(exc).__name__}: {text}", **where)

    def _typed(self, kind: str | None, status: int | None, detail: str, key: str | None) -> Any:
        """The typed error for a service answer: ``kind`` from its error code, else from its status."""
        kind = kind or KIND_BY_STATUS.get(status or 0)
        if kind is None and status is not None and status >= 500:
            kind = "transient"
        where = {"location": self.location, "key": key}
        detail = self._redact(detail, cut=True)  # callers may have cut it short already
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
        }.get(kind or "", lambda: RequestRejected(f"request refused ({detail})", **where))
        return make()

    def _call(self, key: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` and translate what it raises (see :meth:`_translate`)."""
        try:
            return fn(*args, **kwargs)
        except (BlobStoreError, RangeNotSatisfiable):
            raise
        except Exception as exc:
            failure = self._translate(exc, key)
        raise failure  # out of the except block: the SDK's exception is not its __context__

    # -- shared operations ----------------------------------------------------------------

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
        """A seekable stream of ranged GETs of ``STREAM_BLOCK`` bytes, pinned to one version.

        One HEAD up front (BlobNotFound for a missing key), then one GET per block; a blob
        replaced while the stream reads it raises BlobChanged rather than mixing versions.
        """
        info = self.stat(key)

        def fetch(start: int, length: int) -> bytes:
            try:
                return self._read(key, start, length, info.etag_or_generation)
            except (BlobAlreadyExists, BlobNotFound) as exc:  # the pinned version is gone
                raise BlobChanged("the blob was replaced or deleted while being read",
                                  location=self.location, key=key) from exc
            except RangeNotSatisfiable:
                return b""

        raw = RangeReader(fetch, info.size, STREAM_BLOCK)
        return io.BufferedReader(raw, buffer_size=STREAM_BLOCK)  # type: ignore[return-value]

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Stream into a multipart/resumable upload; small streams become one conditional put.

        A failure part-way (source or service) aborts the upload, so nothing partial is
        ever published.
        """
        path = self._path(key)
        first = read_full(readable, SINGLE_PUT_MAX)
        if len(first) < SINGLE_PUT_MAX:
            # Small enough to hold: the native conditional put, with the writer token.
            # (This also avoids the s3fs trap where an empty "xb" upload truncates.)
            return self.put(key, first, if_absent=if_absent, token=token)
        f = self._call(key, self.fs.open, path, "xb" if if_absent else "wb", block_size=STREAM_BLOCK,
                       **self._stream_kwargs(token))
        size = 0
        failure: BaseException | None = None
        try:
            chunk = first
            while chunk:
                f.write(chunk)
                size += len(chunk)
                chunk = read_full(readable, STREAM_BLOCK)
            f.close()  # completes the upload (the condition is checked here)
        except BaseException as exc:
            _discard(f)
            if not isinstance(exc, Exception) or isinstance(exc, BlobStoreError):
                raise
            failure = self._translate(exc, key)
        if failure is not None:
            raise failure  # out of the except block (see _call)
        self._metrics.add("bytes_out", size)
        return self.stat(key)

    def close(self) -> None:
        """Close this store's HTTP sessions (the next call opens new ones)."""
        with self._fs_lock:
            fs, self._fs = self._fs, None
        if fs is not None:
            try:
                self._close_fs(fs)
            except Exception:  # closing is best effort; nothing is lost
                pass


def read_full(readable: BinaryIO, size: int) -> bytes:
    """Read until ``size`` bytes or the end of the stream (sources may return short reads)."""
    parts, got = [], 0
    while got < size:
        data = readable.read(size - got)
        if not data:
            break
        parts.append(data)
        got += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _discard(f: Any) -> None:
    """Abort an unfinished upload (S3 multipart abort, GCS resumable cancel) and drop the file."""
    try:
        f.discard()
    except Exception:  # the upload may never have started; nothing to abort
        pass
    f.closed = True


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__




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
