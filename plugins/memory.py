"""``memory://name/prefix``: an in-process store, shared by every store of the same name.

For tests and embedding.  Stores opened with the same name in one process see the same
blobs (so a pickled store that is unpickled in the same process sees them too); another
process sees an empty store.  Conditional create is decided under a lock.
"""

from __future__ import annotations

import bisect
import io
import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from shardstore.blobstores.backend import BackendStore
from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.blobstores.keys import check_range
from shardstore.blobstores.options import Option

PAGE = 1000


class _Space:
    """One named key space: blobs plus a sorted key list for ordered listing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generation = itertools.count(1)
        self.blobs: dict[str, tuple[bytes, str, str | None]] = {}
        self.keys: list[str] = []


_SPACES: dict[tuple[str, str], _Space] = {}
_SPACES_LOCK = threading.Lock()


def _space(scheme: str, name: str) -> _Space:
    with _SPACES_LOCK:
        return _SPACES.setdefault((scheme, name), _Space())


class MemoryStore(BackendStore):
    """A process-local store kept in a dict; the reference implementation of the contract."""

    scheme = "memory"
    OPTIONS = {"page_size": Option("page_size", int, PAGE, "keys per list page")}

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._space = _space(self.url.scheme, self.url.bucket)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Store a copy of ``data``; conditional create is atomic under the space's lock."""
        full = self._full(self._check(key))
        data = bytes(data)
        self._metrics.request("put")
        sp = self._space
        with sp.lock:
            etag = str(next(sp.generation))  # like a GCS generation: new on every write
            if full in sp.blobs:
                if if_absent:
                    raise BlobAlreadyExists("the key already exists", location=self.location, key=key)
            else:
                bisect.insort(sp.keys, full)
            sp.blobs[full] = (data, etag, token)
        self._metrics.add("bytes_out", len(data))
        return BlobInfo(key, len(data), etag, token)

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Read the stream to its end, then put."""
        return self.put(key, readable.read(), if_absent=if_absent, token=token)

    def _entry(self, key: str, kind: str) -> tuple[bytes, str, str | None]:
        full = self._full(self._check(key))
        self._metrics.request(kind)
        with self._space.lock:
            entry = self._space.blobs.get(full)
        if entry is None:
            raise BlobNotFound("no such blob", location=self.location, key=key)
        return entry

    def get(self, key: str) -> bytes:
        """Return the blob's bytes."""
        data = self._entry(key, "get")[0]
        self._metrics.add("bytes_in", len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Return ``length`` bytes from ``start`` (fewer at the end)."""
        check_range(start, length, location=self.location, key=key)
        data = self._entry(key, "get")[0][start : start + length]
        self._metrics.add("bytes_in", len(data))
        return data

    def open_read(self, key: str) -> BinaryIO:
        """A BytesIO over the blob."""
        return io.BytesIO(self.get(key))

    def stat(self, key: str) -> BlobInfo:
        """Size, etag and writer token of the blob."""
        data, etag, writer = self._entry(key, "head")
        return BlobInfo(key, len(data), etag, writer)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Yield blobs in key order, a page at a time (one list request per page)."""
        self._check_prefix(prefix)
        root = self.url.prefix + "/" if self.url.prefix else ""
        full_prefix = root + prefix
        cursor = root + start_after if start_after is not None and start_after >= prefix else None
        page = self.options["page_size"]
        sp = self._space
        while True:
            self._metrics.request("list")
            with sp.lock:
                i = bisect.bisect_right(sp.keys, cursor) if cursor else bisect.bisect_left(sp.keys, full_prefix)
                batch = []
                for k in sp.keys[i : i + page]:
                    if not k.startswith(full_prefix):
                        break
                    data, etag, writer = sp.blobs[k]
                    batch.append(BlobInfo(k[len(root):], len(data), etag, writer))
            yield from batch
            if len(batch) < page:
                return
            cursor = root + batch[-1].key

    def delete(self, keys: Iterable[str]) -> None:
        """Remove the keys; missing keys are ignored."""
        full = [self._full(self._check(k)) for k in keys]
        sp = self._space
        for start in range(0, len(full), PAGE):
            self._metrics.request("delete")
            with sp.lock:
                for k in full[start : start + PAGE]:
                    if sp.blobs.pop(k, None) is not None:
                        del sp.keys[bisect.bisect_left(sp.keys, k)]

    @classmethod
    def drop(cls, name: str) -> None:
        """Forget every blob of the memory space ``name``."""
        with _SPACES_LOCK:
            _SPACES.pop((cls.scheme, name), None)

