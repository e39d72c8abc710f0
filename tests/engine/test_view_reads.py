"""Reads that show an ingest job all at once across shards (engine/coordinator/view_reads.py): the pure decision
over every combination of three shards' tags, and the read loop with a fake clock."""

from __future__ import annotations

import itertools
import logging

import pytest

from shardstore.engine.coordinator.view_reads import hiding, mixed_jobs, read_all_at_once, tag_of
from shardstore.segments.held_view import ViewTag

# what one shard's view can say of one job: never heard of it, holds (hides) it, or shows it after its release
STATES = {"none": ViewTag(), "hides": ViewTag(hidden=frozenset({"j"})), "shows": ViewTag(shown=frozenset({"j"}))}


def test_a_job_is_mixed_exactly_when_one_shard_shows_it_and_another_hides_it():
    for combo in itertools.product(STATES, repeat=3):
        tags = [STATES[s] for s in combo]
        want = {"j"} if "hides" in combo and "shows" in combo else set()
        assert mixed_jobs(tags) == want, combo
        assert hiding(tags, "j") == [i for i, s in enumerate(combo) if s == "hides"]
    # two jobs are judged apart: k shown everywhere, j hidden everywhere
    both = [ViewTag(hidden=frozenset({"j"}), shown=frozenset({"k"}))] * 2
    assert mixed_jobs(both) == frozenset() and mixed_jobs([]) == frozenset()
    assert tag_of({"count": 3, "hidden": ["a"], "shown": []}) == ViewTag(hidden=frozenset({"a"}))


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


def test_a_consistent_read_answers_at_once():
    for states in (["none", "hides"], ["hides", "hides"], ["shows", "none"], ["shows", "shows"]):
        fake = Fake(states, flips_at=None)
        assert _run(fake) == states and fake.reads == 1 and not fake.released


def test_a_mixed_read_is_read_again_until_the_release_reaches_every_shard():
    fake = Fake(["shows", "hides", "hides"], flips_at=0.1)
    assert _run(fake) == ["shows"] * 3
    assert fake.reads > 1 and not fake.released  # the release under way got there first


def test_a_release_cut_short_is_finished_by_the_reader():
    fake = Fake(["shows", "hides", "none"], flips_at=None)  # the job's coordinator died between two releases
    assert _run(fake) == ["shows", "shows", "none"]
    assert fake.released == [("j", 1)] and 0.25 <= fake.now < 0.5


def test_a_view_another_job_holds_is_answered_after_the_wait_with_a_warning(caplog: pytest.LogCaptureFixture):
    fake = Fake(["shows", "hides"], flips_at=None)
    fake.release = lambda job, shard: fake.released.append((job, shard))  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        assert _run(fake, what="count of [docs]") == ["shows", "hides"]
    assert fake.released == [("j", 1)]  # asked once, not on every read
    assert 10.0 <= fake.now < 10.2
    assert "count of [docs] shows part of ingest job(s) j" in caplog.text
