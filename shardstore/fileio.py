"""Durable local file writes shared by the translog and the segments: atomic replace and directory fsync."""

from __future__ import annotations

import os
import tempfile


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
    fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=temp_suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:
        fsync_dir(directory)
