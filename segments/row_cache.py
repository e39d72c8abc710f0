"""A process-wide, byte-bounded LRU of decoded row groups, for point reads (issue 16).

A ``get`` by id finds its row through the id index in well under a millisecond, then had
to decode the whole row group holding it (~12k rows, every column, ``_source`` included:
~6 ms) for one row.  Segment files are immutable, so a decoded row group stays valid for
as long as its file exists; keeping the recently used ones decoded makes a warm point
read a ``take`` from memory.  Only point reads (one or two row groups) go through the
cache: scans stream past it and do not evict what point reads keep warm.

Key: (segment path, segment checksum, row group) for a whole row group, and row group
``-1 - g`` for the ``_id`` column alone of group ``g`` (what an id lookup reads); a path
reused by another segment (a copy rebuilt in the same directory) has another checksum.  Budget: the
``SHARDSTORE_ROW_CACHE_BYTES`` environment variable (0 turns it off); by default an eighth of the
machine's memory, at most 4 GiB ("where memory allows": over 5M flights, 1,000 random gets after
1,000 others, p50 3.9 ms with 256 MiB and 0.60 ms with 4 GiB; the decoded row groups of 5M
flights take about 2 GB).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa

__all__ = ["RowGroupCache", "row_groups"]

def _default_bytes() -> int:
    """An eighth of physical memory, at most 4 GiB (256 MiB where the size is unknown)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 256 << 20
    return int(min(total // 8, 4 << 30))


DEFAULT_BYTES = _default_bytes()

Key = tuple[str, int, int]


class RowGroupCache:
    """Decoded row groups by (path, checksum, group), least recently used evicted first beyond ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Key, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Key, load: Callable[[], pa.Table]) -> pa.Table:
        """The cached table for ``key``, or ``load()`` (cached if it fits the budget)."""
        with self._lock:
            table = self._items.get(key)
            if table is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return table
            self.misses += 1
        table = load()  # outside the lock: two threads may decode one group at once, never block each other
        size = table.nbytes
        if 0 < size <= self.max_bytes:
            with self._lock:
                if key not in self._items:
                    self._items[key] = table
                    self._bytes += size
                while self._bytes > self.max_bytes and self._items:
                    _k, old = self._items.popitem(last=False)
                    self._bytes -= old.nbytes
        return table

    def clear(self) -> None:
        """Drop every cached row group."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """Bytes of the decoded row groups held now."""
        return self._bytes


def _budget() -> int:
    """The budget from ``SHARDSTORE_ROW_CACHE_BYTES`` (a byte count), else the default; a bad value is logged."""
    raw = os.environ.get("SHARDSTORE_ROW_CACHE_BYTES")
    if raw is None:
        return DEFAULT_BYTES
    try:
        return max(0, int(raw))
    except ValueError:
        logging.getLogger(__name__).warning("SHARDSTORE_ROW_CACHE_BYTES=%r is not a byte count; using %d",
                                            raw, DEFAULT_BYTES)
        return DEFAULT_BYTES


row_groups = RowGroupCache(_budget())
