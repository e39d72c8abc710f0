"""Durable local file writes shared by the translog and the segments: atomic replace, fsync, directory fsync.

Every local write and fsync of a shard's files passes :func:`disk_fault` first.  In
production it is one global read (no hook is set).  The fault simulator
(:mod:`shardstore.testing.disk`) sets a hook there to make chosen writes fail with
``ENOSPC`` (disk full), chosen fsyncs fail with ``EIO``, or a write tear half-way
(:class:`TornWrite`): faults no real disk produces on demand.  A shard copy treats any
such ``OSError`` as fatal for itself (docs/design/engine.md, "Local disk faults").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

#: set by the fault simulator only (see the module docstring); called as ``hook(op, path)``
_fault_hook: Callable[[str, str], None] | None = None


class TornWrite(OSError):
    """An injected write that lands only partly, then fails (``ENOSPC``); the writer tears it itself."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.ENOSPC, "No space left on device (injected: the write landed only partly)", path)


def set_fault_hook(hook: Callable[[str, str], None] | None) -> Callable[[str, str], None] | None:
    """Install the disk-fault hook (None removes it); returns the previous one. For the fault simulator only."""
    global _fault_hook
    previous, _fault_hook = _fault_hook, hook
    return previous


def disk_fault(op: str, path: str) -> None:
    """Raise the injected fault for ``op`` ("write", "fsync") on ``path``, if the simulator set one."""
    hook = _fault_hook
    if hook is not None:
        hook(op, path)


def fsync(fd: int, path: str) -> None:
    """``os.fsync(fd)`` of the file at ``path`` (an injected fault first, see the module docstring)."""
    disk_fault("fsync", path)
    os.fsync(fd)


_fsync_file = fsync  # write_atomic's ``fsync`` flag shadows the name


_syncfs: Callable[[int], int] | None = None


def sync_filesystem(path: str, files: Sequence[str] = ()) -> None:
    """Make everything written to the filesystem holding ``path`` durable: one ``syncfs(2)`` (``os.sync``
    where there is none), for a caller that wrote many files without an fsync each (the node-level
    translog round, issue 30).  The fault hook sees an fsync of each of ``files`` (what the sync
    makes durable) first, as :func:`fsync` does."""
    global _syncfs
    for f in files:
        disk_fault("fsync", f)
    if _syncfs is None:
        _syncfs = _load_syncfs()
    fd = os.open(path, os.O_RDONLY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}", path)
    finally:
        os.close(fd)


def _load_syncfs() -> Callable[[int], int]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the C library this process already runs on
        fn = libc.syncfs
        fn.argtypes = [ctypes.c_int]
        return fn
    except (OSError, AttributeError):  # no syncfs (not Linux): sync every filesystem
        return lambda _fd: (os.sync(), 0)[1]


def fsync_dir(directory: str) -> None:
    """fsync a directory so renames and creations in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(directory: str, name: str, data: bytes, *, fsync: bool = True, temp_suffix: str = ".tmp") -> None:
    """Write ``directory/name`` atomically: temp file (``.<name>.*<temp_suffix>``), fsync, rename, fsync of the directory.

    A reader (or a crash) sees the old file or the new one, never a mix; a failed write
    leaves no temp file behind.
    """
    target = os.path.join(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=temp_suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                disk_fault("write", target)
            except TornWrite:
                f.write(data[: len(data) // 2])
                raise
            f.write(data)
            f.flush()
            if fsync:
                _fsync_file(f.fileno(), target)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:
        fsync_dir(directory)


@contextlib.contextmanager
def mapped(f: BinaryIO) -> Iterator[memoryview]:
    """A read-only memory map of an open file's bytes as a memoryview (an empty file: an empty view).

    For checksumming a file before it is streamed elsewhere without copying it into memory.
    Unmapped on exit; a view still held (e.g. by a traceback) leaves the map to the collector.
    """
    if os.fstat(f.fileno()).st_size == 0:
        yield memoryview(b"")
        return
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(m)
    try:
        yield view
    finally:
        view.release()
        with contextlib.suppress(BufferError):
            m.close()


def tree_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (0 when it is gone; a file removed meanwhile counts 0)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a merge or a flush may remove a file meanwhile
                total += os.path.getsize(os.path.join(root, name))
    return total
