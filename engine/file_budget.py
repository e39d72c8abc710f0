"""Whether this process can open the files a new index's shard copies need (issue 30).

Each open shard copy holds 2 file descriptors (its translog's current generation and its
directory's write lock; ``python -m benches cost`` counts them), so a node with thousands
of copies meets the open-file limit (``ulimit -n``).  Creating an index checks first, so
it is refused whole with :class:`~shardstore.errors.TooManyOpenFiles` naming the limit
instead of failing part-way with a raw ``OSError`` and leaving the node unable to open a
file.  Opening fewer descriptors per idle copy is the lasting fix (issue 30).
"""

from __future__ import annotations

import os

from shardstore.errors import TooManyOpenFiles, open_file_limit

__all__ = ["FDS_PER_COPY", "HEADROOM", "check_file_budget", "open_files"]

#: file descriptors one open shard copy holds
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
