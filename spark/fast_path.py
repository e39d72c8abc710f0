"""The fast path: commits and live docs resolved in Python, the segment files read by Spark's own Parquet reader.

Segments are plain Parquet files, so :func:`read_index` plans the read exactly as
``format("shardstore")`` does (:func:`shardstore.spark.reader.plan_read`: the same
commits, ``asOfCommit`` / ``asOfSeqNo`` / ``includeTranslog`` options), fetches every
segment and live-docs file into the verified local cache (size and CRC32C checked, once
per driver process), and hands the file list to ``spark.read.parquet``:

- files without deletions are read as they are (``count()`` then comes from the Parquet
  footers, and Spark prunes columns and row groups itself);
- files with deleted rows (live docs, or documents superseded by the translog tail) are
  read with ``_metadata.file_name`` and ``_metadata.row_index`` and left-anti-joined
  with a broadcast table of the deleted (file, row) pairs;
- with ``includeTranslog`` the tail's documents are added as a small local DataFrame.

The cache lives on the driver's disk: executors must reach the same paths.  That holds
for ``local[*]`` (and for a ``file://`` cache dir on a shared file system); on a cluster
with remote executors use ``format("shardstore")``, whose executors fetch what they read.

A Python data source cannot hand Spark a plan of its own (``read()`` must yield the
rows); the JVM bridge (:mod:`shardstore.spark.bridge`) is how ``format("shardstore")``
serves its reads from this path.  docs/design/spark.md has the measurements.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from shardstore.segments.read_plan import DEFAULT_CACHE_DIR, WHOLE_SEGMENTS
from shardstore.segments.segment import conform
from shardstore.segments.stamp import Stamp
from shardstore.spark.conf import SPARK_CONF
from shardstore.spark.reader import (
    ReadPlan,
    _flag,
    check_columns,
    full_arrow_schema,
    lower_options,
    parse_sources_table,
    plan_read,
    to_struct_type,
)

_FILE, _ROW = "__shardstore_file", "__shardstore_row"
_BASE, _TERM = "__shardstore_seq_base", "__shardstore_term"


def resolve_files(store: Any, plan: ReadPlan, cache_dir: str) -> list[tuple[str, pa.Array | None]]:
    """(local path, deleted row numbers or None) of every segment file the plan reads (one task per segment)."""
    return [(path, deleted) for path, deleted, _stamp in _resolve(store, plan, cache_dir)]


def _resolve(store: Any, plan: ReadPlan, cache_dir: str) -> list[tuple[str, pa.Array | None, Stamp | None]]:
    """:func:`resolve_files` with each file's stamp (segments/stamp.py; None for a file with its metadata columns)."""
    tasks = [t for s in plan.shards for t in s.commit.tasks(row_groups_per_task=WHOLE_SEGMENTS)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda t: (*t.local_file(store, cache_dir), t.info.stamp), tasks))


def _user_columns(schema: pa.Schema, user: Any, index: str) -> list[Any]:
    """The columns of a user schema (StructType or DDL string): known names only, cast to the types it gives."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    wanted = StructType.fromDDL(user) if isinstance(user, str) else user
    check_columns(wanted.fieldNames(), schema, index)
    return [F.col(_quote(f.name)).cast(f.dataType).alias(f.name) for f in wanted.fields]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def read_index(spark: Any, store: str, index: str, schema: Any = None, **options: Any) -> Any:
    """The index's live documents as a DataFrame read by Spark's native Parquet reader (same columns as the source).

    ``schema`` (a StructType or DDL string) picks columns and their types, as ``.schema(...)``
    does for ``format("shardstore")``; the other options are the source's (asOfCommit...).
    """
    return read_options(spark, {**options, "store": store, "index": index}, schema)


def wants_source(options: dict[str, Any], schema: Any = None) -> bool:
    """Whether a read asks for ``_source`` (``includeSource``, or a user schema naming it)."""
    if schema is not None:
        from pyspark.sql.types import StructType

        return "_source" in (StructType.fromDDL(schema) if isinstance(schema, str) else schema).fieldNames()
    return _flag(lower_options(options), "includesource")


def read_options(spark: Any, options: dict[str, Any], schema: Any = None) -> Any:
    """:func:`read_index` with every option, ``store`` and ``index`` included, in one dict (as the source gets them).

    A read that asks for ``_source`` goes through the Arrow data source instead: a null
    ``_source`` (a row its fields rebuild, segments/source_keep.py) is rebuilt by its read tasks on
    the executors, where Spark's own Parquet reader would return it null.
    """
    if wants_source(options, schema):
        return _read_with_sources(spark, options, schema)
    opts = lower_options(options)
    blob_store, plan = plan_read(opts)
    full = full_arrow_schema(plan.mapping, True)
    if schema is not None:
        columns = _user_columns(full, schema, plan.location.name)
        return _read(spark, blob_store, plan, opts, full_arrow_schema(plan.mapping, False)).select(*columns)
    return _read(spark, blob_store, plan, opts, full_arrow_schema(plan.mapping, False))


def _stamped_frame(spark: Any, sschema: Any, files: list[tuple[str, pa.Array | None, Stamp]]) -> Any:
    """The live rows of stamped segment files (segments/stamp.py), their virtual columns made as Spark columns.

    Spark's Parquet reader reads the columns the files hold, with ``_metadata.file_name`` and
    ``_metadata.row_index``; a broadcast table of each file's stamp gives ``_seq_no = base +
    row``, the term and version 1; deleted rows are anti-joined away as for any file with
    deletions.  (``_source`` is never read here: a read asking for it takes the read tasks.)
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    virtual = {"_seq_no": (F.col(_BASE) + F.col(_ROW)), "_primary_term": F.col(_TERM), "_version": F.lit(1)}
    physical = StructType([f for f in sschema.fields if f.name not in virtual])
    names = [p.rsplit("/", 1)[-1] for p, _d, _st in files]
    stamps = spark.createDataFrame(pa.table({_FILE: pa.array(names, pa.string()),
                                             _BASE: pa.array([st.seq_no_base for _p, _d, st in files], pa.int64()),
                                             _TERM: pa.array([st.primary_term for _p, _d, st in files], pa.int64())}))
    raw = spark.read.schema(physical).parquet(*("file://" + p for p, _d, _st in files))
    rows = raw.select("*", F.col("_metadata.file_name").alias(_FILE), F.col("_metadata.row_index").alias(_ROW))
    gone = [(name, d) for name, (_p, d, _st) in zip(names, files) if d is not None and len(d)]
    if gone:
        deleted = spark.createDataFrame(pa.table({
            _FILE: pa.concat_arrays([pa.array([n] * len(d), pa.string()) for n, d in gone]),
            _ROW: pa.concat_arrays([d.cast(pa.int64()) for _n, d in gone])}))
        rows = rows.join(F.broadcast(deleted), [_FILE, _ROW], "left_anti")
    rows = rows.join(F.broadcast(stamps), [_FILE])
    return rows.select(*((virtual[f.name].cast(f.dataType) if f.name in virtual else F.col(_quote(f.name))).alias(f.name)
                         for f in sschema.fields))


def _read_with_sources(spark: Any, options: dict[str, Any], schema: Any) -> Any:
    """The read through ``format("shardstore-arrow")`` (registered and its filter pushdown on, as ``register`` does)."""
    from shardstore.spark.registration import register_source
    from shardstore.spark.source import ShardstoreArrowDataSource

    for key, value in SPARK_CONF.items():
        spark.conf.set(key, value)
    register_source(spark, ShardstoreArrowDataSource)
    reader = spark.read.format(ShardstoreArrowDataSource.name()).options(
        **{k: str(v) for k, v in options.items() if str(k).lower() != "fastpath"})
    return (reader.schema(schema) if schema is not None else reader).load()


def _read(spark: Any, blob_store: Any, plan: ReadPlan, opts: dict[str, str], schema: pa.Schema) -> Any:
    """The plan's live documents with the columns of ``schema``."""
    from pyspark.sql import functions as F

    sschema = to_struct_type(schema)
    files = _resolve(blob_store, plan, opts.get("cachedir") or DEFAULT_CACHE_DIR)
    clean = ["file://" + p for p, d, st in files if d is None and st is None]
    dirty = [(p, d) for p, d, st in files if d is not None and st is None]
    frames = []
    if any(st is not None for _p, _d, st in files):
        frames.append(_stamped_frame(spark, sschema, [(p, d, st) for p, d, st in files if st is not None]))
    if clean:
        frames.append(spark.read.schema(sschema).parquet(*clean))
    if dirty:
        names = pa.concat_arrays([pa.array([p.rsplit("/", 1)[-1]] * len(d), pa.string()) for p, d in dirty])
        rows = pa.concat_arrays([d.cast(pa.int64()) for _p, d in dirty])
        deleted = spark.createDataFrame(pa.table({_FILE: names, _ROW: rows}))
        raw = spark.read.schema(sschema).parquet(*("file://" + p for p, _d in dirty))
        tagged = raw.select("*", F.col("_metadata.file_name").alias(_FILE), F.col("_metadata.row_index").alias(_ROW))
        frames.append(tagged.join(F.broadcast(deleted), [_FILE, _ROW], "left_anti").drop(_FILE, _ROW))
    tails = [s for s in plan.shards if s.translog is not None and s.translog.num_rows]
    if tails:
        table = pa.concat_tables([conform(parse_sources_table(s.translog, s.metadata.commit.mapping, source=False),
                                          schema) for s in tails])
        if table.num_rows:
            frames.append(spark.createDataFrame(table, schema=sschema))
    if not frames:
        return spark.createDataFrame([], sschema)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    # every frame above keeps the schema's order (a select costs a Py4J call per column: ~3 ms each)
    return out if out.columns == schema.names else out.select(*(_quote(n) for n in schema.names))


__all__ = ["read_index", "read_options", "resolve_files", "wants_source"]
