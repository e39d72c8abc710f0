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
through its releases leaves no read mixed until the holds' lease runs out).

A shard can also hide a job it was already released from, because a second job holds its view too:
the second job's hold reached that shard before the first job's release, and another shard after it
(that shard flipped first).  The second job's coordinator repairs that before its first row
(:func:`advance_past_released`: once the first job's releases are all in, every copy the second job
alone holds pins its view again from what is applied now, ``shard.advance_view``), so a read waits
for that too, up to :data:`STUCK_WAIT`.  What still cannot settle (a third job holding the same
shard, already applying) is answered as read, with a WARNING naming the job, and later reads of
that job answer at once (:data:`WARNED_JOBS` jobs remembered).  A read never waits more than
:data:`SETTLE_WAIT`; a failed helping release is logged, not raised (the read is a read).

Request cost: one read per shard when no release is under way; otherwise the reads again, every
few milliseconds, for as long as the release takes (one round of messages).  A job's coordinator
reads every shard once after its holds, again only while another job's release is under way, and
sends one ``shard.advance_view`` per copy only when a view hides a released job.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardstore.segments.held_view import ViewTag

__all__ = ["ADVANCE_WAIT", "HELP_AFTER", "SETTLE_WAIT", "STUCK_WAIT", "advance_past_released", "advance_plan", "hiding",
           "mixed_jobs", "read_all_at_once", "settling", "stale_jobs", "tag_of"]

log = logging.getLogger(__name__)

#: how long a read waits for a release under way before it releases a mixed job on the shards hiding it (s)
HELP_AFTER = 0.25
#: how long a read waits for answers showing every job all at once before it answers what it read (s)
SETTLE_WAIT = 10.0
#: how long a read waits for a shard hiding a released job to be advanced by the job holding it too (s)
STUCK_WAIT = 0.5
#: how long a job's coordinator waits, after its holds, for other jobs' releases under way to finish (s); well
#: under a third of the hold lease, after which its own renewal would make its holds unfit to advance
ADVANCE_WAIT = 2.0
#: how many jobs a process remembers having warned about (each read of them then answers at once)
WARNED_JOBS = 1024

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


def stale_jobs(tags: Sequence[ViewTag], job: str) -> tuple[frozenset[str], dict[str, list[int]]]:
    """The jobs other than ``job`` that a shard's view hides though they no longer hold it (released, or lapsed);
    and the jobs other than ``job`` whose release is under way, with the shards they still hold: released from a
    shard (stale there, or shown) and still holding another."""
    stale = frozenset(j for t in tags for j in t.hidden - t.held if j != job)
    shown = _shown(tags)
    busy = {j: [i for i, t in enumerate(tags) if j in t.held]
            for j in sorted(stale | (shown & frozenset().union(*(t.held for t in tags))) - {job})}
    return stale, {j: shards for j, shards in busy.items() if shards}


def advance_plan(tags: Sequence[ViewTag], job: str) -> tuple[str, dict[str, list[int]]]:
    """What ``job``'s coordinator does next, after its holds (:func:`advance_past_released`), from every shard's tag:

    - ``wait``: another job's release is under way (the jobs and the shards they still hold);
    - ``advance``: a released job one shard shows is hidden by others, and every shard hiding a released job is
      held by ``job`` alone, so advancing them all shows it everywhere;
    - ``stuck``: such a job, but another job holds one of those shards too: advancing only the others could hide a
      released job on one shard and show it on another where none was mixed, so nothing is advanced;
    - ``done``: no released job is shown by one shard and hidden by another.
    """
    stale, busy = stale_jobs(tags, job)
    if busy:
        return "wait", busy
    if not stale & _shown(tags):  # a released job hidden everywhere it is known is consistent: it shows when the holds end
        return "done", {}
    if all(t.held == {job} for t in tags if t.hidden - t.held - {job}):
        return "advance", {}
    return "stuck", {}


def tag_of(answer: Any) -> ViewTag:
    """The view tag of a shard's tagged answer (``shard.count``/``shard.scan`` with ``tagged``); an untagged one
    (a node of an older build answers the bare value) hides and shows nothing."""
    if not isinstance(answer, dict):
        return ViewTag()
    return ViewTag(hidden=frozenset(answer.get("hidden") or ()), held=frozenset(answer.get("held") or ()),
                   shown=frozenset(answer.get("shown") or ()))


def _shown(tags: Sequence[ViewTag]) -> frozenset[str]:
    """The released jobs some shard's view shows."""
    return frozenset().union(*(t.shown for t in tags))


def _help_release(jobs: dict[str, list[int]], helped: set[tuple[str, int]], release: Callable[[str, int], None],
                  what: str) -> None:
    """``release(job, shard)`` once per released job and shard still holding it; a failure is logged (the caller
    reads again, and the job's lease ends the hold at the latest)."""
    for job, shards in jobs.items():
        for shard in shards:
            if (job, shard) not in helped:
                helped.add((job, shard))
                log.info("%s: shard %d still holds released ingest job %s: releasing it there", what, shard, job)
                try:
                    release(job, shard)
                except Exception as exc:  # noqa: BLE001 - a read or a job goes on either way
                    log.info("%s: releasing ingest job %s on shard %d failed (%r)", what, job, shard, exc)


_warned: OrderedDict[str, None] = OrderedDict()  # jobs a read answered part of (logged once each), newest last


def _warn_once(jobs: Sequence[str]) -> bool:
    """Remember ``jobs`` as warned about; True when one of them was not yet (the caller logs then)."""
    new = [j for j in jobs if j not in _warned]
    for j in jobs:
        _warned[j] = None
        _warned.move_to_end(j)
    while len(_warned) > WARNED_JOBS:
        _warned.popitem(last=False)
    return bool(new)


def read_all_at_once(read: Callable[[], list[A]], tag: Callable[[A], ViewTag],
                     release: Callable[[str, int], None], *, what: str = "a read",
                     help_after: float = HELP_AFTER, settle_wait: float = SETTLE_WAIT,
                     stuck_wait: float = STUCK_WAIT, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> list[A]:
    """``read()`` (one answer per shard) again while the release of an ingest job mixed among the answers' tags is
    under way; after ``help_after``, ``release(job, shard)`` on each shard it has yet to reach; while a shard hides a
    released job, for ``stuck_wait`` (unless that job was warned about before); answers that cannot settle, or
    after ``settle_wait``, with a WARNING (see the module docstring)."""
    start = clock()
    pause = 0.002
    helped: set[tuple[str, int]] = set()
    while True:
        answers = read()
        waiting, stuck = settling([tag(a) for a in answers])
        if not waiting and not stuck:
            return answers
        waited = clock() - start
        if (stuck and (waited >= stuck_wait or any(j in _warned for j in stuck))) or waited >= settle_wait:
            jobs = sorted(stuck | set(waiting))
            if _warn_once(jobs):
                log.warning("%s shows part of ingest job(s) %s: a shard hides what another shows (%s)", what,
                            ", ".join(jobs), "its view is held by another job until that one ends" if stuck else
                            f"their release did not reach every shard in {waited:.1f}s")
            return answers
        if waited >= help_after:
            _help_release(waiting, helped, release, what)
        sleep(pause)
        pause = min(pause * 2, 0.05)


def advance_past_released(read: Callable[[], list[A]], tag: Callable[[A], ViewTag], job: str,
                          advance: Callable[[], None], release: Callable[[str, int], None], *,
                          what: str = "an ingest job", wait: float = ADVANCE_WAIT, help_after: float = HELP_AFTER,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep) -> bool:
    """After ``job``'s holds and before its first row: until no released job is shown by one shard and hidden by
    another (:func:`advance_plan` decides each round).

    ``read()``: one tagged answer per shard; ``advance()``: ``shard.advance_view`` for ``job`` on every copy (a copy
    it alone holds, by its first hold there, whose view hides only released jobs besides it, pins its view again
    from what is applied now).  While another job's release is under way (released from a shard, still holding
    another) this waits for it first, since a shard advanced before that release reaches the others would show the
    job they then keep hiding; after ``help_after`` it releases that job where it still holds if a shard shows it
    (proof that its ``done`` is written), as a read would.  True when nothing is mixed; False, with a WARNING,
    when that does not settle within ``wait``, or another job holds a shard that would need advancing: the job
    then goes on, and those views show the released job when every holder ends.  The caller holds every copy again
    after this (a renewal: an ``advance_view`` still on its way, as after a timeout, then changes nothing)."""
    start = clock()
    pause = 0.002
    helped: set[tuple[str, int]] = set()
    advances = 0
    while True:
        tags = [tag(a) for a in read()]
        plan, busy = advance_plan(tags, job)
        if plan == "done":
            return True
        waited = clock() - start
        if plan == "advance" and advances < 2:
            advances += 1
            advance()
            continue
        if plan != "wait" or waited >= wait:
            stale, _ = stale_jobs(tags, job)
            log.warning("%s %s: a view it holds still hides released ingest job(s) %s that another shows (%s); they "
                        "show there when the jobs holding that view end", what, job,
                        ", ".join(sorted(stale | set(busy))), f"their release is not in after {waited:.1f}s"
                        if plan == "wait" else "another job holds it too")
            return False
        if waited >= help_after:  # only a job a shard shows: the proof that its done is written
            shown = _shown(tags)
            _help_release({o: sh for o, sh in busy.items() if o in shown}, helped, release, f"{what} {job}")
        sleep(pause)
        pause = min(pause * 2, 0.05)
