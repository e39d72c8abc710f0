"""Pure decisions of retrying and conditional create, and the wrappers over the memory store."""

from __future__ import annotations

import random

import pytest

from shardstore.blobstores import (
    BlobAlreadyExists,
    BlobNotFound,
    RetryingStore,
    RetryPolicy,
    Throttled,
    TransientError,
    open_backend,
)
from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.conditional import is_own_write
from shardstore.blobstores.errors import ConfigError
from shardstore.testing import FaultyStore


def test_backoff_is_capped_and_jittered() -> None:
    p = RetryPolicy(attempts=10, deadline=100, base_delay=0.1, max_delay=1.0)
    rng = random.Random(1)
    for attempt in range(1, 10):
        cap = min(1.0, 0.1 * 2 ** (attempt - 1))
        samples = [p.delay(attempt, rng) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8  # jitter spreads over the whole window


def test_attempts_and_deadline_bound_retries() -> None:
    rng = random.Random(0)
    p = RetryPolicy(attempts=3, deadline=10, base_delay=0.01, max_delay=0.01)
    assert p.next_delay(1, 0, rng) is not None
    assert p.next_delay(2, 0, rng) is not None
    assert p.next_delay(3, 0, rng) is None  # the third attempt was the last
    assert p.next_delay(1, 9.999, rng) is None or p.next_delay(1, 9.999, rng) < 0.001


@pytest.mark.parametrize("kw", [{"attempts": 0}, {"deadline": 0}, {"base_delay": 2, "max_delay": 1}])
def test_bad_policy(kw: dict) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kw)


def test_is_own_write() -> None:
    mine = BlobInfo("k", 3, "e", "w/1")
    assert is_own_write(mine, "w/1", b"abc", lambda: pytest.fail("no fetch with a token"))
    assert not is_own_write(mine, "w/2", b"abc", lambda: b"abc")
    bare = BlobInfo("k", 3, "e", None)
    assert is_own_write(bare, "w/1", b"abc", lambda: b"abc")
    assert not is_own_write(bare, "w/1", b"abd", lambda: b"abc")
    assert not is_own_write(bare, "w/1", b"abcd", lambda: pytest.fail("sizes differ: no fetch"))
    assert not is_own_write(bare, "w/1", None, lambda: b"abc")


def _stack(name: str, **policy: float) -> tuple[RetryingStore, FaultyStore, list[float]]:
    # FaultyStore stands in for faults no real part produces on demand (a lost reply).
    faulty = FaultyStore(open_backend(f"memory://{name}"))
    slept: list[float] = []
    store = RetryingStore(faulty, RetryPolicy(**{"attempts": 4, "base_delay": 0.001, "max_delay": 0.002, **policy}),
                          sleep=slept.append)
    return store, faulty, slept


def test_throttles_are_retried_and_counted(request: pytest.FixtureRequest) -> None:
    store, faulty, slept = _stack(request.node.name)
    faulty.inject(op="put", action="fail", error=Throttled, times=2)
    store.put("k", b"v")
    assert store.get("k") == b"v"
    m = store.metrics()
    assert (m["retries"], m["throttles"], len(slept)) == (2, 2, 2)


def test_retries_give_up_with_the_last_error(request: pytest.FixtureRequest) -> None:
    store, faulty, _ = _stack(request.node.name, attempts=3)
    faulty.inject(op="get", action="fail", error=TransientError, times=None)
    store.put("k", b"v")
    with pytest.raises(TransientError) as info:
        store.get("k")
    assert "gave up after 3 attempt(s)" in "".join(info.value.__notes__)
    assert store.metrics()["retries"] == 2


def test_permanent_errors_are_not_retried(request: pytest.FixtureRequest) -> None:
    store, _, slept = _stack(request.node.name)
    with pytest.raises(BlobNotFound):
        store.get("missing")
    assert slept == [] and store.metrics()["retries"] == 0


def test_crash_after_write_is_recognised_as_own(request: pytest.FixtureRequest) -> None:
    store, faulty, _ = _stack(request.node.name)
    faulty.inject(op="put", action="crash_after")
    info = store.put("c", b"mine", if_absent=True)
    assert info.size == 4 and store.get("c") == b"mine"
    # A different writer's blob is still a conflict, even after an ambiguous failure.
    faulty.inject(op="put", action="crash_before")
    with pytest.raises(BlobAlreadyExists):
        store.put("c", b"other", if_absent=True)


def test_crash_before_write_lands_nothing_then_retry_succeeds(request: pytest.FixtureRequest) -> None:
    store, faulty, _ = _stack(request.node.name)
    rule = faulty.inject(op="put", key="x/*", action="crash_before")
    store.put("x/1", b"v", if_absent=True)
    assert rule.fired == 1 and store.get("x/1") == b"v"


def test_fault_rules_by_key_count_and_probability(request: pytest.FixtureRequest) -> None:
    store, faulty, _ = _stack(request.node.name, attempts=1)
    store.put("a/1", b"1")
    store.put("b/1", b"1")
    faulty.inject(op="get", key="a/*", error=TransientError, times=None, after=1, probability=0.5)
    store.get("a/1")  # skipped by `after`
    outcomes = []
    for _ in range(40):
        try:
            store.get("a/1")
            outcomes.append(True)
        except TransientError:
            outcomes.append(False)
    assert 5 < outcomes.count(False) < 35  # seeded probability, both sides seen
    assert all(store.get("b/1") == b"1" for _ in range(5))  # other keys untouched


def test_a_stale_listing_lags_the_last_puts_and_deletes(request: pytest.FixtureRequest) -> None:
    faulty = FaultyStore(open_backend(f"memory://{request.node.name}"))
    for k in ("p/a", "p/b", "p/c", "q/x"):
        faulty.put(k, b"12345")
    faulty.delete(["p/a"])
    faulty.put("p/d", b"1")
    rule = faulty.inject(op="list", key="p/*", action="stale_list", lag=2)
    # the last two mutations under p/: p/a deleted (still listed, with its size), p/d put (not yet listed)
    assert [(i.key, i.size) for i in faulty.list("p/")] == [("p/a", 5), ("p/b", 5), ("p/c", 5)]
    assert rule.fired == 1
    assert [i.key for i in faulty.list("p/")] == ["p/b", "p/c", "p/d"]  # fired once: consistent again
    with pytest.raises(BlobNotFound):
        faulty.get("p/a")  # a ghost of a stale listing is gone
    with pytest.raises(ConfigError, match="op='list' only"):
        faulty.inject(op="get", action="stale_list")
