"""The claim log on real stores (segments/claim_log.py): epochs, concurrent claimants, collection, the watch."""

from __future__ import annotations

import threading

import pytest

from shardstore.segments import claim_log
from shardstore.segments.claim_log import ClaimWatch, append_claim, list_epochs
from shardstore.segments.claim_rule import KEEP_CLAIMS

REMOTE = pytest.mark.parametrize("backend", ["memory", "file", "s3"], indirect=True)


@REMOTE
def test_claims_get_increasing_epochs_even_when_racing(store_factory) -> None:
    store = store_factory()
    assert append_claim(store, "c", "idx", 0, 1, "w") == 1
    got: list[int] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        epoch = append_claim(store, "c", "idx", i, 1, f"w{i}")
        with lock:
            got.append(epoch)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(2, 8))  # every claimant got its own epoch, none lost
    assert list_epochs(store, "c") == list(range(7, 0, -1))


@REMOTE
def test_the_watch_fences_older_terms_of_the_claimed_shard_only(store_factory) -> None:
    store = store_factory()
    mine = append_claim(store, "c", "idx", 0, 1, "a")
    other = append_claim(store, "c", "idx", 1, 1, "b")
    watch = ClaimWatch(store, "c")
    store.reset_metrics()
    watch.refresh()
    assert store.metrics()["requests"]["list"] == 1  # one LIST, whatever the shard count
    v = watch.verdict("idx", 0, 1, mine)
    assert v.fenced_by is None and not v.check_markers and v.verified_epoch == other
    append_claim(store, "c", "idx", 0, 2, "new-primary")
    assert watch.verdict("idx", 0, 1, v.verified_epoch).fenced_by is None  # not listed yet
    watch.refresh()
    assert watch.verdict("idx", 0, 1, v.verified_epoch).fenced_by == 2
    assert watch.verdict("idx", 1, 1, other).fenced_by is None
    assert watch.verdict("idx", 0, 2, v.verified_epoch).fenced_by is None  # the new primary itself


@pytest.mark.parametrize("backend", ["memory", "file"], indirect=True)
def test_the_log_is_collected_and_a_sleeper_is_told_to_check_markers(store_factory) -> None:
    store = store_factory()
    first = append_claim(store, "c", "idx", 0, 1, "a")
    for i in range(KEEP_CLAIMS + 5):
        append_claim(store, "c", "other", i, 1, "b")
    assert len(list_epochs(store, "c")) == KEEP_CLAIMS
    watch = ClaimWatch(store, "c")
    watch.refresh()
    v = watch.verdict("idx", 0, 1, first)
    assert v.check_markers and v.fenced_by is None  # claims it never saw are gone: it must LIST its markers


@pytest.mark.parametrize("backend", ["memory", "file"], indirect=True)
def test_a_claim_landing_in_a_collected_slot_is_withdrawn_and_made_again(store_factory, monkeypatch) -> None:
    """A claimant that listed long ago (a paused process) is a fault no real part produces on demand: its stale
    listing is simulated by returning an empty listing once."""
    store = store_factory()
    for i in range(KEEP_CLAIMS + 10):
        append_claim(store, "c", "other", i, 1, "b")
    assert min(list_epochs(store, "c")) > 1  # slot 1 was collected
    real = claim_log.list_epochs
    calls = [0]

    def stale_once(s, cluster_uuid):
        calls[0] += 1
        return [] if calls[0] == 1 else real(s, cluster_uuid)  # "the log is empty": it creates slot 1

    monkeypatch.setattr(claim_log, "list_epochs", stale_once)
    epoch = append_claim(store, "c", "idx", 0, 3, "late")
    assert epoch == real(store, "c")[0]  # withdrawn from slot 1 and made again at the top
    assert 1 not in real(store, "c")
