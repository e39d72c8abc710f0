"""The sink's fast write path: Spark SQL builds the segment columns, the bridge's JVM writer routes, stamps and writes them.

``df.write.format("shardstore")`` with the JVM bridge loaded reaches :func:`write` (through the
bridge's planner).  Measured, a Python sink that does no work at all already moves rows out of
the JVM at about the cost of Spark's whole Parquet write, so the per-row work stays in the JVM:

1. **Claim** (driver): :func:`~shardstore.spark.writer.make_writer`, as the Python sink (term
   claim fencing live primaries, base commit with the translog tail folded into C0).
2. **Write** (Spark SQL builds the columns, the bridge's ``SegmentWriter`` writes them): each
   task routes its rows by ES murmur3 of ``_id`` (the bridge's ``Routing``, equal to
   engine/coordinator/routing.py) and hands each row, in its input order, to its shard's open Parquet
   writer (no partitioned write; no sort for up to :data:`MAX_OPEN_SHARDS` shards, beyond that
   each task's rows are sorted by shard and one file is open at a time); ``_seq_no`` from
   per-shard counters in the driver's JVM started at each shard's first free seq#, taken in
   each task's input order (contiguous per shard; only a failed task attempt leaves a gap; a
   later write of an id gets the higher seq#); the files are unsorted segments (format 2)
   unless the rows came in ``_id`` order; ``_primary_term`` the job's term; ``_version`` the
   live base copy's + 1 (a join with the base's live ids, only when the base holds documents;
   the seq#s are then taken before the join) else 1; ``_source`` JSON by ``to_json`` (null for
   a ``source="synthetic"`` index); one typed column per mapped field; Spark's Parquet writer
   (zstd, ~4 MB row groups, bloom filter on ``_id``) into a local temp directory: one file per
   task and shard, each with a file of its ids' 64-bit fingerprints beside it.
3. **Parts** (driver): a shard of a fresh index whose fingerprints do not repeat is taken from
   its footers alone (:func:`collect_parts`); every other file has its ids and seq#s read back
   (checked inside the counters' range; an id written more than once, in one file or in two:
   the highest seq# wins, the others are deleted through live docs) and its old copies in the
   base looked up (deleted through live docs; their versions checked against the file's).
   Then per file its segment info from the footer, CRC32C, upload under the job's term.
4. **Commit**: one ledger entry per shard recording the seq# range the counters handed out,
   then the Python sink's own commit (owner check, one commit metadata per shard written last,
   ``if_absent``), or on any failure its abort (job closed, every upload and the ledger deleted).

:func:`plan_columns` declines (``None``) what only the Python sink handles exactly (dotted or
nested columns, arrays, a column whose type is not the mapped field's, new string columns that
look like dates, which dynamic mapping would map ``date``...): :func:`write` then returns
False and the bridge writes through ``format("shardstore-arrow")``.  docs/design/spark.md,
"The fast write path", has the invariants and the figures.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.errors import InvalidError
from shardstore.segments.mapping import _DATE_RE, METADATA_FIELDS, FieldType, Mapping
from shardstore.spark.bridge_options import use_fast_path
from shardstore.spark.catalog import IndexLocation, open_from_options, resolve_index
from shardstore.spark.jvm_writer import MAX_OPEN_SHARDS, PARQUET_OPTIONS, SPARK_TYPES
from shardstore.spark.jvm_writer import jvm_class as _jvm_class
from shardstore.spark.jvm_writer import quote as _q
from shardstore.spark.jvm_writer import session_conf as _session_conf
from shardstore.spark.jvm_writer import sink_functions as _sink_functions
from shardstore.spark.segment_files import (
    SparkSegmentMismatch,
    check_seq_no_range,
    check_shard_seq_nos,
    fingerprints_repeat,
    footer_key_bounds,
    in_parallel,
    key_bounds,
    new_name,
    read_keys,
    segment_info,
    upload,
)
from shardstore.spark.writer import (
    IGNORED_COLUMNS,
    LEDGER,
    ShardPart,
    ShardstoreArrowWriter,
    ShardstoreCommitMessage,
    _versions_and_old_copies,
    make_writer,
)

log = logging.getLogger(__name__)

#: Spark type name (``DataType.typeName()``) -> the field type a new column of it maps to.
NEW_FIELD_TYPES = {"string": FieldType.KEYWORD, "long": FieldType.LONG, "integer": FieldType.LONG,
                   "short": FieldType.LONG, "byte": FieldType.LONG, "double": FieldType.DOUBLE,
                   "float": FieldType.DOUBLE, "boolean": FieldType.BOOLEAN, "timestamp": FieldType.DATE}
#: Field type -> the Spark types a column may have to be written into it (cast losslessly).
ACCEPTS = {FieldType.KEYWORD: {"string"}, FieldType.TEXT: {"string"},
           FieldType.LONG: {"long", "integer", "short", "byte"}, FieldType.INTEGER: {"integer", "short", "byte"},
           FieldType.DOUBLE: {"double", "float", "long", "integer", "short", "byte"},
           FieldType.BOOLEAN: {"boolean"}, FieldType.DATE: {"timestamp"}}
#: Rows of the frame a new string column is sampled on (dynamic mapping maps all-date strings ``date``).
DATE_SAMPLE_ROWS = 1024
_BASE_VERSION = "__shardstore_base_version"
_STAMP = "__shardstore_stamp"
#: Most shards the fast path writes.
MAX_SHARDS = 128
_DATE_PY = re.compile(_DATE_RE)


@dataclass(frozen=True)
class ColumnPlan:
    """How the frame's columns become segment columns: the mapping and which columns feed each field."""

    mapping: Mapping  # the index's fields plus the frame's new ones
    columns: tuple[tuple[str, str], ...]  # (frame column, Spark type name), the frame's order, ids excluded


def _frame_columns(schema: Any) -> list[tuple[str, str]] | None:
    """(name, Spark type name) of the frame's document columns, or None when one is not a flat scalar."""
    out = []
    for f in schema.fields:
        if f.name == "_id" or f.name in IGNORED_COLUMNS:
            continue
        tname = f.dataType.typeName()
        if tname not in NEW_FIELD_TYPES or "." in f.name or not f.name or f.name.split(".")[0] in METADATA_FIELDS:
            return None
        out.append((f.name, tname))
    return out


def plan_columns(schema: Any, mapping: Mapping, string_sample: Any = None) -> ColumnPlan | None:
    """The column plan for a frame of ``schema`` written into ``mapping``, or None (the Python sink writes it).

    ``string_sample``: ``{column: [values]}`` of the new string columns (a value list that is
    all ISO dates declines: dynamic mapping would make the field a ``date``).
    """
    cols = _frame_columns(schema)
    if cols is None or "_id" not in schema.fieldNames() or schema["_id"].dataType.typeName() != "string":
        return None
    new: dict[str, FieldType] = {}
    for name, tname in cols:
        have = mapping.get(name)
        if have is not None:
            if tname not in ACCEPTS[have]:
                return None
            continue
        if any(name.startswith(f + ".") for f in mapping) or any(f.startswith(name + ".") for f in mapping):
            return None  # an object path of the mapping: the Python sink names the conflict
        if tname == "string":
            values = [v for v in (string_sample or {}).get(name, []) if v is not None]
            if values and all(_DATE_PY.match(v) for v in values):
                return None
        new[name] = NEW_FIELD_TYPES[tname]
    return ColumnPlan(mapping.with_fields(new), tuple(cols))


def new_string_columns(schema: Any, mapping: Mapping) -> list[str]:
    """The frame's string columns the mapping does not map yet (sampled for dates)."""
    cols = _frame_columns(schema) or []
    return [n for n, t in cols if t == "string" and n not in mapping]


def build_frame(spark: Any, df: Any, plan: ColumnPlan, writer: ShardstoreArrowWriter, synthetic: bool,
                base_versions: Any, *, grouped: bool) -> Any:
    """The DataFrame the JVM ``SegmentWriter`` writes: the segment columns in segment order.

    ``_seq_no`` and ``_primary_term`` are placeholders the writer fills per row, in each task's
    input order, with its shard's next seq# and term.  With base versions to join, or
    ``grouped`` (more than :data:`MAX_OPEN_SHARDS` shards: each task's rows are sorted by shard),
    the join or the sort may reorder rows, so the seq#s are taken before it
    (``SinkFunctions.stamp``, one stateful JVM call per row in a projection of its own); the
    frame's ``_seq_no`` then holds the whole stamp, whose shard bits the writer checks against its
    own routing before it keeps the seq#.  Either way a later write of an id has the higher
    seq#, and the commit deletes the older copies.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    keep = ["_id"] + [n for n, _t in plan.columns]
    d = df.select(*(F.col(_q(c)) for c in keep))
    seq_no = F.lit(0).cast("bigint")
    if base_versions is not None or grouped:
        sink = _sink_functions(spark)
        d = d.select("*", Column(sink.stamp(writer.job, F.col("_id")._jc, len(writer.plans))).alias(_STAMP))
        if base_versions is not None:
            d = d.join(base_versions, on="_id", how="left")
        if grouped:  # each task's rows grouped by shard: the writer keeps one file open
            d = d.sortWithinPartitions(F.col(_STAMP).bitwiseAND((1 << int(sink.SHARD_BITS)) - 1))
        seq_no = F.col(_STAMP)  # the whole stamp: the writer checks its shard bits against its own routing
    version = F.lit(1) if base_versions is None else F.coalesce(F.col(_BASE_VERSION) + 1, F.lit(1))
    kinds = dict(plan.columns)
    clean = {}
    for name, tname in plan.columns:  # NaN and infinities: absent from the source and null in the field (JSON has none)
        c = F.col(_q(name))
        if tname in ("double", "float"):
            c = c.cast("double")
            c = F.when(F.isnan(c) | (F.abs(c) == F.lit(float("inf"))), F.lit(None).cast("double")).otherwise(c)
        clean[name] = c
    if synthetic or not plan.columns:
        source = F.lit(None).cast("binary") if synthetic else F.lit("{}").cast("binary")
    else:
        source = F.to_json(F.struct(*(clean[n].alias(n) for n, _t in plan.columns)),
                           {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'", "timeZone": "UTC",
                            "ignoreNullFields": "true"}).cast("binary")
    fields = []
    for name, ftype in plan.mapping.items():
        if name in kinds:
            fields.append(clean[name].cast(SPARK_TYPES[ftype]).alias(name))
        else:
            fields.append(F.lit(None).cast(SPARK_TYPES[ftype]).alias(name))
    return d.select(
        F.col("_id"),  # a null id fails the writer's task; the writer declares the column required
        seq_no.alias("_seq_no"),
        F.lit(0).cast("bigint").alias("_primary_term"),  # the writer sets the shard's term
        version.cast("bigint").alias("_version"),
        source.alias("_source"),
        *fields,
    )


def _base_versions(spark: Any, options: dict[str, str], writer: ShardstoreArrowWriter, loc: IndexLocation) -> Any:
    """The live ids of the claimed base commits and their versions (None when they hold no live document).

    Read by the fast read path from exactly the commits the claim found (not the newest ones
    again): Spark's Parquet reader over the verified cache, deleted rows anti-joined.
    """
    from pyspark.sql import functions as F

    from shardstore.segments.read_plan import CommitPlan
    from shardstore.spark.fast_path import _read
    from shardstore.spark.reader import ReadPlan, ShardRead, full_arrow_schema, lower_options

    based = [p for p in writer.plans if p.base is not None and any(s.live_count for s in p.base.commit.segments)]
    if not based:
        return None
    plan = ReadPlan(loc, tuple(ShardRead(p.shard, CommitPlan(p.shard, p.base)) for p in based), Mapping())
    schema = pa.schema([f for f in full_arrow_schema(Mapping(), False) if f.name in ("_id", "_version")])
    base = _read(spark, open_from_options(options), plan, lower_options(options), schema)
    return base.select("_id", F.col("_version").alias(_BASE_VERSION))


def _sample_strings(df: Any, columns: list[str]) -> dict[str, list[Any]]:
    """The first rows' values of the given columns (one small job)."""
    if not columns:
        return {}
    rows = df.select(*(_q(c) for c in columns)).limit(DATE_SAMPLE_ROWS).collect()
    return {c: [r[i] for r in rows] for i, c in enumerate(columns)}


def fast_path_option(options: dict[str, str]) -> str:
    """The ``fastPath`` option of a write: ``auto`` (the default), ``true`` or ``false``."""
    value = next((str(v).strip().lower() for k, v in options.items() if str(k).lower() == "fastpath"), "auto")
    use_fast_path("local", {"fastPath": value})  # InvalidError on anything else
    return value


def write(spark: Any, df: Any, options: dict[str, str], mode: str) -> bool:
    """Write ``df`` through the fast path and commit it; False when the Python sink should write it instead.

    ``fastPath=auto`` takes the fast path for a ``source="synthetic"`` index only: with a JSON
    ``_source`` to build, Spark's ``to_json`` and parquet-mr's write of it measured slower than
    the Python sink's Arrow kernels (docs/design/spark.md, "The fast write path");
    ``fastPath=true`` takes it for every index, ``false`` never.  Only on a ``local[...]``
    master (the seq# counters live in the driver's JVM).
    """
    started = time.perf_counter()
    choice = fast_path_option(options)
    if mode.lower() != "append" or choice == "false" or not spark.sparkContext.master.startswith("local"):
        return False
    index = options.get("index")
    if not index:
        return False
    store = open_from_options(options)
    loc = resolve_index(store, index)
    if loc.shards > MAX_SHARDS or (choice == "auto" and loc.source != "synthetic"):
        return False
    declared = Mapping.from_dict(loc.mappings)
    if plan_columns(df.schema, declared, None) is None:
        return False
    sample = _sample_strings(df, new_string_columns(df.schema, declared))
    if plan_columns(df.schema, declared, sample) is None:
        return False
    writer = make_writer(options, df.schema, False)
    try:
        try:
            merged = declared
            for p in writer.plans:
                merged = merged.merged(Mapping.from_dict(p.mapping))
            plan = plan_columns(df.schema, merged, sample)
        except InvalidError:
            plan = None
        if plan is not None:
            log.info("spark job %s (fast path): planned and claimed in %.2fs", writer.job,
                     time.perf_counter() - started)
            _run(spark, df, options, writer, plan, loc)
    except BaseException:
        writer.abort([])
        raise
    if plan is None:  # the base commits map a column otherwise: the Python sink refuses it with its own error
        writer.abort([])
        return False
    return True



def _run(spark: Any, df: Any, options: dict[str, str], writer: ShardstoreArrowWriter, plan: ColumnPlan,
         loc: IndexLocation) -> None:
    """Spark writes the files, then the parts are uploaded, the ledger written and the shards committed."""
    sink = _sink_functions(spark)
    clock = [time.perf_counter()]
    base_versions = _base_versions(spark, options, writer, loc)
    grouped = len(writer.plans) > MAX_OPEN_SHARDS  # rows sorted by shard within each task, one file open
    stamped = base_versions is None and not grouped  # the writer takes the seq#s (else the frame carries them)
    frame = build_frame(spark, df, plan, writer, loc.source == "synthetic", base_versions, grouped=grouped)
    tmp = tempfile.mkdtemp(prefix="shardstore-fast-sink-", dir=os.environ.get("SHARDSTORE_SPARK_TMP"))
    try:
        gateway = spark.sparkContext._gateway
        firsts = gateway.new_array(gateway.jvm.long, len(writer.plans))
        terms = gateway.new_array(gateway.jvm.long, len(writer.plans))
        for p in writer.plans:
            firsts[p.shard], terms[p.shard] = p.base_seq_no + 1, p.term
        conf = {}
        if any(t is FieldType.DATE for _n, t in plan.mapping.items()):
            conf["spark.sql.parquet.outputTimestampType"] = "TIMESTAMP_MILLIS"  # date fields: timestamp[ms, UTC]
            # proleptic Gregorian, as every other segment writer: a session's LEGACY mode would shift dates before 1582
            conf["spark.sql.parquet.datetimeRebaseModeInWrite"] = "CORRECTED"
        out = os.path.abspath(os.path.join(tmp, "out"))  # the JVM resolves a relative path on its own
        os.makedirs(out)
        sink.start(writer.job, firsts)
        try:
            with _session_conf(spark, conf):
                written = _jvm_class(spark, "SegmentWriter").write(
                    frame._jdf, out, writer.job, terms, stamped, 1 if grouped else len(writer.plans), PARQUET_OPTIONS)
        finally:
            ends = sink.finish(writer.job)
        files = sorted((int(shard), path, flag == "1") for shard, path, flag in (str(f).split("\t") for f in written))
        clock.append(time.perf_counter())
        parts = collect_parts(spark, writer, plan, files, ends, stamped=stamped)
        for p in writer.plans:
            mine = [part for part in parts if part.shard == p.shard]
            check_shard_seq_nos(p.shard, [part.seq_nos for part in mine], sum(part.info["doc_count"] for part in mine),
                                int(ends[p.shard]) - (p.base_seq_no + 1))
        store = open_from_options(writer.options)
        for p in writer.plans:  # the counters' range, as the Python sink's tasks reserve theirs
            count = int(ends[p.shard]) - (p.base_seq_no + 1)
            if count > 0:
                body = json.dumps({"start": p.base_seq_no + 1, "count": count, "attempt": writer.job}).encode()
                store.put(f"{p.prefix}/{LEDGER}{0:010d}", body, if_absent=True, token=writer.job)
        clock.append(time.perf_counter())
        writer.commit([ShardstoreCommitMessage(parts)])
        clock.append(time.perf_counter())
        log.info("spark job %s (fast path): Spark write %.2fs, %d parts %.2fs, commit %.2fs", writer.job,
                 clock[1] - clock[0], len(parts), clock[2] - clock[1], clock[3] - clock[2])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def collect_parts(spark: Any, writer: ShardstoreArrowWriter, plan: ColumnPlan, files: list[tuple[int, str, bool]],
                  ends: Any, stamped: bool = False) -> list[ShardPart]:
    """Each file Spark wrote as an uploaded part of its shard (info, remote file, ids, seq#s, old copies).

    ``files``: ``(shard, path, ids never decrease)`` from the JVM writer; ``ends[shard]``: the
    seq# after the last one the job's counters handed out for the shard.  ``stamped``: the
    writer took the seq#s itself (no base join, at most MAX_OPEN_SHARDS shards).  A shard whose
    base holds no segment is then
    first screened by its files' id fingerprints (:func:`fingerprints_repeat`): with no repeat,
    every id is unique and its parts carry no ids (``ids``/``seq_nos`` None; the key bounds
    come from the footer).  Every other file has its ids and seq#s read back and checked.
    """
    store = open_from_options(writer.options)
    mapping = plan.mapping.to_dict()
    footer = _jvm_class(spark, "SegmentFooter").addKeyValue

    def based(shard: int) -> bool:
        p = writer.plans[shard]
        return p.base is not None and bool(p.base.commit.segments)

    paths: dict[int, list[str]] = {}
    for shard, path, _sorted in files:
        paths.setdefault(shard, []).append(path)
    candidates = [s for s in sorted(paths) if stamped and not based(s)]
    repeats = in_parallel(lambda s: fingerprints_repeat(paths[s], [pq.read_metadata(f).num_rows for f in paths[s]]),
                          candidates)
    unique = {s for s, rep in zip(candidates, repeats) if not rep}

    def one(item: tuple[int, str, bool]) -> ShardPart:
        shard, path, id_sorted = item
        p = writer.plans[shard]
        first, end = p.base_seq_no + 1, ends[shard]
        deletes: dict[str, list[int]] = {}
        if shard in unique:
            ids = seqs = None
            keys = footer_key_bounds(path, id_sorted)
            check_seq_no_range(path, keys.min_seq_no, keys.max_seq_no, first, end)
        else:
            ids, seqs, versions = read_keys(path, first, end, versions=based(shard))
            keys = key_bounds(ids, seqs)
            if keys.id_sorted != id_sorted:
                raise SparkSegmentMismatch(f"{path}: the writer saw its ids {'' if id_sorted else 'not '}in order, "
                                           f"the file has them {'' if keys.id_sorted else 'not '}in order")
            if based(shard):
                expected, deletes = _versions_and_old_copies(store, p, ids)
                if not expected.equals(versions):
                    raise SparkSegmentMismatch(f"{path}: versions differ from the base commit's live copies + 1")
        info = segment_info(path, new_name(), keys, p.term, footer)
        remote = upload(store, p.prefix, path, info, writer.job)
        return ShardPart(shard, info.to_dict(), remote, ids, seqs, deletes, mapping)

    return in_parallel(one, files)


__all__ = ["ColumnPlan", "build_frame", "collect_parts", "plan_columns", "write"]

