"""Spark 4.x auto-registration of ``format("shardstore-arrow")``: the Python source the JVM bridge falls back to."""

from shardstore.spark.source import ShardstoreArrowDataSource as DefaultSource

__all__ = ["DefaultSource"]
