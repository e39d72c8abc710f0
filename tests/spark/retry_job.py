"""A fast-path write whose task fails half-way on its first attempt and succeeds on its retry (run as a script).

Spark's own master ``local[2,2]`` (two cores, two attempts per task): the shared test session
is ``local[2]``, where one task failure fails the job.  Prints one JSON line of what the
store then holds.  Used by tests/spark/test_spark_fast_write.py.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from shardstore.blobstores import open_store
from shardstore.engine.cluster import Cluster
from shardstore.segments.reader import open_commit
from shardstore.segments.remote_store import latest_commit
from shardstore.spark import configure, register
from shardstore.spark.catalog import resolve_index

ROWS = 4000
FAIL_AT = 1500  # the failing attempt writes this many of its partition's rows first


def _fail_first_attempt(n: int) -> int:
    """``n``, except in the first attempt of partition 1 once it reached FAIL_AT rows of it."""
    ctx = TaskContext.get()
    if ctx.partitionId() == 1 and ctx.attemptNumber() == 0 and n - ROWS // 2 >= FAIL_AT:
        raise RuntimeError("injected failure of the first attempt")
    return n


def main(root: str) -> None:
    url = f"file://{root}/remote"
    cluster = Cluster(store=url, data_dir=f"{root}/node", nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index("retry", shards=2, replicas=0, source="synthetic")
    finally:
        cluster.close()
    builder = (SparkSession.builder.master("local[2,2]").appName("shardstore-retry")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    register(spark)
    fail = F.udf(_fail_first_attempt, "long")
    rows = spark.sparkContext.parallelize([(f"d{i}", i) for i in range(ROWS)], 2)  # partition 1: d2000..d3999
    df = spark.createDataFrame(rows, "_id string, n long")
    df = df.select("_id", fail("n").alias("n"))
    df.write.format("shardstore").option("store", url).option("index", "retry").mode("append").save()
    store = open_store(url)
    loc = resolve_index(store, "retry")
    out = {"ids": [], "rows": 0, "max_seq_no": [], "created_by": []}
    for s in range(loc.shards):
        out["max_seq_no"].append(latest_commit(store, loc.address(s)).commit.max_seq_no)
        reader = open_commit(store, loc.address(s))
        for b in reader.scan(columns=["_id", "_seq_no"]):
            out["ids"] += b.column(0).to_pylist()
        for seg, _live in reader.segments():
            out["rows"] += seg.info.doc_count
            out["created_by"].append(pq.ParquetFile(seg.path).metadata.created_by)
    spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main(sys.argv[1])
