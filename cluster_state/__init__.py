"""Remote cluster state: metadata as entity blobs with a manifest written last (issue 6).

Entry points: :class:`ClusterState` / :class:`IndexMetadata` (values), :mod:`.tasks`
(master tasks), :class:`RemoteClusterStateService` (store I/O), :class:`ClusterManagerNode`
and :class:`LocalCluster` (elections and two-phase publication), and
:func:`restore_cluster_state` (quorum-loss restore).  See ``docs/design/cluster_state.md``.

Names are imported lazily, so that ``shardstore.engine`` may import this package at
module level without an import cycle (coordination uses the engine's transport).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ClusterState": "model", "IndexMetadata": "model", "RemoteClusterStateService": "remote",
    "ClusterManagerNode": "coordination", "LocalCluster": "coordination", "restore_cluster_state": "restore",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"shardstore.cluster_state.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'shardstore.cluster_state' has no attribute {name!r}")
