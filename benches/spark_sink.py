"""Spark sink throughput: ``df.write.format("shardstore")`` next to ``df.write.parquet`` of the same data.

Called by ``benches/spark.py`` (:func:`figures`) with its Spark session and table (TPC-H
``lineitem`` or repeated flights rows, >= 5M rows in the full run); :func:`run` runs it
alone on a generated table (``python -c "from benches.spark_sink import main; main()"``).

Method: the table gets an ``_id`` (its row number) if it has none; the DataFrame is
built from it, repartitioned over the session's cores and cached (materialized with
``count()``) before any clock starts, so both writes read the same in-memory rows.  A
local file store holds a cluster state with one index per rep (``SINK_SHARDS`` shards, no
documents, made by a :class:`Cluster` closed before the runs).  One warm-up round, then
per rep, timed:
``df.write.parquet(fresh dir)`` (zstd, Spark's default Parquet writer) and
``df.write.format("shardstore")...mode("append").save()`` into a fresh index (routing,
JSON ``_source`` built and parsed against the mapping, one segment per task and shard,
uploads, the seq# ledger, and the driver's commits).  Median over REPS reps.

Figures: ``sink_rows_per_s``, ``parquet_write_rows_per_s``, ``sink_vs_parquet`` (sink
throughput / Parquet throughput, target >= 0.7 from issue 7), and ``sink_bytes_ratio``
(bytes the sink stored / Parquet bytes: the sink also stores ``_source``), and what Spark's
Python data-source API costs alone (:mod:`benches.spark_ceiling`): ``null_python_sink_vs_parquet``
(a Python Arrow sink that keeps nothing, the ceiling of any Python sink) and
``sink_vs_null_python_sink`` (the share of that ceiling the shardstore sink reaches).
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
REPS = 3
QUICK_REPS = 1


def _dir_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, fs in os.walk(path) for f in fs)


def figures(ctx: Context, spark: Any, table: pa.Table) -> Iterator[Figure]:
    """Sink and Parquet-write throughput of the same cached DataFrame, and their ratio."""
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
            for r in range(reps + 1):  # sink0 takes the warm-up round
                cluster.create_index(f"sink{r}", shards=SINK_SHARDS, replicas=0)
        finally:
            cluster.close()
        cores = int(spark.sparkContext.defaultParallelism)
        df = spark.createDataFrame(table).repartition(cores).cache()
        rows = df.count()
        ctx.progress(f"{rows:,} rows cached in {cores} partitions; {reps} reps")
        from benches import spark_ceiling

        spark_ceiling.register(spark)
        sink_s, parquet_s, null_s, sink_bytes, parquet_bytes = [], [], [], 0, 0
        for r in range(reps + 1):  # round 0 warms up (Python workers, JIT) and is not counted
            out = f"{root}/parquet{r}"
            t = time.perf_counter()
            df.write.mode("overwrite").parquet(out)
            parquet_s.append(time.perf_counter() - t)
            parquet_bytes = _dir_bytes(out)
            shutil.rmtree(out, ignore_errors=True)
            before = _dir_bytes(f"{root}/remote")
            t = time.perf_counter()
            df.write.format("shardstore").option("store", url).option("index", f"sink{r}").mode("append").save()
            sink_s.append(time.perf_counter() - t)
            sink_bytes = _dir_bytes(f"{root}/remote") - before
            t = time.perf_counter()
            df.write.format("shardstore-bench-null-sink").mode("append").save()
            null_s.append(time.perf_counter() - t)
            ctx.progress(f"{'warm-up' if r == 0 else f'rep {r}'}: parquet {parquet_s[-1]:.2f}s, "
                         f"shardstore sink {sink_s[-1]:.2f}s, null Python sink {null_s[-1]:.2f}s")
            if r == 0:
                del parquet_s[:], sink_s[:], null_s[:]
        df.unpersist()
        common = {"rows": rows, "shards": SINK_SHARDS, "partitions": cores, "reps": reps,
                  "columns": len(table.column_names)}
        sink_rate, parquet_rate = rows / statistics.median(sink_s), rows / statistics.median(parquet_s)
        yield ctx.figure("sink_rows_per_s", sink_rate, "rows/s", **common)
        yield ctx.figure("parquet_write_rows_per_s", parquet_rate, "rows/s", **common)
        ratio = sink_rate / parquet_rate
        yield ctx.figure("sink_vs_parquet", ratio, "x", target=">= 0.7", met=ratio >= 0.7, **common)
        # the best any Python Arrow sink can do here (a writer that keeps nothing), and our share of it
        null_rate = rows / statistics.median(null_s)
        yield ctx.figure("null_python_sink_vs_parquet", null_rate / parquet_rate, "x", **common)
        yield ctx.figure("sink_vs_null_python_sink", sink_rate / null_rate, "x", **common)
        yield ctx.figure("sink_bytes_ratio", sink_bytes / max(1, parquet_bytes), "x", **common,
                         sink_bytes=sink_bytes, parquet_bytes=parquet_bytes)
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
    from shardstore.spark import register

    put_repo_on_worker_path()
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-sink")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.memory", "4g").getOrCreate())
    register(spark)
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
