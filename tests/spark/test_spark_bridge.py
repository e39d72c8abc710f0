"""The JVM bridge: ``format("shardstore")`` served by Spark's native Parquet reader, and its fallbacks.

The shared session loads the bridge jar (``shardstore.spark.configure``) and installs the
planner (``register``).  Every result is compared with the segments reading API
(``open_commit(...).scan()``, pyarrow) and with the Python data source (``shardstore-arrow``).
"""

from __future__ import annotations

import os
import zipfile

import pyarrow as pa
import pytest

from shardstore.errors import InvalidError
from shardstore.segments.reader import open_commit
from shardstore.spark import bridge, read_index
from shardstore.spark.catalog import open_from_options, resolve_index
from shardstore.spark.jar import jar_path

N = 2000
COLUMNS = ["_id", "_seq_no", "_primary_term", "_version", "s", "x", "f"]


@pytest.mark.parametrize(("master", "options", "fast"), [
    ("local[2]", {}, True),
    ("local", {"fastPath": "auto"}, True),
    ("local[*]", {"FASTPATH": "False"}, False),
    ("spark://host:7077", {}, False),
    ("yarn", {"fastpath": "AUTO"}, False),
    ("k8s://https://api:6443", {"fastPath": "true"}, True),
    ("spark://host:7077", {"fastPath": "false"}, False),
])
def test_use_fast_path_decisions(master, options, fast):
    assert bridge.use_fast_path(master, options) is fast


def test_use_fast_path_refuses_unknown_values():
    with pytest.raises(InvalidError, match="fastPath='sometimes'"):
        bridge.use_fast_path("local[2]", {"fastPath": "sometimes"})


def test_jar_built_once_with_service_file(tmp_path):
    first = jar_path(tmp_path)
    mtime = os.stat(first).st_mtime_ns
    assert jar_path(tmp_path) == first and os.stat(first).st_mtime_ns == mtime  # built once
    with zipfile.ZipFile(first) as z:
        names = set(z.namelist())
        service = z.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister").decode()
    assert "io/shardstore/spark/DefaultSource.class" in names and "io/shardstore/spark/Planner.class" in names
    assert service.strip() == "io.shardstore.spark.DefaultSource"


def test_jar_build_without_a_jdk_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real environment without javac, not a mock
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(InvalidError, match="needs a JDK"):
        jar_path(tmp_path / "jars")


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    """2 shards: a commit, a second one with updates and deletes, then unflushed acknowledged writes."""
    from shardstore.engine import Cluster

    root = tmp_path_factory.mktemp("spark-bridge")
    url = f"file://{root}/store"
    cluster = Cluster(store=url, data_dir=str(root / "data"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index("b", shards=2, replicas=0)
        r = range(N)
        cluster.bulk("b", pa.table({"_id": [f"k{i:05d}" for i in r], "x": list(r), "s": [f"v{i % 5}" for i in r],
                                    "f": [i / 8 for i in r]}))
        cluster.flush("b")
        cluster.bulk("b", [{"_id": f"k{i:05d}", "x": -i, "s": "upd", "f": 0.25} for i in range(50)])
        for i in range(50, 80):
            cluster.delete("b", f"k{i:05d}")
        cluster.flush("b")
        cluster.bulk("b", [{"_id": "tail-1", "x": 99_999, "s": "tl", "f": 1.5}])
        cluster.delete("b", "k00100")
        cache = str(root / "cache")
        yield {"url": url, "cache": cache, "opts": {"store": url, "index": "b", "cacheDir": cache}}
    finally:
        cluster.close()


def _load(spark, idx, fmt="shardstore", **options):
    reader = spark.read.format(fmt).options(**idx["opts"])
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _relation(df):
    """The bridge's relation under a DataFrame (io.shardstore.spark.DatasetRelation), through Py4J."""
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()  # the optimizer may inline it away
    relation = leaves.head().relation()
    assert relation.getClass().getName() == "io.shardstore.spark.DatasetRelation"
    return relation


def _oracle(idx) -> pa.Table:
    store = open_from_options({"store": idx["url"]})
    loc = resolve_index(store, "b")
    parts = [pa.Table.from_batches(list(open_commit(store, loc.address(s), cache_dir=idx["cache"]).scan(COLUMNS)))
             for s in range(loc.shards)]
    return pa.concat_tables(parts).select(COLUMNS).sort_by("_id")


def _table(df) -> pa.Table:
    return df.toArrow().select(COLUMNS).sort_by("_id")


def test_bridge_is_installed_by_register(spark):
    assert bridge.bridge_on_classpath(spark)
    assert spark.sparkContext._jvm.io.shardstore.spark.Bridge.planner() is not None


def test_format_shardstore_reads_native_parquet(spark, idx):
    expected = _oracle(idx)
    assert expected.num_rows == N - 30
    df = _load(spark, idx)
    assert _relation(df).kind() == "native"
    got = _table(df)
    assert got.equals(expected.cast(got.schema))
    assert df.count() == expected.num_rows
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "PythonDataSource" not in plan and "shardstore[" not in plan, plan
    assert _table(_load(spark, idx, "shardstore-arrow")).equals(got)


def _executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def test_native_reads_become_the_fast_paths_own_plan(spark, idx):
    """The optimizer extension inlines the fast path's plan: Spark prunes columns and row groups itself."""
    df = _load(spark, idx).filter("x >= 1900 and s = 'v3'").select("_id", "x")
    assert sorted(r["x"] for r in df.collect()) == [i for i in range(1900, N) if i % 5 == 3]
    plan = _executed(df)
    assert "shardstore[" not in plan and "FileScan parquet" in plan, plan  # no row hand-over left
    assert "GreaterThanOrEqual(x,1900)" in plan and "EqualTo(s,v3)" in plan, plan  # row-group pruning
    scans = [line for line in plan.splitlines() if "FileScan parquet" in line]
    assert all("_version" not in line and "f:" not in line for line in scans), scans  # column pruning
    counted = _load(spark, idx)
    assert counted.count() == N - 30 and "shardstore[" not in _executed(counted.groupBy().count())


def test_a_self_join_keeps_the_row_hand_over_and_its_pruning(spark, idx):
    """One loaded DataFrame twice in a plan is not inlined (same attribute ids); the relation then scans."""
    df = _load(spark, idx)
    both = df.filter("x >= 1900 and s = 'v3'").select("_id", "x").union(df.filter("x < 3").select("_id", "x"))
    want = sorted([i for i in range(1900, N) if i % 5 == 3] + _small_xs(spark, idx))
    assert sorted(r["x"] for r in both.collect()) == want
    assert "shardstore[native]" in _executed(both)
    plan = _relation(df).lastScanPlan()
    assert "FileScan parquet" in plan, plan
    assert "GreaterThanOrEqual(x,1900)" in plan or "LessThan(x,3)" in plan, plan  # the last of its two scans
    read_schema = plan[plan.index("ReadSchema: "):].split("\n")[0]
    assert "_version" not in read_schema and "f:" not in read_schema, read_schema  # column pruning
    joined = df.alias("a").join(df.alias("b"), "_id")
    assert joined.count() == N - 30


def _small_xs(spark, idx) -> list[int]:
    return sorted(r["x"] for r in _load(spark, idx, "shardstore-arrow").filter("x < 3").select("x").collect())


def test_filters_keep_sparks_semantics(spark, idx):
    """NOT, IN, <=>, doubles and nulls: Spark re-checks every filter, the pushed ones only prune."""
    for where in ["NOT (s = 'upd') AND x IN (5, 60, 150, 99999)", "NOT (x <=> 5) AND x < 8",
                  "f > 240.5 OR _id LIKE 'k0001%'", "NOT (x > 10 AND s LIKE 'v%') AND x < 20",
                  "s IS NULL OR x IS NULL"]:
        native = sorted(_load(spark, idx).filter(where).select("_id").toArrow().column(0).to_pylist())
        arrow = sorted(_load(spark, idx, "shardstore-arrow").filter(where).select("_id").toArrow()
                       .column(0).to_pylist())
        assert native == arrow, where


def test_a_reused_dataframe_is_not_stale(spark, idx):
    """Spark caches a Python source's pushed-down read on the DataFrame; the bridge plans each scan anew."""
    for fast in ["true", "false"]:
        df = _load(spark, idx, fastPath=fast)
        assert df.filter("x = 1234").count() == 1
        assert df.count() == N - 30


def test_include_translog_and_time_travel_through_the_bridge(spark, idx):
    tail = _load(spark, idx, includeTranslog="true")
    assert _relation(tail).kind() == "native"
    ids = set(tail.select("_id").toArrow().column(0).to_pylist())
    assert "tail-1" in ids and "k00100" not in ids and len(ids) == N - 30 + 1 - 1
    old = _load(spark, idx, asOfCommit="1")
    assert old.count() == N and old.filter("s = 'upd'").count() == 0


def test_user_schema_through_the_bridge(spark, idx):
    df = spark.read.format("shardstore").options(**idx["opts"]).schema("_id string, x double").load()
    assert _relation(df).kind() == "native" and df.columns == ["_id", "x"]
    assert df.filter("_id = 'k01234'").collect()[0]["x"] == 1234.0
    same = read_index(spark, idx["url"], "b", schema="_id string, x double", cacheDir=idx["cache"])
    assert sorted(same.collect()) == sorted(df.collect())


def test_fast_path_false_reads_through_the_python_source_with_only_the_needed_columns(spark, idx):
    df = _load(spark, idx, fastPath="false")
    assert _relation(df).kind() == "arrow"
    assert _table(df).equals(_table(_load(spark, idx)))
    grouped = df.groupBy("s").count()
    assert dict(grouped.collect()) == dict(_load(spark, idx).groupBy("s").count().collect())
    plan = _relation(df).lastScanPlan()
    read_schema = plan[plan.index("ReadSchema: "):].split("\n")[0] if "ReadSchema: " in plan else plan
    assert "_version" not in read_schema and "s" in read_schema, plan  # the Python source read one column


def test_without_a_planner_the_bridge_reads_through_the_python_source(spark, idx):
    bridge.uninstall(spark)
    try:
        df = _load(spark, idx)
        assert _relation(df).kind() == "arrow"
        assert df.count() == N - 30
        assert _table(df).equals(_oracle(idx).cast(_table(df).schema))
    finally:
        assert bridge.install(spark)
    assert _relation(_load(spark, idx)).kind() == "native"


def test_bad_options_are_named_through_the_bridge(spark, idx):
    with pytest.raises(Exception, match="fastPath='never'"):
        _load(spark, idx, fastPath="never")
    with pytest.raises(Exception, match="no index 'missing'"):
        spark.read.format("shardstore").option("store", idx["url"]).option("index", "missing").load()
    with pytest.raises(Exception, match="no column"):
        spark.read.format("shardstore").options(**idx["opts"]).schema("nope string").load()


def test_another_session_of_the_context_reads_through_the_bridge(spark, idx):
    """The planner is JVM-wide: a read from spark.newSession() is planned in that session."""
    other = spark.newSession()
    df = other.read.format("shardstore").options(**idx["opts"]).load()
    assert _relation(df).kind() == "native"
    assert df.count() == N - 30


def test_sql_using_shardstore(spark, idx):
    """``CREATE TEMPORARY VIEW ... USING shardstore``: SQL reaches the same native read."""
    opts = ", ".join(f"{k} '{v}'" for k, v in idx["opts"].items())
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW bridge_v USING shardstore OPTIONS ({opts})")
    try:
        assert spark.sql("SELECT count(*) FROM bridge_v").collect()[0][0] == N - 30
        got = spark.sql("SELECT s, count(*) AS n FROM bridge_v WHERE x >= 0 GROUP BY s").collect()
        want = _load(spark, idx, "shardstore-arrow").filter("x >= 0").groupBy("s").count().collect()
        assert sorted(map(tuple, got)) == sorted(map(tuple, want))
        assert "FileScan parquet" in spark.sql("SELECT x FROM bridge_v")._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.catalog.dropTempView("bridge_v")
