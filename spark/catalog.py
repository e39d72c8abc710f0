"""Where an index's shards are, from the blob store alone (the latest committed cluster state).

Spark jobs know a store URL and an index name.  :func:`resolve_index` reads the latest
valid cluster state (seed 000's UUID choice, then the newest complete committed
manifest) and returns the index's :class:`IndexLocation`: the cluster UUID its shards'
blobs live under, its UUID, shard count, path strategy and declared mappings, with one
:class:`~shardstore.segments.remote_store.ShardAddress` per shard.  It pickles cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardstore.blobstores import open_store
from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.core.path_strategy import PathStrategy
from shardstore.core.settings import DATA_CLUSTER_UUID
from shardstore.errors import InvalidError, NotFoundError

#: The index setting naming its source mode (engine/manager/metadata.py's ``SOURCE_MODE``).
SOURCE_MODE_SETTING = "index.mapping.source.mode"


class IndexNotInStore(NotFoundError):
    """The store's latest cluster state has no index of that name (a retry does not help)."""


@dataclass(frozen=True)
class IndexLocation:
    """One index's shards in the blob store."""

    name: str
    index_uuid: str
    data_cluster_uuid: str
    shards: int
    strategy: PathStrategy
    mappings: dict
    primary_terms: tuple[int, ...]
    source: str = "stored"  # the index's source mode: "synthetic" segments hold no JSON _source

    def address(self, shard: int) -> ShardAddress:
        """The blob-store address of one shard."""
        if not 0 <= shard < self.shards:
            raise InvalidError(f"index {self.name!r} has shards 0..{self.shards - 1}, not {shard}")
        return ShardAddress(self.data_cluster_uuid, self.index_uuid, shard, self.strategy)


def store_options(options: dict[str, str]) -> dict[str, Any]:
    """The data-source options meant for the blob store (everything but the reserved ones)."""
    return {k: v for k, v in options.items() if k not in {"store", "index", "path"} and k not in RESERVED_READ_WRITE}


#: Option names the data sources take for themselves (never passed to ``open_store``).
RESERVED_READ_WRITE = frozenset({
    "asofcommit", "asOfCommit", "asofseqno", "asOfSeqNo", "includetranslog", "includeTranslog",
    "includesource", "includeSource", "fromseqno", "fromSeqNo", "toseqno", "toSeqNo",
    "rowgroupsperpartition", "rowGroupsPerPartition", "cachedir", "cacheDir", "fastpath", "fastPath",
    "refresh", "routing",
    # the sink into a live cluster (spark/live_sink.py) and Spark's own streaming options
    "hosts", "cluster", "shards", "replicas", "source", "streamid", "streamId", "checkpointlocation",
    "checkpointLocation", "ingestjob", "ingestJob", "tlsca", "tlsCa", "tlscert", "tlsCert", "tlskey", "tlsKey",
    "adopt",  # "false": stage rows, never files adopted as segments (spark/routed_stage.py)
})


def open_from_options(options: dict[str, str]) -> BlobStore:
    """The blob store named by the ``store`` option (other non-reserved options go to the store)."""
    url = options.get("store") or options.get("path")
    if not url:
        raise InvalidError("the shardstore data source needs .option('store', '<url>') (file://, s3://, gs://, ...)")
    return open_store(url, **store_options(options))


def sink_index(options: dict[str, str], schema: Any) -> str:
    """The index a sink writes (option ``index``), after checking the frame has the ``_id`` it routes by
    (InvalidError naming what is missing): the one check of the bulk-load and the live-cluster sinks."""
    index = next((str(v) for k, v in options.items() if str(k).lower() == "index"), None)
    if not index:
        raise InvalidError("the shardstore sink needs .option('index', '<name>')")
    if "_id" not in schema.fieldNames():
        raise InvalidError(f"the DataFrame needs an _id column (string) to route and index rows; it has "
                           f"{schema.fieldNames()}")
    return index


def resolve_index(store: BlobStore, index: str) -> IndexLocation:
    """The index's location from the latest committed cluster state of the store."""
    from shardstore.cluster_state.remote import RemoteClusterStateService
    from shardstore.cluster_state.restore import find_latest

    svc = RemoteClusterStateService(store)
    head, _chain = find_latest(svc)
    state = svc.restore_latest(head).state
    im = state.indices.get(index)
    if im is None:
        raise IndexNotInStore(f"{store.location}: no index {index!r} in the latest cluster state "
                              f"(cluster {head}; indices: {sorted(state.indices)[:20]})")
    return IndexLocation(name=im.name, index_uuid=im.uuid, data_cluster_uuid=im.settings.get(DATA_CLUSTER_UUID) or head,
                         shards=im.shards, strategy=im.strategy(), mappings=dict(im.mappings),
                         primary_terms=tuple(im.primary_terms),
                         source=im.settings.get(SOURCE_MODE_SETTING, "stored"))
