"""The routing check a cluster heals by (engine/manager/routing_check.py), exhaustively over small cases."""

from __future__ import annotations

import itertools

from shardstore.core.path_strategy import PlainPathStrategy
from shardstore.engine.manager.metadata import IndexMeta, ShardRouting
from shardstore.engine.manager.routing_check import HeldCopy, held_from_stats, routing_faults

NODES = ("n1", "n2", "n3")


def _meta(primary: str | None, replicas: tuple[str, ...], term: int = 3) -> IndexMeta:
    copies = tuple(dict.fromkeys([*([primary] if primary else []), *replicas]))
    return IndexMeta(name="docs", uuid="u", shards=1, replicas=len(replicas), mappings={}, durability="request",
                     strategy=PlainPathStrategy(), routing=(ShardRouting(0, primary, term, copies, copies),),
                     data_cluster_uuid="c")


def _expected(primary: str | None, replicas: tuple[str, ...], held: dict, term: int) -> set[tuple[str, str]]:
    out = set()
    for node in [*([primary] if primary else []), *replicas]:
        if node not in held:
            continue
        copy = held[node].get(("u", 0))
        if copy is None:
            out.add((node, "missing"))
        elif node == primary and (not copy.primary or copy.term != term):
            out.add((node, "not_primary"))
        elif node != primary and copy.primary:
            out.add((node, "stale_primary"))
    return out


def test_every_combination_of_routing_and_held_copies_is_judged_as_the_table_says() -> None:
    states = [None, HeldCopy(False, 3), HeldCopy(True, 3), HeldCopy(True, 2)]  # absent, replica, primary, old primary
    checked = 0
    for primary in (None, "n1"):
        for replicas in [(), ("n2",), ("n2", "n3")]:
            routed = [*([primary] if primary else []), *replicas]
            for answered in itertools.product([True, False], repeat=len(NODES)):
                for held_states in itertools.product(states, repeat=len(NODES)):
                    held = {n: ({("u", 0): st} if st is not None else {}) for n, st, a in
                            zip(NODES, held_states, answered) if a}
                    faults = routing_faults({"docs": _meta(primary, replicas)}, held)
                    got = {(f.node, f.what) for f in faults}
                    assert got == _expected(primary, replicas, held, 3), (primary, replicas, held)
                    assert all(f.node in routed and f.index == "docs" and f.shard == 0 for f in faults)
                    checked += 1
    assert checked == 2 * 3 * 8 * 64


def test_a_consistent_cluster_has_no_fault_and_a_silent_node_is_left_to_fault_detection() -> None:
    meta = {"docs": _meta("n1", ("n2",))}
    held = {"n1": {("u", 0): HeldCopy(True, 3)}, "n2": {("u", 0): HeldCopy(False, 3)}}
    assert routing_faults(meta, held) == []
    assert routing_faults(meta, {"n1": {("u", 0): HeldCopy(True, 3)}}) == []  # n2 did not answer
    assert [(f.node, f.what) for f in routing_faults(meta, {**held, "n1": {}})] == [("n1", "missing")]


def test_node_stats_rows_read_with_and_without_a_term() -> None:
    assert held_from_stats([["u", "0", True, 4], ["v", 1, False]]) == {
        ("u", 0): HeldCopy(True, 4), ("v", 1): HeldCopy(False, -1)}
