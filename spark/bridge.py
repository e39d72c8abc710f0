"""The Python half of the JVM bridge: ``format("shardstore")`` reads at the speed of Spark's Parquet reader.

With the bridge jar on ``spark.jars`` (:func:`shardstore.spark.configure`), Spark resolves
``format("shardstore")`` to the JVM class ``io.shardstore.spark.DefaultSource``.  For each read it
calls back into the PySpark driver (Py4J) to the :class:`Planner` installed here by
:func:`install` (``shardstore.spark.register`` does it), which resolves commits, live docs and the
translog tail exactly as ``format("shardstore-arrow")`` does and returns the fast path's DataFrame
(:func:`shardstore.spark.read_index`).  The JVM side then hands Spark's scan the columns and filters
a query needs, so Parquet column and row-group pruning apply.

When the fast path cannot serve a read the planner declines and the JVM side reads through the
Arrow data source (``format("shardstore-arrow")``), as it does when no planner is installed:

- ``fastPath=false``;
- ``fastPath=auto`` (the default) on a cluster that is not ``local[...]``: the fast path's files are
  in the driver's verified cache, which remote executors do not see (unless ``cacheDir`` names a
  shared file system: then set ``fastPath=true``).

Writes ask :meth:`Planner.write`: into the live cluster serving the store, if one does
(:mod:`shardstore.spark.live_sink`: every save mode, never fencing it); else the sink's fast path (:mod:`shardstore.spark.fast_write`: Spark's
own Parquet writer makes the segment files, this driver commits them) on the same conditions as
reads (``fastPath``), else the Arrow data source's sink.  docs/design/spark.md, "The JVM bridge" and
"The fast write path", has the protocol and the measurements.  ``writeStream.format("shardstore")``
calls :meth:`Planner.writeBatch` once per micro-batch (the JVM's streaming sink).

A shardstore error reaches the user as one line: the planner raises it marked (:data:`USER_ERROR`)
and the JVM side (``Bridge.userError``) throws that line alone, instead of a Py4J stack holding the
Python traceback.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from shardstore.spark.bridge_options import JVM_PACKAGE, use_fast_path

log = logging.getLogger(__name__)
_lock = threading.Lock()
#: how a planner error the user should read is marked for the JVM side (Bridge.java's MARKED)
USER_ERROR = "[shardstore] "


def _marked(exc: BaseException) -> BaseException:
    """A shardstore error as one marked line (the JVM side shows that line alone); anything else as it is."""
    from shardstore.errors import ShardstoreError

    if not isinstance(exc, ShardstoreError):
        return exc
    line = " ".join(str(exc).split())
    retry = " (retrying may help)" if exc.retryable else ""
    return RuntimeError(f"{USER_ERROR}{type(exc).__name__}: {line}{retry}")


class Planner:
    """Implements the JVM interface ``io.shardstore.spark.Planner`` through Py4J callbacks."""

    class Java:
        implements = [f"{JVM_PACKAGE}.Planner"]

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def read(self, jsession: Any, options_json: str, user_schema_json: str | None) -> Any:
        """The fast path's Java DataFrame for these options (a JSON object), or None for the Arrow source."""
        try:
            opts = json.loads(options_json)
            spark = self._session(jsession)
            if not use_fast_path(spark.sparkContext.master, opts):
                return None
            from shardstore.spark.fast_path import read_options, wants_source

            schema = None
            if user_schema_json:
                from pyspark.sql.types import StructType

                schema = StructType.fromJson(json.loads(user_schema_json))
            if wants_source(opts, schema):
                return None  # the Arrow source rebuilds a null _source on the executors (fast_path.read_options)
            # store, index (or a load(path) store) and every other option: checked as the source checks them
            return read_options(spark, opts, schema)._jdf
        except Exception as exc:
            # Py4J hands Java only the traceback text; the log keeps the typed error too
            log.debug("shardstore bridge read failed: %r", exc)
            raise _marked(exc) from exc

    def write(self, jsession: Any, options_json: str, mode: str, jdf: Any) -> bool:
        """Write the Java DataFrame through the sink's fast path (:mod:`.fast_write`); False: the Python sink writes."""
        try:
            # lazy, as pyspark: fast_write loads it (no cycle: fast_write imports bridge_options, not this module)
            from pyspark.sql.classic.dataframe import DataFrame

            from shardstore.spark.fast_write import write
            from shardstore.spark.live_sink import write_frame

            spark = self._session(jsession)
            df, options = DataFrame(jdf, spark), json.loads(options_json)
            return write_frame(spark, df, options, mode) or write(spark, df, options, mode)
        except Exception as exc:
            log.debug("shardstore bridge write failed: %r", exc)
            raise _marked(exc) from exc

    def writeBatch(self, jsession: Any, options_json: str, batch_id: int, jdf: Any) -> None:  # noqa: N802 - Java's
        """One micro-batch of ``writeStream.format("shardstore")``, applied once (live_sink.write_batch)."""
        try:
            from pyspark.sql.classic.dataframe import DataFrame

            from shardstore.spark.live_sink import write_batch

            spark = self._session(jsession)
            write_batch(spark, DataFrame(jdf, spark), json.loads(options_json), int(batch_id))
        except Exception as exc:
            log.debug("shardstore bridge micro-batch failed: %r", exc)
            raise _marked(exc) from exc

    def _session(self, jsession: Any) -> Any:
        """The Python SparkSession of the JVM session the read runs in."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        for known in (self.spark, SparkSession.getActiveSession()):
            if known is not None and (jsession is None or jsession.equals(known._jsparkSession)):
                return known
        return SparkSession(SparkContext.getOrCreate(), jsession)  # another session of the live context


def bridge_on_classpath(spark: Any) -> bool:
    """Whether the driver's JVM has the bridge's classes (its jar is on ``spark.jars``)."""
    return _bridge_class(spark) is not None


def _bridge_class(spark: Any) -> Any:
    """The JVM class ``io.shardstore.spark.Bridge`` through Py4J, or None (no jar, or no local JVM)."""
    from py4j.java_gateway import JavaClass

    try:
        jvm = spark.sparkContext._gateway.jvm  # Spark Connect sessions have no local JVM
    except Exception:
        return None
    if jvm is None:
        return None
    found = jvm
    for part in (*JVM_PACKAGE.split("."), "Bridge"):
        found = getattr(found, part)
    return found if isinstance(found, JavaClass) else None


def install(spark: Any) -> bool:
    """Install the :class:`Planner` for ``spark`` if the bridge jar is loaded; whether it is now installed."""
    bridge = _bridge_class(spark)
    if bridge is None:
        return False
    from pyspark.java_gateway import ensure_callback_server_started

    with _lock:
        ensure_callback_server_started(spark.sparkContext._gateway)
        bridge.install(Planner(spark))
    return True


def uninstall(spark: Any) -> None:
    """Remove the installed planner: reads through the bridge go to the Arrow source until the next install."""
    bridge = _bridge_class(spark)
    if bridge is not None:
        bridge.install(None)


__all__ = ["JVM_PACKAGE", "Planner", "bridge_on_classpath", "install", "uninstall", "use_fast_path"]
