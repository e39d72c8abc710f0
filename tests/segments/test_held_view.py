"""Views held for ingest jobs (issue 43, segments/held_view.py): the pure bookkeeping, then a directory's reads."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from shardstore.segments.held_view import SHOWN_MEMORY, HeldView, ViewTag


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_view_is_pinned_by_the_first_hold_and_follows_the_segments_after_the_last_release():
    clock, segments = Clock(), [("s1", "live1")]
    view = HeldView(clock)
    assert view.visible(lambda: list(segments)) == [("s1", "live1")] and not view.held
    assert view.hold("a", 10, lambda: list(segments)) is True
    segments.append(("s2", "live2"))
    assert view.hold("b", 10, lambda: list(segments)) is False  # a second job keeps the first one's view
    assert view.visible(lambda: list(segments)) == [("s1", "live1")]
    assert view.release("a") is False and view.jobs == ("b",)
    assert view.visible(lambda: list(segments)) == [("s1", "live1")]
    assert view.release("b") is True and not view.held
    assert view.visible(lambda: list(segments)) == [("s1", "live1"), ("s2", "live2")]
    assert view.release("never held") is True  # releasing twice, or a job a lapse dropped, is harmless
    with pytest.raises(ValueError, match="more than 0 seconds"):
        view.hold("c", 0, lambda: segments)


def test_a_read_says_which_jobs_its_view_hides_and_which_released_ones_it_shows():
    clock, segments = Clock(), [("s1", "live1")]
    view = HeldView(clock)

    def tag() -> ViewTag:
        return view.read(lambda: list(segments))[1]

    assert tag() == ViewTag()
    view.hold("a", 10, lambda: list(segments))
    view.hold("b", 10, lambda: list(segments))
    assert tag() == ViewTag(hidden=frozenset({"a", "b"}), held=frozenset({"a", "b"}))
    view.release("a")  # b still holds: the view still hides a, which no longer holds it
    assert tag() == ViewTag(hidden=frozenset({"a", "b"}), held=frozenset({"b"}))
    view.release("b")
    assert tag() == ViewTag(shown=frozenset({"a", "b"}))
    clock.now += SHOWN_MEMORY
    assert tag() == ViewTag()  # forgotten after SHOWN_MEMORY
    view.hold("c", 10, lambda: list(segments))
    clock.now += 11  # c's lease lapses: what is applied of it shows, but c was never released
    assert tag() == ViewTag() and view.lapsed == ["c"]


def test_a_release_after_the_lease_ran_out_is_a_lapse_not_a_release():
    """The lease ends at 10: a release at 10 finds it lapsed (logged by the directory), and the view does not
    claim to show a released job."""
    clock = Clock()
    view = HeldView(clock)
    view.hold("a", 10, lambda: [])
    clock.now = 10
    assert view.release("a") is True and view.lapsed == ["a"]
    assert view.read(lambda: [])[1] == ViewTag()


def test_a_view_and_its_tag_are_read_at_one_instant():
    """b's lease runs out between two clock readings of one read: the view and its tag agree (before, the view
    came from one reading and the tag from a later one: a pinned view hiding a, tagged as showing a)."""
    readings = iter([0.0] * 6 + [9.0] + [11.0] * 4)
    view = HeldView(lambda: next(readings))
    view.hold("a", 10, lambda: [("old", None)])  # readings: hold's lapse, its lease
    view.hold("b", 10, lambda: [("old", None)])  # two more
    view.release("a")  # two more (a lapse before and after): a released, b holds
    segments, tag = view.read(lambda: [("new", None)])  # one reading, 9.0: b still holds
    assert segments == [("old", None)] and tag.hidden == {"a", "b"} and tag.held == {"b"} and not tag.shown


def test_every_short_history_matches_a_model():
    """All 16,807 histories of 5 events over two jobs with 5-tick leases: the view is pinned exactly while some
    unexpired hold exists, pinned by the first hold after it was last free, re-holding extends a lease, and an
    advance pins it again only for a job holding it alone, by a hold that is not a renewal, while it hides
    another job that no longer holds it."""
    events = ["hold a", "hold b", "release a", "release b", "advance a", "advance b", "tick"]
    histories = list(itertools.product(events, repeat=5))
    assert len(histories) == 16807
    for history in histories:
        _check_history(history)


def _check_history(events: tuple[str, ...]) -> None:
    clock, generation = Clock(), [0]
    view = HeldView(clock)
    leases: dict[str, float] = {}
    pinned_at: int | None = None
    hidden: set[str] = set()  # jobs held since the pin
    released: set[str] = set()  # of those, released while another holds
    shown: set[str] = set()  # released jobs whose release (theirs or a later one) flipped the view
    renewed: set[str] = set()  # jobs that held again while holding

    def flip_if_free() -> None:
        nonlocal pinned_at
        if not leases and pinned_at is not None:
            shown.update(released)
            hidden.clear()
            released.clear()
            renewed.clear()
            pinned_at = None

    def expire() -> dict[str, float]:
        kept = {j: t for j, t in leases.items() if t > clock.now}
        renewed.difference_update(set(leases) - set(kept))
        return kept

    for event in events:
        generation[0] += 1  # the segments change between any two events
        current = lambda: [(generation[0], None)]  # noqa: E731
        if event == "tick":
            clock.now += 3
        else:
            verb, job = event.split()
            if verb == "hold":
                leases = expire()
                flip_if_free()
                if not leases:
                    pinned_at = generation[0]
                if job in leases or job in hidden:
                    renewed.add(job)
                leases[job] = clock.now + 5
                hidden.add(job)
                shown.discard(job)
                view.hold(job, 5, current)
            elif verb == "advance":
                leases = expire()
                flip_if_free()
                others = hidden - {job}
                can = (pinned_at is not None and set(leases) == {job} and job not in renewed and bool(others)
                       and others <= released)
                if can:
                    shown.update(released)
                    hidden.clear()
                    hidden.add(job)
                    released.clear()
                    pinned_at = generation[0]
                assert view.can_advance(job) == can, events
                assert view.advance(job, current) == can, events
            else:
                if leases.pop(job, None) is not None:
                    released.add(job)
                renewed.discard(job)
                view.release(job)
        leases = expire()
        flip_if_free()
        want = [(pinned_at, None)] if pinned_at is not None else current()
        assert view.visible(current) == want, events
        assert view.held == bool(leases) and set(view.jobs) == set(leases)
        # what a read of that view hides and shows (engine/coordinator/view_reads.py compares them across shards)
        _segments, tag = view.read(current)
        assert tag == ViewTag(hidden=frozenset(hidden) if pinned_at is not None else frozenset(),
                              held=frozenset(leases) if pinned_at is not None else frozenset(),
                              shown=frozenset(shown)), events


def test_no_job_shows_a_row_it_applied_while_holding_before_its_release_in_random_histories():
    """A property, not a copy of the implementation: 20,000 seeded histories of 10 events over three jobs (hold,
    apply a row, release, advance, a tick of 3 against 5-tick leases), the jobs' coordinators keeping the protocol:
    rows only while holding; an advance sent only before the job's first row of its hold (a retry after a lapse or
    a release is a new hold) and then a renewal before that first row; a sent advance may arrive late, any time.
    A row a job applied while holding must stay out of the view until that job's release, or until the view
    follows the segments again (nobody holds it: a lapse shows what is applied)."""
    import random

    jobs = ("a", "b", "c")
    for seed in range(20_000):
        rnd = random.Random(seed)
        clock = Clock()
        view = HeldView(clock)
        applied: set[tuple[str, int]] = set()
        protected: set[tuple[str, int]] = set()
        period: dict[str, dict[str, bool]] = {}  # job -> {"rows": applied a row, "sent": advance sent} this hold
        history = []
        for step in range(10):
            verb, job = rnd.choice(("hold", "apply", "release", "advance", "tick")), rnd.choice(jobs)
            history.append(f"{verb} {job}")
            current = lambda: [(frozenset(applied), None)]  # noqa: E731
            holding = set(view.jobs)
            for j in list(period):
                if j not in holding:  # its hold ended (a lapse): a new hold is a new period
                    del period[j]
            if verb == "tick":
                clock.now += 3
            elif verb == "hold":
                period.setdefault(job, {"rows": False, "sent": False})
                view.hold(job, 5, current)
            elif verb == "apply" and job in holding:
                p = period[job]
                if not p["rows"] and p["sent"]:
                    view.hold(job, 5, current)  # the coordinator renews before its first row after an advance
                p["rows"] = True
                applied.add((job, step))
                protected.add((job, step))
            elif verb == "release":
                view.release(job)
                protected -= {r for r in protected if r[0] == job}
                period.pop(job, None)
            elif verb == "advance" and job in period:
                p = period[job]
                if not p["rows"]:
                    p["sent"] = True
                if p["sent"]:  # sent before the first row; maybe delivered only now
                    view.advance(job, current)
            if not view.held:  # the view follows the segments: nothing is held back any more
                protected.clear()
            (visible, _live), = view.visible(current)
            assert not visible & protected, (seed, history, sorted(visible & protected))


def test_a_retry_after_its_hold_lapsed_never_advances_past_its_own_rows():
    """Review of stop 57: job j applied rows and its coordinator died; its hold lapsed while job k kept the view
    pinned.  The retried commit of j holds again (j no longer holds, but it held this view before), k is released:
    an advance for j would pin j's first rows before j's release; it is refused.  A lapsed job hidden by the view
    (rows of a job cut short) keeps another job's advance refused too."""
    clock, applied = Clock(), ["P"]
    current = lambda: [(tuple(applied), None)]  # noqa: E731
    view = HeldView(clock)
    view.hold("k", 10, current)
    view.hold("j", 5, current)
    applied.append("j rows")
    clock.now = 6  # j lapsed; k (lease 10) still holds
    assert view.jobs == ("k",) and view.visible(current) == [(("P",), None)]
    view.hold("j", 30, current)  # the retry
    view.release("k")
    assert view.can_advance("j") is False and view.advance("j", current) is False
    assert view.visible(current) == [(("P",), None)]
    # a lapsed job in the view: nobody advances past its rows
    other = HeldView(clock)
    other.hold("x", 5, current)  # lapses at 11
    other.hold("y", 100, current)
    clock.now = 12
    other.hold("z", 100, current)
    other.release("y")
    assert other.can_advance("z") is False


def test_a_directory_answers_count_and_scan_from_the_held_view_and_flips_at_the_last_release(tmp_path: Path):
    """Updates, deletes and new ids of a job, refreshed twice behind the held view: count and scan show the view
    as it was (the update's old copy included), get stays realtime, nothing is merged; the release shows all."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import deletes, docs, live_ids

    sd = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b", "x"]))
        assert sd.hold_view("job", 60) is True  # refreshes first: what was acknowledged before stays searchable
        assert sd.count() == 3
        sd.apply(docs(3, ["c", "d", "a"]))
        sd.apply(deletes(6, ["x"]))
        sd.refresh()
        sd.apply(docs(7, ["e"]))
        assert sd.hold_view("job", 60) is False  # a retried commit: the same view
        sd.refresh()
        assert sd.count() == 3 and live_ids(sd) == {"a": 0, "b": 1, "x": 2}
        assert sd.get("a")["_seq_no"] == 5 and sd.get("x") is None  # get stays realtime
        assert sd.maybe_merge() == [] and sd.force_merge() == []  # no pinned segment's file merged away
        assert sd.release_view("job") is True
        assert sd.count() == 5 and live_ids(sd) == {"a": 5, "b": 1, "c": 3, "d": 4, "e": 7}
    finally:
        sd.close()


@pytest.mark.parametrize("primary", [True, False])
def test_a_directory_advances_a_view_past_a_job_released_while_another_held_it(tmp_path: Path, primary: bool):
    """Job x's release reached this copy while job j held its view too (j's hold came first here, x's release first
    on another shard): the view still hides x.  Before j's first row, ``advance_view("j")`` pins it again from what
    is applied (a primary refreshes; a replica marks its buffer, writing nothing until read): x shows, j's rows
    applied after stay hidden until j's release.  A renewed hold of j never advances (rows of it may be applied)."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import docs, live_ids

    sd = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        sd.refresh()
        assert sd.hold_view("x", 60, refresh=primary) is True
        assert sd.advance_view("x", refresh=primary) is False  # nothing released meanwhile
        sd.apply(docs(2, ["x1", "a"]))  # x's rows
        assert sd.hold_view("j", 60, refresh=primary) is False  # j joins the view x pinned
        assert sd.release_view("x", refresh=primary) is False  # j still holds: no flip, x still hidden
        assert live_ids(sd) == {"a": 0, "b": 1}
        files = set(os.listdir(sd.path))
        assert sd.advance_view("j", refresh=primary) is True
        assert (set(os.listdir(sd.path)) == files) is not primary  # a replica writes nothing until read
        assert sd.advance_view("j", refresh=primary) is False  # once is enough
        sd.apply(docs(4, ["j1", "b"]))  # j's rows
        sd.refresh()
        assert live_ids(sd) == {"a": 3, "b": 1, "x1": 2} and sd.count() == 3
        assert sd.hold_view("j", 60, refresh=primary) is False  # a renewal (or a retried commit)
        assert sd.release_view("j", refresh=primary) is True
        assert live_ids(sd) == {"a": 3, "b": 5, "x1": 2, "j1": 4}
        # a renewed hold: the job's rows may be applied already, so the view stays
        sd.hold_view("y", 60, refresh=primary)
        sd.hold_view("k", 60, refresh=primary)
        sd.apply(docs(6, ["k1"]))
        sd.hold_view("k", 60, refresh=primary)
        sd.release_view("y", refresh=primary)
        assert sd.advance_view("k", refresh=primary) is False
        assert "k1" not in live_ids(sd)
    finally:
        sd.close()


def test_repin_replaces_the_pinned_view_only_while_it_is_held():
    clock, segments = Clock(), [("s1", "live1")]
    view = HeldView(clock)
    view.repin(lambda: [("never", None)])  # nothing held: nothing pinned
    assert view.visible(lambda: list(segments)) == [("s1", "live1")]
    view.hold("a", 5, lambda: list(segments))
    view.repin(lambda: [("s1", "live1b"), ("s2", "live2")])
    assert view.visible(lambda: [("other", None)]) == [("s1", "live1b"), ("s2", "live2")]
    clock.now = 6  # lapsed: a repin after that pins nothing
    view.repin(lambda: [("late", None)])
    assert not view.held and view.visible(lambda: [("now", None)]) == [("now", None)]


def test_a_hold_without_refresh_writes_nothing_and_pins_what_came_before_the_job_when_read(tmp_path: Path):
    """A replica's hold (refresh=False) writes no segment; operations at or below the buffer's mark (one arriving
    late, below it, included) are what the view shows once read, the job's above it are not, until the release."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import deletes, docs, live_ids

    sd = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        sd.refresh()
        sd.apply(docs(3, ["x"]))  # buffered before the job; seq# 2 is still on its way
        files = set(os.listdir(sd.path))
        assert sd.hold_view("job", 60, refresh=False) is True
        assert set(os.listdir(sd.path)) == files  # no segment written by the hold
        sd.apply(docs(2, ["late"]))  # an operation below the mark arriving after the hold: not the job's
        sd.apply(docs(4, ["a", "c"]))  # the job: an update and a new id
        sd.apply(deletes(6, ["x"]))
        assert sd.hold_view("job", 60, refresh=False) is False
        assert sd.get("a")["_seq_no"] == 4 and sd.get("x") is None  # get stays realtime
        assert set(os.listdir(sd.path)) == files
        assert live_ids(sd) == {"a": 0, "b": 1, "late": 2, "x": 3}  # the read writes and pins the view
        assert sd.count() == 4
        sd.refresh()  # the job's operations are written behind the view
        assert live_ids(sd) == {"a": 0, "b": 1, "late": 2, "x": 3}
        assert sd.release_view("job") is True
        assert live_ids(sd) == {"a": 4, "b": 1, "late": 2, "c": 5}
    finally:
        sd.close()


def test_a_hold_without_refresh_pins_before_a_refresh_and_a_release_writes_nothing(tmp_path: Path):
    """A refresh while a deferred hold stands (a promotion, a full buffer) first writes what came before the job,
    then the rest, and the view shows only the first; a replica's release (refresh=False) of a view never read
    writes nothing, and the next refresh writes every buffered operation."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import docs, live_ids

    sd = ShardDirectory(str(tmp_path / "a"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        sd.hold_view("job", 60, refresh=False)
        sd.apply(docs(2, ["a", "c"]))
        sd.refresh()
        assert live_ids(sd) == {"a": 0, "b": 1}
        assert sd.get("a")["_seq_no"] == 2
        assert sd.release_view("job", refresh=False) is True
        assert live_ids(sd) == {"a": 2, "b": 1, "c": 3}
    finally:
        sd.close()
    sd = ShardDirectory(str(tmp_path / "b"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        files = set(os.listdir(sd.path))
        sd.hold_view("job", 60, refresh=False)
        sd.apply(docs(2, ["a", "c"]))
        assert sd.release_view("job", refresh=False) is True
        assert set(os.listdir(sd.path)) == files
        sd.refresh()
        assert live_ids(sd) == {"a": 2, "b": 1, "c": 3}
    finally:
        sd.close()


def test_a_deferred_view_whose_write_failed_is_written_again_by_the_next_refresh(tmp_path: Path, monkeypatch):
    """The deferred segment's write fails (the disk): the mark stays, so the next refresh writes the operations up to
    it first and pins them; before, the mark was dropped and the view missed a write acknowledged before the job."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import docs, live_ids

    sd = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        sd.refresh()
        sd.apply(docs(2, ["pre"]))  # acknowledged before the job
        sd.hold_view("job", 60, refresh=False)
        sd.apply(docs(3, ["j1", "a"]))  # the job
        write, calls = sd._write_segments, []

        def fails_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise OSError("injected: the disk")
            return write(*args, **kwargs)

        monkeypatch.setattr(sd, "_write_segments", fails_once)
        with pytest.raises(OSError, match="injected"):
            sd.count()
        assert sd.get("pre")["_seq_no"] == 2 and sd.get("a")["_seq_no"] == 4  # nothing lost from the buffer
        sd.refresh()
        assert live_ids(sd) == {"a": 0, "b": 1, "pre": 2}
        assert sd.release_view("job") is True
        assert live_ids(sd) == {"a": 4, "b": 1, "pre": 2, "j1": 3}
    finally:
        sd.close()


def test_counting_without_writing_the_deferred_view(tmp_path: Path):
    """``count(write_deferred=False)`` (the cluster view's count of a replica) answers from the segments the hold
    pinned and writes nothing; a plain count writes the deferred view."""
    from shardstore.segments.directory import ShardDirectory

    from .test_segments_directory import docs

    sd = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    try:
        sd.apply(docs(0, ["a", "b"]))
        sd.refresh()
        sd.apply(docs(2, ["pre"]))
        sd.hold_view("job", 60, refresh=False)
        files = set(os.listdir(sd.path))
        assert sd.count(write_deferred=False) == 2
        assert set(os.listdir(sd.path)) == files
        assert sd.count() == 3 and set(os.listdir(sd.path)) != files
    finally:
        sd.close()
