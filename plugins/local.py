"""``file:///dir``: the local filesystem, the embedded default store.

Every put writes a temporary file under ``<root>/.shardstore-tmp/``, fsyncs it, then
publishes it atomically: ``os.replace`` for a plain put, ``os.link`` for a conditional
create (link fails if the name exists, so exactly one racer wins), and fsyncs the
directory.  A reader therefore never sees a partial blob.  See
docs/design/blobstores.md, "Local filesystem".

Limits of the filesystem: a key cannot also be a prefix directory of other keys (``a``
and ``a/b`` cannot both exist); such a put raises InvalidKey.  There is no user
metadata, so an ambiguous conditional retry is resolved by comparing bytes.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from shardstore.blobstores.backend import BackendStore
from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.errors import (
    AccessDenied,
    BlobAlreadyExists,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    InvalidKey,
    TransientError,
)
from shardstore.blobstores.keys import check_range
from shardstore.blobstores.options import Option
from shardstore.blobstores.streams import CountingReader

TMP_DIR = ".shardstore-tmp"
COPY_CHUNK = 8 * 1024 * 1024


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStore(BackendStore):
    """Blobs as files under a root directory, published atomically."""

    scheme = "file"
    OPTIONS = {
        "fsync": Option("fsync", bool, True, "fsync files and directories on put (off only for scratch data)"),
        "create": Option("create", bool, True, "create the root directory if it is missing"),
    }

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.root = self.url.prefix
        if self.options["create"]:
            os.makedirs(self.root, exist_ok=True)
        elif not os.path.isdir(self.root):
            raise ConfigError("the root directory does not exist (pass create=true)", location=self.location)
        self._tmp = os.path.join(self.root, TMP_DIR)
        os.makedirs(self._tmp, exist_ok=True)

    # -- helpers -------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        self._check(key)
        if key.split("/", 1)[0] == TMP_DIR:
            raise InvalidKey(f"keys under {TMP_DIR}/ are reserved by the local store", location=self.location, key=key)
        return os.path.join(self.root, key)

    def _error(self, exc: OSError, key: str | None) -> BlobStoreError:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
            return BlobNotFound("no such blob", location=self.location, key=key)
        if isinstance(exc, PermissionError):
            return AccessDenied(f"permission denied ({exc.strerror})", location=self.location, key=key)
        if exc.errno in (errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ENOSPC):
            return TransientError(f"{exc.strerror}", location=self.location, key=key)
        return BlobStoreError(f"{type(exc).__name__}: {exc.strerror or exc}", location=self.location, key=key)

    def _fsync_dir(self, path: str) -> None:
        if not self.options["fsync"]:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, fill: Any) -> tuple[str, os.stat_result]:
        """Write a complete, fsynced temp file; its stat (the inode survives link/rename)."""
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        try:
            f = open(tmp, "xb")
        except FileNotFoundError:  # the temp directory was removed under us
            os.makedirs(self._tmp, exist_ok=True)
            f = open(tmp, "xb")
        with f:
            fill(f)
            f.flush()
            if self.options["fsync"]:
                os.fsync(f.fileno())
            return tmp, os.fstat(f.fileno())

    def _publish(self, key: str, tmp: str, if_absent: bool) -> None:
        """Move a complete temp file to ``key``: link (conditional) or rename, then fsync the dir."""
        target = self._path(key)
        parent = os.path.dirname(target)
        try:
            self._link_or_replace(tmp, target, parent, if_absent)
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
            if os.path.isdir(target):
                raise self._collision(key, "a key cannot also be a prefix of other keys") from None
            if not os.path.isdir(parent):
                raise self._collision(key, "a parent of this key is itself a blob") from None
            if isinstance(exc, FileExistsError):
                raise BlobAlreadyExists("the key already exists", location=self.location, key=key) from None
            raise self._error(exc, key) from exc
        except OSError as exc:
            raise self._error(exc, key) from exc
        finally:
            if if_absent or os.path.exists(tmp):  # a link leaves the temp name; a failed rename too
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        self._fsync_dir(parent)

    @staticmethod
    def _link_or_replace(tmp: str, target: str, parent: str, if_absent: bool) -> None:
        # The parent is created only when missing; a concurrent delete may prune it
        # between makedirs and the link, so try again a few times.
        for _ in range(8):
            try:
                if if_absent:
                    os.link(tmp, target)
                else:
                    os.replace(tmp, target)
                return
            except FileNotFoundError:
                if not os.path.exists(tmp):
                    raise
                os.makedirs(parent, exist_ok=True)
        raise TransientError(f"the directory {parent} kept disappearing under concurrent deletes")

    def _collision(self, key: str, what: str) -> InvalidKey:
        return InvalidKey(f"on the local filesystem {what}", location=self.location, key=key)

    # -- the interface -------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Write atomically (temp file, fsync, link or rename, fsync of the directory)."""
        self._path(key)
        self._metrics.request("put")
        view = memoryview(data)
        try:
            tmp, st = self._write_temp(lambda f: f.write(view))
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._publish(key, tmp, if_absent)
        self._metrics.add("bytes_out", st.st_size)
        return BlobInfo(key, st.st_size, _etag(st))

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Copy the stream into a temp file in 8 MiB chunks, then publish it atomically."""
        self._path(key)
        self._metrics.request("put")

        try:
            tmp, st = self._write_temp(lambda f: shutil.copyfileobj(readable, f, COPY_CHUNK))
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._publish(key, tmp, if_absent)
        self._metrics.add("bytes_out", st.st_size)
        return BlobInfo(key, st.st_size, _etag(st))

    def get(self, key: str) -> bytes:
        """Read the whole file."""
        path = self._path(key)
        self._metrics.request("get")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._metrics.add("bytes_in", len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read ``length`` bytes at ``start`` with one pread."""
        path = self._path(key)
        check_range(start, length, location=self.location, key=key)
        self._metrics.request("get")
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, length, start) if length else b""
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._metrics.add("bytes_in", len(data))
        return data

    def open_read(self, key: str) -> BinaryIO:
        """Open the file for buffered reading."""
        path = self._path(key)
        self._metrics.request("get")
        try:
            f = open(path, "rb", buffering=0)
        except OSError as exc:
            raise self._error(exc, key) from exc
        return CountingReader(f, self._metrics, lambda e: self._error(e, key))  # type: ignore[return-value]

    def stat(self, key: str) -> BlobInfo:
        """Size and a version tag (inode, mtime, size) of the file."""
        path = self._path(key)
        self._metrics.request("head")
        try:
            st = os.stat(path)
        except OSError as exc:
            raise self._error(exc, key) from exc
        if not os.path.isfile(path):
            raise BlobNotFound("no such blob (a directory of keys is there)", location=self.location, key=key)
        return BlobInfo(key, st.st_size, _etag(st))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Walk the tree in key order, pruning directories outside the prefix or before start_after."""
        self._check_prefix(prefix)
        self._metrics.request("list")
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        yield from self._walk(base, prefix, start_after)

    def _walk(self, rel_dir: str, prefix: str, start_after: str | None) -> Iterator[BlobInfo]:
        path = os.path.join(self.root, rel_dir) if rel_dir else self.root
        try:
            with os.scandir(path) as it:
                entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise self._error(exc, rel_dir or None) from exc
        # Sorting a directory's names with a '/' after sub-directories gives global key order.
        entries.sort(key=lambda pair: pair[0])
        head = rel_dir + "/" if rel_dir else ""
        for name, entry in entries:
            rel = head + name
            if not rel_dir and name == TMP_DIR + "/":
                continue
            if name.endswith("/"):
                # rel is "dir/": every key under it starts with rel.
                if not (rel.startswith(prefix) or prefix.startswith(rel)):
                    continue
                if start_after is not None and not start_after.startswith(rel) and rel < start_after:
                    continue
                yield from self._walk(rel[:-1], prefix, start_after)
                continue
            if not rel.startswith(prefix) or (start_after is not None and rel <= start_after):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we walked
            yield BlobInfo(rel, st.st_size, _etag(st))

    def delete(self, keys: Iterable[str]) -> None:
        """Unlink each file (missing ones ignored) and prune directories left empty."""
        paths = [self._path(k) for k in keys]
        self._metrics.request("delete")
        parents = set()
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except IsADirectoryError:
                continue
            except OSError as exc:
                raise self._error(exc, os.path.relpath(path, self.root)) from exc
            parents.add(os.path.dirname(path))
        for parent in sorted(parents, key=len, reverse=True):
            while parent != self.root and parent.startswith(self.root):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)
