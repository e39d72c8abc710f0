"""Reads that show an ingest job all at once across shards (engine/coordinator/view_reads.py): the pure decisions
over every combination of three shards' tags, the read loop and a job's advance past released jobs with a fake
clock."""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict

import pytest

from shardstore.engine.coordinator import view_reads
from shardstore.engine.coordinator.view_reads import (
    advance_past_released,
    advance_plan,
    hiding,
    mixed_jobs,
    read_all_at_once,
    settling,
    stale_jobs,
    tag_of,
)
from shardstore.segments.held_view import ViewTag

J = frozenset({"j"})
# what one shard's view can say of job j: never heard of it; hides it, j still holding it (its release has not
# come); hides it, released, while another job holds the view; shows it after its release
STATES = {"none": ViewTag(), "holds": ViewTag(hidden=J, held=J), "hides": ViewTag(hidden=J),
          "shows": ViewTag(shown=J)}


def test_a_job_is_mixed_exactly_when_one_shard_shows_it_and_another_hides_it():
    for combo in itertools.product(STATES, repeat=3):
        tags = [STATES[s] for s in combo]
        hide = [i for i, s in enumerate(combo) if s in ("holds", "hides")]
        mixed = bool(hide) and "shows" in combo
        assert mixed_jobs(tags) == ({"j"} if mixed else set()), combo
        assert hiding(tags, "j") == hide
        waiting, stuck = settling(tags)
        if not mixed:
            assert (waiting, stuck) == ({}, frozenset()), combo
        elif "hides" in combo:  # a shard released from j still hides it: it flips only with the other job
            assert (waiting, stuck) == ({}, {"j"}), combo
        else:  # every shard hiding j still holds it: its release is under way
            assert (waiting, stuck) == ({"j": hide}, frozenset()), combo
    # two jobs are judged apart: k shown everywhere, j hidden everywhere
    both = [ViewTag(hidden=J, held=J, shown=frozenset({"k"}))] * 2
    assert mixed_jobs(both) == frozenset() and mixed_jobs([]) == frozenset()
    assert tag_of({"count": 3, "hidden": ["a"], "held": ["a"], "shown": []}) == ViewTag(hidden={"a"}, held={"a"})
    assert tag_of(3) == ViewTag()  # a node of an older build answers the bare count


class Fake:
    """Shards whose views flip when released; a clock moved by the loop's sleeps."""

    def __init__(self, states: list[str], flips_at: float | None) -> None:
        self.states, self.flips_at, self.now = list(states), flips_at, 0.0
        self.released: list[tuple[str, int]] = []
        self.reads = 0

    def read(self) -> list[str]:
        self.reads += 1
        if self.flips_at is not None and self.now >= self.flips_at:
            self.states = ["shows"] * len(self.states)  # the job's own coordinator reached every shard
        return list(self.states)

    def release(self, job: str, shard: int) -> None:
        self.released.append((job, shard))
        self.states[shard] = "shows"

    def sleep(self, s: float) -> None:
        self.now += s


def _run(fake: Fake, **kw) -> list[str]:  # noqa: ANN003
    return read_all_at_once(fake.read, STATES.__getitem__, fake.release, clock=lambda: fake.now, sleep=fake.sleep,
                            help_after=0.25, settle_wait=10.0, **kw)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):  # noqa: ANN001, ANN202 - each test sees its own first warning
    monkeypatch.setattr(view_reads, "_warned", OrderedDict())


def test_a_consistent_read_answers_at_once():
    for states in (["none", "holds"], ["holds", "hides"], ["shows", "none"], ["shows", "shows"]):
        fake = Fake(states, flips_at=None)
        assert _run(fake) == states and fake.reads == 1 and not fake.released


def test_a_mixed_read_is_read_again_until_the_release_reaches_every_shard():
    fake = Fake(["shows", "holds", "holds"], flips_at=0.1)
    assert _run(fake) == ["shows"] * 3
    assert fake.reads > 1 and not fake.released  # the release under way got there first


def test_a_release_cut_short_is_finished_by_the_reader():
    fake = Fake(["shows", "holds", "none"], flips_at=None)  # the job's coordinator died between two releases
    assert _run(fake) == ["shows", "shows", "none"]
    assert fake.released == [("j", 1)] and 0.25 <= fake.now < 0.5


def test_a_helping_release_that_fails_is_logged_and_the_read_goes_on(caplog: pytest.LogCaptureFixture):
    fake = Fake(["shows", "holds"], flips_at=1.0)

    def failing(job: str, shard: int) -> None:
        fake.released.append((job, shard))
        raise ConnectionError("the primary is gone")

    fake.release = failing  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        assert _run(fake) == ["shows", "shows"]
    assert fake.released == [("j", 1)] and "releasing ingest job j on shard 1 failed" in caplog.text


def test_a_view_another_job_holds_is_waited_for_once_then_answered_at_once_with_one_warning(
        caplog: pytest.LogCaptureFixture):
    """Shard 1 was released from j but another job holds its view, and that job does not advance it (a third job
    holds it too): it flips when those jobs end, maybe minutes later.  The first read waits STUCK_WAIT for an
    advance, later reads answer at once (not after a wait each), and the WARNING is logged once."""
    with caplog.at_level(logging.WARNING):
        for n in range(3):
            fake = Fake(["shows", "hides"], flips_at=None)
            assert _run(fake, what="count of [docs]") == ["shows", "hides"]
            assert not fake.released
            if n == 0:
                assert view_reads.STUCK_WAIT <= fake.now < view_reads.STUCK_WAIT + 0.1 and fake.reads > 1
            else:
                assert fake.reads == 1 and fake.now == 0
    assert caplog.text.count("count of [docs] shows part of ingest job(s) j") == 1
    assert "held by another job" in caplog.text


def test_a_view_the_other_job_advances_meanwhile_is_read_all_at_once(caplog: pytest.LogCaptureFixture):
    """The other job's coordinator advances shard 1 past j 0.05 s later (advance_past_released): the read waits for
    it and answers all of j, with no warning."""
    fake = Fake(["shows", "hides"], flips_at=0.05)
    with caplog.at_level(logging.WARNING):
        assert _run(fake) == ["shows", "shows"]
    assert fake.reads > 1 and not fake.released and not caplog.text


def test_the_jobs_warned_about_are_capped(monkeypatch):  # noqa: ANN001
    monkeypatch.setattr(view_reads, "WARNED_JOBS", 3)
    assert view_reads._warn_once(["a", "b"]) and not view_reads._warn_once(["a"])
    assert view_reads._warn_once(["c", "d"])  # a, the oldest after a was seen again... b goes
    assert list(view_reads._warned) == ["a", "c", "d"]


def test_a_release_that_never_arrives_is_answered_after_the_wait(caplog: pytest.LogCaptureFixture):
    fake = Fake(["shows", "holds"], flips_at=None)
    fake.release = lambda job, shard: fake.released.append((job, shard))  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        assert _run(fake, what="count of [docs]") == ["shows", "holds"]
    assert fake.released == [("j", 1)]  # asked once, not on every read
    assert 10.0 <= fake.now < 10.2
    assert "did not reach every shard in 10.0s" in caplog.text


def test_stale_jobs_are_those_a_view_hides_after_their_release_busy_while_they_hold_another_shard():
    """Every combination of three shards' tags of job j, judged for another job k that holds them all."""
    for combo in itertools.product(STATES, repeat=3):
        tags = [STATES[s] for s in combo]
        stale, busy = stale_jobs(tags, "k")
        assert stale == ({"j"} if "hides" in combo else set()), combo
        holding = [i for i, s in enumerate(combo) if s == "holds"]
        released = "hides" in combo or "shows" in combo  # somewhere: its release is under way if it holds elsewhere
        assert busy == ({"j": holding} if released and holding else {}), combo
        assert stale_jobs(tags, "j") == (frozenset(), {})  # a job is never stale to itself


K = frozenset({"k"})
# what a shard says after the holds of job k, which runs advance_past_released, of another job j: unknown here; j
# holds it too (running, or its release has not come); j released here, k alone holds; j released here, k and a
# third job m hold; j's release flipped it before k's hold
ADV = {"none": ViewTag(hidden=K, held=K), "holds": ViewTag(hidden=J | K, held=J | K),
       "hides": ViewTag(hidden=J | K, held=K), "third": ViewTag(hidden=J | K | {"m"}, held=K | {"m"}),
       "shows": ViewTag(hidden=K, held=K, shown=J)}


def test_the_advance_plan_over_every_state_of_three_shards():
    """``advance_plan`` against an oracle written from the states' meaning, for every combination of three shards."""
    for combo in itertools.product(ADV, repeat=3):
        plan, busy = advance_plan([ADV[s] for s in combo], "k")
        holding = [i for i, s in enumerate(combo) if s == "holds"]
        released = {"hides", "third", "shows"} & set(combo)
        if holding and released:  # j's release reached some shard and not yet this one
            want = ("wait", {"j": holding})
        elif "shows" in combo and {"hides", "third"} & set(combo):  # mixed now
            want = ("stuck", {}) if "third" in combo else ("advance", {})
        else:  # j hidden wherever it is known, or shown wherever it is known: consistent
            want = ("done", {})
        assert (plan, busy) == want, combo


class Advancing(Fake):
    """Shards as job k's coordinator sees them after its holds (:data:`ADV`): ``advance`` flips every shard k alone
    holds that hides released j to show it; j's release of a shard it still holds leaves it hiding j (k holds it
    too), as does a helping release."""

    def __init__(self, states: list[str], release_at: float | None) -> None:
        super().__init__(states, None)
        self.release_at, self.advances = release_at, 0

    def read(self) -> list[str]:
        self.reads += 1
        if self.release_at is not None and self.now >= self.release_at:  # j's own releases came in
            self.states = ["hides" if s == "holds" else s for s in self.states]
        return list(self.states)

    def release(self, job: str, shard: int) -> None:
        self.released.append((job, shard))
        self.states[shard] = "hides"

    def advance(self) -> None:
        self.advances += 1
        self.states = ["shows" if s == "hides" else s for s in self.states]


def _advance(fake: Advancing) -> bool:
    return advance_past_released(fake.read, ADV.__getitem__, "k", fake.advance, fake.release,
                                 clock=lambda: fake.now, sleep=fake.sleep, wait=2.0, help_after=0.25)


def test_a_job_advances_its_views_past_a_job_released_between_its_holds():
    fake = Advancing(["shows", "hides"], release_at=None)  # j's release reached shard 0 before k's hold, 1 after
    assert _advance(fake) is True
    assert fake.states == ["shows", "shows"] and fake.advances == 1 and fake.reads == 2 and fake.now == 0


def test_nothing_mixed_needs_no_advance():
    """Among them j released everywhere while k held: hidden on every shard, consistent (it shows when k ends);
    advancing could flip one shard and not another (a hold of a third job on its way)."""
    for states in (["none", "none"], ["shows", "shows"], ["holds", "holds"], ["shows", "none"],
                   ["hides", "hides"], ["hides", "third"], ["none", "hides"]):
        fake = Advancing(states, release_at=None)
        assert _advance(fake) is True and fake.advances == 0 and fake.reads == 1, states


def test_a_release_under_way_is_waited_for_and_then_nothing_is_mixed():
    fake = Advancing(["hides", "holds"], release_at=0.1)  # j hidden on both once its release is in
    assert _advance(fake) is True
    assert fake.states == ["hides", "hides"] and fake.advances == 0 and not fake.released
    assert 0.1 <= fake.now < 0.2


def test_a_release_under_way_that_no_view_hides_yet_is_waited_for_then_advanced():
    """j's release flipped shard 0 before k's hold there and has not reached shard 1 (held by j and k): once it gets
    there shard 1 would hide j for as long as k runs; so k waits for it, then advances."""
    fake = Advancing(["shows", "holds"], release_at=0.1)
    assert _advance(fake) is True
    assert fake.states == ["shows", "shows"] and fake.advances == 1 and not fake.released and 0.1 <= fake.now < 0.2


def test_a_release_cut_short_is_finished_when_a_shard_proves_it_then_advanced():
    fake = Advancing(["shows", "hides", "holds"], release_at=None)  # j's coordinator died before shard 2
    assert _advance(fake) is True
    assert fake.released == [("j", 2)] and fake.states == ["shows"] * 3 and 0.25 <= fake.now < 0.5


def test_without_proof_of_the_release_nothing_is_released_and_the_job_goes_on(caplog: pytest.LogCaptureFixture):
    fake = Advancing(["hides", "holds"], release_at=None)  # no shard shows j: its done is not proven
    with caplog.at_level(logging.WARNING):
        assert _advance(fake) is False
    assert not fake.released and fake.advances == 0 and 2.0 <= fake.now < 2.1
    assert "their release is not in after 2.0s" in caplog.text


def test_views_a_third_job_holds_are_not_advanced_at_all(caplog: pytest.LogCaptureFixture):
    fake = Advancing(["shows", "hides", "third"], release_at=None)
    with caplog.at_level(logging.WARNING):
        assert _advance(fake) is False
    assert fake.advances == 0 and fake.now == 0 and fake.states == ["shows", "hides", "third"]
    assert "another job holds it too" in caplog.text
