"""Whether a shard restore brought back every acknowledged operation: pure decisions, no I/O (issue 14, case 1).

A restore takes the newest readable commit and replays the remote translog above its local
checkpoint.  It must hold every seq# from 0 up to the highest seq# the store says was
acknowledged: the local checkpoint of any readable commit metadata, and the highest seq#
any readable translog metadata names (older-term generations capped at the trims a newer
primary recorded).  Seq#s form a contiguous history (gaps are filled with no-ops on
promotion), so any hole in ``(commit checkpoint, expected max]`` is a lost acknowledged
operation: the restore refuses with :class:`~shardstore.engine.errors.RestoreDataLoss`
naming the range and the blobs at fault (docs/design/engine.md, "Restore never returns less").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardLoss:
    """Seq# ranges a shard restore could not bring back, and the blobs at fault."""

    index: str
    shard: int
    missing: tuple[tuple[int, int], ...]
    faults: tuple[str, ...]

    def __str__(self) -> str:
        ranges = ", ".join(f"seq# {lo}-{hi}" if lo != hi else f"seq# {lo}" for lo, hi in self.missing)
        why = "; ".join(self.faults) or "no blob was found damaged: the operations were purged or never uploaded"
        return f"[{self.index}][{self.shard}] {ranges} missing (blobs at fault: {why})"


def missing_ranges(from_seq_no: int, seq_nos: np.ndarray, expected_max: int) -> list[tuple[int, int]]:
    """The seq# ranges in ``[from_seq_no, expected_max]`` absent from ``seq_nos`` (any order, duplicates allowed)."""
    if expected_max < from_seq_no:
        return []
    s = np.unique(np.asarray(seq_nos, dtype=np.int64))
    s = s[(s >= from_seq_no) & (s <= expected_max)]
    # boundaries: one below the first wanted seq#, one above the last
    bounds = np.concatenate(([from_seq_no - 1], s, [expected_max + 1]))
    gaps = np.nonzero(np.diff(bounds) > 1)[0]
    return [(int(bounds[i] + 1), int(bounds[i + 1] - 1)) for i in gaps]


def capped(max_seq_no: int, primary_term: int, trims: list[tuple[int, int]]) -> int:
    """``max_seq_no`` of a generation or commit of ``primary_term``, capped by newer primaries' trims (seq#, term)."""
    for seq_no, term in trims:
        if primary_term < term:
            max_seq_no = min(max_seq_no, seq_no)
    return max_seq_no


__all__ = ["ShardLoss", "capped", "missing_ranges"]
