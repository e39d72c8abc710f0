"""The routing invariants the cluster manager checks before it publishes a change (engine/manager/invariants.py)."""

from __future__ import annotations

import itertools

import pytest

from shardstore.engine.errors import InvariantViolated
from shardstore.engine.manager.invariants import ROUTING_INVARIANTS, broken_invariants, check_routing
from shardstore.engine.manager.metadata import ShardRouting


def r(primary: str | None, term: int, copies: str, in_sync: str) -> ShardRouting:
    """A routing of shard 0; copies and in-sync copies as strings of one-letter node names."""
    return ShardRouting(0, primary, term, tuple(copies), tuple(in_sync))


# the transitions the manager makes (engine/manager/role.py), each of which must pass
ALLOWED = {
    "promotion of an in-sync replica": (r("a", 1, "ab", "ab"), r("b", 2, "b", "b")),
    "promotion waits out a lease": (r("a", 1, "ab", "ab"), r(None, 1, "b", "b")),
    "promotion after the lease": (r(None, 1, "b", "b"), r("b", 2, "b", "b")),
    "a failed promotion uses its term": (r(None, 1, "bc", "bc"), r(None, 2, "bc", "bc")),
    "no in-sync copy left": (r("a", 1, "a", "a"), r(None, 1, "", "")),
    "rebuilt from the store": (r(None, 1, "", ""), r("c", 3, "c", "c")),
    "rebuilt from the store, unclaimed term reused": (r(None, 2, "", ""), r("c", 2, "c", "c")),
    "replica started": (r("a", 1, "a", "a"), r("a", 1, "ab", "ab")),
    "replica failed": (r("a", 1, "ab", "ab"), r("a", 1, "a", "a")),
    "a replica left": (r("a", 1, "abc", "abc"), r("a", 1, "ac", "ac")),
}

# one transition per invariant that only it refuses
REFUSED = {
    "primary-in-sync": (r("a", 1, "ab", "ab"), r("a", 1, "ab", "b")),
    "in-sync-are-copies": (r("a", 1, "a", "a"), r("a", 1, "a", "ab")),
    "term-never-decreases": (r(None, 2, "b", "b"), r(None, 1, "b", "b")),
    "new-primary-new-term": (r("a", 2, "ab", "ab"), r("b", 2, "ab", "ab")),
    "promoted-from-in-sync": (r("a", 1, "ab", "a"), r("b", 2, "b", "b")),
}


@pytest.mark.parametrize("what", sorted(ALLOWED))
def test_the_managers_transitions_keep_every_invariant(what: str) -> None:
    before, after = ALLOWED[what]
    assert broken_invariants(before, after) == []
    check_routing("docs", before, after)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_invariant_refuses_its_transition_by_name_with_its_reason(name: str) -> None:
    before, after = REFUSED[name]
    assert [inv.name for inv in broken_invariants(before, after)] == [name]
    with pytest.raises(InvariantViolated, match=name) as info:
        check_routing("docs", before, after)
    reason = next(inv.reason for inv in ROUTING_INVARIANTS if inv.name == name)
    assert reason in str(info.value) and "docs/0" in str(info.value) and not info.value.retryable


def _routings() -> list[ShardRouting]:
    nodes = "abc"
    subsets = ["".join(c) for k in range(4) for c in itertools.combinations(nodes, k)]
    return [r(p, t, copies, sync) for p in (None, *nodes) for t in (1, 2) for copies in subsets for sync in subsets]


def test_exhaustively_over_three_nodes_and_two_terms_against_a_reference() -> None:
    """Every (before, after) pair of small routings: the predicates agree with a reference written apart."""
    routings = _routings()
    for before in routings:
        for after in routings:
            expected = set()
            if after.primary is not None and after.primary not in after.in_sync:
                expected.add("primary-in-sync")
            if not set(after.in_sync).issubset(after.copies):
                expected.add("in-sync-are-copies")
            if after.primary_term < before.primary_term:
                expected.add("term-never-decreases")
            moved = after.primary is not None and before.primary is not None and after.primary != before.primary
            if moved and after.primary_term <= before.primary_term:
                expected.add("new-primary-new-term")
            new = after.primary is not None and after.primary != before.primary
            from_store = before.primary is None and not before.in_sync and after.in_sync == (after.primary,)
            if new and after.primary not in before.in_sync and not from_store:
                expected.add("promoted-from-in-sync")
            assert {inv.name for inv in broken_invariants(before, after)} == expected, (before, after)
