"""Reads that show an ingest job all at once across shards (engine/coordinator/view_reads.py): the pure decision
over every combination of three shards' tags, and the read loop with a fake clock."""

from __future__ import annotations

import itertools
import logging

import pytest

from shardstore.engine.coordinator import view_reads
from shardstore.engine.coordinator.view_reads import hiding, mixed_jobs, read_all_at_once, settling, tag_of
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
    monkeypatch.setattr(view_reads, "_warned", set())


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


def test_a_view_another_job_holds_is_answered_at_once_with_one_warning(caplog: pytest.LogCaptureFixture):
    """Shard 1 was released from j but another job holds its view: it flips when that job ends, maybe minutes
    later; reads answer at once (not after SETTLE_WAIT each), and the WARNING is logged once."""
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            fake = Fake(["shows", "hides"], flips_at=None)
            assert _run(fake, what="count of [docs]") == ["shows", "hides"]
            assert fake.reads == 1 and fake.now == 0 and not fake.released
    assert caplog.text.count("count of [docs] shows part of ingest job(s) j") == 1
    assert "held by another job" in caplog.text


def test_a_release_that_never_arrives_is_answered_after_the_wait(caplog: pytest.LogCaptureFixture):
    fake = Fake(["shows", "holds"], flips_at=None)
    fake.release = lambda job, shard: fake.released.append((job, shard))  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        assert _run(fake, what="count of [docs]") == ["shows", "holds"]
    assert fake.released == [("j", 1)]  # asked once, not on every read
    assert 10.0 <= fake.now < 10.2
    assert "did not reach every shard in 10.0s" in caplog.text
