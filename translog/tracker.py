"""Local checkpoint tracking that copes with out-of-order, batched completion.

Seed 004: a shard copy's *local checkpoint* is the highest seq# s such that every
seq# <= s has been handled.  This tracker keeps two of them over the same seq# space:

- ``processed_checkpoint``: every op <= it was applied (indexed);
- ``persisted_checkpoint``: every op <= it is durable (in the translog).

Operations complete in batches (Arrow arrays of seq#s), in any order, with gaps and
with duplicates (a replay marks again what was marked: marking is idempotent).

Representation, per checkpoint: the checkpoint itself plus the completed seq#s above
it as sorted, disjoint, *non-adjacent* closed intervals ``starts[i]..ends[i]``, every
``starts[i] > checkpoint + 1`` (a missing seq# separates each interval from the next
and from the checkpoint).  Memory is therefore one pair of ints per gap, never one per
operation.

Cost of marking a batch of N seq#s (no Python loop over operations):

- the batch is reduced with Arrow compute, outside the lock: ``min_max`` and, when the
  span could be contiguous, ``count_distinct``.  The set of a batch's values is exactly
  ``lo..hi`` iff ``count_distinct == hi - lo + 1``, duplicates included;
- a contiguous batch is one interval: O(log gaps) under the lock (``bisect``), O(1)
  for the common in-order case;
- a batch with gaps is sorted and cut into runs with Arrow (a shifted comparison),
  then merged: a few runs one by one with ``bisect``, many runs with one columnar
  merge (sort by start, ``cumulative_max`` of ends, new interval where a start exceeds
  the running end + 1).

Every marked seq# also advances ``max_seq_no`` (a replica learns of seq#s this way).
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array
from shardstore.core.ops import NO_OPS as NO_OPS_PERFORMED
from shardstore.errors import InvalidError
from shardstore.translog.errors import TranslogError

#: The checkpoint / max seq# of a shard copy that has seen no operation.

#: Batches that split into at most this many runs are merged run by run with bisect;
#: more runs take the columnar merge.  (A class attribute of the tracker, so tests can
#: force either path.)
BISECT_MAX_RUNS = 16

SeqNos = pa.Array | pa.ChunkedArray | Sequence[int]


class InvalidSeqNo(TranslogError, InvalidError):
    """A seq# or a tracker argument is out of range (negative, null, or inconsistent)."""


def _as_int64(seq_nos: SeqNos) -> pa.Array:
    """The batch as one int64 Arrow array without nulls; InvalidSeqNo otherwise."""
    try:
        if isinstance(seq_nos, pa.ChunkedArray):
            arr = one_array(seq_nos)
        elif isinstance(seq_nos, pa.Array):
            arr = seq_nos
        else:
            arr = pa.array(seq_nos)  # inferred, so 1.5 or True is refused, not coerced
        if not (pa.types.is_integer(arr.type) or (pa.types.is_null(arr.type) and len(arr) == 0)):
            raise InvalidSeqNo(f"seq#s must be integers, got Arrow type {arr.type}")
        if arr.type != pa.int64():
            arr = arr.cast(pa.int64())  # safe cast: overflow or non-integers raise
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError) as exc:
        raise InvalidSeqNo(f"seq#s must be integers: {exc}") from None
    if arr.null_count:
        i = pc.index(pc.is_null(arr), True).as_py()
        raise InvalidSeqNo(f"seq# at position {i} of the batch is null; nothing of the batch was marked")
    return arr


class _Runs:
    """Completed seq#s of one batch, above a floor: sorted disjoint non-adjacent runs."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: pa.Array, ends: pa.Array) -> None:
        self.starts = starts
        self.ends = ends

    def __len__(self) -> int:
        return len(self.starts)


def ascending_by_one(arr: pa.Array) -> bool:
    """Whether a null-free int64 array is x, x+1, x+2, ... (read through numpy, no copy)."""
    a = arr.to_numpy(zero_copy_only=True)
    return bool(np.all(a[1:] - a[:-1] == 1))


def _reduce(arr: pa.Array, floor: int) -> tuple[int, _Runs | tuple[int, int] | None]:
    """(batch max, what to insert): a range a..b, runs, or None when all are <= floor."""
    mm = pc.min_max(arr)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo < 0:
        i = pc.index(pc.less(arr, 0), True).as_py()
        raise InvalidSeqNo(
            f"seq# {arr[i].as_py()} at position {i} of the batch is negative; nothing of the batch was marked"
        )
    if hi <= floor:
        return hi, None
    span = hi - lo + 1
    if span == len(arr) and ascending_by_one(arr):  # a stamped batch: lo..hi in order, no hash needed
        return hi, (max(lo, floor + 1), hi)
    if span <= len(arr) and pc.count_distinct(arr).as_py() == span:
        return hi, (max(lo, floor + 1), hi)
    v = pc.filter(arr, pc.greater(arr, floor)) if lo <= floor else arr
    v = pc.unique(v)
    v = pc.take(v, pc.sort_indices(v))
    m = len(v)
    if m == 1:
        x = v[0].as_py()
        return hi, (x, x)
    breaks = pc.not_equal(pc.subtract(v.slice(1), v.slice(0, m - 1)), 1)
    starts = pa.concat_arrays([v.slice(0, 1), pc.filter(v.slice(1), breaks)])
    ends = pa.concat_arrays([pc.filter(v.slice(0, m - 1), breaks), v.slice(m - 1)])
    return hi, _Runs(starts, ends)


class _Pending:
    """One checkpoint and the completed intervals above it (not locked: the tracker locks)."""

    __slots__ = ("checkpoint", "starts", "ends")

    def __init__(self, checkpoint: int) -> None:
        self.checkpoint = checkpoint
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add_range(self, a: int, b: int) -> None:
        """Mark a..b (inclusive) completed."""
        cp = self.checkpoint
        if b <= cp:
            return
        a = max(a, cp + 1)
        starts, ends = self.starts, self.ends
        if a == cp + 1 and (not starts or b + 1 < starts[0]):
            self.checkpoint = b  # the in-order case: no interval touched
            return
        lo = bisect_left(ends, a - 1)  # first interval that overlaps, touches or follows a..b
        hi = bisect_right(starts, b + 1)  # past the last one that overlaps or touches it
        if lo < hi:
            a = min(a, starts[lo])
            b = max(b, ends[hi - 1])
        starts[lo:hi] = [a]
        ends[lo:hi] = [b]
        if starts[0] == cp + 1:
            self.checkpoint = ends[0]
            del starts[0]
            del ends[0]

    def add_runs(self, runs: _Runs, bisect_max: int) -> None:
        """Mark every run completed."""
        if len(runs) <= bisect_max:
            for a, b in zip(runs.starts.to_pylist(), runs.ends.to_pylist()):
                self.add_range(a, b)
            return
        # Columnar merge.  A sentinel interval -1..checkpoint sorts first (seq#s are >= 0,
        # stored starts are > checkpoint + 1), so the first merged interval ends at the
        # new checkpoint and the others are the new pending intervals.
        s = pa.concat_arrays([pa.array([-1, *self.starts], pa.int64()), runs.starts])
        e = pa.concat_arrays([pa.array([self.checkpoint, *self.ends], pa.int64()), runs.ends])
        order = pc.sort_indices(s)
        s = pc.take(s, order)
        running = pc.cumulative_max(pc.take(e, order))
        n = len(s)
        begins = pa.concat_arrays(
            [pa.array([True]), pc.greater(s.slice(1), pc.add(running.slice(0, n - 1), 1))]
        )
        last = pa.concat_arrays([begins.slice(1), pa.array([True])])
        new_starts = pc.filter(s, begins).to_pylist()
        new_ends = pc.filter(running, last).to_pylist()
        self.checkpoint = new_ends[0]
        self.starts = new_starts[1:]
        self.ends = new_ends[1:]

    def contains(self, seq_no: int) -> bool:
        """Whether seq_no was marked."""
        if seq_no <= self.checkpoint:
            return True
        i = bisect_right(self.starts, seq_no) - 1
        return i >= 0 and seq_no <= self.ends[i]


class LocalCheckpointTracker:
    """Thread-safe seq# service plus processed and persisted local checkpoints."""

    #: Runs per batch merged one by one; above this, the columnar merge.
    bisect_max_runs: int = BISECT_MAX_RUNS

    def __init__(self, max_seq_no: int = NO_OPS_PERFORMED, local_checkpoint: int = NO_OPS_PERFORMED) -> None:
        """Start with every seq# <= local_checkpoint done and max_seq_no the highest seen."""
        for name, value in (("max_seq_no", max_seq_no), ("local_checkpoint", local_checkpoint)):
            if not isinstance(value, int) or value < NO_OPS_PERFORMED:
                raise InvalidSeqNo(f"{name} must be an int >= {NO_OPS_PERFORMED}, got {value!r}")
        if local_checkpoint > max_seq_no:
            raise InvalidSeqNo(f"local_checkpoint {local_checkpoint} is above max_seq_no {max_seq_no}")
        self._lock = threading.Lock()
        self._processed_cond = threading.Condition(self._lock)
        self._persisted_cond = threading.Condition(self._lock)
        self._next_seq_no = max_seq_no + 1
        self._processed = _Pending(local_checkpoint)
        self._persisted = _Pending(local_checkpoint)

    # -- the seq# service -----------------------------------------------------------

    def generate_seq_nos(self, n: int) -> int:
        """Hand out the contiguous range first..first+n-1 (primary) and return first."""
        if not isinstance(n, int) or n < 0:
            raise InvalidSeqNo(f"the number of seq#s to generate must be an int >= 0, got {n!r}")
        with self._lock:
            first = self._next_seq_no
            self._next_seq_no = first + n
            return first

    def advance_max_seq_no(self, seq_no: int) -> None:
        """Raise max_seq_no to seq_no if it is lower (a replica saw seq_no)."""
        if not isinstance(seq_no, int) or seq_no < NO_OPS_PERFORMED:
            raise InvalidSeqNo(f"seq# must be an int >= {NO_OPS_PERFORMED}, got {seq_no!r}")
        with self._lock:
            if seq_no >= self._next_seq_no:
                self._next_seq_no = seq_no + 1

    @property
    def max_seq_no(self) -> int:
        """The highest seq# generated or seen."""
        return self._next_seq_no - 1

    # -- marking --------------------------------------------------------------------

    def mark_processed(self, seq_nos: SeqNos) -> None:
        """Record a batch of seq#s as applied (any order, gaps and duplicates allowed)."""
        self._mark(self._processed, self._processed_cond, seq_nos)

    def mark_persisted(self, seq_nos: SeqNos) -> None:
        """Record a batch of seq#s as durable (any order, gaps and duplicates allowed)."""
        self._mark(self._persisted, self._persisted_cond, seq_nos)

    def mark_processed_range(self, first: int, last: int) -> None:
        """Record first..last (inclusive) as applied; O(log gaps), no array needed."""
        self._mark_range(self._processed, self._processed_cond, first, last)

    def mark_persisted_range(self, first: int, last: int) -> None:
        """Record first..last (inclusive) as durable; O(log gaps), no array needed."""
        self._mark_range(self._persisted, self._persisted_cond, first, last)

    def _mark_range(self, state: _Pending, cond: threading.Condition, first: int, last: int) -> None:
        if not (isinstance(first, int) and isinstance(last, int)) or first < 0 or last < first - 1:
            raise InvalidSeqNo(f"bad seq# range {first!r}..{last!r}")
        if last < first:
            return
        with self._lock:
            if last >= self._next_seq_no:
                self._next_seq_no = last + 1
            before = state.checkpoint
            state.add_range(first, last)
            if state.checkpoint != before:
                cond.notify_all()

    def _mark(self, state: _Pending, cond: threading.Condition, seq_nos: SeqNos) -> None:
        arr = _as_int64(seq_nos)
        if len(arr) == 0:
            return
        # Checkpoints only rise, so a stale read is a safe floor: values <= it are done.
        hi, work = _reduce(arr, state.checkpoint)
        with self._lock:
            if hi >= self._next_seq_no:
                self._next_seq_no = hi + 1
            if work is None:
                return
            before = state.checkpoint
            if isinstance(work, tuple):
                state.add_range(*work)
            else:
                state.add_runs(work, self.bisect_max_runs)
            if state.checkpoint != before:
                cond.notify_all()

    # -- reading --------------------------------------------------------------------

    @property
    def processed_checkpoint(self) -> int:
        """Highest s such that every seq# <= s was processed."""
        return self._processed.checkpoint

    @property
    def persisted_checkpoint(self) -> int:
        """Highest s such that every seq# <= s is durable."""
        return self._persisted.checkpoint

    def has_processed(self, seq_no: int) -> bool:
        """Whether seq_no was marked processed (at or below the checkpoint, or pending above it)."""
        with self._lock:
            return self._processed.contains(seq_no)

    def pending_processed_ranges(self) -> list[tuple[int, int]]:
        """The processed intervals above the checkpoint (one per gap): introspection."""
        with self._lock:
            return list(zip(self._processed.starts, self._processed.ends))

    def pending_persisted_ranges(self) -> list[tuple[int, int]]:
        """The persisted intervals above the checkpoint (one per gap): introspection."""
        with self._lock:
            return list(zip(self._persisted.starts, self._persisted.ends))

    # -- waiting --------------------------------------------------------------------

    def wait_for_processed(self, seq_no: int, timeout: float | None = None) -> bool:
        """Block until processed_checkpoint >= seq_no; False if timeout seconds pass first."""
        with self._processed_cond:
            return self._processed_cond.wait_for(lambda: self._processed.checkpoint >= seq_no, timeout)

    def wait_for_persisted(self, seq_no: int, timeout: float | None = None) -> bool:
        """Block until persisted_checkpoint >= seq_no; False if timeout seconds pass first."""
        with self._persisted_cond:
            return self._persisted_cond.wait_for(lambda: self._persisted.checkpoint >= seq_no, timeout)

    def __repr__(self) -> str:
        return (
            f"LocalCheckpointTracker(max_seq_no={self.max_seq_no}, processed={self.processed_checkpoint}, "
            f"persisted={self.persisted_checkpoint})"
        )
