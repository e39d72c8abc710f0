"""The bridge's JVM writer as Python calls it: its classes, the Parquet settings of the files it writes, the
Spark type of each field type, and a session setting held for one write (spark/fast_write.py, the fast write
path, and spark/routed_stage.py, the live sink's routed files, both call it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shardstore.segments.mapping import FieldType
from shardstore.spark.bridge_options import JVM_PACKAGE

#: Field type -> Spark SQL type of its segment column.
SPARK_TYPES = {FieldType.KEYWORD: "string", FieldType.TEXT: "string", FieldType.LONG: "bigint",
               FieldType.INTEGER: "int", FieldType.DOUBLE: "double", FieldType.BOOLEAN: "boolean",
               FieldType.DATE: "timestamp"}
#: Parquet writer settings of the segment files (segments/segment.py's choices in parquet-mr's terms).
PARQUET_OPTIONS = {
    "compression": "zstd",
    "parquet.compression.codec.zstd.level": "1",
    # parquet-mr's row-group threshold counts its buffered encoded bytes, not the Arrow bytes of the engine's
    # TARGET_ROW_GROUP_BYTES; and one codec for every column (parquet-mr has none per column, unlike
    # segment_info.column_codecs): the fast path keeps the settings its Spark figures were measured with
    "parquet.block.size": str(4 << 20),
    "parquet.block.row.count.limit": str(128 * 1024),  # MAX_ROW_GROUP_ROWS
    "parquet.bloom.filter.enabled#_id": "true",
    "parquet.bloom.filter.expected.ndv#_id": str(128 * 1024),
    "parquet.bloom.filter.fpp#_id": "0.01",
    # data page v2 encodings: _seq_no, _version and _primary_term (no dictionary) as DELTA_BINARY_PACKED, a few
    # bytes per block of 128 values; a dictionary's lookup per value cost 0.1 s of a 2.6 s write (docs/design/spark.md)
    "parquet.writer.version": "v2",
    "parquet.enable.dictionary#_id": "false",
    "parquet.enable.dictionary#_seq_no": "false",
    "parquet.enable.dictionary#_version": "false",
    "parquet.enable.dictionary#_primary_term": "false",
    "parquet.enable.dictionary#_source": "false",
    # as segments/segment.py's writer: no statistics on _source, no size statistics (nothing reads them; 0.1 s)
    "parquet.column.statistics.enabled#_source": "false",
    "parquet.size.statistics.enabled": "false",
}
#: Most shards whose files a task keeps open at once (each buffers a row group: 128 shards x 2 tasks ran a 1 GiB
#: driver out of heap); the rows of an index of more shards are sorted by shard in each task first, one file open.
MAX_OPEN_SHARDS = 16


def jvm_class(spark: Any, name: str) -> Any:
    """A class of the bridge's JVM package (Py4J)."""
    found = spark.sparkContext._gateway.jvm
    for part in (*JVM_PACKAGE.split("."), name):
        found = getattr(found, part)
    return found


def sink_functions(spark: Any) -> Any:
    """The bridge's JVM class ``SinkFunctions``."""
    return jvm_class(spark, "SinkFunctions")


def quote(name: str) -> str:
    """A column name quoted for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


@contextlib.contextmanager
def session_conf(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` on the session for the duration of the write, the previous values back after it."""
    saved = {k: spark.conf.get(k, None) for k in settings}
    try:
        for k, v in settings.items():
            spark.conf.set(k, v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)



__all__ = ["MAX_OPEN_SHARDS", "PARQUET_OPTIONS", "SPARK_TYPES", "jvm_class", "quote", "session_conf", "sink_functions"]
