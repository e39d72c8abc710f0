"""Reading an index through Spark: ``format("shardstore")`` and the fast path against independent oracles.

One small index (2 shards) is written through the engine: commit 1 (the first 3000
documents), commit 2 (updates and deletes), then acknowledged but unflushed writes in
the remote translog.  Every Spark result is compared with two oracles that share no
code with the Spark reader: the segments reading API (``open_commit(...).scan()``,
pyarrow) and DuckDB over the very same Parquet files with the live docs applied
(``file_row_number`` anti-joined with the deleted rows).  Uses the shared session.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore.errors import InvalidError, NotFoundError
from shardstore.segments.reader import open_commit
from shardstore.spark import read_index
from shardstore.spark.catalog import open_from_options, resolve_index
from shardstore.spark.reader import infer_schema, make_reader, plan_read

N = 3000
COLUMNS = ["_id", "_seq_no", "_primary_term", "_version", "b", "f", "s", "x"]


def _docs(lo: int, hi: int) -> pa.Table:
    r = range(lo, hi)
    return pa.table({"_id": [f"d{i:05d}" for i in r], "x": list(r), "s": [f"v{i % 7}" for i in r],
                     "f": [i / 4 for i in r], "b": [i % 2 == 0 for i in r]})


@pytest.fixture(scope="module")
def idx(tmp_path_factory):
    """A 2-shard index: commit 1, commit 2 (updates, deletes), then unflushed acknowledged writes."""
    from shardstore.engine import Cluster

    root = tmp_path_factory.mktemp("spark-read")
    url = f"file://{root}/store"
    cluster = Cluster(store=url, data_dir=str(root / "data"), nodes=3, recovery_delay=0.05)
    try:
        cluster.create_index("t", shards=2, replicas=1)
        cluster.bulk("t", _docs(0, N))
        cluster.flush("t")
        cluster.bulk("t", [{"_id": f"d{i:05d}", "x": -i, "s": "upd", "f": 0.5, "b": True} for i in range(0, 100)])
        for i in range(100, 150):
            cluster.delete("t", f"d{i:05d}")
        cluster.bulk("t", _docs(N, N + 200))
        cluster.flush("t")
        # acknowledged, never flushed: only the remote translog has them
        cluster.bulk("t", [{"_id": "d00001", "x": 111111, "s": "tl", "f": 1.0, "b": False},
                           {"_id": "new-1", "x": 222222, "s": "tl", "f": 2.0, "b": True}])
        cluster.delete("t", "d00002")
        cluster.delete("t", "d00200")
        cache = str(root / "cache")  # segment cache of the readers and the oracles (not the shared default)
        yield {"url": url, "cache": cache, "opts": {"store": url, "index": "t", "cacheDir": cache}}
    finally:
        cluster.close()


def _sorted(table: pa.Table) -> pa.Table:
    return table.select(COLUMNS).sort_by("_id")


def _spark_arrow(df) -> pa.Table:
    """A DataFrame's rows as an Arrow table (Spark 4 toArrow), sorted by _id."""
    return _sorted(df.toArrow())


def _oracle_pyarrow(idx: dict, generations: dict[int, int] | None = None) -> pa.Table:
    store = open_from_options({"store": idx["url"]})
    loc = resolve_index(store, "t")
    parts = []
    for s in range(loc.shards):
        reader = open_commit(store, loc.address(s), (generations or {}).get(s), cache_dir=idx["cache"])
        parts.append(pa.Table.from_batches(list(reader.scan(COLUMNS)), schema=reader.schema(COLUMNS)))
    return _sorted(pa.concat_tables(parts))


def _oracle_duckdb(idx: dict, generations: dict[int, int] | None = None) -> pa.Table:
    import duckdb

    store = open_from_options({"store": idx["url"]})
    loc = resolve_index(store, "t")
    files, deleted_files, deleted_rows = [], [], []
    for s in range(loc.shards):
        for reader, live in open_commit(store, loc.address(s), (generations or {}).get(s), idx["cache"]).segments():
            files.append(reader.path)
            rows = live.deleted_rows().to_pylist()
            deleted_files += [reader.path] * len(rows)
            deleted_rows += rows
    con = duckdb.connect()
    con.register("deleted", pa.table({"file": pa.array(deleted_files, pa.string()),
                                      "row": pa.array(deleted_rows, pa.int64())}))
    cols = ", ".join(f'"{c}"' for c in COLUMNS)
    sql = (f"SELECT {cols} FROM read_parquet(?, filename=true, file_row_number=true, union_by_name=true) p "
           "WHERE NOT EXISTS (SELECT 1 FROM deleted d WHERE d.file = p.filename AND d.row = p.file_row_number)")
    return _sorted(con.sql(sql, params=[files]).to_arrow_table()).cast(_oracle_pyarrow_schema())


def _oracle_pyarrow_schema() -> pa.Schema:
    return pa.schema([("_id", pa.string()), ("_seq_no", pa.int64()), ("_primary_term", pa.int64()),
                      ("_version", pa.int64()), ("b", pa.bool_()), ("f", pa.float64()), ("s", pa.string()),
                      ("x", pa.int64())])


#: format("shardstore") is the JVM bridge in the shared session (its jar is loaded: native Parquet reads);
#: format("shardstore-arrow") is the Python data source it falls back to.  Both must equal the oracles.
FORMATS = ["shardstore", "shardstore-arrow"]


@pytest.fixture(params=FORMATS)
def fmt(request) -> str:
    return request.param


def _load(spark, idx, fmt="shardstore", **options):
    reader = spark.read.format(fmt).options(**idx["opts"])
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _filter_node(plan: str) -> bool:
    """Whether Spark's physical plan still evaluates a Filter above the scan."""
    return re.search(r"\bFilter \(", plan) is not None


def _equal(a: pa.Table, b: pa.Table) -> None:
    a, b = a.cast(_oracle_pyarrow_schema()), b.cast(_oracle_pyarrow_schema())
    assert a.num_rows == b.num_rows
    assert a.equals(b), "tables differ"


def test_schema_typed_and_source_on_request(spark, idx, fmt):
    schema = infer_schema(idx["opts"])
    assert schema.fieldNames() == COLUMNS
    assert {f.name: f.dataType.simpleString() for f in schema.fields} == {
        "_id": "string", "_seq_no": "bigint", "_primary_term": "bigint", "_version": "bigint",
        "b": "boolean", "f": "double", "s": "string", "x": "bigint"}
    with_source = _load(spark, idx, fmt, includeSource="true")
    assert "_source" in with_source.columns
    row = with_source.filter("_id = 'd00500'").select("_source").collect()[0][0]
    assert b'"x":500' in bytes(row)


def test_newest_commit_equals_both_oracles(spark, idx, fmt):
    expected = _oracle_pyarrow(idx)
    _equal(expected, _oracle_duckdb(idx))
    assert expected.num_rows == N + 200 - 50  # 50 deleted; updates replace, never add
    _equal(_spark_arrow(_load(spark, idx, fmt)), expected)
    _equal(_spark_arrow(read_index(spark, idx["url"], "t", cacheDir=idx["cache"])), expected)
    assert _load(spark, idx, fmt).count() == expected.num_rows
    assert read_index(spark, idx["url"], "t", cacheDir=idx["cache"]).count() == expected.num_rows


def test_updates_and_deletes_exact(spark, idx, fmt):
    df = _load(spark, idx, fmt)
    got = {r["_id"]: r for r in df.filter("_id in ('d00000', 'd00099', 'd00100', 'd00149', 'd00150')").collect()}
    assert sorted(got) == ["d00000", "d00099", "d00150"]
    assert (got["d00099"]["x"], got["d00099"]["s"], got["d00099"]["_version"]) == (-99, "upd", 2)
    assert (got["d00150"]["x"], got["d00150"]["_version"]) == (150, 1)
    assert _load(spark, idx, fmt).filter("s = 'upd'").count() == 100


def test_time_travel_as_of_commit(spark, idx, fmt):
    old = _oracle_pyarrow(idx, {0: 1, 1: 1})
    assert old.num_rows == N
    _equal(old, _oracle_duckdb(idx, {0: 1, 1: 1}))
    _equal(_spark_arrow(_load(spark, idx, fmt, asOfCommit="1")), old)
    _equal(_spark_arrow(read_index(spark, idx["url"], "t", cacheDir=idx["cache"], asOfCommit="1")), old)
    mixed = _oracle_pyarrow(idx, {0: 1})  # shard 0 old, shard 1 newest
    _equal(_spark_arrow(_load(spark, idx, fmt, asOfCommit="0:1")), mixed)


def test_time_travel_as_of_seq_no(spark, idx, fmt):
    store, plan = plan_read({**idx["opts"], "asOfCommit": "1"})
    per_shard = {s.shard: s.metadata.commit.max_seq_no for s in plan.shards}
    spec = ",".join(f"{s}:{n}" for s, n in per_shard.items())
    _equal(_spark_arrow(_load(spark, idx, fmt, asOfSeqNo=spec)), _oracle_pyarrow(idx, {0: 1, 1: 1}))
    _equal(_spark_arrow(_load(spark, idx, fmt, asOfSeqNo="1000000")), _oracle_pyarrow(idx))
    with pytest.raises(NotFoundError, match="asOfSeqNo"):
        plan_read({**idx["opts"], "asOfSeqNo": "-1"})


def test_include_translog_sees_unflushed_acknowledged_writes(spark, idx, fmt):
    base = _oracle_pyarrow(idx)
    df = _load(spark, idx, fmt, includeTranslog="true")
    got = _spark_arrow(df)
    assert got.num_rows == base.num_rows + 1 - 2  # new-1 added; d00002 and d00200 deleted
    ids = set(got.column("_id").to_pylist())
    assert "new-1" in ids and "d00002" not in ids and "d00200" not in ids
    row = got.filter(pc.equal(got["_id"], "d00001")).to_pylist()[0]
    assert (row["x"], row["s"], row["_version"]) == (111111, "tl", 3)
    assert len(ids) == got.num_rows  # newest version per id only
    untouched = pc.invert(pc.is_in(base["_id"], pa.array(["d00001", "d00002", "d00200"])))
    _equal(got.filter(pc.invert(pc.is_in(got["_id"], pa.array(["d00001", "new-1"])))), base.filter(untouched))
    _equal(_spark_arrow(read_index(spark, idx["url"], "t", cacheDir=idx["cache"], includeTranslog="true")), got)
    assert df.filter("s = 'tl'").count() == 2  # filters apply to translog documents too
    with pytest.raises(InvalidError, match="asOfCommit"):
        plan_read({**idx["opts"], "includeTranslog": "true", "asOfCommit": "1"})


def test_include_translog_as_of_seq_no(idx):
    _store, old = plan_read({**idx["opts"], "asOfCommit": "1"})
    at = {s.shard: s.metadata.commit.max_seq_no for s in old.shards}
    _store, plan = plan_read({**idx["opts"], "includeTranslog": "true",
                              "asOfSeqNo": ",".join(f"{s}:{n}" for s, n in at.items())})
    assert all(s.translog.num_rows == 0 for s in plan.shards)  # exactly commit 1: nothing above it is needed
    # the translog above commit 1 outlives commit 2 (restore's fallback past one bad commit, issue 14):
    # a state between them is commit 1 plus its tail (purged only after a third commit, tested below)
    _store, between = plan_read({**idx["opts"], "includeTranslog": "true",
                                 "asOfSeqNo": ",".join(f"{s}:{n + 5}" for s, n in at.items())})
    gen1 = {s.shard: s.metadata.commit.generation for s in old.shards}
    assert all(s.metadata.commit.generation == gen1[s.shard] and s.translog.num_rows > 0 for s in between.shards)
    # the newest commit's state plus the tail up to a seq# (the first shard's newest acknowledged op)
    _store, newest = plan_read({**idx["opts"], "includeTranslog": "true"})
    s0 = newest.shards[0]
    top = s0.metadata.commit.max_seq_no + max(1, s0.translog.num_rows)
    _store, upto = plan_read({**idx["opts"], "includeTranslog": "true", "asOfSeqNo": f"0:{top}"})
    assert upto.shards[0].metadata.commit.generation == s0.metadata.commit.generation


def test_a_purged_state_between_commits_is_refused(tmp_path):
    """After a third commit the translog above commit 1 is purged: asOfSeqNo between commits 1 and 2 is refused."""
    from shardstore.engine import Cluster

    url = f"file://{tmp_path / 'store'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "data"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index("p", shards=1, replicas=0)
        for lo in (0, 20, 40):
            cluster.bulk("p", _docs(lo, lo + 20))
            cluster.flush("p")
    finally:
        cluster.close()
    opts = {"store": url, "index": "p", "cacheDir": str(tmp_path / "cache")}
    _store, first = plan_read({**opts, "asOfCommit": "1"})
    n = first.shards[0].metadata.commit.max_seq_no
    with pytest.raises(NotFoundError, match="no longer holds"):
        plan_read({**opts, "includeTranslog": "true", "asOfSeqNo": f"0:{n + 5}"})
    # between commits 2 and 3 the tail is still there
    _store, second = plan_read({**opts, "asOfCommit": "2"})
    m = second.shards[0].metadata.commit.max_seq_no
    _store, ok = plan_read({**opts, "includeTranslog": "true", "asOfSeqNo": f"0:{m + 5}"})
    assert ok.shards[0].translog.num_rows == 5


def test_filters_pushed_down_and_correct(spark, idx):
    """The Python source takes the filters pyarrow evaluates like Spark (the bridge: tests/spark/test_spark_bridge.py)."""
    base = _oracle_pyarrow(idx)
    df = _load(spark, idx, "shardstore-arrow").filter("x >= 2900 and s = 'v3' and _id like 'd02%'")
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert not _filter_node(plan), plan  # every filter handled by the source
    want = base.filter((pc.field("x") >= 2900) & (pc.field("s") == "v3") & pc.starts_with(pc.field("_id"), "d02"))
    _equal(_spark_arrow(df), want)
    # doubles go back to Spark (NaN ordering), still correct
    dbl = _load(spark, idx, "shardstore-arrow").filter("f > 700.0")
    assert _filter_node(dbl._jdf.queryExecution().executedPlan().toString())
    assert dbl.count() == base.filter(pc.field("f") > 700.0).num_rows
    # negation and nulls follow Spark's three-valued logic
    neg = _load(spark, idx, "shardstore-arrow").filter("NOT (s = 'upd') AND x IN (5, 150, 151, 99999)")
    _equal(_spark_arrow(neg), base.filter(pc.invert(pc.field("s") == "upd") & pc.field("x").isin([5, 150, 151, 99999])))
    nullsafe = _load(spark, idx, "shardstore-arrow").filter("NOT (x <=> 5) AND x < 8")
    _equal(_spark_arrow(nullsafe), base.filter((pc.field("x") != 5) & (pc.field("x") < 8)))
    # NOT (a <=> v) keeps the rows where a is null: Spark evaluates it, the source does not
    from pyspark.sql.datasource import EqualNullSafe, Not

    reader = make_reader(idx["opts"], infer_schema(idx["opts"]))
    kept = Not(EqualNullSafe(("x",), 5))
    assert list(reader.pushFilters([kept, Not(EqualNullSafe(("x",), None))])) == [kept]


def test_pushed_filters_prune_segments_and_rows(spark, idx):
    from pyspark.sql.datasource import EqualTo, GreaterThan, LessThan

    opts = idx["opts"]
    schema = infer_schema(opts)
    everything = make_reader(opts, schema)
    all_parts = everything.partitions()
    reader = make_reader(opts, schema)
    rest = list(reader.pushFilters([GreaterThan(("x",), N - 1), LessThan(("f",), 1e9)]))
    assert [type(f).__name__ for f in rest] == ["LessThan"]  # the double filter is Spark's
    parts = reader.partitions()
    assert 0 < len(parts) < len(all_parts)  # segments whose x range is <= N are skipped
    rows = sum(b.num_rows for p in parts for b in reader.read(p))
    assert rows == 200
    point = make_reader(opts, schema)
    list(point.pushFilters([EqualTo(("_id",), "d00150")]))
    assert sum(b.num_rows for p in point.partitions() for b in point.read(p)) == 1


def test_user_schema_reads_only_those_columns(spark, idx, fmt):
    df = spark.read.format(fmt).options(**idx["opts"]).schema("_id string, x long").load()
    assert df.columns == ["_id", "x"]
    assert df.filter("x >= 150 and x < 160").count() == 10
    cast = spark.read.format(fmt).options(**idx["opts"]).schema("_id string, x double").load()
    assert cast.filter("_id = 'd00150'").collect()[0]["x"] == 150.0  # a user schema may pick the type
    with pytest.raises(Exception, match="no column"):
        spark.read.format(fmt).options(**idx["opts"]).schema("nope string").load().count()


def test_auto_registration_module():
    import pyspark_shardstore
    from shardstore.spark.source import ShardstoreDataSource

    assert pyspark_shardstore.DefaultSource is ShardstoreDataSource
    assert ShardstoreDataSource.name() == "shardstore"


def test_clear_errors(spark, idx, fmt):
    from shardstore.spark.catalog import IndexNotInStore

    with pytest.raises(IndexNotInStore, match="no index 'missing'"):
        plan_read({"store": idx["url"], "index": "missing"})
    with pytest.raises(InvalidError, match="option\\('store'"):
        plan_read({"index": "t"})
    with pytest.raises(InvalidError, match="option\\('index'"):
        plan_read({"store": idx["url"]})
    with pytest.raises(InvalidError, match="asOfCommit"):
        plan_read({**idx["opts"], "asOfCommit": "7:1"})
    with pytest.raises(NotFoundError, match="generation 99"):
        plan_read({**idx["opts"], "asOfCommit": "99"})
    with pytest.raises(Exception, match="no index 'missing'"):
        spark.read.format(fmt).option("store", idx["url"]).option("index", "missing").load()
    with pytest.raises(Exception, match="option\\('store'"):
        spark.read.format(fmt).option("index", "t").load()


def test_large_segment_read_in_row_group_ranges_with_deletes(spark, tmp_path):
    from shardstore.engine import Cluster

    url = f"file://{tmp_path}/store"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "data"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index("big", shards=1, replicas=0)
        n = 40_000
        from shardstore.segments.segment_info import TARGET_ROW_GROUP_BYTES

        pad = TARGET_ROW_GROUP_BYTES // 12_000  # about 4 row groups of 40,000 rows, whatever the target
        cluster.bulk("big", pa.table({"_id": pc.cast(pa.array(range(n), pa.int64()), pa.string()),
                                      "x": pa.array(range(n), pa.int64()),
                                      "pad": pa.array(["p" * pad] * n)}))
        cluster.flush("big")
        for i in range(0, n, 997):  # deletes spread over every row group
            cluster.delete("big", str(i))
        cluster.flush("big")
    finally:
        cluster.close()
    opts = {"store": url, "index": "big", "rowGroupsPerPartition": "1", "cacheDir": str(tmp_path / "cache")}
    _store, plan = plan_read(opts)
    (seg,) = [s for s in plan.shards[0].metadata.commit.segments if s.live_count]
    assert seg.info.row_groups > 3 and seg.deleted_count == len(range(0, n, 997))
    reader = make_reader(opts, infer_schema(opts))
    assert len(reader.partitions()) == seg.info.row_groups
    df = spark.read.format("shardstore-arrow").options(**opts).load()  # the Python source's row-group ranges
    got = df.select("_id", "x").toArrow().sort_by("x")
    want = pa.Table.from_batches(list(open_commit(open_from_options(opts), plan.location.address(0), cache_dir=opts["cacheDir"]).scan(["_id", "x"])))
    assert got.num_rows == n - len(range(0, n, 997))
    assert got.column("x").to_pylist() == want.sort_by("x").column("x").to_pylist()
    # a filter prunes row groups inside the ranges, deletes still applied
    assert df.filter("x >= 30000").count() == len([i for i in range(30000, n) if i % 997])
    fast = read_index(spark, url, "big", cacheDir=opts["cacheDir"]).select("_id", "x").toArrow().sort_by("x")
    assert fast.equals(got)


class _CountingStore:
    """Counts the commit-metadata GETs of the planner (a thin proxy over the real file store)."""

    def __init__(self, inner, seen: list[str]) -> None:
        self._inner, self._seen = inner, seen

    def get(self, key, *args, **kwargs):
        if "/segments/metadata/" in key:
            self._seen.append(key)
        return self._inner.get(key, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_load_plans_once(idx, monkeypatch):
    """Spark asks the source for its schema in one worker and pickles it to the one that asks for the reader:
    the plan travels with it, so a load reads each shard's commit metadata once (it read it twice)."""
    import pickle

    import shardstore.spark.catalog as catalog
    from shardstore.spark.source import ShardstoreDataSource

    seen: list[str] = []
    real = catalog.open_store
    monkeypatch.setattr(catalog, "open_store", lambda url, **o: _CountingStore(real(url, **o), seen))
    source = ShardstoreDataSource(dict(idx["opts"]))
    schema = source.schema()  # Spark's create-data-source worker
    reader = pickle.loads(pickle.dumps(source)).reader(schema)  # its planning worker
    parts = reader.partitions()
    assert len(seen) == 2 and len(set(seen)) == 2, seen  # 2 shards, one metadata GET each
    got = pa.Table.from_batches([b for p in parts for b in reader.read(p)])
    assert got.num_rows == _oracle_pyarrow(idx).num_rows
    seen.clear()
    ShardstoreDataSource(dict(idx["opts"])).reader(schema).partitions()  # a user schema: no schema() call
    assert len(seen) == 2, seen


def test_spark_reads_through_the_segments_read_plan(idx):
    """Partitions are the segments' own read tasks: picklable references with checksums, no bytes."""
    import pickle

    from shardstore.segments.read_plan import ReadTask
    from shardstore.spark.reader import SegmentPartition

    store, plan = plan_read(idx["opts"])
    reader = make_reader(idx["opts"], infer_schema(idx["opts"], plan), plan)
    parts = [p for p in reader.partitions() if isinstance(p, SegmentPartition)]
    assert parts and all(isinstance(p.task, ReadTask) for p in parts)
    for p in parts:
        task = pickle.loads(pickle.dumps(p.task))
        assert task.data == p.task.data and task.data.checksum and len(pickle.dumps(p.task)) < 4096
    tasks = [t for s in plan.shards for t in s.commit.tasks()]
    assert [(t.shard, t.data.key, t.row_groups) for t in tasks] == [
        (p.task.shard, p.task.data.key, p.task.row_groups) for p in parts]


def test_read_index_rebuilds_the_source_it_is_asked_for(spark, idx):
    """Issue 31: the default index keeps no JSON these rows' fields rebuild; read_index with includeSource (or a
    schema naming _source) reads through the Arrow source, whose read tasks rebuild it, and gives every row's JSON."""
    df = read_index(spark, idx["url"], "t", cacheDir=idx["cache"], includeSource="true")
    rows = {r["_id"]: bytes(r["_source"]) for r in df.select("_id", "_source").collect()}
    assert rows["d00500"] == b'{"x":500,"s":"v3","f":125.0,"b":true}'
    assert all(rows.values()) and len(rows) == read_index(spark, idx["url"], "t", cacheDir=idx["cache"]).count()
    picked = read_index(spark, idx["url"], "t", "_id string, _source binary", cacheDir=idx["cache"])
    assert bytes(picked.filter("_id = 'd00500'").collect()[0]["_source"]) == rows["d00500"]
