"""Staging a live append as routed files: one Parquet file per task and shard, adopted as segments (issue 43).

The live sink (spark/live_sink.py) stages what a job writes; the cluster then applies it. When
every column of the DataFrame is a field the index maps, with a type Spark casts to the mapped
one exactly, the sink writes the job so the cluster can *adopt* the files instead of indexing
their rows (docs/design/adoption.md, step 5):

- each row gets its shard from the bridge's ``SinkFunctions.route`` (ES murmur3 of ``_id``, the
  JVM twin of engine/coordinator/routing.py), and Spark's own Parquet writer partitions by it:
  each task writes one file per shard it holds rows of, in its input order;
- the columns are cast to the mapped types (``date`` fields as ``TIMESTAMP_MILLIS`` with the
  proleptic calendar, as segment files hold them); no ``_source`` and no metadata column is
  written (a NaN or an infinity is refused by the coordinator's check, as a bulk refuses it);
- each file is staged under its shard (job record v2).

Anything else (a column the mapping lacks, a struct, an array, a ``DateType`` whose cast to a
timestamp depends on the session's time zone, a string into a numeric field) keeps the row
layout, and the coordinator applies the rows as before.  The coordinator checks each file again
before it adopts anything (engine/coordinator/ingest_adopt.py), so a wrong guess here costs
speed, never correctness.
"""

from __future__ import annotations

import os
from typing import Any

from shardstore.engine.coordinator.ingest import IGNORED_COLUMNS
from shardstore.segments.mapping import FieldType, Mapping
from shardstore.spark.fast_write import SPARK_TYPES, _q, _session_conf, _sink_functions

#: the partition column of the routed layout (Spark writes it as the directory name, not into the files)
SHARD_COLUMN = "_shard"
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
    "timestamp": (FieldType.DATE,),
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


def write_routed(spark: Any, df: Any, layout: list[tuple[str, FieldType]], shards: int, out: str) -> None:
    """Write ``df`` under ``out`` as ``_shard=<k>/part-*.parquet`` files of the routed layout (zstd)."""
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    sink = _sink_functions(spark)
    cols = [F.col("_id")]
    for name, ftype in layout:  # a NaN stays: the coordinator refuses it as the row path does
        cols.append(F.col(_q(name)).cast(SPARK_TYPES[ftype]).alias(name))
    cols.append(Column(sink.route(F.col("_id")._jc, shards)).alias(SHARD_COLUMN))
    conf = {}
    if any(t is FieldType.DATE for _n, t in layout):
        conf["spark.sql.parquet.outputTimestampType"] = "TIMESTAMP_MILLIS"  # date fields: timestamp[ms, UTC]
        conf["spark.sql.parquet.datetimeRebaseModeInWrite"] = "CORRECTED"
    with _session_conf(spark, conf):
        (df.select(*cols).write.mode("overwrite").option("compression", "zstd").partitionBy(SHARD_COLUMN)
         .parquet("file://" + out))


def routed_files(out: str) -> list[tuple[int, str]]:
    """(shard, path) of every file :func:`write_routed` wrote under ``out``, by shard then name."""
    found = []
    for entry in sorted(os.listdir(out)):
        if not entry.startswith(SHARD_COLUMN + "="):
            continue
        shard = int(entry.split("=", 1)[1])
        found.extend((shard, os.path.join(out, entry, p)) for p in sorted(os.listdir(os.path.join(out, entry)))
                     if p.endswith(".parquet"))
    return found


__all__ = ["SHARD_COLUMN", "routed_files", "routed_layout", "write_routed"]
