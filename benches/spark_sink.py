"""Spark sink throughput: ``df.write.format("shardstore")`` next to ``df.write.parquet`` of the same data.

Called by ``benches/spark.py`` (:func:`figures`) with its Spark session and table (TPC-H
``lineitem`` or repeated flights rows, >= 5M rows in the full run); :func:`run` runs it
alone on a generated table (``python -c "from benches.spark_sink import main; main()"``).

Method: the table gets an ``_id`` (its row number) if it has none; the DataFrame is
built from it, repartitioned over the session's cores and cached (materialized with
``count()``) before any clock starts, so every write reads the same in-memory rows.  A
local file store holds a cluster state with one index per rep and path (``SINK_SHARDS``
shards, no documents, made by a :class:`Cluster` closed before the runs).  The session
has the JVM bridge loaded (:func:`shardstore.spark.configure`).  One warm-up round, then
per rep, timed: ``df.write.parquet(fresh dir)`` (Spark's default Parquet writer), then
``df.write.format("shardstore")...mode("append").save()`` into a fresh index along each of
:data:`PATHS`:

- ``fast``: ``fastPath=true`` into a stored-source index: the fast write path
  (:mod:`shardstore.spark.fast_write`: Spark SQL builds the JSON ``_source`` and the typed
  columns, the bridge's ``SegmentWriter`` routes, stamps seq#s and writes one segment file per
  task and shard; the driver screens the id fingerprints, uploads and commits);
- ``synthetic``: the same into a ``source="synthetic"`` index (no JSON ``_source``; what
  ``fastPath=auto`` picks for such an index);
- ``python``: ``fastPath=false``: the Python sink (Arrow batches to Python workers);

and a Python Arrow sink that keeps nothing (:mod:`benches.spark_ceiling`).  Rows/s: from the
median time over REPS reps; ratios: the median over the reps of each round's ratio (the writes of
one round run back to back, so a change of the machine's load between rounds cancels out).

Figures: ``sink_rows_per_s`` and ``sink_vs_parquet`` (target >= 0.7, issue 16) of the faster
fast path (``params.path``), ``parquet_write_rows_per_s``, each path's ratio on its own
(``fast_sink_vs_parquet``, ``fast_synthetic_sink_vs_parquet``, ``python_sink_vs_parquet``),
``null_python_sink_vs_parquet`` (the ceiling of any Python sink) and ``sink_vs_null_python_sink``
(the Python sink's share of it), and bytes stored per path / Parquet bytes (``*_sink_bytes_ratio``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from benches.runner import Context, Figure

SINK_SHARDS = 2
#: The sink's paths: the fast path into a stored-source index and a synthetic-source one, the Python sink.
PATHS = ("fast", "synthetic", "python")
REPS = 3
QUICK_REPS = 1


def _dir_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(path) for f in fs)


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def figures(ctx: Context, spark: Any, table: pa.Table) -> Iterator[Figure]:
    """Sink and Parquet-write throughput of the same cached DataFrame, and their ratio (fast and Python paths)."""
    from shardstore.engine.cluster import Cluster

    if "_id" not in table.column_names:
        table = table.append_column("_id", pa.array([str(i) for i in range(table.num_rows)], pa.string())
                                    if table.num_rows < 1000 else _row_ids(table.num_rows))
    reps = QUICK_REPS if ctx.quick else REPS
    root = tempfile.mkdtemp(prefix="bench-spark-sink-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    url = f"file://{root}/remote"
    try:
        cluster = Cluster(store=url, data_dir=f"{root}/nodes", nodes=1, recovery_delay=0.05)
        try:
            for r in range(reps + 1):  # round 0 warms up
                for path in PATHS:
                    cluster.create_index(f"{path}{r}", shards=SINK_SHARDS, replicas=0,
                                         source="synthetic" if path == "synthetic" else "stored")
        finally:
            cluster.close()
        cores = int(spark.sparkContext.defaultParallelism)
        df = spark.createDataFrame(table).repartition(cores).cache()
        rows = df.count()
        ctx.progress(f"{rows:,} rows cached in {cores} partitions; {reps} reps")
        from benches import spark_ceiling

        spark_ceiling.register(spark)
        secs: dict[str, list[float]] = {k: [] for k in ("parquet", *PATHS, "null")}
        sizes: dict[str, int] = {}
        for r in range(reps + 1):  # round 0 warms up (Python workers, JIT) and is not counted
            out = f"{root}/parquet{r}"
            secs["parquet"].append(_timed(lambda: df.write.mode("overwrite").parquet(out)))
            sizes["parquet"] = _dir_bytes(out)
            shutil.rmtree(out, ignore_errors=True)
            for path in PATHS:
                before = _dir_bytes(f"{root}/remote")
                w = (df.write.format("shardstore").option("store", url).option("index", f"{path}{r}")
                     .option("fastPath", "false" if path == "python" else "true").mode("append"))
                secs[path].append(_timed(w.save))
                sizes[path] = _dir_bytes(f"{root}/remote") - before
            secs["null"].append(_timed(lambda: df.write.format("shardstore-bench-null-sink").mode("append").save()))
            ctx.progress(f"{'warm-up' if r == 0 else f'rep {r}'}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in secs.items()))
            if r == 0:
                for v in secs.values():
                    del v[:]
        df.unpersist()
        common = {"rows": rows, "shards": SINK_SHARDS, "partitions": cores, "reps": reps,
                  "columns": len(table.column_names)}
        rate = {k: rows / statistics.median(v) for k, v in secs.items()}
        # ratios per rep (each write next to the Parquet write of the same round), then the median: a
        # change of the machine's load between rounds then moves both sides of a ratio alike
        vs = {k: statistics.median(p / x for p, x in zip(secs["parquet"], v)) for k, v in secs.items()}
        best = max(("fast", "synthetic"), key=lambda k: vs[k])
        yield ctx.figure("sink_rows_per_s", rate[best], "rows/s", path=best, **common)
        yield ctx.figure("parquet_write_rows_per_s", rate["parquet"], "rows/s", **common)
        ratio = vs[best]
        yield ctx.figure("sink_vs_parquet", ratio, "x", target=">= 0.7", met=ratio >= 0.7, path=best, **common)
        # each path on its own: the fast path (stored JSON source / synthetic source) and the Python sink
        yield ctx.figure("fast_sink_vs_parquet", vs["fast"], "x", target=">= 0.7", met=vs["fast"] >= 0.7, **common)
        yield ctx.figure("fast_synthetic_sink_vs_parquet", vs["synthetic"], "x", target=">= 0.7",
                         met=vs["synthetic"] >= 0.7, **common)
        yield ctx.figure("python_sink_vs_parquet", vs["python"], "x", **common)
        # the best any Python Arrow sink can do here (a writer that keeps nothing), and the Python sink's share of it
        yield ctx.figure("null_python_sink_vs_parquet", vs["null"], "x", **common)
        yield ctx.figure("sink_vs_null_python_sink", statistics.median(
            n / x for n, x in zip(secs["null"], secs["python"])), "x", path="python", **common)
        yield ctx.figure("sink_bytes_ratio", sizes[best] / max(1, sizes["parquet"]), "x", path=best, **common,
                         sink_bytes=sizes[best], parquet_bytes=sizes["parquet"])
        for path in PATHS:
            yield ctx.figure(f"{path}_sink_bytes_ratio", sizes[path] / max(1, sizes["parquet"]), "x", **common,
                             sink_bytes=sizes[path], parquet_bytes=sizes["parquet"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _row_ids(n: int) -> pa.Array:
    """``"0"``..``str(n-1)`` built with Arrow kernels (no Python loop)."""
    import pyarrow.compute as pc

    return pc.cast(pa.array(range(n), pa.int64()), pa.string())


def synthetic_table(rows: int) -> pa.Table:
    """A flights-like table: keyword, long, double and timestamp columns (for running this bench alone)."""
    import numpy as np

    rng = np.random.default_rng(7)
    carriers = pa.array(["AA", "DL", "UA", "WN", "B6", "AS", "NK", "F9"])
    return pa.table({
        "carrier": carriers.take(pa.array(rng.integers(0, len(carriers), rows))),
        "flight": pa.array(rng.integers(1, 9999, rows), pa.int64()),
        "distance": pa.array(rng.integers(50, 5000, rows), pa.int64()),
        "dep_delay": pa.array(rng.normal(5, 30, rows)),
        "sched": pa.array(rng.integers(1_356_998_400_000, 1_388_534_400_000, rows), pa.timestamp("ms", tz="UTC")),
    })


def run(ctx: Context) -> Iterator[Figure]:
    """The sink bench alone, on a generated table and a local Spark session of its own."""
    import sys

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from benches.spark_ceiling import put_repo_on_worker_path
    from shardstore.spark import configure, register

    put_repo_on_worker_path()
    builder = (SparkSession.builder.master("local[2]").appName("bench-spark-sink")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "4g"))
    spark = configure(builder).getOrCreate()  # the bridge jar: format("shardstore") writes through the fast path
    spark.sparkContext.setLogLevel("ERROR")
    if not register(spark):
        raise RuntimeError("the shardstore bridge jar did not load")
    try:
        yield from figures(ctx, spark, synthetic_table(200_000 if ctx.quick else 2_000_000))
    finally:
        spark.stop()


def main() -> None:
    """Run :func:`run` and print the figures as JSON lines."""
    import argparse
    import json

    ctx = Context(bench="spark_sink", quick="--quick" in os.sys.argv, args=argparse.Namespace())
    for fig in run(ctx):
        print(json.dumps(fig.to_json()), flush=True)


if __name__ == "__main__":
    main()
