"""What the committed routing says against what the nodes hold: the pure check a cluster heals by (issue 41).

After a partition heals, a node can hold less than the routing gives it: a primary fenced
or dropped while it was cut off, a replica discarded, a copy that never came back.  Writes
to such a shard fail ("holds no primary") until the cluster manager notices.  The manager
asks every member what it holds (``node.stats``: per copy whether it is primary and its
term) and compares, here, with the routing it committed:

======================  ======================================================  ===================================
fault                   when                                                    the manager then
======================  ======================================================  ===================================
``missing``             a routed copy (primary or replica) is not held           treats the copy as lost: a primary
                                                                                is promoted elsewhere (or rebuilt
                                                                                from the store), a replica rebuilt
``not_primary``         the routed primary holds a replica, or a primary of      the same: another in-sync copy is
                        another term                                            promoted with a newer term
``stale_primary``       a routed replica holds a primary                        the same for the replica
======================  ======================================================  ===================================

Nodes that did not answer are left out: that is fault detection's business.  A shard with a
fault is not green (docs/design/engine.md, "Health tells the truth").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardstore.engine.manager.metadata import IndexMeta

__all__ = ["FAULTS", "HeldCopy", "RoutingFault", "held_from_stats", "routing_faults"]

FAULTS = ("missing", "not_primary", "stale_primary")


@dataclass(frozen=True)
class HeldCopy:
    """A copy a node holds: whether it acts as primary, its primary term and its global checkpoint."""

    primary: bool
    term: int
    global_checkpoint: int = -1


@dataclass(frozen=True)
class RoutingFault:
    """``node``'s copy of ``index``/``shard`` is not what the routing says (``what``: one of :data:`FAULTS`)."""

    index: str
    shard: int
    node: str
    what: str


def held_from_stats(copies: list[list]) -> dict[tuple[str, int], HeldCopy]:
    """The ``copies`` rows of a ``node.stats`` answer ([index UUID, shard, primary, term, global checkpoint])."""
    return {(str(c[0]), int(c[1])): HeldCopy(bool(c[2]), int(c[3]) if len(c) > 3 else -1,
                                             int(c[4]) if len(c) > 4 else -1) for c in copies}


def routing_faults(indices: Mapping[str, IndexMeta],
                   held: Mapping[str, Mapping[tuple[str, int], HeldCopy]]) -> list[RoutingFault]:
    """Every routed copy that its node (one of ``held``'s, those that answered) does not hold as routed (pure)."""
    faults = []
    for name in sorted(indices):
        meta = indices[name]
        for sr in meta.routing:
            for node in dict.fromkeys([*([sr.primary] if sr.primary else []), *sr.copies]):
                if node not in held:
                    continue
                copy = held[node].get((meta.uuid, sr.shard))
                if copy is None:
                    faults.append(RoutingFault(name, sr.shard, node, "missing"))
                elif node == sr.primary and (not copy.primary or copy.term != sr.primary_term):
                    faults.append(RoutingFault(name, sr.shard, node, "not_primary"))
                elif node != sr.primary and copy.primary:
                    faults.append(RoutingFault(name, sr.shard, node, "stale_primary"))
    return faults
