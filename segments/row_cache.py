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

Warming (:class:`Warmer`, one daemon thread per process): a segment a directory publishes
(refresh, merge, open) is queued; the thread builds its id index and decodes its row groups
into the cache, oldest queued first, while the cache holds less than :data:`WARM_FILL` of its
budget, so a first get of a fresh segment is a hit (over 5M flights, 1,000 random gets
after a flush: p99 7.45 ms without warming, 0.50 ms with it; docs/design/segments.md).
Warming never evicts to make room: it stops at the fill mark (the LRU itself may still evict
anything once point reads fill the budget).  ``SHARDSTORE_ROW_CACHE_WARM=0`` turns it off; a segment gone
before its turn (merged, its copy closed) is skipped.  It yields to writes: while a shard copy applies a
bulk or flushes (:meth:`Warmer.foreground`), and for :data:`WARM_QUIET` after, it decodes nothing new, for
at most :data:`WARM_YIELD_MAX` per row group (issue 16: warming the segments of a one-go bulk while its translog upload and flush
were still running cost that bulk about 7 ms of 210 on two cores).

At interpreter exit (:func:`atexit`) the warmer stops and its thread is joined (:meth:`Warmer.stop`): a daemon
thread still inside a pyarrow decode when the interpreter finalizes is ended by ``pthread_exit`` as it takes
the GIL back, and that unwind through C++ frames can abort the process ("terminate called without an active
exception", exit status -6): stop 54's CI saw that from the demo after every check had passed, the warmer
decoding at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.segments.point_read import GroupColumns, group_columns
from shardstore.segments.stamp import read_groups

__all__ = ["RowGroupCache", "Warmer", "row_groups", "warmer"]

log = logging.getLogger(__name__)

#: Warming stops while the cache holds more than this share of its budget.
WARM_FILL = 0.75
#: After decoding a row group the warmer sleeps ``pace`` times as long (1.0: half of one core at most).
WARM_PACE = 1.0
WARM_PAUSE_MAX = 0.05
#: While a foreground write is in flight the warmer waits before its next decode, at most this long (then it
#: decodes one row group anyway: writes that never stop do not starve warming).
WARM_YIELD_MAX = 0.5
#: ... and once the last write ended, waits this long more: writes come in bursts (a bulk, then its flush).
WARM_QUIET = 0.05

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
        self._columns: dict[Key, GroupColumns] = {}  # a cached group's columns, split once for point reads
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def peek(self, key: Key) -> pa.Table | None:
        """The cached table for ``key`` or None, without loading it or changing the LRU order (a scan's look)."""
        with self._lock:
            return self._items.get(key)

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
                    k, old = self._items.popitem(last=False)
                    self._columns.pop(k, None)
                    self._bytes -= old.nbytes
        return table

    def columns(self, key: Key, load: Callable[[], pa.Table]) -> GroupColumns:
        """The group of :meth:`get` as its names and arrays, split once while it stays cached (a point read's path)."""
        table = self.get(key, load)  # the one hit, miss and LRU path
        with self._lock:
            cols = self._columns.get(key)
            if cols is not None and self._items.get(key) is table:
                return cols
        cols = group_columns(table)
        with self._lock:
            if self._items.get(key) is table:  # only beside its table: evicted together
                self._columns[key] = cols
        return cols

    def forget(self, path: str) -> int:
        """Drop every cached row group of the segment file ``path`` (merged away, its copy closed); how many."""
        with self._lock:
            doomed = [k for k in self._items if k[0] == path]
            for k in doomed:
                self._bytes -= self._items.pop(k).nbytes
                self._columns.pop(k, None)
        return len(doomed)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def clear(self) -> None:
        """Drop every cached row group."""
        with self._lock:
            self._items.clear()
            self._columns.clear()
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


class _Warmable(Protocol):
    path: str
    info: Any

    @property
    def index_loaded(self) -> bool: ...

    def install_index(self, ids: pa.Array) -> None: ...


def _warm_enabled() -> bool:
    return os.environ.get("SHARDSTORE_ROW_CACHE_WARM", "1").strip().lower() not in ("0", "false", "no", "off")


class Warmer:
    """Decodes queued segments' id indexes and row groups into ``cache`` on one background thread."""

    def __init__(self, cache: RowGroupCache, *, enabled: bool | None = None, pace: float = WARM_PACE) -> None:
        self.cache = cache
        self.pace = pace
        self.enabled = _warm_enabled() if enabled is None else enabled
        self._queue: deque[Any] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._current: str | None = None
        self._current_gone = False
        self._thread: threading.Thread | None = None
        self._stopped = False  # stop() was called: nothing is queued or warmed any more
        self._writes = 0  # foreground writes in flight (foreground())
        self._last_write = 0.0  # time.monotonic() when the last one ended
        self.warmed_groups = 0

    def submit(self, reader: _Warmable) -> None:
        """Queue ``reader``'s segment for warming (no-op when warming is off or the cache has no budget)."""
        if not self.enabled or self.cache.max_bytes <= 0:
            return
        with self._cond:
            if self._stopped:
                return
            self._queue.append(reader)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="row-cache-warmer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def discard(self, path: str) -> None:
        """Unqueue the segment ``path`` and drop what the cache holds of it."""
        with self._cond:
            self._queue = deque(r for r in self._queue if r.path != path)
            if self._current == path:
                self._current_gone = True
        self.cache.forget(path)

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Mark write work in flight: the warmer decodes nothing new until it ends (or WARM_YIELD_MAX passed)."""
        with self._cond:
            self._writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writes -= 1
                self._last_write = time.monotonic()
                if not self._writes:
                    self._cond.notify_all()

    def _yield_to_writes(self) -> None:
        """Wait until no foreground write has been in flight for WARM_QUIET, at most WARM_YIELD_MAX in all."""
        deadline = time.monotonic() + WARM_YIELD_MAX
        with self._cond:
            while not self._current_gone:
                now = time.monotonic()
                if now >= deadline:
                    return
                if self._writes:
                    self._cond.wait(deadline - now)  # the end of the last write wakes us
                    continue
                quiet_at = self._last_write + WARM_QUIET
                if now >= quiet_at:
                    return
                self._cond.wait(min(quiet_at, deadline) - now)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the queue is empty and nothing is being warmed (False on timeout)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def stop(self, timeout: float = 5.0) -> bool:
        """Unqueue everything, end the row group in hand, join the thread (at exit); False if it is still running."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._current_gone = True  # the segment in hand is left between two row groups
            thread = self._thread
            self._cond.notify_all()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _full(self) -> bool:
        return self.cache.size_bytes >= WARM_FILL * self.cache.max_bytes

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stopped)
                if self._stopped:
                    return
                reader = self._queue.popleft()
                self._busy = True
                self._current, self._current_gone = reader.path, False
            try:
                if not self._full():
                    self._warm(reader)
            except Exception as exc:  # noqa: BLE001 - a segment gone or closed under us: nothing to warm
                log.debug("not warming %s: %r", getattr(reader, "path", reader), exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._current = None
                    self._cond.notify_all()

    def _warm(self, reader: _Warmable) -> None:
        info = reader.info
        if os.path.getsize(reader.path) != info.size:
            return  # another file now sits at that path
        # Its own handle, single-threaded reads: never the reader's ParquetFile, which a foreground
        # get or scan may be reading (two threads in one pyarrow ParquetFile hung: fault simulator),
        # and which the directory may close meanwhile.
        with pq.ParquetFile(reader.path) as pf:
            md = pf.metadata
            if md.num_rows != info.doc_count or md.num_row_groups != info.row_groups:
                return
            # the id index: a first lookup then needs no full read of _id (unless a get built it already)
            self._yield_to_writes()
            if not reader.index_loaded:
                reader.install_index(pf.read(columns=["_id"], use_threads=False).column("_id").combine_chunks())
            for g in range(md.num_row_groups):
                if self._full():
                    return
                if self._current_gone:
                    break
                key = (reader.path, info.checksum, g)
                if key not in self.cache:
                    self._yield_to_writes()
                    t0 = time.perf_counter()
                    self.cache.get(key, lambda g=g: read_groups(pf, info.stamp, [g], use_threads=False))
                    if key not in self.cache:
                        return  # a row group larger than the whole budget: warming this segment is useless
                    self.warmed_groups += 1
                    # background work: at most about half of one core, so gets and scans keep theirs
                    time.sleep(min(WARM_PAUSE_MAX, (time.perf_counter() - t0) * self.pace))
        if self._current_gone:  # discarded while we warmed it: what we added is dead weight
            self.cache.forget(reader.path)


warmer = Warmer(row_groups)


def _after_fork_in_child() -> None:
    """A forked child starts with an empty cache, fresh locks and no warmer thread (the parent's may hold a lock)."""
    row_groups._lock = threading.Lock()
    row_groups._items.clear()
    row_groups._columns.clear()
    row_groups._bytes = 0
    warmer._cond = threading.Condition()
    warmer._queue.clear()
    warmer._busy, warmer._current, warmer._current_gone, warmer._thread = False, None, False, None
    warmer._writes, warmer._last_write, warmer._stopped = 0, 0.0, False


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(warmer.stop)
