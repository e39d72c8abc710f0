"""Local-disk faults for tests and the fault simulator: disk full, failed fsync, torn writes.

No real disk fails on demand (dm-flakey or a tiny loop mount need root and a kernel this
sandbox does not lend), so :class:`DiskFaults` sets the hook of :mod:`shardstore.fileio`,
through which every local write and fsync of a shard's files passes.  A rule matches an
operation (``write``, ``fsync`` or ``*``) and a path pattern (fnmatch, e.g.
``*/node-1/*/translog/*``), may skip its first ``after`` matches, fires at most ``times``
times, and then:

- ``enospc``: the write fails with ``ENOSPC`` (disk full) before a byte lands;
- ``eio``: the fsync (or write) fails with ``EIO``;
- ``torn``: half of the write lands, then ``ENOSPC`` (:class:`~shardstore.fileio.TornWrite`);
- ``crash``: the write or fsync fails with ``EIO`` and ``on_crash(path)`` is called, for
  the simulator to kill the node that owns ``path`` right there, inside whatever step was
  writing (a crash at an arbitrary point, not only at a transport send).

The hook is process-wide: use one :class:`DiskFaults` at a time, as a context manager.
"""

from __future__ import annotations

import errno
import fnmatch
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from shardstore import fileio
from shardstore.errors import InvalidError
from shardstore.testing.faulty import pick_rule

DiskAction = Literal["enospc", "eio", "torn", "crash"]
DISK_ACTIONS = ("enospc", "eio", "torn", "crash")
DISK_OPS = ("write", "fsync", "*")


@dataclass
class DiskRule:
    """Which local writes or fsyncs to fail and how (see the module docstring)."""

    op: str = "*"
    path: str = "*"
    action: DiskAction = "enospc"
    times: int | None = 1
    after: int = 0
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.op not in DISK_OPS:
            raise InvalidError(f"DiskRule: unknown operation {self.op!r}; known: {', '.join(DISK_OPS)}")
        if self.action not in DISK_ACTIONS:
            raise InvalidError(f"DiskRule: unknown action {self.action!r}; known: {', '.join(DISK_ACTIONS)}")


class DiskFaults:
    """The rules, and the hook that applies them while this object is entered."""

    def __init__(self, on_crash: Callable[[str], None] | None = None) -> None:
        self.on_crash = on_crash
        self.rules: list[DiskRule] = []
        self.fired_total = 0
        self._lock = threading.Lock()
        self._previous: Any = None

    def inject(self, **rule: Any) -> DiskRule:
        """Add a rule (keyword arguments of DiskRule) and return it."""
        with self._lock:
            self.rules.append(DiskRule(**rule))
            return self.rules[-1]

    def clear(self) -> None:
        """Remove every rule (the count of faults fired stays)."""
        with self._lock:
            self.rules = []

    def __call__(self, op: str, path: str) -> None:
        with self._lock:
            rule = pick_rule(self.rules, lambda r: r.op in ("*", op) and fnmatch.fnmatchcase(path, r.path))
            self.fired_total += rule is not None
        if rule is None:
            return
        if rule.action == "crash" and self.on_crash is not None:
            self.on_crash(path)
        if rule.action == "torn" and op == "write":
            raise fileio.TornWrite(path)
        if rule.action == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
        raise OSError(errno.EIO, "Input/output error (injected)", path)

    def __enter__(self) -> DiskFaults:
        self._previous = fileio.set_fault_hook(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        fileio.set_fault_hook(self._previous)


__all__ = ["DISK_ACTIONS", "DiskFaults", "DiskRule"]
