"""Spark 4.x auto-registration of ``format("shardstore")`` (it registers installed ``pyspark_*`` modules' DefaultSource)."""

from shardstore.spark.source import ShardstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
