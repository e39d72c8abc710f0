"""What a local disk error does to a shard copy: it fails the copy for good (Elasticsearch's "tragic event").

Its files may hold a torn frame and, after a failed fsync, the page cache cannot be trusted,
so every later call on the copy raises the same :class:`~shardstore.errors.LocalDiskError`;
the cluster fails the copy and rebuilds it elsewhere (docs/design/engine.md).  Two errors are
not this disk's: running out of descriptors (the process's limit: :class:`TooManyOpenFiles`,
nothing failed), and any error of a copy closed under the call (a killed node, a failed copy),
which a waiting client gets as :class:`WriteNotAcknowledged`, never as a raw ``OSError``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shardstore.engine.errors import WriteNotAcknowledged
from shardstore.errors import LocalDiskError, TooManyOpenFiles, is_too_many_open_files

#: the local operations no request waits on: a copy they failed is reported by the thread that failed it
#: (``ShardCopy.on_background_failure``), and a request that meets that failure did not cause it (it is routed on)
BACKGROUND_OPS = frozenset({"merge", "refresh beside the writes"})


@contextlib.contextmanager
def local_disk(copy: Any, op: str) -> Iterator[None]:
    """Run a local ``op`` of ``copy`` (a ShardCopy: ``disk_failure``, ``closed``, ``path``, ``spec``) under the
    rules of the module."""
    if copy.disk_failure is not None:
        raise copy.disk_failure
    try:
        yield
    except LocalDiskError as exc:
        copy.disk_failure = exc
        raise
    except OSError as exc:
        if copy.closed:  # not this disk: the copy closed under the call
            if op == "write":  # a client is waiting: a typed answer (chaos seed 1367)
                raise WriteNotAcknowledged(
                    copy.spec.index_uuid, copy.spec.shard,
                    f"its copy at {copy.path} closed during the write ({type(exc).__name__}: {exc})") from exc
            raise
        if is_too_many_open_files(exc):
            raise TooManyOpenFiles(f"{copy.path}: local {op}", exc) from exc
        copy.disk_failure = LocalDiskError(copy.path, op, exc)
        raise copy.disk_failure from exc


__all__ = ["BACKGROUND_OPS", "local_disk"]
