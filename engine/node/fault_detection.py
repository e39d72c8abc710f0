"""Fault detection between node processes: leader checks and follower checks (issue 29).

As in Elasticsearch's ``LeaderChecker`` and ``FollowersChecker``: the elected cluster
manager checks every member (``fd.follower_check``) and every member checks the manager
(``fd.leader_check``), each every ``interval`` seconds with a ``timeout``.  A peer is
declared failed after ``retries`` consecutive failed checks, or at once when the
connection is refused (the process is gone: nothing listens on its port), so a SIGKILLed
node is removed within one interval and a SIGSTOPped one (its port still accepts, it
answers nothing) within about ``retries * (interval + timeout)``.

:class:`FailureCounter` is the pure decision (tested exhaustively); the node process runs
the checks on its fault-detection thread (docs/design/transport.md, "Fault detection").
"""

from __future__ import annotations

from dataclasses import dataclass

#: one check's outcome
OK, TIMEOUT, REFUSED = "ok", "timeout", "refused"


@dataclass(frozen=True)
class FaultDetectionSettings:
    """Intervals, timeouts and retry counts of both checks (settings ``fd.*`` of a node)."""

    interval: float = 0.5
    timeout: float = 1.0
    retries: int = 3

    def __post_init__(self) -> None:
        if not self.interval > 0 or not self.timeout > 0:
            raise ValueError(f"fault detection interval and timeout must be > 0 seconds, got {self}")
        if not isinstance(self.retries, int) or self.retries < 1:
            raise ValueError(f"fault detection retries must be an int >= 1, got {self.retries!r}")

    @property
    def read_lease_seconds(self) -> float:
        """How long a node serves reads after a manager last confirmed it a member (engine/node/read_lease.py):
        ``(retries - 1) * (interval + timeout)``, at least one check's time, so a check or two may fail."""
        return max(self.interval + self.timeout, (self.retries - 1) * (self.interval + self.timeout))

    @property
    def worst_case_seconds(self) -> float:
        """The longest a silent peer goes undetected."""
        return self.retries * (self.interval + self.timeout)


class FailureCounter:
    """Consecutive failed checks per peer; says when a peer is to be declared failed (pure, no I/O)."""

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self._failures: dict[str, int] = {}

    def record(self, peer: str, outcome: str) -> bool:
        """Count one check of ``peer``; True when it is now failed (then its count restarts)."""
        if outcome == OK:
            self._failures.pop(peer, None)
            return False
        if outcome not in (TIMEOUT, REFUSED):
            raise ValueError(f"unknown check outcome {outcome!r}")
        n = self._failures.get(peer, 0) + 1
        if outcome == REFUSED or n >= self.retries:
            self._failures.pop(peer, None)
            return True
        self._failures[peer] = n
        return False

    def failures(self, peer: str) -> int:
        """Consecutive failed checks of ``peer`` not yet acted on."""
        return self._failures.get(peer, 0)

    def forget(self, peer: str) -> None:
        """Drop ``peer``'s count (it left, or the checker's target changed)."""
        self._failures.pop(peer, None)
