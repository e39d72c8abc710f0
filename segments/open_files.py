"""A process-wide bound on open segment files (issue 30: the descriptors a node needs do not grow with its
idle shards).

A :class:`~shardstore.segments.segment.SegmentReader` opens its Parquet file on first use
and keeps it for the next read.  A node with thousands of shard copies would then hold one
descriptor per segment ever read, and meet the open-file limit.  Each reader tells this
registry when it uses its file; past :func:`segment_file_limit` open readers, the one used
least recently *drops* its handle.  Nothing is closed under a reader: a read in flight on
another thread keeps its own reference to the file (CPython closes it when that read lets
go; one held only in a reference cycle, at the next garbage collection), and the dropped
reader opens the file again on its next use.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Protocol

from shardstore.errors import open_file_limit

__all__ = ["OpenSegmentFiles", "open_segment_files", "segment_file_limit"]


class _Droppable(Protocol):
    def _drop_file(self) -> None: ...


def segment_file_limit() -> int:
    """How many segment files this process keeps open: a quarter of its open-file limit, 32 to 4,096."""
    soft, _hard = open_file_limit()
    return 4096 if soft < 0 else max(32, min(4096, soft // 4))


class OpenSegmentFiles:
    """The readers holding an open file, least recently used first; past ``limit`` the oldest drops its file."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, weakref.ref[_Droppable]] = OrderedDict()
        self.dropped = 0  # files dropped for the limit (a figure for tests and benches)

    def __len__(self) -> int:
        return len(self._lru)

    def used(self, reader: _Droppable) -> None:
        """``reader`` holds its file and just used it; the least recently used beyond the limit drop theirs."""
        key = id(reader)
        victims: list[_Droppable] = []
        with self._lock:
            ref = self._lru.get(key)
            if ref is not None and ref() is reader:
                self._lru.move_to_end(key)
            else:  # new (or an id reused after its reader was collected)
                self._lru[key] = weakref.ref(reader)
                while len(self._lru) > self.limit:
                    _k, old = self._lru.popitem(last=False)
                    victim = old()
                    if victim is not None:
                        victims.append(victim)
                self.dropped += len(victims)
        for v in victims:
            v._drop_file()

    def closed(self, reader: _Droppable) -> None:
        """``reader`` let go of its file itself."""
        with self._lock:
            ref = self._lru.get(id(reader))
            if ref is not None and ref() in (reader, None):
                del self._lru[id(reader)]


_REGISTRY = OpenSegmentFiles(segment_file_limit())


def open_segment_files() -> OpenSegmentFiles:
    """This process's registry."""
    return _REGISTRY
