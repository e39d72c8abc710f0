"""Index metadata the cluster manager keeps, and how it maps onto the remote cluster state (issue 6).

Per index: name, UUID, shard and replica counts, mappings, durability, the path
strategy, the cluster UUID under which its shards' blobs live, and per shard the
routing: primary node, primary term, the nodes holding a copy and the in-sync set.
Frozen; changes make a new object.

Persistence goes through :mod:`shardstore.cluster_state`: every change becomes a master
task (:func:`sync_index`) that the elected cluster manager publishes (entities, then the
manifest, two-phase commit).  In the cluster state an index keeps its durable parts as
:class:`~shardstore.cluster_state.model.IndexMetadata` (settings ``index.translog.durability``
and ``index.remote_store.cluster_uuid``, per-shard primary terms, in-sync node names,
path strategy) and its routing (primary node and copies per shard) in the ephemeral
routing table, which a restore drops: the restored cluster allocates anew.

The primary terms in the cluster state only *help*: every primary claims its term with a
put-if-absent term marker in the blob store, and a restore starts above the newest marker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from shardstore.cluster_state.model import ClusterState, IndexMetadata
from shardstore.core.path_strategy import PathStrategy
from shardstore.core.settings import DATA_CLUSTER_UUID
from shardstore.segments.mapping import Mapping

DURABILITY = "index.translog.durability"
#: Elasticsearch's setting name: ``stored`` (the default) keeps each document's JSON, ``synthetic`` rebuilds it
SOURCE_MODE = "index.mapping.source.mode"


@dataclass(frozen=True)
class ShardRouting:
    """Where one shard's copies are."""

    shard: int
    primary: str | None
    primary_term: int
    copies: tuple[str, ...]
    in_sync: tuple[str, ...]


@dataclass(frozen=True)
class IndexMeta:
    """One index as the cluster manager knows it."""

    name: str
    uuid: str
    shards: int
    replicas: int
    mappings: dict
    durability: str
    strategy: PathStrategy
    routing: tuple[ShardRouting, ...]
    data_cluster_uuid: str = ""  # the cluster UUID in its shards' blob keys (kept across restores)
    source: str = "stored"  # "synthetic": no JSON copy of a document, rebuilt from its fields (issue 16)

    def with_routing(self, shard: int, **changes: Any) -> IndexMeta:
        """A copy with one shard's routing changed (lists become tuples)."""
        changes = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
        routing = list(self.routing)
        routing[shard] = replace(routing[shard], **changes)
        return replace(self, routing=tuple(routing))

    def with_all_routing(self, routing: tuple[ShardRouting, ...]) -> IndexMeta:
        """A copy with new routing for every shard."""
        return replace(self, routing=routing)


def to_index_metadata(meta: IndexMeta) -> IndexMetadata:
    """The durable part of ``meta`` as a cluster-state entity."""
    return IndexMetadata(
        name=meta.name, uuid=meta.uuid, mappings=dict(meta.mappings), shards=meta.shards, replicas=meta.replicas,
        settings={DURABILITY: meta.durability, DATA_CLUSTER_UUID: meta.data_cluster_uuid,
                  **({SOURCE_MODE: meta.source} if meta.source != "stored" else {})},
        primary_terms=tuple(r.primary_term for r in meta.routing),
        in_sync=tuple(tuple(r.in_sync) for r in meta.routing), path_strategy=meta.strategy.to_dict())


def routing_table(meta: IndexMeta) -> dict[str, Any]:
    """The ephemeral routing of ``meta`` (primary node and copies per shard) as JSON."""
    return {"shards": [[r.shard, r.primary, list(r.copies)] for r in meta.routing]}


def from_index_metadata(im: IndexMetadata, cluster_uuid: str) -> IndexMeta:
    """An index restored from the cluster state, with no copy allocated yet."""
    return IndexMeta(
        name=im.name, uuid=im.uuid, shards=im.shards, replicas=im.replicas, mappings=dict(im.mappings),
        durability=im.settings.get(DURABILITY, "request"), strategy=im.strategy(),
        routing=tuple(ShardRouting(s, None, int(t), (), ()) for s, t in enumerate(im.primary_terms)),
        data_cluster_uuid=im.settings.get(DATA_CLUSTER_UUID) or cluster_uuid,
        source=im.settings.get(SOURCE_MODE, "stored"))


def sync_index(meta: IndexMeta):
    """A master task making the cluster state hold ``meta`` (created, or its terms, in-sync sets and routing).

    Idempotent: it writes the cluster manager's whole view of the index, so a
    publication that failed (no quorum) is made good by the next one.
    """
    target = to_index_metadata(meta)
    table = routing_table(meta)

    def task(state: ClusterState) -> ClusterState:
        cur = state.indices.get(meta.name)
        if cur is None or cur.uuid != meta.uuid:
            state = state.with_index(target)
        else:
            im = cur
            if target.mappings != im.mappings:  # fields only ever join a mapping: merged, never replaced
                merged = Mapping.from_dict(im.mappings).merged(Mapping.from_dict(target.mappings))
                if merged.to_dict() != im.mappings:
                    im = replace(im, mappings=merged.to_dict())
            for s, term in enumerate(target.primary_terms):
                if term > im.primary_terms[s]:
                    im = im.with_primary_term(s, term)
                if target.in_sync[s] != im.in_sync[s]:
                    im = im.with_in_sync(s, target.in_sync[s])
            if im is not cur:
                state = state.with_index(im)
        if state.routing.get(meta.name) != table:
            state = state.with_routing(meta.name, table)
        return state
    return task


def indices_from_state(state: ClusterState) -> dict[str, IndexMeta]:
    """Every index of ``state`` as the cluster manager knows it: terms, in-sync sets and the routing table.

    A node process reads its routing from the cluster state it applied (issue 29); an index
    without a routing table (a restored state) has no copy allocated.
    """
    out = {}
    for name, im in state.indices.items():
        meta = from_index_metadata(im, state.cluster_uuid)
        table = state.routing.get(name) or {}
        placed = {int(s): (p, tuple(c)) for s, p, c in table.get("shards", [])}
        routing = tuple(ShardRouting(r.shard, placed.get(r.shard, (None, ()))[0], r.primary_term,
                                     placed.get(r.shard, (None, ()))[1], tuple(im.in_sync[r.shard]))
                        for r in meta.routing)
        out[name] = meta.with_all_routing(routing)
    return out
