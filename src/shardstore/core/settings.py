"""Names of index settings that more than one layer reads (the engine writes them, Spark reads them back)."""

from __future__ import annotations

__all__ = ["DATA_CLUSTER_UUID"]

#: The cluster UUID under which an index's shard data lives in the store (it outlives cluster-state restores).
DATA_CLUSTER_UUID = "index.remote_store.cluster_uuid"
