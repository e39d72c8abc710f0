"""Whether a flush has anything to do: a flush of a copy that changed nothing since its last one makes
no request (issue 30; docs/design/engine.md, "Flushes that skip what did not change").

Pure: :class:`FlushMark` is what a copy looked like when its last flush succeeded, and
:func:`flush_needed` compares it with now.  A flush is needed when

* this copy never flushed since it was opened or promoted (no mark),
* any seq# was generated, applied or counted since (``max_seq_no``, ``local_checkpoint``),
* the global checkpoint moved (a commit records it; replicas purge their translog by it),
* the copy's term or role changed (a new term uploads a commit of its own), or
* an older term's commits still wait for garbage collection after a failover.

Nothing else changes what a commit would hold: a refresh or a merge only rearranges
operations the last commit already covers, and skipping keeps the translog's purge gate
where it was (what is retained only grows, never shrinks).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FlushMark", "flush_needed"]


@dataclass(frozen=True, slots=True)
class FlushMark:
    """A copy's state at its last successful flush."""

    primary_term: int
    primary: bool
    max_seq_no: int
    local_checkpoint: int
    global_checkpoint: int


def flush_needed(last: FlushMark | None, now: FlushMark, *, older_terms_pending: bool = False) -> bool:
    """True unless the copy is exactly as its last successful flush left it (see the module docstring)."""
    return last is None or older_terms_pending or last != now
