"""A node's shared remote-store roles: one node-level translog and one claim-log watch per cluster (issue 30).

Every primary copy on a node uploads through the node's :class:`NodeTranslog` (one data
blob and one index blob per round, whatever the number of shards), and is fenced from the
claim log the round lists once (:class:`ClaimWatch`), instead of a LIST of its term markers
per write.  Copies get this object passed in (``ShardCopy(..., node_remote=)``); a copy
without one keeps the per-shard remote translog (docs/design/translog.md).
"""

from __future__ import annotations

import contextlib
import threading

from shardstore.blobstores.base import BlobStore
from shardstore.segments.claim_log import ClaimWatch
from shardstore.translog.node_translog import NodeTranslog


class NodeRemote:
    """The node-level translog and claim watch of one node, created per cluster on first use."""

    def __init__(self, store: BlobStore, node: str, *, owner: str | None = None) -> None:
        """``owner``: this node process's ephemeral id, which its translog streams carry (issue 46)."""
        self.store = store
        self.node = node
        self.owner = owner
        self._lock = threading.Lock()
        self._translogs: dict[str, NodeTranslog] = {}
        self._watches: dict[str, ClaimWatch] = {}

    def claims(self, cluster_uuid: str) -> ClaimWatch:
        """The claim watch of ``cluster_uuid`` (refreshed by every translog round of this node)."""
        with self._lock:
            watch = self._watches.get(cluster_uuid)
            if watch is None:
                watch = self._watches[cluster_uuid] = ClaimWatch(self.store, cluster_uuid)
            return watch

    def translog(self, cluster_uuid: str) -> NodeTranslog:
        """The node-level translog of ``cluster_uuid`` (its rounds end with one listing of the claim log)."""
        watch = self.claims(cluster_uuid)
        with self._lock:
            tl = self._translogs.get(cluster_uuid)
            if tl is None:
                tl = self._translogs[cluster_uuid] = NodeTranslog(self.store, cluster_uuid, node=self.node,
                                                                  after_round=watch.refresh, owner=self.owner)
            return tl

    def staging(self, cluster_uuid: str) -> contextlib.AbstractContextManager[None]:
        """Hold this node's next upload round while one bulk's parts for many shards are staged."""
        return self.translog(cluster_uuid).staging()

    def joining(self, cluster_uuid: str) -> contextlib.AbstractContextManager[None]:
        """Ask this node's next upload round to wait (a round's time at most) for a bulk queued on its shard lock."""
        return self.translog(cluster_uuid).joining()

    def close(self) -> None:
        """Stop the uploaders (copies are closed first by their node)."""
        with self._lock:
            translogs = list(self._translogs.values())
        for t in translogs:
            t.close()


__all__ = ["NodeRemote"]
