"""Merges in the background, at a low CPU priority: one thread per process runs the merges shard copies ask for.

A flush commits, then asks for the merges its tiered policy wants (``ShardCopy.flush``).  They are CPU work
(decoding and re-encoding every live row of the segments merged: about 0.6 s for 400,000 rows here) and none
of it is needed for a write to be acknowledged, so a flush no longer runs them itself: it *submits* its shard,
and this process's merge thread runs ``maybe_merge`` for it (segments/merging.py: written beside the writes,
installed under the directory's lock).  The thread lowers its own scheduling priority once (Linux: ``nice``
+10 for that thread only), so on a busy machine a bulk, an adoption or a replication gets the cores first and
merges use what is left, as Elasticsearch's merge scheduler throttles merges behind indexing.

A shard submitted while already queued is queued once.  A merge's error is the submitter's to handle (its
``run`` callable fails the copy on a local disk error: engine/shard/local_disk.py); anything else is logged,
and the next flush submits the shard again.  After a fork the child starts with no queue and no thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MERGE_NICE", "MergeScheduler", "merges"]

log = logging.getLogger(__name__)

#: how much the merge thread lowers its own priority (``nice`` increment; 0: not at all)
MERGE_NICE = 10


class MergeScheduler:
    """One background thread running the merges submitted to it, one shard at a time (module docstring)."""

    def __init__(self, nice: int = MERGE_NICE) -> None:  # noqa: D107
        self.nice = nice
        self._queue: OrderedDict[str, Callable[[], object]] = OrderedDict()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._stopped = False
        self.ran = 0  # merges run (for tests and stats)

    def submit(self, key: str, run: Callable[[], object]) -> None:
        """Queue ``run`` (a shard's ``maybe_merge``) under ``key``, once: a key already queued keeps its place (the
        newest ``run`` is the one called: a copy reopened at the same path replaces its closed predecessor)."""
        with self._cond:
            if self._stopped:
                return
            self._queue[key] = run  # a key queued already keeps its place and takes the newest callable
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="segment-merges", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or running (False on timeout)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def stop(self, timeout: float = 10.0) -> bool:
        """Unqueue everything and wait up to ``timeout`` for the merge in hand to end (at exit: a merge is not left
        half-written in a thread the interpreter is tearing down); False if it is still running."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            thread = self._thread
            self._cond.notify_all()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _loop(self) -> None:
        _lower_priority(self.nice)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stopped)
                if self._stopped:
                    return
                key, run = self._queue.popitem(last=False)
                self._busy = True
            try:
                run()
            except Exception:  # noqa: BLE001 - the submitter's own handling ran inside ``run``; the thread goes on
                log.warning("the merges of %s failed", key, exc_info=True)
            finally:
                with self._cond:
                    self._busy = False
                    self.ran += 1
                    self._cond.notify_all()

    def _after_fork(self) -> None:
        self._queue.clear()
        self._cond = threading.Condition()
        self._thread, self._busy, self._stopped = None, False, False


def _lower_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (Linux: a thread is a task of its own); no-op elsewhere."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.debug("merges keep their priority: %r", exc)


merges = MergeScheduler()
os.register_at_fork(after_in_child=merges._after_fork)
atexit.register(merges.stop)
