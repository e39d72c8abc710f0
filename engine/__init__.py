"""shardstore.engine: shards with primaries and replicas over the blob store (issue 5).

``Cluster`` (nodes, allocation, replication, failover, recovery, restore), ``ShardCopy``
(one copy of a shard), ``Transport`` (in-process, with fault injection), ``routing``
(Elasticsearch-compatible murmur3 routing) and the demo drill (``python -m
shardstore.engine.demo``).
"""

from shardstore.engine.allocation import ClusterHealth
from shardstore.engine.cluster import BulkResult, Cluster
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
from shardstore.engine.shard import ShardCopy, ShardSpec
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
