"""``file:///dir``: the local filesystem, the embedded default store.

Every put writes a temporary file under ``<root>/.shardstore-tmp/``, fsyncs it, then
publishes it atomically: ``os.replace`` for a plain put, ``os.link`` for a conditional
create (link fails if the name exists, so exactly one racer wins), and fsyncs the
directory; directories made for a new key are fsynced into their parents too.  A reader
therefore never sees a partial blob, and a published blob survives a power loss.  See
docs/design/blobstores.md, "Local filesystem".

Nothing outside the root is touched: a key that resolves outside the resolved root
through a symlink raises InvalidKey (checked just before each operation), and listings
skip such symlinks and never descend into symlinked directories.  A key cannot also be
a prefix directory of other keys (``a`` and ``a/b``); such a put raises InvalidKey.
Conditional create needs hard links: where ``link`` fails with EPERM, ENOTSUP or
EOPNOTSUPP it raises ConfigError (rename-if-absent would not be atomic).  A full disk
is a non-retryable RequestRejected.  Temp files older than an hour (from crashed
writers) are deleted on open.  A root that is not a directory, or that cannot be
created, is a ConfigError; with ``read_only`` the open creates nothing (a missing root
is a ConfigError) and writes raise AccessDenied.  There is no user metadata, so an
ambiguous conditional retry is resolved by comparing bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from stat import S_ISDIR, S_ISREG
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
    RequestRejected,
    TransientError,
)
from shardstore.blobstores.keys import check_range
from shardstore.blobstores.options import Option
from shardstore.blobstores.streams import CountingReader

TMP_DIR = ".shardstore-tmp"
COPY_CHUNK = 8 * 1024 * 1024
STALE_TEMP_SECONDS = 3600
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP})
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_O_PATH = getattr(os, "O_PATH", 0)  # Linux: a handle that neither reads nor blocks (FIFOs, devices)
_PROC_FD = "/proc/self/fd/" if _O_PATH and os.path.isdir("/proc/self/fd") else ""


def _etag(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


class LocalStore(BackendStore):
    """Blobs as files under a root directory, published atomically."""

    scheme = "file"
    keeps_writer_tokens = False  # no user metadata: ambiguous retries compare bytes
    OPTIONS = {
        "fsync": Option("fsync", bool, True, "fsync files and directories on put (off only for scratch data)"),
        "create": Option("create", bool, True, "create the root directory if it is missing"),
        "read_only": Option("read_only", bool, False, "create nothing (not the root, not the temp dir); "
                                                      "refuse writes"),
    }

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.root = self.url.prefix
        self._read_only = self.options["read_only"]
        self._open_root()
        self._real_root = os.path.realpath(self.root)
        self._real_head = os.path.join(self._real_root, "")  # with the trailing separator
        self._tmp = os.path.join(self.root, TMP_DIR)
        if os.path.islink(self._tmp):
            raise ConfigError(f"{TMP_DIR} is a symlink; temp files must stay inside the root", location=self.location)
        if not self._read_only:
            self._make_dir(self._tmp, "the temp directory")
            self._sweep_temp()

    # -- helpers -------------------------------------------------------------------------

    def _open_root(self) -> None:
        """Check that the root is a directory, creating it only when ``create`` and not ``read_only``."""
        try:
            if not S_ISDIR(os.stat(self.root).st_mode):
                raise ConfigError("the root is not a directory", location=self.location)
            return
        except FileNotFoundError:
            pass
        except NotADirectoryError:
            raise ConfigError("a part of the root's path is not a directory", location=self.location) from None
        except OSError as exc:
            raise ConfigError(f"cannot use the root directory ({exc.strerror or exc})",
                              location=self.location) from None
        if self._read_only:
            raise ConfigError("the root directory does not exist (a read-only open creates nothing)",
                              location=self.location)
        if not self.options["create"]:
            raise ConfigError("the root directory does not exist (pass create=true: ?create=true in the URL, -o "
                              "create=true on the command line)", location=self.location)
        self._make_dir(self.root, "the root directory")

    def _make_dir(self, path: str, what: str) -> None:
        """``os.makedirs``; a failure (a file in the way, /proc, permissions) is a ConfigError naming ``path``."""
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            if isinstance(exc, (FileExistsError, NotADirectoryError)):
                reason = "something that is not a directory is in the way"
            else:
                reason = exc.strerror or str(exc)
            raise ConfigError(f"cannot create {what} {path} ({reason}); the root must be a writable directory",
                              location=self.location) from None

    def _refuse_write(self, key: str | None) -> None:
        if self._read_only:
            raise AccessDenied("write refused: the store was opened read-only", location=self.location, key=key)

    def _path(self, key: str) -> str:
        self._check(key)
        if key.split("/", 1)[0] == TMP_DIR:
            raise self._invalid(key, f"keys under {TMP_DIR}/ are reserved by the local store")
        return os.path.join(self.root, key)

    def _outside(self, path: str) -> bool:
        # Linux: O_PATH open + readlink (~3 us); else, or if missing, realpath (an lstat a part, ~30 us).
        real = None
        if _PROC_FD:
            try:
                fd = os.open(path, _O_PATH)
                try:
                    real = os.readlink(f"{_PROC_FD}{fd}")
                finally:
                    os.close(fd)
            except OSError:
                pass
        if real is None:
            real = os.path.realpath(path)
        return real != self._real_root and not real.startswith(self._real_head)

    def _resolve(self, key: str, *, whole: bool) -> str:
        """The path of ``key``, checked to stay under the root: the file itself (reads) or its parent."""
        path = self._path(key)
        probe = path if whole else os.path.dirname(path)
        if probe != self.root and self._outside(probe):
            raise self._invalid(key, "resolves outside the store root through a symlink")
        return path

    def _invalid(self, key: str, what: str) -> InvalidKey:
        return InvalidKey(what, location=self.location, key=key)

    def _error(self, exc: BaseException, key: str | None) -> BlobStoreError:
        if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
            return BlobNotFound("no such blob", location=self.location, key=key)
        text = getattr(exc, "strerror", None) or str(exc)
        if isinstance(exc, PermissionError):
            return AccessDenied(f"permission denied ({text})", location=self.location, key=key)
        code = getattr(exc, "errno", None)
        if code in _NO_SPACE:  # retrying cannot help until someone frees space
            return RequestRejected(f"no space left on the device under {self.root} ({text}); free space first",
                                   location=self.location, key=key)
        if code in (errno.EAGAIN, errno.EINTR, errno.EBUSY):
            return TransientError(text, location=self.location, key=key)
        return RequestRejected(f"{type(exc).__name__}: {text}", location=self.location, key=key)

    def _fsync_dir(self, path: str) -> None:
        if self.options["fsync"]:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _sweep_temp(self) -> None:
        """Delete temp files older than STALE_TEMP_SECONDS; best effort, never fails."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        with contextlib.suppress(OSError), os.scandir(self._tmp) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)

    def _write_temp(self, fill: Any) -> tuple[str, os.stat_result]:
        """Write a complete, fsynced temp file; its stat (the inode survives link/rename)."""
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        try:
            f = open(tmp, "xb")
        except FileNotFoundError:  # the temp directory was removed under us
            os.makedirs(self._tmp, exist_ok=True)
            f = open(tmp, "xb")
        try:
            with f:
                fill(f)
                f.flush()
                if self.options["fsync"]:
                    os.fsync(f.fileno())
                return tmp, os.fstat(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _publish(self, key: str, target: str, tmp: str, if_absent: bool) -> None:
        """Move a complete temp file to ``target``: link (conditional) or rename, then fsync the dir."""
        parent = os.path.dirname(target)
        try:
            self._link_or_replace(tmp, target, parent, if_absent)
            self._fsync_dir(parent)  # an error here (EIO, ENOSPC) is typed too
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
            fs = "on the local filesystem"
            if os.path.isdir(target):
                raise self._invalid(key, f"{fs} a key cannot also be a prefix of other keys") from None
            if not os.path.isdir(parent):
                raise self._invalid(key, f"{fs} a parent of this key is itself a blob") from None
            if isinstance(exc, FileExistsError):
                raise BlobAlreadyExists("the key already exists", location=self.location, key=key) from None
            raise self._error(exc, key) from exc
        except OSError as exc:
            raise self._error(exc, key) from exc
        finally:
            if if_absent or os.path.exists(tmp):  # a link leaves the temp name; a failed rename too
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _link_or_replace(self, tmp: str, target: str, parent: str, if_absent: bool) -> None:
        # The parent is created only when missing; a concurrent delete may prune it
        # between its creation and the link, so try again a few times.
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
                self._make_parents(parent)
            except OSError as exc:
                if if_absent and exc.errno in _NO_HARD_LINKS:
                    raise ConfigError(f"the filesystem under {self.root} does not support hard links, which "
                                      f"conditional create needs ({exc.strerror})", location=self.location) from exc
                raise
        raise TransientError(f"the directory {parent} kept disappearing under concurrent deletes")

    def _make_parents(self, parent: str) -> None:
        """Create the missing directories down to ``parent``, each fsynced into its own parent."""
        missing = []
        while parent != self.root and not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made concurrently, or a blob (the link says)
                os.mkdir(path)
            self._fsync_dir(os.path.dirname(path))

    def _put(self, key: str, fill: Any, if_absent: bool) -> BlobInfo:
        target = self._resolve(key, whole=False)
        self._refuse_write(key)
        self._metrics.request("put")
        try:
            tmp, st = self._write_temp(fill)
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._publish(key, target, tmp, if_absent)
        self._metrics.add("bytes_out", st.st_size)
        return BlobInfo(key, st.st_size, _etag(st))

    # -- the interface -------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Write atomically (temp file, fsync, link or rename, fsync of the directory)."""
        view = memoryview(data)
        return self._put(key, lambda f: f.write(view), if_absent)

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Copy the stream into a temp file (in the kernel from a regular file, else in 8 MiB chunks), then publish
        it atomically."""
        return self._put(key, lambda f: _copy_stream(readable, f), if_absent)

    def get(self, key: str) -> bytes:
        """Read the whole file."""
        path = self._resolve(key, whole=True)
        self._metrics.request("get")
        try:
            with open(path, "rb") as f:  # open() refuses a directory (IsADirectoryError)
                data = f.read()
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._metrics.add("bytes_in", len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read ``length`` bytes at ``start`` with one pread."""
        path = self._resolve(key, whole=True)
        check_range(start, length, location=self.location, key=key)
        self._metrics.request("get")
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if not length and not S_ISREG(os.fstat(fd).st_mode):  # a pread would fail with EISDIR
                    raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
                data = os.pread(fd, length, start) if length else b""
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error(exc, key) from exc
        self._metrics.add("bytes_in", len(data))
        return data

    def open_read(self, key: str) -> BinaryIO:
        """Open the file for buffered reading."""
        path = self._resolve(key, whole=True)
        self._metrics.request("get")
        try:
            f = open(path, "rb", buffering=0)
        except OSError as exc:
            raise self._error(exc, key) from exc
        return CountingReader(f, self._metrics, lambda e: self._error(e, key))  # type: ignore[return-value]

    def stat(self, key: str) -> BlobInfo:
        """Size and a version tag (inode, mtime, size) of the file."""
        path = self._resolve(key, whole=True)
        self._metrics.request("head")
        try:
            st = os.stat(path)
        except OSError as exc:
            raise self._error(exc, key) from exc
        if not S_ISREG(st.st_mode):
            raise BlobNotFound("no such blob (a directory of keys is there)", location=self.location, key=key)
        return BlobInfo(key, st.st_size, _etag(st))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Walk the tree in key order, pruning directories outside the prefix or before start_after."""
        self._check_prefix(prefix)
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base:
            self._resolve(base, whole=True)  # not the temp dir, not through a symlink out of the root
        self._metrics.request("list")
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
                st = self._entry_stat(entry)
            except FileNotFoundError:
                continue  # deleted while we walked
            if st is not None:
                yield BlobInfo(rel, st.st_size, _etag(st))

    def _entry_stat(self, entry: os.DirEntry[str]) -> os.stat_result | None:
        """A listed entry's stat, or None unless it is a file (through a symlink only inside the root)."""
        if not entry.is_symlink():
            return entry.stat(follow_symlinks=False) if entry.is_file(follow_symlinks=False) else None
        try:
            st = None if self._outside(entry.path) else os.stat(entry.path)
        except OSError:  # dangling or looping
            return None
        return st if st is not None and S_ISREG(st.st_mode) else None

    def delete(self, keys: Iterable[str]) -> None:
        """Unlink each file (missing ones ignored) and prune directories left empty."""
        paths = [self._resolve(k, whole=False) for k in keys]
        self._refuse_write(None)
        self._metrics.request("delete")
        parents = set()
        for path in paths:
            try:
                os.unlink(path)  # a symlink itself is removed, never what it points to
            except (FileNotFoundError, IsADirectoryError):
                continue
            except OSError as exc:
                raise self._error(exc, os.path.relpath(path, self.root)) from exc
            parents.add(os.path.dirname(path))
        head = os.path.join(self.root, "")
        for parent in sorted(parents, key=len, reverse=True):
            while parent != self.root and parent.startswith(head):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)


def _copy_stream(readable: BinaryIO, out: BinaryIO) -> None:
    """Copy the rest of ``readable`` to ``out``: ``os.copy_file_range`` when it is a regular file (no copy through
    user space, no buffer per call: a 22 MB translog generation or segment moves page cache to page cache),
    else ``shutil.copyfileobj`` in 8 MiB chunks.  ``readable`` is left at its end, as after a read."""
    try:
        src = readable.fileno()
        regular = S_ISREG(os.fstat(src).st_mode)
        start = readable.tell()  # the logical position: a buffered reader's descriptor may be ahead of it
    except (AttributeError, OSError, ValueError):
        regular = False
    if not regular or not hasattr(os, "copy_file_range"):
        shutil.copyfileobj(readable, out, COPY_CHUNK)
        return
    out.flush()
    dst = out.fileno()
    offset = start
    try:
        while n := os.copy_file_range(src, dst, COPY_CHUNK, offset):
            offset += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL) or offset != start:
            raise
        readable.seek(start)  # this kernel or filesystem pair cannot: copy through user space
        shutil.copyfileobj(readable, out, COPY_CHUNK)
        return
    readable.seek(offset)
