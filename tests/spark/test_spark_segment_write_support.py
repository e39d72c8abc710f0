"""The fast path's Parquet row loop (``SegmentWriteSupport``) writes what Spark's own write support writes.

Real Spark (the shared session, bridge jar loaded). The same frame goes through the JVM
``SegmentWriter`` (the lean loop) and through ``df.write.parquet`` (Spark's ``ParquetWriteSupport``)
with the segment's Parquet settings; pyarrow reads both back, and every value, null, NaN,
timestamp and byte must match, as must the Parquet schema.
"""

from __future__ import annotations

import datetime as dt
import glob
import math
import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shardstore.spark.fast_write import PARQUET_OPTIONS

SCHEMA = ("_id string, _seq_no long, _primary_term long, l long, i int, s short, b byte, d double, f float, "
          "flag boolean, at timestamp, name string, raw binary")
UTC = dt.timezone.utc


def _rows() -> list[tuple]:
    """Every value kind at its edges: nulls, NaN, infinities, -0.0, extremes, timestamps before 1970 and in year 1000,
    empty, non-ASCII and long strings, empty and arbitrary binaries."""
    out = []
    doubles = [0.0, -0.0, 1.5, float("nan"), float("inf"), float("-inf"), 1e308, -5e-324, None]
    stamps = [dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 999999,
              tzinfo=UTC), dt.datetime(1000, 1, 1, tzinfo=UTC), dt.datetime(1970, 1, 1, tzinfo=UTC), None]
    names = ["", "plain", "ünïcödé 中文 😀", "x" * 70_000, None, "tab\tand\nnewline"]
    raws = [b"", b"\x00\xff\x00", bytes(range(256)) * 300, None]
    for k in range(240):
        out.append((f"id-{k:04d}", 0, 0,
                    None if k % 7 == 0 else (k - 120) * 10**15 + (2**63 - 1 if k == 1 else 0),
                    None if k % 5 == 0 else (k - 120) * 17_000_000, None if k % 6 == 0 else (k * 137) % 65536 - 32768,
                    None if k % 4 == 0 else (k * 7) % 256 - 128, doubles[k % len(doubles)],
                    None if k % 9 == 0 else (float("nan") if k % 10 == 3 else k / 3.0),
                    None if k % 11 == 0 else k % 2 == 0, stamps[k % len(stamps)], names[k % len(names)],
                    raws[k % len(raws)]))
    return out


def _read(path_glob: str) -> dict[str, list]:
    """The rows of the Parquet files under ``path_glob``, by ``_id``, each value made comparable (NaN, -0.0, bytes)."""
    files = sorted(glob.glob(path_glob))
    assert files
    tables = [pq.read_table(f) for f in files]
    assert len({_schema(f) for f in files}) == 1
    out = {}
    for t in tables:
        for row in t.to_pylist():
            out[row["_id"]] = {k: _comparable(v) for k, v in row.items() if k not in ("_seq_no", "_primary_term")}
    return out


def _schema(path: str) -> str:
    """The Parquet schema of a file, as text (pyarrow's first line names the Python object)."""
    return str(pq.ParquetFile(path).schema).split("\n", 1)[1]


def _comparable(v):
    if isinstance(v, float):
        return ("nan",) if math.isnan(v) else struct.pack("<d", v)  # -0.0 and 0.0 differ; every NaN is one NaN
    return v


#: Small row groups, so that parquet-mr makes a new record consumer (and the loop finds its column writers) many times.
OPTIONS = {**PARQUET_OPTIONS, "parquet.block.row.count.limit": "50"}


def _segment_writer(spark, frame, out: Path, job: str, options: dict[str, str]) -> list[str]:
    gateway = spark.sparkContext._gateway
    sink = gateway.jvm.io.shardstore.spark.SinkFunctions
    writer = gateway.jvm.io.shardstore.spark.SegmentWriter
    firsts = gateway.new_array(gateway.jvm.long, 1)
    terms = gateway.new_array(gateway.jvm.long, 1)
    out.mkdir()
    sink.start(job, firsts)
    try:
        return [str(f).split("\t")[1] for f in writer.write(frame._jdf, str(out), job, terms, True, 1, options)]
    finally:
        sink.finish(job)


def _lean(spark, frame) -> bool:
    """Whether SegmentWriteSupport's own loop takes the frame's columns (else each row goes through Spark's)."""
    jvm = spark.sparkContext._gateway.jvm
    conf = spark._jsparkSession.sessionState().conf()  # the session's settings (the timestamp type set by the test)
    schema = frame._jdf.schema()
    parquet = jvm.org.apache.spark.sql.execution.datasources.parquet.SparkToParquetSchemaConverter(conf).convert(schema)
    return jvm.io.shardstore.spark.SegmentWriteSupport.kinds(schema, parquet) is not None


@pytest.mark.parametrize("extra", ["", "dec", "validating"])
def test_the_segment_write_support_writes_what_spark_writes(spark, tmp_path: Path, extra: str) -> None:
    """Every column type of a segment reads back the same from both writers, over many row groups: straight to the
    column writers (""), by Spark's own loop for a row group whose record consumer hides them (a validating
    consumer), and by Spark's own loop for a file of a type the lean loop does not take (a decimal)."""
    from pyspark.sql import functions as F

    support = spark.sparkContext._gateway.jvm.io.shardstore.spark.SegmentWriteSupport
    frame = spark.createDataFrame(spark.sparkContext.parallelize(_rows(), 2), SCHEMA)
    if extra == "dec":
        frame = frame.withColumn("dec", (F.col("i") / 100).cast("decimal(12,2)"))
    options = {**OPTIONS, **({"parquet.validation": "true"} if extra == "validating" else {})}
    before = spark.conf.get("spark.sql.parquet.outputTimestampType")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MILLIS")  # as the fast path writes dates
    try:
        assert _lean(spark, frame) == (extra != "dec")
        direct, consumer = int(support.DIRECT_ROW_GROUPS), int(support.CONSUMER_ROW_GROUPS)
        files = _segment_writer(spark, frame, tmp_path / "lean", f"ws-{extra}", options)
        direct, consumer = int(support.DIRECT_ROW_GROUPS) - direct, int(support.CONSUMER_ROW_GROUPS) - consumer
        frame.write.options(**options).parquet(str(tmp_path / "spark"))
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", before)
    assert len(files) == 2  # one file per task (one shard)
    groups = sum(pq.ParquetFile(f).metadata.num_row_groups for f in files)
    assert groups >= 4  # 240 rows in row groups of 50
    # parquet-mr makes a consumer per row group (and one more after a last full one): each counted by its way
    if extra == "dec":  # Spark's loop: neither of ours
        assert (direct, consumer) == (0, 0)
    else:
        ours, other = (direct, consumer) if extra == "" else (consumer, direct)
        assert ours >= groups and other == 0
    lean, theirs = _read(str(tmp_path / "lean" / "*.parquet")), _read(str(tmp_path / "spark" / "*.parquet"))
    assert len(lean) == len(_rows())
    assert lean == theirs
    ours, spark_s = _schema(files[0]).splitlines(), _schema(glob.glob(str(tmp_path / "spark" / "*.parquet"))[0]).splitlines()
    assert [line.split()[0] for line in ours[1:4]] == ["required"] * 3  # the writer declares the key columns required
    assert ours[4:] == spark_s[4:]
    assert lean["id-0002"]["at"] == dt.datetime(1000, 1, 1, tzinfo=UTC)  # year 1000 and before 1970, in milliseconds
    assert lean["id-0001"]["at"] == dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert lean["id-0002"]["name"] == "ünïcödé 中文 😀" and lean["id-0003"]["name"] == "x" * 70_000
