"""Whether this process can open the files a new index's shard copies need (issue 30).

An idle shard copy holds 1 file descriptor (its directory's write lock); its translog's
current generation is open only between an append and the next roll or sync (released
when idle, ``translog/local.py``), and a segment file once it was read.  Budgeting 2 per
copy covers a copy taking writes.  Creating an index checks first, so it is refused whole
with :class:`~shardstore.errors.TooManyOpenFiles` naming the limit instead of failing
part-way with a raw ``OSError`` and leaving the node unable to open a file.
"""

from __future__ import annotations

import os

from shardstore.errors import TooManyOpenFiles, open_file_limit

__all__ = ["FDS_PER_COPY", "HEADROOM", "check_file_budget", "open_files"]

#: file descriptors budgeted per shard copy (its lock, and its translog file while it takes writes)
FDS_PER_COPY = 2
#: descriptors kept free for everything else (sockets, segment reads, store files, the cluster state)
HEADROOM = 64


def open_files() -> int | None:
    """How many file descriptors this process has open (None where the system does not say)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return None


def check_file_budget(what: str, copies: int) -> None:
    """Raise TooManyOpenFiles if opening ``copies`` more shard copies would pass the open-file limit."""
    soft, _hard = open_file_limit()
    used = open_files()
    if soft < 0 or used is None:
        return
    need = copies * FDS_PER_COPY
    if used + need + HEADROOM > soft:
        raise TooManyOpenFiles(f"{what}: {copies} shard copies, {FDS_PER_COPY} files each, with {used} open now",
                               needed=need)
