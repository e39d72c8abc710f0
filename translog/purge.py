"""Which translog generations may be deleted: pure decisions, generations and checkpoints in.

Nothing here does I/O.  A caller lists its generations (:class:`GenerationInfo`, from the
local checkpoint files or the remote metadata blob), passes the checkpoints it knows,
and deletes what comes back.

Rules (issue 3, "Replay, trim, purge"; seeds 004 and 001):

**Prefix rule.**  Readers replay from the minimum retained generation onwards, so the
retained generations are always a contiguous *suffix* in generation order: a
generation is deletable iff it is below :func:`min_retained_generation`, the lowest
generation that must be kept for its own sake.  A generation is never deleted while
an older one stays.

**Current generation.**  The generation being written (``current_generation``) and any
later one are always kept, even when empty.

**Empty generations** (``num_ops == 0``, min/max seq# -1) hold no operation, so they
never force retention themselves: one is deleted iff it lies below the minimum
retained generation, and kept iff it lies above it (contiguity).

**Local.**  A non-empty local generation must be kept while its ``max_seq_no`` is above
``min(last_commit_local_checkpoint, retention_seq_no)``:

- ``last_commit_local_checkpoint`` is the local checkpoint of the last *safe* local
  commit (seed 004: only commits whose ops are all <= the global checkpoint are valid
  starting points; a replica rolled back to one must replay from it);
- ``retention_seq_no`` is the highest seq# no copy needs any more (ops above it are kept
  for replica recovery): the global checkpoint, or the minimum retention lease's
  retaining seq# minus one, whichever is lower.

  Seq#s <= the global checkpoint are never re-issued by a later primary (a new
  primary only re-uses seq#s above it), so this bound needs no term check.
- ``min_unuploaded_generation`` (optional): with a remote translog, the lowest local
  generation not yet durably uploaded; it and every later one are kept, whatever the
  checkpoints say (otherwise an op could vanish before reaching the remote log).

**Remote.**  A non-empty remote generation may go only when a durably uploaded *remote*
segment commit covers it (seed 001: the remote translog must outlive the segment
upload).  Covering means both:

- ``max_seq_no <= remote_commit_local_checkpoint``: every op of the generation is at or
  below the commit's local checkpoint.  ``max_seq_no`` is the *raw* maximum of what was
  written: trimming ops above a seq# (seed 004, primary promotion) does not lower it,
  so a trimmed older-term generation still holding ops above the commit's checkpoint
  is kept;
- ``primary_term <= remote_commit_primary_term``: after a failover the new primary
  re-issues seq#s above the global checkpoint, possibly *below* an older commit's
  local checkpoint.  A commit of term c holds term-c history; ops of a later term t > c
  at seq#s <= its checkpoint are not in it and must stay in the translog until a commit
  of term >= t covers them.

No remote commit yet (``remote_commit_local_checkpoint is None``) means nothing remote is
deletable, not even empty generations.

Every decision is monotonic: raising a checkpoint (or the commit's term, or
``min_unuploaded_generation``, or ``current_generation``) never makes a deletable
generation retained again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shardstore.core.ops import NO_OPS
from shardstore.errors import InvalidError
from shardstore.translog.errors import TranslogError

#: min/max seq# of a generation without operations; also "no op" for checkpoints.
NO_SEQ_NO = NO_OPS  # the seq# of an empty generation (shardstore.core.ops)


class InvalidGenerations(TranslogError, InvalidError):
    """The generations or checkpoints handed to a purge decision are inconsistent."""


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """What the purge rules need of one translog generation."""

    generation: int
    primary_term: int
    min_seq_no: int
    max_seq_no: int
    num_ops: int

    def __post_init__(self) -> None:
        for name in ("generation", "primary_term", "min_seq_no", "max_seq_no", "num_ops"):
            if not isinstance(getattr(self, name), int):
                raise InvalidGenerations(f"{name} must be an int, got {getattr(self, name)!r}")
        if self.generation < 0 or self.primary_term < 0 or self.num_ops < 0:
            raise InvalidGenerations(f"negative generation, term or op count in {self}")
        if self.num_ops == 0:
            if self.min_seq_no != NO_SEQ_NO or self.max_seq_no != NO_SEQ_NO:
                raise InvalidGenerations(f"an empty generation has min/max seq# {NO_SEQ_NO}: {self}")
        elif not 0 <= self.min_seq_no <= self.max_seq_no:
            raise InvalidGenerations(f"need 0 <= min_seq_no <= max_seq_no: {self}")

    @property
    def is_empty(self) -> bool:
        """Whether the generation holds no operation."""
        return self.num_ops == 0

    @classmethod
    def empty(cls, generation: int, primary_term: int) -> GenerationInfo:
        """A generation without operations."""
        return cls(generation, primary_term, NO_SEQ_NO, NO_SEQ_NO, 0)


def _checked(generations: Iterable[GenerationInfo], current_generation: int) -> list[GenerationInfo]:
    """The generations sorted by number, after checking they describe one translog."""
    gens = sorted(generations, key=lambda g: g.generation)
    if not isinstance(current_generation, int) or current_generation < 0:
        raise InvalidGenerations(f"current_generation must be an int >= 0, got {current_generation!r}")
    for prev, nxt in zip(gens, gens[1:]):
        if prev.generation == nxt.generation:
            raise InvalidGenerations(f"generation {nxt.generation} is listed twice")
        if nxt.primary_term < prev.primary_term:
            raise InvalidGenerations(
                f"generation {nxt.generation} has term {nxt.primary_term}, below term "
                f"{prev.primary_term} of older generation {prev.generation}"
            )
    if gens and gens[-1].generation > current_generation:
        raise InvalidGenerations(
            f"generation {gens[-1].generation} is newer than the current generation {current_generation}"
        )
    return gens


def _seq_no_arg(name: str, value: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or value < NO_SEQ_NO:
        raise InvalidGenerations(f"{name} must be an int >= {NO_SEQ_NO}, got {value!r}")


def min_retained_generation(
    generations: Iterable[GenerationInfo],
    *,
    current_generation: int,
    covered_seq_no: int | None,
    covered_primary_term: int | None = None,
    keep_from_generation: int | None = None,
) -> int:
    """Lowest generation to keep; every listed generation below it is deletable, none above."""
    gens = _checked(generations, current_generation)
    _seq_no_arg("covered_seq_no", covered_seq_no, optional=True)
    floor = current_generation if keep_from_generation is None else min(current_generation, keep_from_generation)
    if covered_seq_no is None:  # nothing covered: keep everything listed
        return min([floor, *(g.generation for g in gens)])
    for g in gens:
        if g.generation >= floor:
            break
        if g.is_empty:
            continue
        newer_term = covered_primary_term is not None and g.primary_term > covered_primary_term
        if g.max_seq_no > covered_seq_no or newer_term:
            return g.generation
    return floor


def _below(gens: Iterable[GenerationInfo], bound: int) -> set[int]:
    return {g.generation for g in gens if g.generation < bound}


def section_order(entries: Iterable[Any]) -> list[Any]:
    """Uploaded sections (anything with ``generation``, ``min_seq_no`` and ``offset``) in log order.

    A node-level translog may upload one generation as several pieces (translog/pieces.py); the
    remote purge rule then runs over sections, numbered in this order, instead of generations.
    The order only decides how far a purge gets, never whether a section may go: one is dropped
    only when the commit covers it, whatever its place.
    """
    return sorted(entries, key=lambda e: (e.generation, e.min_seq_no, e.offset))


def remote_deletable_sections(entries: Iterable[Any], *, remote_commit_local_checkpoint: int | None,
                              remote_commit_primary_term: int | None) -> list[Any]:
    """The sections (as :func:`section_order` takes them) a durably uploaded remote commit covers, by the
    generation rule of :func:`remote_deletable` applied to each section as if it were a generation."""
    ordered = section_order(entries)
    infos = [GenerationInfo(i, e.primary_term, e.min_seq_no, e.max_seq_no, e.num_ops) for i, e in enumerate(ordered)]
    doomed = remote_deletable(infos, remote_commit_local_checkpoint=remote_commit_local_checkpoint,
                              remote_commit_primary_term=remote_commit_primary_term, current_generation=len(infos))
    return [ordered[i] for i in sorted(doomed)]


def local_deletable(
    generations: Iterable[GenerationInfo],
    *,
    current_generation: int,
    last_commit_local_checkpoint: int,
    retention_seq_no: int,
    min_unuploaded_generation: int | None = None,
) -> set[int]:
    """Local generations that may be deleted: covered by the safe commit and by retention."""
    gens = list(generations)
    _seq_no_arg("last_commit_local_checkpoint", last_commit_local_checkpoint)
    _seq_no_arg("retention_seq_no", retention_seq_no)
    keep = min_retained_generation(
        gens,
        current_generation=current_generation,
        covered_seq_no=min(last_commit_local_checkpoint, retention_seq_no),
        keep_from_generation=min_unuploaded_generation,
    )
    return _below(gens, keep)


def remote_deletable(
    generations: Iterable[GenerationInfo],
    *,
    remote_commit_local_checkpoint: int | None,
    remote_commit_primary_term: int | None,
    current_generation: int,
) -> set[int]:
    """Remote generations that may be deleted: covered by a durably uploaded remote segment commit."""
    gens = list(generations)
    _seq_no_arg("remote_commit_local_checkpoint", remote_commit_local_checkpoint, optional=True)
    if remote_commit_local_checkpoint is None:
        _checked(gens, current_generation)
        return set()
    if not isinstance(remote_commit_primary_term, int) or remote_commit_primary_term < 0:
        raise InvalidGenerations(
            f"a remote commit needs its primary term (int >= 0), got {remote_commit_primary_term!r}"
        )
    keep = min_retained_generation(
        gens,
        current_generation=current_generation,
        covered_seq_no=remote_commit_local_checkpoint,
        covered_primary_term=remote_commit_primary_term,
    )
    return _below(gens, keep)
