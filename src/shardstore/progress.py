"""Periodic progress lines for long work (uploads, restores, merges), through :mod:`logging`.

``with Progress("restore shard 0", total=n, unit="files") as p: p.advance(bytes_=size)``
logs ``restore shard 0: 3/10 files, 12.5 MB, 4.1 MB/s`` at most every ``every`` seconds,
plus a final line; callers that want a bar pass ``callback`` and draw their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger("shardstore.progress")


class Progress:
    """Counts done items and bytes; logs a line every ``every`` seconds and at the end."""

    def __init__(
        self,
        what: str,
        *,
        total: int | None = None,
        unit: str = "items",
        every: float = 2.0,
        callback: Callable[[int, int | None, int], None] | None = None,
    ) -> None:
        self.what, self.total, self.unit, self.every, self.callback = what, total, unit, every, callback
        self.done = 0
        self.bytes = 0
        self._start = time.monotonic()
        self._last = self._start
        self._lock = threading.Lock()

    def advance(self, n: int = 1, *, bytes_: int = 0) -> None:
        """Record ``n`` more items (and ``bytes_`` bytes) done; maybe log a line."""
        with self._lock:
            self.done += n
            self.bytes += bytes_
            now = time.monotonic()
            due = now - self._last >= self.every
            if due:
                self._last = now
        if self.callback is not None:
            self.callback(self.done, self.total, self.bytes)
        if due:
            log.info("%s", self.line())

    def line(self) -> str:
        """The current progress line."""
        took = max(time.monotonic() - self._start, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        return f"{self.what}: {self.done}{of} {self.unit}, {self.bytes / 1e6:.1f} MB, {self.bytes / 1e6 / took:.1f} MB/s"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        log.info("%s%s", self.line(), " (failed)" if e is not None else " (done)")
