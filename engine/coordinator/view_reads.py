"""Reads over every shard of an index that show an ingest job all at once, or nothing of it (issue 43).

An ingest job's release flips each shard copy's view in turn, within one round of messages
(docs/design/ingest.md, "Atomic visibility"): a count or scan that reads one shard just after its
flip and another just before would show part of the job.  So each shard answers with a
:class:`~shardstore.segments.held_view.ViewTag`: the jobs its view hides (held since it was pinned)
and the released jobs it shows.  A job one shard shows and another hides is *mixed*
(:func:`mixed_jobs`); the read is taken again until no job is mixed.

A shard shows a job only once the job's release reached it, and a release is sent only after the
job's ``done`` record is written: every row of it is applied on every shard.  So a reader that sees
a mixed job may finish that release itself (:func:`read_all_at_once` asks the hiding shards to
release it after :data:`HELP_AFTER`): a coordinator killed halfway through its releases leaves
no read mixed until the holds' lease runs out.  A shard still hiding the job because another job
holds its view too flips with that job; a read waits :data:`SETTLE_WAIT` at most, then answers what
it read, with a WARNING naming the jobs.

Request cost: one read per shard when no release is under way; otherwise the reads again, every
few milliseconds, for as long as the release takes (one round of messages).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardstore.segments.held_view import ViewTag

__all__ = ["HELP_AFTER", "SETTLE_WAIT", "hiding", "mixed_jobs", "read_all_at_once", "tag_of"]

log = logging.getLogger(__name__)

#: how long a read waits for a release under way before it releases a mixed job on the shards hiding it (s)
HELP_AFTER = 0.25
#: how long a read waits for answers showing every job all at once before it answers what it read (s)
SETTLE_WAIT = 10.0

A = TypeVar("A")


def mixed_jobs(tags: Sequence[ViewTag]) -> frozenset[str]:
    """The ingest jobs one of ``tags`` shows and another hides: answers read under them show part of these jobs."""
    hidden = frozenset().union(*(t.hidden for t in tags))
    shown = frozenset().union(*(t.shown for t in tags))
    return hidden & shown


def hiding(tags: Sequence[ViewTag], job: str) -> list[int]:
    """The positions (shards) of ``tags`` whose view hides ``job``."""
    return [i for i, t in enumerate(tags) if job in t.hidden]


def tag_of(answer: dict[str, Any]) -> ViewTag:
    """The view tag of a shard's tagged answer (``shard.count``/``shard.scan`` with ``tagged``)."""
    return ViewTag(hidden=frozenset(answer.get("hidden") or ()), shown=frozenset(answer.get("shown") or ()))


def read_all_at_once(read: Callable[[], list[A]], tag: Callable[[A], ViewTag],
                     release: Callable[[str, int], None], *, what: str = "a read",
                     help_after: float = HELP_AFTER, settle_wait: float = SETTLE_WAIT,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> list[A]:
    """``read()`` (one answer per shard) again until no ingest job is mixed among the answers' tags; after
    ``help_after`` of mixed answers, ``release(job, shard)`` on each shard hiding a mixed job; after
    ``settle_wait``, the last answers with a WARNING (see the module docstring)."""
    start = clock()
    pause = 0.002
    helped: set[tuple[str, int]] = set()
    while True:
        answers = read()
        tags = [tag(a) for a in answers]
        mixed = mixed_jobs(tags)
        if not mixed:
            return answers
        waited = clock() - start
        if waited >= settle_wait:
            log.warning("%s shows part of ingest job(s) %s: after %.1fs some shards still hide them (another job "
                        "holds their view too)", what, ", ".join(sorted(mixed)), waited)
            return answers
        if waited >= help_after:
            for job in sorted(mixed):
                for shard in hiding(tags, job):
                    if (job, shard) not in helped:
                        helped.add((job, shard))
                        log.info("%s: shard %d still hides released ingest job %s: releasing it there", what,
                                 shard, job)
                        release(job, shard)
        sleep(pause)
        pause = min(pause * 2, 0.05)
