"""The Spark session settings every shardstore source needs (one place, imported by the package and its readers)."""

from __future__ import annotations

#: ``spark.sql.python.filterPushdown.enabled``: the Python source's filter pushdown needs it
SPARK_CONF = {"spark.sql.python.filterPushdown.enabled": "true"}

__all__ = ["SPARK_CONF"]
