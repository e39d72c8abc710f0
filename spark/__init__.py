"""shardstore.spark: PySpark data sources over shardstore indices (issue 7).

``spark.read.format("shardstore").option("store", url).option("index", name).load()``
works with no set-up call: the installed top-level module ``pyspark_shardstore`` exposes
``DefaultSource``, which Spark 4.x registers by itself (``pyspark_shardstore_changes``
does the same for ``format("shardstore-changes")``).  :func:`register` registers both
explicitly and turns on ``spark.sql.python.filterPushdown.enabled`` so filters reach
the reader.  :func:`read_index` is the fast path: commits and live docs resolved in
Python, the Parquet segment files read by Spark's native reader.

Nothing here imports pyspark until it is used, so ``import shardstore.spark`` is cheap.
"""

from __future__ import annotations

from typing import Any

#: Spark settings :func:`register` applies (filters reach Python data sources only with it).
SPARK_CONF = {"spark.sql.python.filterPushdown.enabled": "true"}


def register(spark: Any) -> None:
    """Register the ``shardstore`` and ``shardstore-changes`` data sources on ``spark`` and enable filter pushdown."""
    from shardstore.spark.changes import ShardstoreChangesDataSource
    from shardstore.spark.source import ShardstoreDataSource

    for key, value in SPARK_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(ShardstoreDataSource)
    spark.dataSource.register(ShardstoreChangesDataSource)


def read_index(spark: Any, store: str, index: str, **options: Any) -> Any:
    """The index's live documents as a DataFrame through Spark's native Parquet reader (the fast path)."""
    from shardstore.spark.fast_path import read_index as _read_index

    return _read_index(spark, store, index, **options)


__all__ = ["SPARK_CONF", "read_index", "register"]
