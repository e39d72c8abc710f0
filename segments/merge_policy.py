"""Which segments to merge: a tiered merge policy (Lucene's TieredMergePolicy, simplified).

Pure: segment statistics in, tuples of segment names out.  Sizes are *live* estimates,
``live(s) = size_bytes * live_count // doc_count`` (0 for an empty segment); a segment's
*floored* size is ``max(live(s), floor_segment_bytes)``, so tiny segments count as equal
and merge together.

Natural merges (:meth:`TieredMergePolicy.find_merges`):

- A segment is *too big* when ``live(s) > max_merged_segment_bytes / 2``: it is never
  merged for count, and does not count against the budget.
- *Budget.*  With ``T`` the floored total of the other segments, tiers start at
  ``level = max(smallest floored size, floor)`` and grow by ``merge_factor =
  min(max_merge_at_once, segments_per_tier)``; each full tier allows
  ``segments_per_tier`` segments, so the allowed count is at most
  ``segments_per_tier * (log_merge_factor(T / floor) + 1)`` and at least
  ``segments_per_tier``.
- *Count phase.*  While the eligible (not merging, not too big) segments, plus the
  outputs of merges already picked, outnumber the budget, pick the best merge of 2 to
  ``merge_factor`` segments, windows of consecutive segments in size order (largest
  first) skipping those that would push the merge over ``max_merged_segment_bytes``.
  Score (lower is better) = skew x live_total**0.05 x (live_bytes / raw_bytes)**2, where
  skew = largest floored size / floored total: similar sizes merge, small merges are
  preferred, and merges that reclaim deletes are preferred.
- *Deletes phase.*  While deleted docs outside picked merges exceed
  ``deletes_pct_allowed`` percent of the docs left after the picked merges, pick the best-scoring merge (1 to
  ``merge_factor`` segments) that reclaims deletes; too-big segments whose own deleted
  share exceeds ``deletes_pct_allowed`` are eligible here.
- *Too-big rewrites.*  A too-big segment whose own deleted share exceeds
  ``deletes_pct_allowed`` and that no merge took yet is rewritten alone (a singleton
  merge), whatever the index-wide share: nothing else would ever reclaim its deletes.

Invariants of every returned list (all three finders):

- no segment in ``merging`` appears, and no segment appears twice;
- every merge has >= 2 segments, or is a singleton that reclaims deletes;
- the estimated result (sum of live sizes) is <= ``max_merged_segment_bytes`` (forced
  merges: <= the forced cap, see :meth:`TieredMergePolicy.find_forced_merges`);
- deterministic: the same input (in any order) gives the same output; names in a merge
  are in size order, largest first (ties by name).

Repeatedly applying :meth:`~TieredMergePolicy.find_merges` keeps the number of segments
within ``O(segments_per_tier * log(total size / floor))`` plus the too-big ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shardstore.errors import InvalidError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """What the merge policy needs of one segment."""

    name: str
    size_bytes: int
    doc_count: int
    live_count: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidError(f"a segment name must be a non-empty str, got {self.name!r}")
        for f in ("size_bytes", "doc_count", "live_count"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InvalidError(f"segment {self.name!r}: {f} must be an int >= 0, got {v!r}")
        if self.live_count > self.doc_count:
            raise InvalidError(f"segment {self.name!r}: live_count {self.live_count} > doc_count {self.doc_count}")

    @property
    def live_bytes(self) -> int:
        """Estimated size after deletes are reclaimed."""
        return self.size_bytes * self.live_count // self.doc_count if self.doc_count else 0

    @property
    def deleted(self) -> int:
        """Number of deleted documents."""
        return self.doc_count - self.live_count

    @property
    def deletes_pct(self) -> float:
        """Deleted share of the documents in percent (0 for an empty segment)."""
        return 100.0 * self.deleted / self.doc_count if self.doc_count else 0.0


def _checked(segments: Iterable[SegmentStats], merging: Iterable[str]) -> tuple[list[SegmentStats], frozenset[str]]:
    segs = list(segments)
    names: set[str] = set()
    for s in segs:
        if not isinstance(s, SegmentStats):
            raise InvalidError(f"expected SegmentStats, got {s!r}")
        if s.name in names:
            raise InvalidError(f"segment {s.name!r} is listed twice")
        names.add(s.name)
    if isinstance(merging, str):
        raise InvalidError("merging must be a collection of segment names, not a str")
    busy = frozenset(merging)
    # Largest live size first, ties by name: the one order every decision uses.
    segs.sort(key=lambda s: (-s.live_bytes, s.name))
    return segs, busy


@dataclass(frozen=True, slots=True)
class TieredMergePolicy:
    """Tiered merge policy parameters (validated); the finders are pure functions of them."""

    segments_per_tier: int = 10
    max_merge_at_once: int = 10
    floor_segment_bytes: int = 2 * MiB
    max_merged_segment_bytes: int = 5 * GiB
    deletes_pct_allowed: float = 20.0

    def __post_init__(self) -> None:
        for name, low in (
            ("segments_per_tier", 2),
            ("max_merge_at_once", 2),
            ("floor_segment_bytes", 1),
            ("max_merged_segment_bytes", 1),
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise InvalidError(f"{name} must be an int >= {low}, got {v!r}")
        p = self.deletes_pct_allowed
        if not isinstance(p, int | float) or isinstance(p, bool) or not 5.0 <= p <= 50.0:
            raise InvalidError(f"deletes_pct_allowed must be a number in 5..50 (percent), got {p!r}")

    @property
    def merge_factor(self) -> int:
        """Most segments merged at once by a natural merge: min(max_merge_at_once, segments_per_tier)."""
        return min(self.max_merge_at_once, self.segments_per_tier)

    def _floored(self, s: SegmentStats) -> int:
        return max(s.live_bytes, self.floor_segment_bytes)

    def _too_big(self, s: SegmentStats) -> bool:
        return s.live_bytes > self.max_merged_segment_bytes / 2

    def allowed_segment_count(self, segments: Sequence[SegmentStats]) -> int:
        """How many (not too big) segments the tiers allow for this total size."""
        small = [s for s in segments if not self._too_big(s)]
        if not small:
            return self.segments_per_tier
        total = sum(self._floored(s) for s in small)
        level = max(min(self._floored(s) for s in small), self.floor_segment_bytes)
        allowed = 0.0
        left = float(total)
        while True:
            at_level = left / level
            if at_level < self.segments_per_tier or level >= self.max_merged_segment_bytes:
                allowed += math.ceil(at_level)
                break
            allowed += self.segments_per_tier
            left -= self.segments_per_tier * level
            level = min(self.max_merged_segment_bytes, level * self.merge_factor)
        return max(int(allowed), self.segments_per_tier)

    def _score(self, cand: Sequence[SegmentStats]) -> float:
        floored = [self._floored(s) for s in cand]
        skew = max(floored) / sum(floored)
        live = sum(s.live_bytes for s in cand)
        raw = sum(s.size_bytes for s in cand)
        nondel = live / raw if raw else 0.0
        return skew * (max(live, 1) ** 0.05) * nondel * nondel

    def _best(self, pool: list[SegmentStats], *, min_size: int, need_deletes: bool) -> list[SegmentStats] | None:
        """The best-scoring window merge over ``pool`` (size order), or None."""
        best: list[SegmentStats] | None = None
        best_key: tuple[float, tuple[str, ...]] | None = None
        for i in range(len(pool)):
            cand: list[SegmentStats] = []
            total = 0
            for s in pool[i:]:
                if len(cand) >= self.merge_factor:
                    break
                if total + s.live_bytes > self.max_merged_segment_bytes:
                    continue  # skip it; a smaller one further on may still fit
                cand.append(s)
                total += s.live_bytes
            if len(cand) < min_size:
                continue
            if need_deletes and not any(s.deleted for s in cand):
                continue
            if len(cand) == 1 and not cand[0].deleted:
                continue  # a singleton without deletes reclaims nothing
            key = (self._score(cand), tuple(s.name for s in cand))
            if best_key is None or key < best_key:
                best, best_key = cand, key
        return best

    def find_merges(
        self, segments: Iterable[SegmentStats], merging: Iterable[str] = frozenset()
    ) -> list[tuple[str, ...]]:
        """Natural merges: keep the count within the tier budget and deletes within the allowed share."""
        segs, busy = _checked(segments, merging)
        allowed = self.allowed_segment_count(segs)
        pool = [s for s in segs if s.name not in busy and (not self._too_big(s) or s.deletes_pct > self.deletes_pct_allowed)]
        count = sum(1 for s in pool if not self._too_big(s))
        merges: list[tuple[str, ...]] = []

        def take(cand: list[SegmentStats]) -> None:
            nonlocal count
            names = {s.name for s in cand}
            pool[:] = [s for s in pool if s.name not in names]
            count -= sum(1 for s in cand if not self._too_big(s))
            if sum(s.live_bytes for s in cand) <= self.max_merged_segment_bytes / 2:
                count += 1
            merges.append(tuple(s.name for s in cand))

        while count > allowed:
            best = self._best(pool, min_size=2, need_deletes=False)
            if best is None:
                break
            take(best)

        # Deletes are measured against the docs left once the picked merges reclaim theirs.
        total_docs = sum(s.doc_count for s in segs)
        in_merges = {n for m in merges for n in m}
        reclaimed = sum(s.deleted for s in segs if s.name in in_merges)
        dels = sum(s.deleted for s in segs if s.name not in in_merges and s.name not in busy)
        while dels > (total_docs - reclaimed) * self.deletes_pct_allowed / 100.0:
            best = self._best(pool, min_size=1, need_deletes=True)
            if best is None:
                break
            gained = sum(s.deleted for s in best)
            dels -= gained
            reclaimed += gained
            take(best)
        # Too-big segments are never merged for count, so one whose own deleted share is
        # over the limit is rewritten alone (its live size fits: it is <= the max merged size).
        for s in list(pool):
            if self._too_big(s) and s.deletes_pct > self.deletes_pct_allowed and s.live_bytes <= self.max_merged_segment_bytes:
                take([s])
        return merges

    def forced_cap(self, segments: Iterable[SegmentStats], max_segments: int) -> int:
        """Largest forced-merge result: max(max_merged_segment_bytes, ceil(2 * live total / max_segments))."""
        total = sum(s.live_bytes for s in segments)
        return max(self.max_merged_segment_bytes, -(-2 * total // max_segments))

    def find_forced_merges(
        self, segments: Iterable[SegmentStats], max_segments: int, merging: Iterable[str] = frozenset()
    ) -> list[tuple[str, ...]]:
        """Merges (smallest first, disjoint) toward at most ``max_segments`` segments; call again until []."""
        if not isinstance(max_segments, int) or isinstance(max_segments, bool) or max_segments < 1:
            raise InvalidError(f"max_segments must be an int >= 1, got {max_segments!r}")
        segs, busy = _checked(segments, merging)
        # The cap may exceed max_merged_segment_bytes: the caller asked for that few segments.
        # With cap >= 2 * total / max_segments the two smallest segments always fit together
        # while more than max_segments remain, so repeated calls always converge.
        cap = self.forced_cap(segs, max_segments)
        pool = sorted((s for s in segs if s.name not in busy), key=lambda s: (s.live_bytes, s.name))
        excess = len(pool) - max_segments
        merges: list[tuple[str, ...]] = []
        i = 0
        while excess > 0 and i < len(pool) - 1:
            group = [pool[i]]
            total = pool[i].live_bytes
            j = i + 1
            while j < len(pool) and len(group) < self.max_merge_at_once and len(group) - 1 < excess:
                if total + pool[j].live_bytes > cap:
                    break
                group.append(pool[j])
                total += pool[j].live_bytes
                j += 1
            if len(group) < 2:
                break  # sorted ascending: nothing later fits either
            merges.append(tuple(s.name for s in sorted(group, key=lambda s: (-s.live_bytes, s.name))))
            excess -= len(group) - 1
            i = j
        return merges

    def find_expunge_deletes(
        self,
        segments: Iterable[SegmentStats],
        merging: Iterable[str] = frozenset(),
        *,
        pct_allowed: float = 10.0,
    ) -> list[tuple[str, ...]]:
        """Merges rewriting every segment whose deleted share exceeds ``pct_allowed`` (neighbours grouped)."""
        if not isinstance(pct_allowed, int | float) or isinstance(pct_allowed, bool) or not 0 <= pct_allowed <= 100:
            raise InvalidError(f"pct_allowed must be a number in 0..100, got {pct_allowed!r}")
        segs, busy = _checked(segments, merging)
        heavy = [s for s in segs if s.name not in busy and s.deleted and s.deletes_pct > pct_allowed]
        merges: list[tuple[str, ...]] = []
        group: list[SegmentStats] = []
        total = 0
        for s in heavy:  # size order, largest first
            if group and (len(group) >= self.max_merge_at_once or total + s.live_bytes > self.max_merged_segment_bytes):
                merges.append(tuple(x.name for x in group))
                group, total = [], 0
            if s.live_bytes > self.max_merged_segment_bytes:
                continue  # even alone it would exceed the cap
            group.append(s)
            total += s.live_bytes
        if group:
            merges.append(tuple(x.name for x in group))
        return merges


__all__ = ["GiB", "MiB", "SegmentStats", "TieredMergePolicy"]
