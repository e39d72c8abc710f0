"""Read leases as the cluster manager knows them: when a removed node may still serve a read (issue 41).

A primary serves realtime reads (``shard.get``, ``shard.count``, ``shard.scan``) only within its
node's read lease (:meth:`~shardstore.engine.node.process.NodeProcess.in_contact`): a follower's
lease runs ``seconds`` from the moment it *sent* a leader check that the manager answered
"member"; the manager's own from the start of a follower-check round a quorum answered.

Fault detection can remove a node long before its lease ends: a refused connection fails it at
once, and a link taken down refuses exactly as a dead process does.  Promoting another copy then
would let the cut-off primary answer reads with values older than writes the new primary
acknowledges (process simulator seed 291).  So the manager promotes a removed node's primaries
only once that node's lease is surely over (docs/design/transport.md, "Fault detection", read lease):

- it notes a grant each time it answers a member's leader check: the lease ends no later than
  ``seconds`` after the answer (the node started counting when it sent the check, earlier);
- a newly elected manager cannot know what its predecessor granted: every node that did not
  answer its activation may hold a lease until ``seconds`` after the activation;
- a node that restarted (a new process holds its data directory) or answered that it holds no
  such copy serves nothing stale: its lease is forgotten;
- a lease is granted only to a node that applied the cluster state that last took a primary
  from it (its removal, a promotion elsewhere) and the state its manager took over with: a
  node that missed that publication (a link cut one way: the manager's checks of it fail,
  its own checks of the manager pass, and it rejoins) may still hold the primary the
  routing moved away from.  Other publications it may lag by a moment without losing its
  lease: a routing change that concerns it is always one of those two.

:class:`ReadLeases` is that bookkeeping, pure (times are arguments), tested exhaustively.  The
leader-check thread grants while the manager decides: :meth:`ReadLeases.grant` (check and
grant) and :meth:`ReadLeases.take_primary` (bar further grants, then read how long the lease
may run) are each atomic, so no grant slips between a decision and its wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class ReadLeases:
    """Until when each node's read lease may run, as the manager knows it (see the module docstring)."""

    def __init__(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a read lease lasts >= 0 seconds, got {seconds!r}")
        self.seconds = seconds
        self._until: dict[str, float] = {}
        self._floor: tuple[int, int] = (0, 0)  # (term, version) every node must have applied
        self._demoted: dict[str, tuple[int, int]] = {}  # node -> the state that last took a primary from it
        self._lock = threading.Lock()  # never held across I/O

    def granted(self, node: str, at: float) -> None:
        """The manager answered ``node``'s leader check as a member at ``at``."""
        self._until[node] = max(self._until.get(node, at + self.seconds), at + self.seconds)

    def assume(self, nodes: Iterable[str], at: float) -> None:
        """A new manager at ``at``: each of ``nodes`` may hold a lease its predecessor granted."""
        for node in nodes:
            self.granted(node, at)

    def forget(self, node: str) -> None:
        """``node`` serves nothing stale any more (a new process, or it holds no copy)."""
        self._until.pop(node, None)

    def took_primary(self, node: str, state: tuple[int, int]) -> None:
        """The committed ``state`` (term, version) took a primary from ``node`` (or removed it)."""
        self._demoted[node] = max(self._demoted.get(node, (0, 0)), state)

    def took_over(self, state: tuple[int, int]) -> None:
        """This manager took over with ``state``: every node must apply it before a grant."""
        self._floor = max(self._floor, state)
        self._demoted.clear()

    def may_grant(self, node: str, applied: tuple[int, int] | None) -> bool:
        """Whether ``node``, having applied ``applied`` (term, version), may be granted a lease."""
        return applied is not None and applied >= max(self._floor, self._demoted.get(node, (0, 0)))

    def remaining(self, node: str, now: float) -> float:
        """Seconds until ``node``'s lease is surely over (0 when it is)."""
        return max(0.0, self._until.get(node, now) - now)

    def grant(self, node: str, applied: tuple[int, int] | None, at: float) -> bool:
        """Grant ``node`` a lease at ``at`` if it may have one (:meth:`may_grant`); whether it was granted."""
        with self._lock:
            if not self.may_grant(node, applied):
                return False
            self.granted(node, at)
            return True

    def take_primary(self, node: str, publishing: tuple[int, int], now: float) -> float:
        """A primary is being taken from ``node`` by the state ``publishing`` (term, version) or a later one: no
        grant from now until ``node`` applied it; the seconds its lease may still run."""
        with self._lock:
            self.took_primary(node, publishing)
            return self.remaining(node, now)
