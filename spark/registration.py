"""Idempotent registration of shardstore's Python data sources on a Spark session (issue 18).

A name may already resolve before :func:`shardstore.spark.register` runs, and registering it
again is then refused by Spark with ``DATA_SOURCE_ALREADY_EXISTS``:

- Spark discovered it: every installed top-level ``pyspark_*`` module exposing ``DefaultSource``
  (``pyspark_shardstore``, ``pyspark_shardstore_arrow``, ``pyspark_shardstore_changes``) is a
  *static* Python source, found by a Python worker started with the session's ``PYSPARK_PYTHON``.
  Whether that lookup sees the modules depends on the install (a wheel, an editable install, the
  interpreter the workers run), so it is never assumed either way.
- A JVM source owns it: with the bridge jar on ``spark.jars`` the JVM class
  ``io.shardstore.spark.DefaultSource`` answers ``format("shardstore")``, and Spark refuses a
  Python source under the name of a JVM one when no Python source of that name is known yet.
- An earlier :func:`register` on this session registered it.

:func:`register_source` registers a source only when its name is free and reports which of the
cases above applied, so calling ``register`` in any install mode, any number of times, works.
"""

from __future__ import annotations

import enum
from typing import Any

#: Spark's error condition for a data source name that is taken.
ALREADY_EXISTS = "DATA_SOURCE_ALREADY_EXISTS"


class Provided(str, enum.Enum):
    """Who answers a data source name after :func:`register_source`."""

    REGISTERED = "registered"  # this call registered the Python source
    PYTHON = "python"  # a Python source of that name was already known (discovered or registered)
    JVM = "jvm"  # a JVM data source owns the name (the bridge jar); Spark resolves it first


def python_source_known(spark: Any, name: str) -> bool | None:
    """Whether the session already knows a Python data source ``name``; None when Spark cannot tell us."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(name))
    except Exception:  # Spark Connect (no local JVM) or an internal API that moved: fall back to trying
        return None


def register_source(spark: Any, source: type) -> Provided:
    """Register the Python data source class ``source`` on ``spark`` unless its name is taken; who answers it now."""
    from pyspark.errors import AnalysisException

    name = source.name()
    if python_source_known(spark, name):
        return Provided.PYTHON
    try:
        spark.dataSource.register(source)
    except AnalysisException as exc:
        if _condition(exc) != ALREADY_EXISTS:
            raise
        # Known Python sources passed the check above (or it could not run): a JVM source owns it,
        # unless the check was unavailable, in which case either answer leaves the name working.
        return Provided.JVM if python_source_known(spark, name) is False else Provided.PYTHON
    return Provided.REGISTERED


def _condition(exc: Exception) -> str | None:
    """The Spark error condition of ``exc`` (``getCondition`` on 4.x, ``getErrorClass`` before)."""
    for getter in ("getCondition", "getErrorClass"):
        method = getattr(exc, getter, None)
        if method is not None:
            try:
                return method()
            except Exception:
                continue
    return None


__all__ = ["ALREADY_EXISTS", "Provided", "python_source_known", "register_source"]
