"""Master tasks for the engine: ``ClusterState -> ClusterState`` functions to pass to ``submit`` (pure).

Each returns a function the elected cluster-manager runs against the current state, one
task at a time (:meth:`ClusterManagerNode.submit` / :meth:`LocalCluster.submit`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shardstore.cluster_state.model import ClusterState
from shardstore.core.path_strategy import PathStrategy

Task = Callable[[ClusterState], ClusterState]


def create_index(name: str, *, shards: int = 1, replicas: int = 0, settings: Mapping[str, Any] | None = None,
                 mappings: Mapping[str, Any] | None = None, path_strategy: PathStrategy | None = None,
                 uuid: str | None = None) -> Task:
    """Create an index (fresh UUID unless given; primary term 1 on every shard)."""
    return lambda s: s.create_index(name, shards=shards, replicas=replicas, settings=settings, mappings=mappings,
                                    path_strategy=path_strategy, uuid=uuid)


def delete_index(name: str) -> Task:
    """Delete an index and its routing table."""
    return lambda s: s.without_index(name)


def set_primary_term(index: str, shard: int, term: int) -> Task:
    """Raise one shard's primary term (a promotion); refuses to lower it."""
    return lambda s: s.update_index(index, lambda im: im.with_primary_term(shard, term))


def set_in_sync(index: str, shard: int, allocation_ids: Iterable[str]) -> Task:
    """Replace one shard's in-sync allocation ids."""
    ids = tuple(allocation_ids)
    return lambda s: s.update_index(index, lambda im: im.with_in_sync(shard, ids))


def set_routing(index: str, table: Mapping[str, Any] | None) -> Task:
    """Replace (None: remove) one index's routing table."""
    return lambda s: s.with_routing(index, table)


def set_nodes(nodes: Mapping[str, Any]) -> Task:
    """Replace the node list."""
    return lambda s: s.with_nodes(nodes)


def chain(*tasks: Task) -> Task:
    """Several tasks applied in order as one publication."""
    def run(s: ClusterState) -> ClusterState:
        for t in tasks:
            s = t(s)
        return s
    return run
