"""One cluster per data directory: an exclusive lock taken before anything is written (issue 15, item 8).

A second :class:`~shardstore.engine.cluster.Cluster` on the same ``data_dir`` (another
process, or the same process) would run its own cluster-manager election over the same
on-disk state and publish over the first one.  ``flock`` on ``<data_dir>/cluster.lock``
(per open file, so it holds between two opens in one process too) makes the second one
fail before it opens the blob store.  The lock goes with its file object: closing the
cluster, or the process dying, releases it.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from shardstore.engine.errors import DataDirInUse

LOCK_FILE = "cluster.lock"


class DataDirLock:
    """The exclusive lock of one data directory (held until :meth:`release`)."""

    def __init__(self, data_dir: str) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, LOCK_FILE)
        self._file: IO[str] | None = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            self._file = None
            raise DataDirInUse(data_dir, holder) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        """Let another cluster open the directory (idempotent)."""
        if self._file is not None:
            self._file.close()  # closing the file drops the flock
            self._file = None
