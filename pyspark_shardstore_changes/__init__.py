"""Spark 4.x auto-registration of ``format("shardstore-changes")`` (the changes feed, batch and streaming)."""

from shardstore.spark.changes import ShardstoreChangesDataSource as DefaultSource

__all__ = ["DefaultSource"]
