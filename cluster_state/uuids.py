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

import time
from collections.abc import Callable, Mapping
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


#: how many more times :func:`latest_of_settled_view` reads a view showing several heads or a cycle
SETTLE_READS = 4
#: seconds between those reads (a purge deletes a few keys per UUID: it moves on within this)
SETTLE_PAUSE = 0.25


def latest_of_settled_view(read: Callable[[], Mapping[str, UuidInfo]], *, reads: int = SETTLE_READS,
                           pause: float = SETTLE_PAUSE) -> tuple[Mapping[str, UuidInfo], str | None]:
    """(the view, its latest cluster UUID), refusing several heads or a cycle only when two reads agree.

    A view is read UUID by UUID (a LIST and GET each), not at one instant.  A purge of the
    UUIDs behind the head (oldest first, possibly by a manager still running elsewhere) may
    delete between two of those reads; the view then spans before and after, and can show
    two heads the store never held at once (chaos seed 636: U1 read before its wipe, U2 read
    after its manifests went, so U1 and U3 both looked like heads).  Reading again settles it.
    """
    infos = read()
    for _ in range(reads):
        try:
            return infos, latest_cluster_uuid(infos)
        except (MultipleClusterUUIDs, ClusterUUIDCycle):
            time.sleep(pause)
            again = read()
            if again == infos:
                raise  # the same twice: the store really holds this
            infos = again
    return infos, latest_cluster_uuid(infos)


def uuid_chain(infos: Mapping[str, UuidInfo], head: str) -> list[str]:
    """``head`` and its committed predecessors, newest first (the path the seed draws)."""
    valid = {u: i for u, i in infos.items() if i.committed}
    chain, u = [], head
    while u in valid and u not in chain:
        chain.append(u)
        u = valid[u].previous  # type: ignore[assignment]
    return chain
