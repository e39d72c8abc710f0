"""Index metadata the cluster manager keeps, and its (interim) record in the blob store.

Per index: name, UUID, shard and replica counts, mappings, durability, the path
strategy, and per shard the routing: primary node, primary term, the nodes holding a
copy and the in-sync set.  Frozen; changes make a new object.

Persistence (interim, until the remote cluster state of issue 6 replaces it): each
change rewrites ``<cluster_uuid>/cluster_meta/indices/<index_uuid>`` (framed JSON record,
magic ``SSIM``, format version 1, CRC32C), and ``clusters/<cluster_uuid>`` marks the
cluster's existence so :meth:`Cluster.restore` can find it from the store alone.  The
primary terms in these records only *help*: restore takes the newest term marker of each
shard (written with put-if-absent by every primary) and starts above it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists
from shardstore.engine.errors import InvalidRequest
from shardstore.segments.path_strategy import PathStrategy
from shardstore.segments.records import decode_record, encode_record

MAGIC = b"SSIM"
FORMAT_VERSION = 1


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

    def with_routing(self, shard: int, **changes: Any) -> IndexMeta:
        """A copy with one shard's routing changed (lists become tuples)."""
        changes = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
        routing = list(self.routing)
        routing[shard] = replace(routing[shard], **changes)
        return replace(self, routing=tuple(routing))

    def with_all_routing(self, routing: tuple[ShardRouting, ...]) -> IndexMeta:
        """A copy with new routing for every shard."""
        return replace(self, routing=routing)

    def to_body(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"name": self.name, "uuid": self.uuid, "shards": self.shards, "replicas": self.replicas,
                "mappings": self.mappings, "durability": self.durability, "strategy": self.strategy.to_dict(),
                "routing": [[r.shard, r.primary, r.primary_term, list(r.copies), list(r.in_sync)] for r in self.routing]}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> IndexMeta:
        """Inverse of :meth:`to_body`."""
        return cls(name=body["name"], uuid=body["uuid"], shards=int(body["shards"]), replicas=int(body["replicas"]),
                   mappings=dict(body["mappings"]), durability=body["durability"],
                   strategy=PathStrategy.from_dict(body["strategy"]),
                   routing=tuple(ShardRouting(int(s), p, int(t), tuple(c), tuple(i)) for s, p, t, c, i in body["routing"]))


def _index_key(cluster_uuid: str, index_uuid: str) -> str:
    return f"{cluster_uuid}/cluster_meta/indices/{index_uuid}"


def save_index(store: BlobStore, cluster_uuid: str, meta: IndexMeta) -> None:
    """Record the index's metadata (and the cluster's existence) in the store."""
    try:
        store.put(f"clusters/{cluster_uuid}", b"", if_absent=True)
    except BlobAlreadyExists:
        pass
    store.put(_index_key(cluster_uuid, meta.uuid), encode_record(MAGIC, FORMAT_VERSION, meta.to_body()))


def load_cluster(store: BlobStore, cluster_uuid: str | None = None) -> tuple[str, list[IndexMeta]]:
    """(cluster UUID, its indices) from the store; the only cluster there unless one is named."""
    if cluster_uuid is None:
        found = [b.key.split("/", 1)[1] for b in store.list("clusters/")]
        if len(found) != 1:
            raise InvalidRequest(f"{store.location}: {len(found)} clusters found ({found}); pass cluster_uuid=")
        cluster_uuid = found[0]
    metas = []
    for b in store.list(f"{cluster_uuid}/cluster_meta/indices/"):
        _v, body = decode_record(store.get(b.key), magic=MAGIC, supported=FORMAT_VERSION, where=b.key,
                                 what="index metadata")
        metas.append(IndexMeta.from_body(body))
    return cluster_uuid, metas
