"""Whether a flush has anything to do: a flush of a copy that changed nothing since its last one makes
no request (issue 30; docs/design/engine.md, "Flushes that skip what did not change").

Pure: :class:`FlushMark` is what a copy looked like when its last flush succeeded, and
:func:`flush_needed` compares it with now.  A flush is needed when

* this copy never flushed since it was opened or promoted (no mark),
* any seq# was generated, applied or counted since (``max_seq_no``, ``local_checkpoint``),
* the global checkpoint moved (a commit records it; replicas purge their translog by it),
* the copy's term or role changed (a new term uploads a commit of its own),
* a merge was installed since (merges run after the flush that asked for them, on the merge thread:
  segments/merge_scheduler.py; the next flush commits and uploads the merged segment), or
* an older term's commits still wait for garbage collection after a failover.

Nothing else changes what a commit would hold: a refresh only rearranges operations the last
commit already covers, and skipping keeps the translog's purge gate where it was (what is
retained only grows, never shrinks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardstore.core.ops import NO_OPS

__all__ = ["FALLBACK_COMMITS", "FlushMark", "flush_needed", "remote_purge_gate"]

#: the remote translog is purged only up to the oldest of this copy's last FALLBACK_COMMITS remote
#: commits: a restore can fall back past FALLBACK_COMMITS - 1 bad commits and lose nothing
FALLBACK_COMMITS = 2


@dataclass(frozen=True, slots=True)
class FlushMark:
    """A copy's state at its last successful flush."""

    primary_term: int
    primary: bool
    max_seq_no: int
    local_checkpoint: int
    global_checkpoint: int
    merges: int = 0  # merges the copy's directory installed (ShardDirectory.merges_installed)


def flush_needed(last: FlushMark | None, now: FlushMark, *, older_terms_pending: bool = False) -> bool:
    """True unless the copy is exactly as its last successful flush left it (see the module docstring)."""
    return last is None or older_terms_pending or last != now


def remote_purge_gate(recent: Sequence[int], *, first_of_shard: bool) -> int:
    """The local checkpoint up to which a commit lets the remote translog be purged (docs/design/engine.md,
    "Restore never returns less", and its first-commit exception).

    ``recent``: the local checkpoints of this copy's last remote commits in its term, the new one last.
    Normally the oldest of the last :data:`FALLBACK_COMMITS` (none before there are that many), so a
    restore that falls back past one bad commit finds every operation above the one it falls back to.
    ``first_of_shard``: the new commit is the first the shard ever had (a new index's first primary,
    term 1, nothing committed before). There is no commit to fall back to: what the gate would keep is
    the whole shard a second time, as translog (issue 31: 2.6x deltalake's bytes after the one-go
    flush). It covers its translog; a restore that then finds it lost or corrupt refuses, naming it.
    """
    if not recent:
        raise ValueError("remote_purge_gate needs the new commit's checkpoint")
    if first_of_shard:
        return recent[-1]
    return recent[-FALLBACK_COMMITS] if len(recent) >= FALLBACK_COMMITS else NO_OPS
