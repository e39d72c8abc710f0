"""Staging a live append as routed files: one Parquet file per task and shard, adopted as segments (issue 43).

The live sink (spark/live_sink.py) stages what a job writes; the cluster then applies it. When
every column of the DataFrame is a field the index maps, with a type Spark casts to the mapped
one exactly, the sink writes the job so the cluster can *adopt* the files instead of indexing
their rows (docs/design/adoption.md, step 5):

- the bridge's ``SegmentWriter.writeRouted`` (the fast write path's JVM writer: Spark's Parquet
  files and settings, no sort, no partition column) routes each row by ES murmur3 of ``_id``
  (``Routing``, the JVM twin of engine/coordinator/routing.py): each task writes one file per
  shard it holds rows of, its rows in input order.  A ``partitionBy`` on a routing column wrote
  the same files 1.5x slower than ``df.write.parquet`` (its dynamic-partition writer), this
  path about as fast (scratch timings in the stop 60 note);
- the columns are cast to the mapped types; no ``_source`` and no metadata column is written (a
  NaN or an infinity is refused by the coordinator's check, as a bulk refuses it).  A timestamp
  column keeps the row layout: the writer would store milliseconds and silently drop digits below
  them, which the row path refuses by name (the Python data source's routed staging keeps such a
  value, so its file is not adopted: spark/routed_rows.py);
- each file is staged under its shard (job record v2).

Anything else (a column the mapping lacks, a struct, an array, a timestamp or a ``DateType``, a
string into a numeric field) keeps the row
layout, and the coordinator applies the rows as before.  The coordinator checks each file again
before it adopts anything (engine/coordinator/ingest_adopt.py), so a wrong guess here costs
speed, never correctness.
"""

from __future__ import annotations

import os
from typing import Any

from shardstore.engine.coordinator.ingest import IGNORED_COLUMNS
from shardstore.segments.mapping import FieldType, Mapping
from shardstore.spark.jvm_writer import (
    MAX_OPEN_SHARDS,
    PARQUET_OPTIONS,
    SPARK_TYPES,
    jvm_class,
    quote,
    session_conf,
    sink_functions,
)

#: Spark type names -> the mapped field types each casts to exactly
_EXACT = {
    "string": (FieldType.KEYWORD, FieldType.TEXT),
    "bigint": (FieldType.LONG,),
    "int": (FieldType.INTEGER, FieldType.LONG),
    "smallint": (FieldType.INTEGER, FieldType.LONG),
    "tinyint": (FieldType.INTEGER, FieldType.LONG),
    "double": (FieldType.DOUBLE,),
    "float": (FieldType.DOUBLE,),
    "boolean": (FieldType.BOOLEAN,),
    # no "timestamp": the bridge's writer stores milliseconds and would drop a value's sub-millisecond digits,
    # which the row path refuses by name (a date field keeps milliseconds): a frame with one keeps the row layout
}


def routed_layout(schema: Any, mapping: dict[str, Any]) -> list[tuple[str, FieldType]] | None:
    """The columns of the routed layout (name, mapped type) in the frame's order, or None when a column keeps the row
    layout (module docstring)."""
    mapped = Mapping.from_dict(mapping)
    out: list[tuple[str, FieldType]] = []
    for f in schema.fields:
        if f.name == "_id":
            if f.dataType.simpleString() != "string":
                return None
            continue
        if f.name in IGNORED_COLUMNS:
            continue
        if f.name not in mapped or "." in f.name:
            return None
        ftype = mapped[f.name]
        if ftype not in _EXACT.get(f.dataType.simpleString(), ()):
            return None
        out.append((f.name, ftype))
    return out


def write_routed(spark: Any, df: Any, layout: list[tuple[str, FieldType]], shards: int, out: str,
                 job: str) -> list[tuple[int, str]]:
    """Write ``df`` under ``out`` in the routed layout (module docstring); (shard, path) of each file, by shard."""
    from pyspark.sql import functions as F

    cols = [F.col("_id")]
    for name, ftype in layout:  # a NaN stays: the coordinator refuses it as the row path does
        cols.append(F.col(quote(name)).cast(SPARK_TYPES[ftype]).alias(name))
    conf = {}
    if any(t is FieldType.DATE for _n, t in layout):
        conf["spark.sql.parquet.outputTimestampType"] = "TIMESTAMP_MILLIS"  # date fields: timestamp[ms, UTC]
        conf["spark.sql.parquet.datetimeRebaseModeInWrite"] = "CORRECTED"
    os.makedirs(out, exist_ok=True)
    many = shards > MAX_OPEN_SHARDS  # each task's rows sorted by shard, one file open (every open file buffers)
    frame = df.select(*cols)
    if many:
        from pyspark.sql.classic.column import Column

        frame = frame.sortWithinPartitions(Column(sink_functions(spark).route(F.col("_id")._jc, shards)))
    with session_conf(spark, conf):
        written = jvm_class(spark, "SegmentWriter").writeRouted(frame._jdf, os.path.abspath(out), job, shards,
                                                                 1 if many else shards, PARQUET_OPTIONS)
    return sorted((int(shard), path) for shard, path, _sorted in (str(f).split("\t") for f in written))


__all__ = ["routed_layout", "write_routed"]
