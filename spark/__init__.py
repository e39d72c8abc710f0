"""shardstore.spark: PySpark data sources over shardstore indices (issue 7).

``spark.read.format("shardstore").option("store", url).option("index", name).load()``
works with no set-up call: the installed top-level module ``pyspark_shardstore`` exposes
``DefaultSource``, which Spark 4.x registers by itself (``pyspark_shardstore_changes`` and
``pyspark_shardstore_arrow`` do the same for ``format("shardstore-changes")`` and
``format("shardstore-arrow")``).  That Python source reads Arrow batches in Python workers.

For the speed of Spark's own Parquet reader under the same name, build the session with
:func:`configure` (it puts the JVM bridge jar on ``spark.jars``) and call :func:`register`:
``format("shardstore")`` then resolves commits and live docs in the driver and lets Spark's
native reader scan the segment files (:mod:`shardstore.spark.bridge`).  :func:`read_index` is
that fast path as a function.

Nothing here imports pyspark until it is used, so ``import shardstore.spark`` is cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Spark settings :func:`register` applies (filters reach Python data sources only with it).
SPARK_CONF = {"spark.sql.python.filterPushdown.enabled": "true"}


#: The bridge's optimizer extension: a native read's plan becomes the fast path's own plan.
EXTENSIONS = "io.shardstore.spark.Extensions"


def configure(builder: Any, jars: Iterable[str] = (), extensions: Iterable[str] = ()) -> Any:
    """``SparkSession.builder`` with shardstore's settings, the bridge jar on ``spark.jars`` and its optimizer extension.

    ``jars`` and ``extensions`` are the caller's own, kept beside shardstore's (both settings
    are comma-separated lists that this call sets as a whole).
    """
    from shardstore.spark.jar import jar_path

    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.jars", ",".join([jar_path(), *jars]))
    return builder.config("spark.sql.extensions", ",".join([EXTENSIONS, *extensions]))


def register(spark: Any) -> bool:
    """Register the data sources on ``spark``, enable filter pushdown, install the bridge; whether the bridge is live."""
    from shardstore.spark.bridge import install
    from shardstore.spark.changes import ShardstoreChangesDataSource
    from shardstore.spark.source import ShardstoreArrowDataSource, ShardstoreDataSource

    for key, value in SPARK_CONF.items():
        spark.conf.set(key, value)
    spark.dataSource.register(ShardstoreDataSource)
    spark.dataSource.register(ShardstoreArrowDataSource)
    spark.dataSource.register(ShardstoreChangesDataSource)
    return install(spark)


def read_index(spark: Any, store: str, index: str, schema: Any = None, **options: Any) -> Any:
    """The index's live documents as a DataFrame through Spark's native Parquet reader (the fast path)."""
    from shardstore.spark.fast_path import read_index as _read_index

    return _read_index(spark, store, index, schema=schema, **options)


__all__ = ["EXTENSIONS", "SPARK_CONF", "configure", "read_index", "register"]
