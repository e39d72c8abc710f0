"""Spark into a live cluster (issue 43): the append and the streaming sink next to ``df.write.parquet``.

Called by ``benches/spark.py`` (:func:`figures`) with its Spark session and table;
``python -m benches spark --spark-live-only`` runs only this part.

Set-up: three ``shardstore node`` processes on 127.0.0.1 over a local file store
(:class:`~shardstore.testing.node_processes.ProcessCluster`), one index of 2 shards and 1
replica that already holds data (the table's first :data:`PRELOAD` rows, bulked through the
client).  The table (``rows`` rows, every column) is cached in Spark over the session's cores.

Per round (one warm-up, then REPS), one after the other:

- ``parquet``: ``df.write.parquet`` of the round's frame (the table with ids prefixed by the
  round: new documents each round) into a fresh directory;
- ``idle``: ``df.write.format("shardstore")...mode("append").save()`` of the same frame into the
  live index, nothing else writing (the issue's speed measure);
- ``append``: the same with other ids, while a client thread bulks 500-document bulks into the index
  as fast as it is answered (:data:`CLIENT_BULK`);
- ``stream``: the same rows, the Parquet files of the round's ``parquet`` write (one per core), read by
  ``spark.readStream`` (one file per micro-batch) and written by ``writeStream.format("shardstore")``
  (``availableNow``) into a second live index; its Parquet baseline is ``df.write.parquet`` of
  the round's frame.

Figures: ``live_append_idle_rows_per_s``, ``live_append_idle_vs_parquet`` (target >= 0.5: per round
parquet seconds / idle append seconds, the median), ``live_append_rows_per_s``,
``live_append_vs_parquet`` (beside the client), ``stream_sink_rows_per_s``,
``stream_sink_vs_parquet``; where the idle append's time goes: ``live_append_idle_commit_seconds`` (the
cluster's commit as the sink logs it: writing the job record and ``Client.ingest``, median; its phases in the
progress lines) and ``live_append_idle_spark_seconds`` (the rest: Spark's own Parquet write of the staged
files, planning, staging; median); and the checks, each target 0: ``live_append_failed_client_writes``
(client items not acknowledged during the appends), ``live_append_lost`` (acknowledged client
documents not found after), ``live_append_missing_rows`` (Spark rows not found through
``count``/``scan`` and ``spark.read.format("shardstore")``), ``stream_missing_rows``.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from benches.runner import Context, Figure

ROWS, QUICK_ROWS = 200_000, 20_000
REPS, QUICK_REPS = 3, 1
PRELOAD = 50_000
CLIENT_BULK = 500


class _Commits(logging.Handler):
    """Keeps the seconds and phases of each commit the sink logs (``live_sink.commit_live``'s INFO line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []
        self.phases: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Take a commit's line: its args are (job, rows, index, seconds, outcome, phases)."""
        if record.msg.startswith("spark job %s: %d rows into") and len(record.args or ()) == 6:
            self.seconds.append(float(record.args[3]))  # type: ignore[index]
            self.phases.append(f"{record.args[4]}; {record.args[5]}")  # type: ignore[index] - the path, the phases


def _client_load(client: Any, index: str, stop: threading.Event, acked: list[str], failed: list[str]) -> None:
    """Bulk ``CLIENT_BULK`` new documents at a time into ``index`` until ``stop``."""
    i = 0
    while not stop.is_set():
        docs = [{"_id": f"client-{i}-{j}", "n": j, "tag": "client"} for j in range(CLIENT_BULK)]
        try:
            res = client.bulk(index, docs)
            acked.extend(res.acknowledged)
            failed.extend(e for e in res.items.column("error").to_pylist() if e)
        except Exception as exc:  # noqa: BLE001 - counted: a bulk that failed as a whole
            failed.extend([f"{type(exc).__name__}: {exc}"] * CLIENT_BULK)
        i += 1


def figures(ctx: Context, spark: Any, table: pa.Table) -> Iterator[Figure]:
    """The live append and the streaming sink next to ``df.write.parquet`` (module docstring)."""
    from pyspark.sql import functions as F

    from shardstore.testing.node_processes import ProcessCluster

    rows = min(table.num_rows, QUICK_ROWS if ctx.quick else ROWS)
    table = table.slice(0, rows)
    if "_id" not in table.column_names:
        table = table.add_column(0, "_id", pc.cast(pa.array(range(rows), pa.int64()), pa.string()))
    reps = QUICK_REPS if ctx.quick else REPS
    root = tempfile.mkdtemp(prefix="bench-spark-live-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    url = f"file://{root}/store"
    procs = ProcessCluster(f"{root}/nodes", f"{url}?create=true", 3)
    try:
        client = procs.client()
        for index in ("live", "stream"):
            client.create_index(index, shards=2, replicas=1)
        preload = table.slice(0, min(PRELOAD, rows))
        for index in ("live", "stream"):
            assert not client.bulk(index, preload).errors
        cores = int(spark.sparkContext.defaultParallelism)
        df = spark.createDataFrame(table).repartition(cores).cache()
        df.count()
        ctx.progress(f"3 node processes up; {rows:,} rows x {len(table.column_names)} columns cached; "
                     f"{preload.num_rows:,} documents preloaded per index; {reps} reps")
        secs: dict[str, list[float]] = {"parquet": [], "idle": [], "append": [], "stream": []}
        acked: list[str] = []
        failed: list[str] = []
        commits = _Commits()
        sink_log = logging.getLogger("shardstore.spark.live_sink")
        sink_log.addHandler(commits)
        level, sink_log.level = sink_log.level, logging.INFO
        idle_commit: list[float] = []
        for r in range(reps + 1):  # round 0 warms up
            frame = df.withColumn("_id", F.concat(F.lit(f"r{r}-"), F.col("_id")))
            out = f"{root}/parquet{r}"
            t = time.perf_counter()
            frame.write.mode("overwrite").parquet(out)
            secs["parquet"].append(time.perf_counter() - t)
            t = time.perf_counter()
            (frame.withColumn("_id", F.concat(F.lit("idle-"), F.col("_id"))).write.format("shardstore")
             .option("store", url).option("index", "live").mode("append").save())
            secs["idle"].append(time.perf_counter() - t)
            idle_commit.append(commits.seconds[-1] if commits.seconds else float("nan"))
            idle_phases = commits.phases[-1] if commits.phases else "?"
            stop = threading.Event()
            load = threading.Thread(target=_client_load, args=(client, "live", stop, acked, failed))
            load.start()
            try:
                t = time.perf_counter()
                frame.write.format("shardstore").option("store", url).option("index", "live").mode("append").save()
                secs["append"].append(time.perf_counter() - t)
            finally:
                stop.set()
                load.join()
            incoming = f"{root}/incoming{r}"  # the Parquet files just written, one micro-batch each
            os.makedirs(incoming)
            parts = sorted(f for f in os.listdir(out) if f.endswith(".parquet"))
            for k, name in enumerate(parts):
                shutil.copy(os.path.join(out, name), os.path.join(incoming, f"{k:03d}.parquet"))
            t = time.perf_counter()
            q = (spark.readStream.schema(frame.schema).option("maxFilesPerTrigger", 1).parquet(incoming)
                 .writeStream.format("shardstore").option("store", url).option("index", "stream")
                 .option("checkpointLocation", f"{root}/checkpoint{r}").trigger(availableNow=True).start())
            q.awaitTermination()
            if q.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {q.exception()}")
            secs["stream"].append(time.perf_counter() - t)
            shutil.rmtree(out, ignore_errors=True)
            ctx.progress(f"{'warm-up' if r == 0 else f'rep {r}'}: " + ", ".join(f"{k} {v[-1]:.2f}s"
                                                                                for k, v in secs.items())
                         + f" (idle commit {idle_commit[-1]:.2f}s: {idle_phases})")
        sink_log.removeHandler(commits)
        sink_log.level = level
        # the checks: nothing the client was told is lost, every Spark row is there
        for index in ("live", "stream"):
            client.refresh(index)
        ids = set(client.scan("live", columns=["_id"]).column("_id").to_pylist())
        lost = sum(1 for i in acked if i not in ids)
        spark_ids = {f"{idle}r{r}-{i}" for r in range(reps + 1) for i in table.column("_id").to_pylist()
                     for idle in ("", "idle-")}
        missing = len(spark_ids - ids)
        client.flush("live")
        read = spark.read.format("shardstore").option("store", url).option("index", "live").load()
        missing += max(0, len(ids) - read.count())
        stream_ids = set(client.scan("stream", columns=["_id"]).column("_id").to_pylist())
        stream_missing = len({i for i in spark_ids if not i.startswith("idle-")} - stream_ids)
        for v in [*secs.values(), idle_commit]:
            del v[0]  # the warm-up round
        common = {"rows": rows, "columns": len(table.column_names), "shards": 2, "replicas": 1, "nodes": 3,
                  "reps": reps, "preloaded": preload.num_rows, "client_bulk": CLIENT_BULK}
        vs = {k: statistics.median(p / x for p, x in zip(secs["parquet"], secs[k])) for k in ("idle", "append",
                                                                                               "stream")}
        yield ctx.figure("parquet_write_rows_per_s", rows / statistics.median(secs["parquet"]), "rows/s", **common)
        yield ctx.figure("live_append_idle_rows_per_s", rows / statistics.median(secs["idle"]), "rows/s", **common)
        for i, (p, a) in enumerate(zip(secs["parquet"], secs["idle"]), 1):
            yield ctx.figure("live_append_idle_vs_parquet_run", p / a, "x", run=i, **common)
        yield ctx.figure("live_append_idle_vs_parquet", vs["idle"], "x", target=">= 0.5", met=vs["idle"] >= 0.5,
                         **common)
        yield ctx.figure("live_append_idle_commit_seconds", statistics.median(idle_commit), "s", **common)
        yield ctx.figure("live_append_idle_spark_seconds",
                         statistics.median(a - c for a, c in zip(secs["idle"], idle_commit)), "s", **common)
        yield ctx.figure("live_append_rows_per_s", rows / statistics.median(secs["append"]), "rows/s",
                         beside="a client bulking", **common)
        for i, (p, a) in enumerate(zip(secs["parquet"], secs["append"]), 1):
            yield ctx.figure("live_append_vs_parquet_run", p / a, "x", run=i, beside="a client bulking", **common)
        yield ctx.figure("live_append_vs_parquet", vs["append"], "x", beside="a client bulking", **common)
        yield ctx.figure("stream_sink_rows_per_s", rows / statistics.median(secs["stream"]), "rows/s",
                         files=len(parts), **common)
        for i, (p, s) in enumerate(zip(secs["parquet"], secs["stream"]), 1):
            yield ctx.figure("stream_sink_vs_parquet_run", p / s, "x", run=i, **common)
        yield ctx.figure("stream_sink_vs_parquet", vs["stream"], "x", files=len(parts), **common)
        yield ctx.figure("live_append_failed_client_writes", len(failed), "items", target="0", met=not failed,
                         client_acked=len(acked), first=(failed[:1] or [""])[0][:200], **common)
        yield ctx.figure("live_append_lost", lost, "docs", target="0", met=lost == 0, client_acked=len(acked), **common)
        yield ctx.figure("live_append_missing_rows", missing, "rows", target="0", met=missing == 0, **common)
        yield ctx.figure("stream_missing_rows", stream_missing, "rows", target="0", met=stream_missing == 0, **common)
        client.close()
        df.unpersist()
    finally:
        procs.close()
        shutil.rmtree(root, ignore_errors=True)


