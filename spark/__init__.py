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

import os
import sys
from collections.abc import Iterable
from typing import Any

#: Spark settings :func:`register` applies (filters reach Python data sources only with it)
from shardstore.spark.conf import SPARK_CONF

#: The bridge's optimizer extension: a native read's plan becomes the fast path's own plan.
EXTENSIONS = "io.shardstore.spark.Extensions"


def configure(builder: Any, jars: Iterable[str] = (), extensions: Iterable[str] = ()) -> Any:
    """``SparkSession.builder`` with shardstore's settings, the bridge jar on ``spark.jars`` and its optimizer extension.

    ``jars`` and ``extensions`` are the caller's own, kept beside shardstore's (both settings
    are comma-separated lists that this call sets as a whole).  On a local master (or none set)
    with no ``PYSPARK_PYTHON`` chosen, Python workers run this interpreter, as they must to
    import shardstore: PySpark's own default, ``python3`` on ``PATH``, is another interpreter
    whenever the venv is not activated.
    """
    from shardstore.spark.jar import jar_path

    if _master(builder).startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.jars", ",".join([jar_path(), *jars]))
    return builder.config("spark.sql.extensions", ",".join([EXTENSIONS, *extensions]))


def _master(builder: Any) -> str:
    """The master a ``SparkSession.builder`` was given (PySpark's default, ``local[*]``, when none)."""
    options = getattr(builder, "_options", None) or {}
    return str(options.get("spark.master") or os.environ.get("MASTER") or "local[*]")


def register(spark: Any) -> bool:
    """Register what is missing of the data sources, enable filter pushdown, install the bridge; whether the bridge is live.

    Idempotent, in every install mode: a name Spark already resolves (a ``pyspark_*`` module it
    discovered, the bridge jar's JVM source, an earlier ``register``) is left as it is
    (:mod:`shardstore.spark.registration`).
    """
    from shardstore.spark.bridge import install
    from shardstore.spark.changes import ShardstoreChangesDataSource
    from shardstore.spark.registration import register_source
    from shardstore.spark.source import ShardstoreArrowDataSource, ShardstoreDataSource

    for key, value in SPARK_CONF.items():
        spark.conf.set(key, value)
    for source in (ShardstoreDataSource, ShardstoreArrowDataSource, ShardstoreChangesDataSource):
        register_source(spark, source)
    return install(spark)


def read_index(spark: Any, store: str, index: str, schema: Any = None, **options: Any) -> Any:
    """The index's live documents as a DataFrame through Spark's native Parquet reader (the fast path)."""
    from shardstore.spark.fast_path import read_index as _read_index

    return _read_index(spark, store, index, schema=schema, **options)


__all__ = ["EXTENSIONS", "SPARK_CONF", "configure", "read_index", "register"]
