"""shardstore.engine: indices of shards with primaries and replicas over the blob store (docs/design/engine.md).

Entry point: :class:`Cluster` (``Cluster(store=..., data_dir=..., nodes=3)`` and
``Cluster.restore``): in-process nodes and a cluster manager, index creation, the document
API (``bulk``, ``index_doc``, ``delete``, ``get``, validated at the door), ``refresh``,
``flush``, ``count``, ``scan``, health, failover and promotion, peer recovery, rebuilding
lost copies from the store, and restore with its data-loss checks.  Also exported:
:class:`ShardCopy` / :class:`ShardSpec` (one copy of a shard), :class:`BulkResult`,
:class:`ClusterHealth`, the typed errors (:class:`EngineError`, :class:`VersionConflict`,
:class:`RestoreDataLoss`, ...), and
:class:`~shardstore.transport.Transport` (re-exported from :mod:`shardstore.transport`).
Modules of note: ``routing`` (Elasticsearch-compatible murmur3 routing), ``metadata``
(index metadata on the remote cluster state) and ``demo`` (the failover drill, ``python -m
shardstore.engine.demo``).  It builds on every library layer below it (translog, segments,
cluster_state, blobstores, plugins, core).
"""

from shardstore.engine.cluster import Cluster
from shardstore.engine.coordinator.documents import BulkResult
from shardstore.engine.errors import (
    ClusterClosed,
    EngineError,
    HealthTimeout,
    IndexAlreadyExists,
    IndexNotCreated,
    IndexNotFound,
    NodeDisconnected,
    OperationTermTooOld,
    RecoverySourceClosed,
    RestoreDataLoss,
    ShardUnavailable,
    StalePrimary,
    VersionConflict,
)
from shardstore.engine.manager.allocation import ClusterHealth
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.transport import Transport

__all__ = [
    "BulkResult",
    "Cluster",
    "ClusterClosed",
    "ClusterHealth",
    "EngineError",
    "HealthTimeout",
    "IndexAlreadyExists",
    "IndexNotCreated",
    "IndexNotFound",
    "NodeDisconnected",
    "OperationTermTooOld",
    "RecoverySourceClosed",
    "RestoreDataLoss",
    "ShardCopy",
    "ShardSpec",
    "ShardUnavailable",
    "StalePrimary",
    "Transport",
    "VersionConflict",
]
