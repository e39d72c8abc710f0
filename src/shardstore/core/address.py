"""Which shard a blob belongs to: cluster UUID, index UUID, shard number, and the layout of its paths."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardstore.core.path_strategy import PathStrategy, PlainPathStrategy

__all__ = ["ShardAddress"]


@dataclass(frozen=True)
class ShardAddress:
    """Which shard: the cluster, index UUID and shard number, and where its paths go."""

    cluster_uuid: str
    index_uuid: str
    shard: int
    strategy: PathStrategy = field(default_factory=PlainPathStrategy)

    def segments_prefix(self, term: int) -> str:
        """The segments prefix of ``term``."""
        return self.strategy.shard_prefix(self.cluster_uuid, term, self.index_uuid, self.shard, "segments")

    def translog_prefix(self, term: int) -> str:
        """The translog prefix of ``term``."""
        return self.strategy.shard_prefix(self.cluster_uuid, term, self.index_uuid, self.shard, "translog")

    def term_marker_prefix(self) -> str:
        """Where primaries record the terms they claimed the shard with."""
        return self.strategy.term_marker_prefix(self.cluster_uuid, self.index_uuid, self.shard)

    def lock_prefix(self) -> str:
        """Where reader leases and snapshot locks live (term-independent)."""
        return self.term_marker_prefix().rstrip("/") + "-locks"
