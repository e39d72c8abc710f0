"""What searches see while ingest jobs apply: a shard copy's view, held at one refresh until the jobs end (issue 43).

An ingest job (docs/design/ingest.md, "Atomic visibility") is applied through the write path
slice by slice, so each refresh in between (a full indexing buffer, a client's ``refresh``)
would make part of it searchable.  Before its first row the coordinator asks every copy of
the index to *hold* its view for the job: the copy refreshes once (everything acknowledged
before the job becomes searchable) and pins that list of segments with their live docs.
From then on ``count``, ``scan`` and every read built on them answer from the pinned list,
while writes, refreshes and version lookups go on against the current segments.  When
every job holding the view is released (its ``done`` record written) the view follows the
current segments again: the jobs' rows appear in one step, as do client writes made meanwhile.

A hold lapses on its own after its lease (the coordinator died, or its job failed and was not
committed again in time): the copy then shows what is applied, as it would without holds.
Holding the same job again extends its lease and keeps the view it pinned first.

Every read also says which jobs its view *hides* (held since the pin; of those, which still *hold*
it) and which released jobs it *shows* (their release flipped it, remembered for :data:`SHOWN_MEMORY`): copies flip one after the
other, so a read over several shards compares these tags and reads again while one shard shows a job
another hides (engine/coordinator/view_reads.py; docs/design/ingest.md, "Atomic visibility").  A view
pinned before a job's release and held on by a second job hides the first until the second ends, while a
shard that flipped in between shows it: before its first row the second job *advances* the views it alone
holds (:meth:`HeldView.advance`), which flips them for the released jobs and keeps its own hold.

Pure bookkeeping, under the directory's lock: no I/O here.  What a copy must not do while a
view is held (merge away a pinned segment's file, upload a commit that Spark readers and
restores would see) is asked through :attr:`HeldView.held`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SHOWN_MEMORY", "HeldView", "ViewTag"]

#: how long a copy remembers the jobs whose release it shows (seconds): longer than any read's fan-out
SHOWN_MEMORY = 300.0


@dataclass(frozen=True)
class ViewTag:
    """The ingest jobs one read's view hides (held since it was pinned), of those the ones holding it now (their
    release has not come), and the released ones it shows."""

    hidden: frozenset[str] = frozenset()
    held: frozenset[str] = frozenset()
    shown: frozenset[str] = frozenset()


class HeldView:
    """The jobs holding one copy's view, their leases, and the view they pinned (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:  # noqa: D107
        self._clock = clock
        self._leases: dict[str, float] = {}  # job -> when its hold lapses (clock seconds)
        self._pinned: list[tuple[Any, Any]] | None = None
        self._hidden: set[str] = set()  # jobs that held the pinned view (released ones included) until it flips
        self._released: set[str] = set()  # jobs released while the view stays pinned for others
        self._shown: dict[str, float] = {}  # released jobs the flipped view shows -> when they flipped it
        self._renewed: set[str] = set()  # jobs that held again while holding (a renewal, a retried commit)
        self.lapsed: list[str] = []  # jobs whose hold lapsed since the caller last looked (for a log line)

    @property
    def held(self) -> bool:
        """Whether some job holds the view now (lapsed holds dropped first)."""
        self._lapse()
        return bool(self._leases)

    @property
    def jobs(self) -> tuple[str, ...]:
        """The jobs holding the view, oldest first."""
        self._lapse()
        return tuple(self._leases)

    def hold(self, job: str, seconds: float, current: Callable[[], list[tuple[Any, Any]]]) -> bool:
        """Hold the view for ``job`` for ``seconds`` (again: a new lease, the same view); True when this pinned it,
        from ``current()`` (the caller refreshed just before)."""
        if seconds <= 0:
            raise ValueError(f"a hold needs a lease of more than 0 seconds, got {seconds}")
        self._lapse()
        pinned = self._pinned is None
        if pinned:
            self._pinned = list(current())
        if job in self._leases or job in self._hidden:  # held this view before (a renewal; a retry after a lapse)
            self._renewed.add(job)
        self._leases[job] = self._clock() + seconds
        self._hidden.add(job)
        self._shown.pop(job, None)
        return pinned

    def repin(self, current: Callable[[], list[tuple[Any, Any]]]) -> None:
        """Pin ``current()`` in place of the pinned view, while some job holds it: a copy held without a refresh
        (its buffer not yet written: ShardDirectory.hold_view) pins the segments it then writes for the view."""
        self._lapse()
        if self._pinned is not None:
            self._pinned = list(current())

    def can_advance(self, job: str) -> bool:
        """Whether :meth:`advance` would pin a new view for ``job``: it alone holds the view, by its first hold of
        this view (not a renewal, not a retry after its lease lapsed), and the view hides other jobs, every one of
        them released (a lapsed job's rows may be a job cut short: they stay hidden while the view is held)."""
        self._lapse()
        others = self._hidden - {job}
        return (self._pinned is not None and set(self._leases) == {job} and job not in self._renewed
                and bool(others) and others <= self._released)

    def advance(self, job: str, current: Callable[[], list[tuple[Any, Any]]]) -> bool:
        """Pin ``current()`` for ``job`` in place of a view pinned before other jobs' releases (:meth:`can_advance`):
        the view flips for those jobs as their last release would have, and ``job`` keeps holding it.  Only before
        ``job``'s first row on this copy (its coordinator asks right after its holds): a renewed hold, as a
        retried commit's after rows were applied, never advances.  True when it did."""
        if not self.can_advance(job):
            return False
        now = self._clock()
        self._shown.update((j, now) for j in self._released)
        self._pinned = list(current())
        self._hidden = {job}
        self._released = set()
        return True

    def release(self, job: str) -> bool:
        """``job`` no longer holds the view; True when no job does any more (the view follows the segments)."""
        self._lapse()  # a lease already run out lapses (and is logged), it is not released
        if self._leases.pop(job, None) is not None:
            self._released.add(job)
        self._renewed.discard(job)
        self._lapse()
        return not self._leases

    def visible(self, current: Callable[[], list[tuple[Any, Any]]]) -> list[tuple[Any, Any]]:
        """What reads see: the pinned view while a job holds it, else ``current()``."""
        return self.read(current)[0]

    def read(self, current: Callable[[], list[tuple[Any, Any]]]) -> tuple[list[tuple[Any, Any]], ViewTag]:
        """:meth:`visible` and what that view hides, holds and shows (:class:`ViewTag`), as of one clock reading."""
        now = self._lapse()
        for job in [j for j, at in self._shown.items() if at + SHOWN_MEMORY <= now]:
            del self._shown[job]
        if self._pinned is None:
            return current(), ViewTag(shown=frozenset(self._shown))
        return list(self._pinned), ViewTag(hidden=frozenset(self._hidden), held=frozenset(self._leases),
                                           shown=frozenset(self._shown))

    def pinned_files(self) -> set[str]:
        """File names of the pinned view's segments (kept on disk while it is held)."""
        return {reader.info.file_name for reader, _live in self._pinned or ()}

    def _lapse(self) -> float:
        """Drop the leases run out (the view flips when none is left); the clock reading it judged by."""
        now = self._clock()
        for job in [j for j, until in self._leases.items() if until <= now]:
            del self._leases[job]
            self._renewed.discard(job)
            self.lapsed.append(job)
        if not self._leases:
            if self._pinned is not None:  # the view flips: the released jobs' rows show from now on
                self._shown.update((j, now) for j in self._released)
            self._pinned = None
            self._hidden.clear()
            self._released.clear()
            self._renewed.clear()
        return now
