"""What a routing change of one shard must keep true, as named predicates (issue 42; docs/design/engine.md).

The cluster manager publishes every routing change before it is acted on
(:meth:`~shardstore.engine.manager.role.ManagerRole.set_routing`); :func:`check_routing` runs
first and refuses a change that breaks one of :data:`ROUTING_INVARIANTS` with
:class:`~shardstore.engine.errors.InvariantViolated`, so a bug in a decision stops at the
manager instead of reaching the copies and the store.  Each predicate is pure and cheap: two
``ShardRouting`` values, before and after.  SlateDB's ``manifest/invariants.rs`` is the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardstore.engine.errors import InvariantViolated
from shardstore.engine.manager.metadata import ShardRouting


@dataclass(frozen=True)
class Invariant:
    """One named predicate over a shard's routing before and after a change, with why it must hold."""

    name: str
    reason: str
    holds: Callable[[ShardRouting, ShardRouting], bool]


def _primary_in_sync(_before: ShardRouting, after: ShardRouting) -> bool:
    return after.primary is None or after.primary in after.in_sync


def _in_sync_are_copies(_before: ShardRouting, after: ShardRouting) -> bool:
    return set(after.in_sync) <= set(after.copies) and len(set(after.copies)) == len(after.copies)


def _term_never_decreases(before: ShardRouting, after: ShardRouting) -> bool:
    return after.primary_term >= before.primary_term


def _new_primary_new_term(before: ShardRouting, after: ShardRouting) -> bool:
    return (before.primary is None or after.primary is None or after.primary == before.primary
            or after.primary_term > before.primary_term)


def _promoted_from_in_sync(before: ShardRouting, after: ShardRouting) -> bool:
    return (after.primary is None or after.primary == before.primary or after.primary in before.in_sync
            or (not before.in_sync and before.primary is None and list(after.in_sync) == [after.primary]))


ROUTING_INVARIANTS: tuple[Invariant, ...] = (
    Invariant("primary-in-sync", "a primary acknowledges only what every in-sync copy applied, itself included",
              _primary_in_sync),
    Invariant("in-sync-are-copies", "an in-sync copy is a copy the manager allocated, each listed once",
              _in_sync_are_copies),
    Invariant("term-never-decreases", "a published term may be claimed in the store: going back would let two "
              "primaries write under one term", _term_never_decreases),
    Invariant("new-primary-new-term", "another node taking over a primary claims a newer term, which fences the "
              "old primary's uploads", _new_primary_new_term),
    Invariant("promoted-from-in-sync", "only an in-sync copy holds every acknowledged write; a shard with none is "
              "rebuilt from the store onto one copy", _promoted_from_in_sync),
)


def broken_invariants(before: ShardRouting, after: ShardRouting) -> list[Invariant]:
    """The invariants the change ``before`` -> ``after`` breaks (empty: it may be published)."""
    return [inv for inv in ROUTING_INVARIANTS if not inv.holds(before, after)]


def check_routing(index: str, before: ShardRouting, after: ShardRouting) -> None:
    """Raise InvariantViolated naming each invariant the change breaks, with its reason."""
    broken = broken_invariants(before, after)
    if broken:
        raise InvariantViolated(f"routing of {index}/{after.shard} {before} -> {after}",
                                [f"{inv.name} ({inv.reason})" for inv in broken])
