"""Reads over every shard of an index that show an ingest job all at once, or nothing of it (issue 43).

An ingest job's release flips each shard copy's view in turn, within one round of messages
(docs/design/ingest.md, "Atomic visibility"): a count or scan that reads one shard just after its
flip and another just before would show part of the job.  So each shard answers with a
:class:`~shardstore.segments.held_view.ViewTag`: the jobs its view hides (held since it was pinned)
and the released jobs it shows.  A job one shard shows and another hides is *mixed*
(:func:`mixed_jobs`); the read is taken again until no job is mixed.

A shard shows a job only once the job's release reached it, and a release is sent only after the
job's ``done`` record is written: every row of it is applied on every shard.  So a job still
*holding* the shards that hide it is being released: the read waits for that (every few ms), and
after :data:`HELP_AFTER` it releases the job on those shards itself (a coordinator killed halfway
through its releases leaves no read mixed until the holds' lease runs out).  A shard that hides a job
it was already released from, because another job holds its view too (its hold reached that shard
before the first job's release, the other shard after), flips only when that job ends: the read
then answers at once what it read, with a WARNING naming the job (once per job), instead of waiting
for it.  A read never waits more than :data:`SETTLE_WAIT`; a failed helping release is logged, not
raised (the read is a read).

Request cost: one read per shard when no release is under way; otherwise the reads again, every
few milliseconds, for as long as the release takes (one round of messages).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardstore.segments.held_view import ViewTag

__all__ = ["HELP_AFTER", "SETTLE_WAIT", "hiding", "mixed_jobs", "read_all_at_once", "settling", "tag_of"]

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


def settling(tags: Sequence[ViewTag]) -> tuple[dict[str, list[int]], frozenset[str]]:
    """Of the mixed jobs: those whose release is under way, with the shards it has yet to reach (each still holds
    the job), and those that cannot settle now (a shard hides the job but no longer holds it: another job does)."""
    waiting, stuck = {}, set()
    for job in sorted(mixed_jobs(tags)):
        shards = hiding(tags, job)
        if all(job in tags[i].held for i in shards):
            waiting[job] = shards
        else:
            stuck.add(job)
    return waiting, frozenset(stuck)


def tag_of(answer: Any) -> ViewTag:
    """The view tag of a shard's tagged answer (``shard.count``/``shard.scan`` with ``tagged``); an untagged one
    (a node of an older build answers the bare value) hides and shows nothing."""
    if not isinstance(answer, dict):
        return ViewTag()
    return ViewTag(hidden=frozenset(answer.get("hidden") or ()), held=frozenset(answer.get("held") or ()),
                   shown=frozenset(answer.get("shown") or ()))


_warned: set[str] = set()  # jobs a read answered part of (logged once each)


def read_all_at_once(read: Callable[[], list[A]], tag: Callable[[A], ViewTag],
                     release: Callable[[str, int], None], *, what: str = "a read",
                     help_after: float = HELP_AFTER, settle_wait: float = SETTLE_WAIT,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> list[A]:
    """``read()`` (one answer per shard) again while the release of an ingest job mixed among the answers' tags is
    under way; after ``help_after``, ``release(job, shard)`` on each shard it has yet to reach; answers that cannot
    settle now, or after ``settle_wait``, with a WARNING (see the module docstring)."""
    start = clock()
    pause = 0.002
    helped: set[tuple[str, int]] = set()
    while True:
        answers = read()
        waiting, stuck = settling([tag(a) for a in answers])
        if not waiting and not stuck:
            return answers
        waited = clock() - start
        if stuck or waited >= settle_wait:
            jobs = sorted(stuck | set(waiting))
            if not set(jobs) <= _warned:
                _warned.update(jobs)
                log.warning("%s shows part of ingest job(s) %s: a shard hides what another shows (%s)", what,
                            ", ".join(jobs), "its view is held by another job until that one ends" if stuck else
                            f"their release did not reach every shard in {waited:.1f}s")
            return answers
        if waited >= help_after:
            for job, shards in waiting.items():
                for shard in shards:
                    if (job, shard) not in helped:
                        helped.add((job, shard))
                        log.info("%s: shard %d still holds released ingest job %s: releasing it there", what, shard,
                                 job)
                        try:
                            release(job, shard)
                        except Exception as exc:  # noqa: BLE001 - the read goes on; the job's lease ends the hold
                            log.info("%s: releasing ingest job %s on shard %d failed (%r)", what, job, shard, exc)
        sleep(pause)
        pause = min(pause * 2, 0.05)
