"""Seed 000's latest-cluster-UUID algorithm, as a pure function.

Input: for every cluster UUID found in the store, :class:`UuidInfo` = (previous cluster
UUID named by its latest committed manifest, whether it has a committed manifest, the
fingerprint of that manifest's persistent metadata).

1. Discard the UUIDs without a committed manifest (a cluster that never committed).
2. Chain the rest through their previous UUID (a previous UUID that is not valid, or
   absent, ends the chain: it was never committed, or was purged).
3. The heads are the valid UUIDs no valid UUID names as previous.  One head: done.
4. Several heads (the seed's race: UUID2 and UUID3 both name UUID1): trim every head
   whose fingerprint equals its predecessor's (it was restored from it and never changed
   its metadata), recompute the heads on what is left, and repeat while that trims.
5. Still more than one head: :class:`MultipleClusterUUIDs` listing them.  No head while
   valid UUIDs exist (every one is named by another): :class:`ClusterUUIDCycle`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shardstore.cluster_state.errors import ClusterUUIDCycle, MultipleClusterUUIDs


@dataclass(frozen=True)
class UuidInfo:
    """What the latest committed manifest of one cluster UUID says."""

    previous: str | None
    committed: bool
    fingerprint: str


def _heads(valid: Mapping[str, UuidInfo]) -> set[str]:
    named = {i.previous for i in valid.values() if i.previous in valid}
    return set(valid) - named


def _check_acyclic(valid: Mapping[str, UuidInfo]) -> None:
    for start in valid:
        seen, u = set(), start
        while u in valid:
            if u in seen:
                raise ClusterUUIDCycle(seen)
            seen.add(u)
            u = valid[u].previous  # type: ignore[assignment]


def latest_cluster_uuid(infos: Mapping[str, UuidInfo]) -> str | None:
    """The one valid latest cluster UUID, or None when no UUID has a committed manifest."""
    valid = {u: i for u, i in infos.items() if i.committed}
    if not valid:
        return None
    _check_acyclic(valid)
    while True:
        heads = _heads(valid)
        if len(heads) == 1:
            return next(iter(heads))
        # only heads are trimmed (as OpenSearch does), then the heads are recomputed
        trimmed = {
            u: i for u, i in valid.items()
            if not (u in heads and i.previous in valid and valid[i.previous].fingerprint == i.fingerprint)
        }
        if len(trimmed) == len(valid):
            raise MultipleClusterUUIDs(heads)
        valid = trimmed


def uuid_chain(infos: Mapping[str, UuidInfo], head: str) -> list[str]:
    """``head`` and its committed predecessors, newest first (the path the seed draws)."""
    valid = {u: i for u, i in infos.items() if i.committed}
    chain, u = [], head
    while u in valid and u not in chain:
        chain.append(u)
        u = valid[u].previous  # type: ignore[assignment]
    return chain
