"""LocalCheckpointTracker: checkpoints over out-of-order batches, against a naive model."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.errors import InvalidError
from shardstore.translog.operations import index_batch, stamp
from shardstore.translog.tracker import InvalidSeqNo, LocalCheckpointTracker


def _naive(done: set[int], start: int) -> tuple[int, list[tuple[int, int]]]:
    """(checkpoint, intervals of done seq#s above it), computed one seq# at a time."""
    cp = start
    while cp + 1 in done:
        cp += 1
    above = sorted(s for s in done if s > cp)
    runs: list[tuple[int, int]] = []
    for s in above:
        if runs and runs[-1][1] + 1 == s:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return cp, runs


def _tracker(bisect_max_runs: int, **kw: int) -> LocalCheckpointTracker:
    t = LocalCheckpointTracker(**kw)
    t.bisect_max_runs = bisect_max_runs  # 0: always the columnar merge; big: always bisect
    return t


@st.composite
def _batches(draw: st.DrawFn, max_n: int = 300) -> tuple[int, list[list[int]]]:
    """(n, batches): 0..n-1 permuted, with duplicates, cut into random batches, shuffled."""
    n = draw(st.integers(0, max_n))
    seq = draw(st.permutations(range(n)))
    dups = draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20)) if n else []
    items = list(seq) + dups
    rnd = draw(st.randoms(use_true_random=False))
    rnd.shuffle(items)
    # Mostly sorted contiguous runs (the primary's case) mixed with scattered ones.
    if draw(st.booleans()):
        items.sort()
    cuts = sorted(draw(st.lists(st.integers(0, len(items)), max_size=30)))
    batches = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)])]
    rnd.shuffle(batches)
    return n, batches


@settings(max_examples=300, deadline=None)
@given(_batches(), st.sampled_from([0, 1, 4, 1000]), st.booleans(), st.data())
def test_checkpoint_is_the_highest_contiguous_prefix_after_every_batch(
    nb: tuple[int, list[list[int]]], bisect_max_runs: int, as_arrow: bool, data: st.DataObject
) -> None:
    n, batches = nb
    start = data.draw(st.integers(-1, max(n - 1, -1)))
    t = _tracker(bisect_max_runs, max_seq_no=start, local_checkpoint=start)
    done: set[int] = set()
    for batch in batches:
        arg = pa.array(batch, pa.int64()) if as_arrow else batch
        t.mark_processed(arg)
        done.update(batch)
        cp, runs = _naive(done, start)
        assert t.processed_checkpoint == cp
        # Memory: exactly one stored interval per run of done seq#s above a gap.
        assert t.pending_processed_ranges() == runs
        assert t.max_seq_no == max([start, *done])
        assert t.persisted_checkpoint == start  # independent of processed
        probe = data.draw(st.integers(-1, n + 1))
        assert t.has_processed(probe) == (probe <= start or probe in done)
    assert t.processed_checkpoint == max(n - 1, start)
    assert t.pending_processed_ranges() == []


@settings(max_examples=150, deadline=None)
@given(_batches(max_n=200), _batches(max_n=200), st.sampled_from([0, 3, 1000]))
def test_processed_and_persisted_advance_independently(
    a: tuple[int, list[list[int]]], b: tuple[int, list[list[int]]], bisect_max_runs: int
) -> None:
    t = _tracker(bisect_max_runs)
    done_a: set[int] = set()
    done_b: set[int] = set()
    for i in range(max(len(a[1]), len(b[1]))):
        if i < len(a[1]):
            t.mark_processed(a[1][i])
            done_a.update(a[1][i])
        if i < len(b[1]):
            t.mark_persisted(pa.chunked_array([pa.array(b[1][i], pa.int64())], pa.int64()))
            done_b.update(b[1][i])
        assert (t.processed_checkpoint, t.pending_processed_ranges()) == _naive(done_a, -1)
        assert (t.persisted_checkpoint, t.pending_persisted_ranges()) == _naive(done_b, -1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 150), st.integers(0, 20)), max_size=40), st.booleans())
def test_ranges_and_arrays_agree(ranges: list[tuple[int, int]], use_range_api: bool) -> None:
    t = LocalCheckpointTracker()
    done: set[int] = set()
    for first, length in ranges:
        last = first + length - 1
        if use_range_api:
            t.mark_persisted_range(first, last)
        else:
            t.mark_persisted(pa.array(range(first, last + 1), pa.int64()))
        done.update(range(first, last + 1))
        assert (t.persisted_checkpoint, t.pending_persisted_ranges()) == _naive(done, -1)


def test_contiguous_stamped_batches_take_the_fast_path_and_dedupe() -> None:
    t = LocalCheckpointTracker()
    first = t.generate_seq_nos(1000)
    batch = stamp(index_batch([f"d{i}" for i in range(1000)], [b"{}"] * 1000), first, 1)
    seq = batch.column("seq_no")
    t.mark_processed(seq.slice(500))  # a gap below: pending, one interval
    assert t.processed_checkpoint == -1
    assert t.pending_processed_ranges() == [(500, 999)]
    t.mark_processed(pa.concat_arrays([seq.slice(0, 500), seq.slice(0, 500)]))  # contiguous, duplicated
    assert t.processed_checkpoint == 999
    assert t.pending_processed_ranges() == []
    t.mark_processed(seq)  # a replay: idempotent
    assert t.processed_checkpoint == 999 and t.max_seq_no == 999


def test_a_million_op_batch_is_marked_without_python_per_op_work() -> None:
    t = LocalCheckpointTracker()
    first = t.generate_seq_nos(1_000_000)
    seq = pa.array(range(first, first + 1_000_000), pa.int64())
    begin = time.perf_counter()
    for i in range(10):  # ten bulks of 100k, in reverse order
        t.mark_processed(seq.slice((9 - i) * 100_000, 100_000))
    assert t.processed_checkpoint == 999_999
    # Every other seq# missing: half a million gaps, merged columnar.
    t2 = LocalCheckpointTracker()
    evens = pa.array(range(0, 1_000_000, 2), pa.int64())
    t2.mark_processed(evens)
    assert t2.processed_checkpoint == 0 and len(t2.pending_processed_ranges()) == 499_999
    t2.mark_processed(pa.array(range(1, 1_000_000, 2), pa.int64()))
    assert t2.processed_checkpoint == 999_999 and t2.pending_processed_ranges() == []
    assert time.perf_counter() - begin < 20  # generous: catches a per-op Python loop on slow CI only


def test_initial_state_and_values_at_or_below_the_checkpoint() -> None:
    t = LocalCheckpointTracker(max_seq_no=10, local_checkpoint=5)
    assert (t.max_seq_no, t.processed_checkpoint, t.persisted_checkpoint) == (10, 5, 5)
    t.mark_processed([0, 1, 2, 3])
    assert t.processed_checkpoint == 5 and t.pending_processed_ranges() == []
    t.mark_processed([3, 4, 6, 8])
    assert t.processed_checkpoint == 6 and t.pending_processed_ranges() == [(8, 8)]
    assert t.generate_seq_nos(3) == 11 and t.max_seq_no == 13
    t.mark_processed([])  # an empty batch is fine
    t.mark_processed(pa.array([20], pa.int32()))  # narrower ints are cast
    assert t.max_seq_no == 20


def test_seq_no_service_and_max_seq_no() -> None:
    t = LocalCheckpointTracker()
    assert t.generate_seq_nos(0) == 0 and t.max_seq_no == -1
    assert t.generate_seq_nos(5) == 0 and t.max_seq_no == 4
    t.advance_max_seq_no(2)
    assert t.max_seq_no == 4
    t.advance_max_seq_no(9)
    assert t.max_seq_no == 9 and t.generate_seq_nos(1) == 10


@pytest.mark.parametrize(
    "bad",
    [[0, -1], pa.array([1, None], pa.int64()), [1.5], [1.0], [True], ["x"], pa.array([2**63], pa.uint64()), [2**64]],
    ids=["negative", "null", "float", "whole-float", "bool", "string", "overflow", "huge"],
)
def test_bad_batches_are_rejected_and_change_nothing(bad: object) -> None:
    t = LocalCheckpointTracker()
    with pytest.raises(InvalidSeqNo) as info:
        t.mark_processed(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidError)
    assert t.processed_checkpoint == -1 and t.max_seq_no == -1 and t.pending_processed_ranges() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: LocalCheckpointTracker(max_seq_no=-2),
        lambda: LocalCheckpointTracker(max_seq_no=3, local_checkpoint=4),
        lambda: LocalCheckpointTracker().generate_seq_nos(-1),
        lambda: LocalCheckpointTracker().advance_max_seq_no(-2),
        lambda: LocalCheckpointTracker().mark_processed_range(-1, 3),
        lambda: LocalCheckpointTracker().mark_persisted_range(5, 3),
    ],
)
def test_bad_arguments(call: object) -> None:
    with pytest.raises(InvalidSeqNo):
        call()  # type: ignore[operator]


def test_wait_for_times_out_and_returns_false() -> None:
    t = LocalCheckpointTracker()
    t.mark_processed([1])
    begin = time.monotonic()
    assert t.wait_for_processed(1, timeout=0.1) is False
    assert t.wait_for_persisted(0, timeout=0.05) is False
    assert time.monotonic() - begin >= 0.14
    assert t.wait_for_processed(-1, timeout=0) is True  # already reached: no wait


def test_wait_for_wakes_when_the_gap_closes() -> None:
    t = LocalCheckpointTracker()
    t.mark_persisted([1, 2, 3])
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(t.wait_for_persisted(3, timeout=10)))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # seq# 0 still missing
    t.mark_processed([0])  # the other checkpoint: no effect
    time.sleep(0.05)
    assert waiter.is_alive()
    t.mark_persisted([0])
    waiter.join(5)
    assert results == [True]


@pytest.mark.parametrize("bisect_max_runs", [0, 1000])
def test_concurrent_generators_and_markers(bisect_max_runs: int) -> None:
    t = _tracker(bisect_max_runs)
    threads_n, bulks, bulk = 8, 40, 50
    total = threads_n * bulks * bulk
    errors: list[BaseException] = []
    woke: list[bool] = []

    def worker(k: int) -> None:
        try:
            rnd = random.Random(k)
            for _ in range(bulks):
                first = t.generate_seq_nos(bulk)
                seq = list(range(first, first + bulk))
                rnd.shuffle(seq)
                cut = rnd.randrange(bulk)
                # processed in two out-of-order halves, persisted as one range, then again (dup)
                t.mark_processed(pa.array(seq[cut:], pa.int64()))
                t.mark_processed(seq[:cut])
                t.mark_persisted_range(first, first + bulk - 1)
                t.mark_persisted(seq[: rnd.randrange(bulk)])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    waiter = threading.Thread(target=lambda: woke.append(t.wait_for_processed(total - 1, timeout=30)))
    waiter.start()
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    waiter.join(30)
    assert errors == []
    assert woke == [True]
    assert t.max_seq_no == total - 1
    assert t.processed_checkpoint == total - 1 and t.persisted_checkpoint == total - 1
    assert t.pending_processed_ranges() == [] and t.pending_persisted_ranges() == []
    assert t.wait_for_persisted(total - 1, timeout=0) is True


def test_generate_seq_nos_hands_out_disjoint_ranges_across_threads() -> None:
    t = LocalCheckpointTracker()
    got: list[list[int]] = [[] for _ in range(6)]

    def grab(k: int) -> None:
        for i in range(500):
            got[k].append(t.generate_seq_nos(1 + i % 3))

    ts = [threading.Thread(target=grab, args=(k,)) for k in range(6)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    handed = sorted((first, 1 + i % 3) for k in range(6) for i, first in enumerate(got[k]))
    nxt = 0
    for first, n in handed:
        assert first == nxt
        nxt += n
    assert t.max_seq_no == nxt - 1
