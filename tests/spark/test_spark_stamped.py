"""Spark reads a commit holding a stamped segment (segments/stamp.py): its virtual ``_seq_no``, ``_primary_term`` and
``_version`` come out as the segments reading API gives them, never null, through the bridge's fast path too (Spark's
Parquet reader alone would read those columns as nulls: the fast path makes them from the row index)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.blobstores import open_store
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.reader import open_commit
from shardstore.segments.remote_store import RemoteSegmentStore, next_free_term
from shardstore.segments.stamp import Stamp
from shardstore.spark import read_index
from shardstore.spark.catalog import resolve_index
from shardstore.spark.reader import plan_read

COLUMNS = ["_id", "_seq_no", "_primary_term", "_version", "x", "s"]


def test_spark_reads_a_stamped_segments_virtual_columns(spark, tmp_path) -> None:
    from shardstore.engine import Cluster

    url = f"file://{tmp_path}/store"
    with Cluster(store=url, data_dir=str(tmp_path / "data"), nodes=1, cluster_managers=0) as cluster:
        cluster.create_index("t", shards=1, replicas=0, mappings={"x": {"type": "long"}, "s": {"type": "keyword"}})
        cluster.bulk("t", [{"_id": f"c{i}", "x": i, "s": "client"} for i in range(5)])
        cluster.flush("t")
    store = open_store(url)
    address = resolve_index(store, "t").address(0)
    base = open_commit(store, address).commit
    term = next_free_term(store, address)
    # a newer term's commit: the client's documents plus a file adopted as it is (as a Spark job's will be)
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"_id": [f"d{i:04d}" for i in range(2000)] + ["c1"], "x": list(range(2001)),
                             "s": ["spark"] * 2001}), path, row_group_size=300)
    with ShardDirectory(str(tmp_path / "local"), mapping=base.mapping, fsync=False, warm=False) as d:
        for reader in open_commit(store, address, cache_dir=str(tmp_path / "c0")).scan(["_id", "x", "s"]):
            from shardstore.translog.operations import index_batch, stamp

            rows = reader.to_pylist()
            d.apply(stamp(index_batch([r["_id"] for r in rows],
                                      [f'{{"x": {r["x"]}, "s": "{r["s"]}"}}'.encode() for r in rows]), 0, term))
        d.adopt(path, Stamp(base.max_seq_no + 1, term))
        commit = d.flush(local_checkpoint=d.max_seq_no, primary_term=term, merge=False)
        RemoteSegmentStore(store, address, term).upload(d.path, commit)
    want = pa.Table.from_batches(list(open_commit(store, address, cache_dir=str(tmp_path / "c1")).scan(COLUMNS)))
    want = want.sort_by("_id")
    assert want.num_rows == 2005 and want.column("_seq_no").null_count == 0
    _store, plan = plan_read({"store": url, "index": "t", "cachedir": str(tmp_path / "c2")})
    assert any(seg.info.stamp is not None for s in plan.shards for seg in s.commit.metadata.commit.segments)
    for df in (spark.read.format("shardstore").option("store", url).option("index", "t").load(),
               read_index(spark, url, "t")):
        got = df.select(*COLUMNS).toArrow().sort_by("_id")
        assert got.column("_seq_no").null_count == 0
        assert got.to_pylist() == want.cast(got.schema).to_pylist()
    rows = {r["_id"]: r for r in want.to_pylist()}  # absolute values, not only the reading API's
    first = base.max_seq_no + 1
    assert all((rows[f"d{i:04d}"]["_seq_no"], rows[f"d{i:04d}"]["_primary_term"], rows[f"d{i:04d}"]["_version"])
               == (first + i, term, 1) for i in range(2000))
    assert (rows["c1"]["_seq_no"], rows["c1"]["_version"], rows["c1"]["x"]) == (first + 2000, 2, 2000)
