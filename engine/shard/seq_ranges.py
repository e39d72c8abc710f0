"""Seq# runs of a shard copy's history: pure helpers for replay (one term per run) and promotion (the gaps a new
primary fills with no-ops)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["gaps", "split_by_term"]


def split_by_term(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` cut into runs of one primary term each (order kept)."""
    terms = batch.column("primary_term")
    if batch.num_rows == 0 or pc.min_max(terms)["min"] == pc.min_max(terms)["max"]:
        return [batch]
    change = pc.not_equal(terms.slice(1), terms.slice(0, len(terms) - 1))
    cuts = [0] + [i + 1 for i in pc.indices_nonzero(change).to_pylist()] + [batch.num_rows]
    return [batch.slice(a, b - a) for a, b in zip(cuts, cuts[1:])]


def gaps(pending: list[tuple[int, int]], checkpoint: int, top: int) -> list[tuple[int, int]]:
    """The seq# ranges in (checkpoint, top] not covered by ``pending`` completed ranges."""
    out, cur = [], checkpoint + 1
    for lo, hi in sorted(pending):
        if lo > cur:
            out.append((cur, min(lo - 1, top)))
        cur = max(cur, hi + 1)
        if cur > top:
            break
    if cur <= top:
        out.append((cur, top))
    return out
