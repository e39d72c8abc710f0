"""Remote cluster state: metadata as entity blobs with a manifest written last (issue 6).

Entry points: :class:`ClusterState` / :class:`IndexMetadata` (values), :mod:`.tasks`
(master tasks), :class:`RemoteClusterStateService` (store I/O), :class:`ClusterManagerNode`
and :class:`LocalCluster` (elections and two-phase publication over :mod:`shardstore.transport`),
and :func:`restore_cluster_state` (quorum-loss restore).  See ``docs/design/cluster_state.md``.

It builds on :mod:`shardstore.core` (record format, path strategy), :mod:`shardstore.blobstores`
and :mod:`shardstore.transport`; it imports neither the engine nor the segments.
"""

from shardstore.cluster_state.coordination import ClusterManagerNode, LocalCluster
from shardstore.cluster_state.model import ClusterState, IndexMetadata
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.cluster_state.restore import restore_cluster_state

__all__ = [
    "ClusterManagerNode",
    "ClusterState",
    "IndexMetadata",
    "LocalCluster",
    "RemoteClusterStateService",
    "restore_cluster_state",
]
