"""Which rounds of node-level translog streams the store may drop: a pure decision (issue 46).

A node process writes one translog *stream* (docs/design/translog.md, "Node-level
translog"); while it lives it deletes its own rounds by reference counts it keeps in
memory.  When it dies, nothing in memory is left to do that.  This module decides, from
what the store says alone, which rounds of such *dead* streams no reader can need; the
cluster manager's collector (``engine/manager/translog_gc.py``) gathers the inputs and
deletes what comes back.  Nothing here does I/O.

**Rule** (docs/design/translog.md, "Collecting dead streams").  A round may be deleted iff

1. its stream is *dead*: the stream's owner (the process id in its name) is not the
   process of any member of the cluster, and has not been for a grace period (the caller
   decides; a stream of an older version, with no owner in its name, is dead too);
2. its index is readable (from the index blob or the data blob's trailer).  A round whose
   index cannot be read is kept: the restore audit names it and the seq# ranges it held;
3. every section in it is *covered* for its shard:
   - the shard is known (its index exists), and
   - the shard has at least ``fallback`` readable remote commits, and every one of the
     ``fallback`` best (restore order: ``Evidence.restore_order``) covers the section by
     the purge rule: ``max_seq_no <= commit local checkpoint`` and ``primary_term <=
     commit term`` (``purge.remote_deletable``; a section without operations is covered).
     A restore that falls back past one bad commit still finds every operation above the
     commit it falls back to, as the live purge gate keeps (``flush_policy.remote_purge_gate``);
   - no per-shard translog metadata of any term names the section (its ``entries``): a
     reader that follows that metadata would read it.  Such a metadata goes when the
     shard's newest commit covers its whole term (``remote.purge_older_prefix``); the
     section is collected at a later pass.

A stream whose every round went is gone: the stream has no blob left, and no marker of its
own.

**Monotonic.**  More commits covering more, fewer metadata entries, a stream dead for longer:
each only grows what may be deleted, never shrinks it, so a pass that deleted a round was
right at every later moment too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: (index UUID, shard number)
ShardKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SectionView:
    """What the decision needs of one section of a round's index."""

    index_uuid: str
    shard: int
    primary_term: int
    max_seq_no: int
    num_ops: int
    offset: int


@dataclass(frozen=True, slots=True)
class RoundView:
    """One round of a stream: its keys in the store and its sections (None: its index could not be read)."""

    stream: str
    round: int
    keys: tuple[str, ...]
    data_key: str
    sections: tuple[SectionView, ...] | None


@dataclass(frozen=True, slots=True)
class ShardRetention:
    """What the store keeps of one shard: its best readable commits and the sections its metadata names."""

    #: (local checkpoint, primary term) of its readable remote commits, best first (restore order)
    commits: tuple[tuple[int, int], ...] = ()
    #: (data blob key, offset) of every section a per-shard translog metadata of any term names
    named: frozenset[tuple[str, int]] = field(default_factory=frozenset)


def covered(section: SectionView, commits: Sequence[tuple[int, int]], fallback: int) -> bool:
    """Whether each of the ``fallback`` best commits holds every operation of ``section`` (the purge rule)."""
    if section.num_ops == 0:
        return True
    best = commits[:fallback]
    if len(best) < fallback:
        return False
    return all(section.max_seq_no <= cp and section.primary_term <= term for cp, term in best)


def round_deletable(r: RoundView, retention: Mapping[ShardKey, ShardRetention], fallback: int) -> bool:
    """Whether no reader can need round ``r`` of a dead stream (rules 2 and 3 of the module)."""
    if r.sections is None:
        return False
    for s in r.sections:
        kept = retention.get((s.index_uuid, s.shard))
        if kept is None:
            return False
        if (r.data_key, s.offset) in kept.named or not covered(s, kept.commits, fallback):
            return False
    return True


def doomed_rounds(rounds: Iterable[RoundView], dead: frozenset[str] | set[str],
                  retention: Mapping[ShardKey, ShardRetention], *, fallback: int = 2) -> list[RoundView]:
    """The rounds of dead streams that no restore, recovery or changes reader can need (see the module)."""
    if fallback < 1:
        raise ValueError(f"fallback must be at least 1, got {fallback}")
    return [r for r in rounds if r.stream in dead and round_deletable(r, retention, fallback)]


def dead_streams(streams: Iterable[str], owner_of: Mapping[str, str | None], live_owners: frozenset[str] | set[str],
                 absent_since: Mapping[str, float], now: float, grace: float) -> set[str]:
    """The streams whose owner is no live member's process and has not been for ``grace`` seconds (rule 1).

    ``owner_of``: each stream's owner (None: a stream of an older version, which names none);
    ``absent_since``: when the caller first saw each stream without a live owner (a stream it
    sees so for the first time counts from ``now``).
    """
    dead = set()
    for stream in streams:
        owner = owner_of.get(stream)
        if owner is not None and owner in live_owners:
            continue
        if now - absent_since.get(stream, now) >= grace:
            dead.add(stream)
    return dead


def shards_of(rounds: Iterable[RoundView], dead: frozenset[str] | set[str]) -> set[ShardKey]:
    """The shards a decision over ``rounds`` needs the retention of: those named by readable rounds of dead streams."""
    return {(s.index_uuid, s.shard) for r in rounds if r.stream in dead and r.sections is not None for s in r.sections}


__all__ = ["RoundView", "SectionView", "ShardKey", "ShardRetention", "covered", "dead_streams", "doomed_rounds",
           "round_deletable", "shards_of"]
