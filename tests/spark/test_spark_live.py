"""Spark writes into a live cluster without fencing it (issue 43): real Spark, real nodes, a real file store.

The embedded cluster (production roles in this process) and three ``shardstore node`` processes
serve the store while Spark appends, creates indices with every save mode, overwrites and streams.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.spark.live_sink import find_live, stream_id
from shardstore.testing.node_processes import ProcessCluster


def _frame(spark, lo: int, hi: int, tag: str):
    return spark.range(lo, hi).selectExpr("concat('s', cast(id as string)) as _id", "id as n",
                                          f"'{tag}' as tag", "id % 7 = 0 as seven")


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=2, recovery_delay=0.05)
    try:
        yield c
    finally:
        c.close()


def test_an_append_goes_through_the_live_cluster_beside_client_writes(spark, cluster: Cluster, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster.create_index("live", shards=2, replicas=1)
    assert not cluster.bulk("live", [{"_id": f"c{i}", "n": i, "tag": "client"} for i in range(100)]).errors
    failed: list[str] = []
    acked: list[str] = []
    stop = threading.Event()

    def client_writes() -> None:
        i = 0
        while not stop.is_set():
            res = cluster.bulk("live", [{"_id": f"w{i}-{j}", "n": j, "tag": "during"} for j in range(20)])
            acked.extend(res.acknowledged)
            failed.extend(e for e in res.items.column("error").to_pylist() if e)
            i += 1

    writer = threading.Thread(target=client_writes)
    writer.start()
    try:
        _frame(spark, 0, 20_000, "spark").write.format("shardstore").option("store", url).option("index", "live") \
            .mode("append").save()
    finally:
        stop.set()
        writer.join()
    assert failed == []
    # the cluster keeps serving writes after the job: it was never fenced
    assert not cluster.bulk("live", [{"_id": "after", "n": 1}]).errors
    cluster.refresh("live")
    assert cluster.count("live") == 100 + 20_000 + len(acked) + 1
    assert cluster.get("live", "s123")["_source"] == {"n": 123, "tag": "spark", "seven": False}
    assert all(cluster.get("live", i) is not None for i in acked[:: max(1, len(acked) // 50)])
    cluster.flush("live")
    read = spark.read.format("shardstore").option("store", url).option("index", "live").load()
    assert read.filter("tag = 'spark'").count() == 20_000
    assert read.count() == cluster.count("live")


def test_a_reader_sees_a_spark_append_all_at_once(spark, cluster: Cluster, tmp_path: Path) -> None:
    """Docs/design/ingest.md, "Atomic visibility": a reader refreshing and counting in a loop while Spark appends
    20,000 rows (10 staged files, several slices each) sees the count before the job, then the count after it,
    and nothing in between."""
    url = f"file://{tmp_path / 'remote'}"
    cluster.create_index("live", shards=2, replicas=1)
    assert not cluster.bulk("live", [{"_id": f"c{i}", "n": i, "tag": "client"} for i in range(100)]).errors
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            cluster.refresh("live")
            seen.append(cluster.count("live"))

    poll = threading.Thread(target=reader)
    poll.start()
    try:
        _frame(spark, 0, 20_000, "spark").repartition(10).write.format("shardstore").option("store", url) \
            .option("index", "live").mode("append").save()
    finally:
        stop.set()
        poll.join()
    assert set(seen) <= {100, 20_100} and 100 in seen, sorted(set(seen))
    assert cluster.count("live") == 20_100


def test_save_modes_create_and_replace_an_index(spark, cluster: Cluster, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    opts = {"store": url, "index": "made", "shards": "3", "replicas": "1"}
    _frame(spark, 0, 500, "first").write.format("shardstore").options(**opts).save()  # errorifexists: created
    meta = cluster.index_meta("made")
    assert meta.shards == 3 and meta.replicas == 1
    # the mapping comes from the DataFrame's schema
    assert meta.mappings["properties"] == {"n": {"type": "long"}, "tag": {"type": "keyword"},
                                           "seven": {"type": "boolean"}}
    with pytest.raises(Exception) as info:
        _frame(spark, 0, 10, "again").write.format("shardstore").options(**opts).save()
    # one line naming the cause, not a Py4J stack holding a Python traceback
    assert str(info.value).startswith("shardstore: IndexExists: index [made] exists: save mode errorifexists")
    assert "\n" not in str(info.value) and len(str(info.value)) < 300, str(info.value)
    _frame(spark, 0, 10, "ignored").write.format("shardstore").options(**opts).mode("ignore").save()
    cluster.refresh("made")
    assert cluster.count("made") == 500 and cluster.get("made", "s1")["_source"]["tag"] == "first"
    # the new index takes client writes and reads like any other
    assert not cluster.bulk("made", [{"_id": "client", "n": 5, "tag": "client"}]).errors
    _frame(spark, 400, 700, "second").write.format("shardstore").options(**opts).mode("overwrite").save()
    cluster.refresh("made")
    ids = set(cluster.scan("made", columns=["_id"]).column("_id").to_pylist())
    assert ids == {f"s{i}" for i in range(400, 700)}
    assert cluster.get("made", "s450")["_source"]["tag"] == "second"
    # ignore on a missing index writes it
    _frame(spark, 0, 5, "x").write.format("shardstore").options(**{**opts, "index": "fresh"}).mode("ignore").save()
    cluster.refresh("fresh")
    assert cluster.count("fresh") == 5


def test_a_streaming_query_applies_each_batch_once_across_a_restart(spark, cluster: Cluster, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    source = tmp_path / "incoming"
    source.mkdir()
    checkpoint = str(tmp_path / "checkpoint")
    schema = "_id string, n long"

    def run() -> None:
        q = (spark.readStream.schema(schema).json(str(source)).writeStream.format("shardstore")
             .option("store", url).option("index", "stream").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    (source / "a.json").write_text("".join(f'{{"_id": "a{i}", "n": {i}}}\n' for i in range(300)))
    run()
    (source / "b.json").write_text("".join(f'{{"_id": "b{i}", "n": {i}}}\n' for i in range(200)))
    run()  # restarted from its checkpoint: only the new file is a new batch
    cluster.refresh("stream")
    assert cluster.count("stream") == 500
    assert cluster.get("stream", "a5")["_version"] == 1 and cluster.get("stream", "b5")["_version"] == 1
    sid = stream_id({"checkpointLocation": checkpoint})
    prefix = cluster.ingest_prefix("stream", f"{sid}-0")
    assert cluster.store.exists(prefix + "done")
    # batch 0 committed again (a driver that died after the ingest, before Spark's commit log): nothing applied
    assert cluster.ingest("stream", f"{sid}-0")["replayed"]
    assert cluster.get("stream", "a5")["_version"] == 1


def test_node_processes_take_the_append_and_a_dead_cluster_is_bulk_loaded(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    procs = ProcessCluster(str(tmp_path / "nodes"), f"{url}?create=true", 3)
    try:
        client = procs.client()
        client.create_index("proc", shards=2, replicas=1)
        assert not client.bulk("proc", [{"_id": "c1", "n": 1}]).errors
        assert find_live({"store": url, "index": "proc"}, open_store(url)) not in (None, ())
        _frame(spark, 0, 3_000, "spark").write.format("shardstore").option("store", url).option("index", "proc") \
            .mode("append").save()
        assert not client.bulk("proc", [{"_id": "c2", "n": 2}]).errors  # not fenced
        client.refresh("proc")
        assert client.count("proc") == 3_002
        assert client.get("proc", "s2999")["_source"]["tag"] == "spark"
        client.flush("proc")
        client.close()
    finally:
        procs.close()
    # every node gone (connections refused): the store is bulk-loaded as before, claiming a term
    assert find_live({"store": url, "index": "proc"}, open_store(url)) is None
    _frame(spark, 5_000, 5_010, "offline").write.format("shardstore").option("store", url).option("index", "proc") \
        .mode("append").save()
    read = spark.read.format("shardstore").option("store", url).option("index", "proc").load()
    assert read.count() == 3_012


def test_a_paused_cluster_is_not_fenced(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    procs = ProcessCluster(str(tmp_path / "nodes"), f"{url}?create=true", 1)
    try:
        with procs.client() as client:
            client.create_index("quiet", shards=1, replicas=0)
            assert not client.bulk("quiet", [{"_id": "c1", "n": 1}]).errors
        procs.pause(procs.live()[0])  # SIGSTOP: alive, answering nothing
        with pytest.raises(Exception, match="alive but did not take this job"):
            _frame(spark, 0, 10, "x").write.format("shardstore").option("store", url).option("index", "quiet") \
                .mode("append").save()
        procs.resume(procs.live()[0])
        with procs.client() as client:  # not fenced: it serves writes where it left off
            assert not client.bulk("quiet", [{"_id": "c2", "n": 2}]).errors
            client.refresh("quiet")
            assert client.count("quiet") == 2
    finally:
        procs.close()


def test_an_abort_after_the_job_record_keeps_what_the_record_names(cluster: Cluster, tmp_path: Path) -> None:
    """A commit that failed once its job record was written (IngestIncomplete past the retries) is aborted by Spark;
    the same job id (a replayed micro-batch, a retry) must still find its files and apply them."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from shardstore.engine.coordinator.ingest import write_job
    from shardstore.engine.coordinator.ingest_job import IngestJob
    from shardstore.spark.live_sink import abort_live, plan_live, stage_rows

    opts = {"store": f"file://{tmp_path / 'remote'}", "index": "kept"}
    schema = StructType([StructField("_id", StringType()), StructField("n", LongType())])
    batch = pa.record_batch({"_id": [f"k{i}" for i in range(100)], "n": list(range(100))})
    job = plan_live(opts, schema, "append")
    assert job is not None and job.hosts == ()  # the cluster this process runs
    msg = stage_rows(job, iter([batch]), "t0")
    write_job(cluster.store, job.prefix, IngestJob(job.job, "kept", job.index_uuid, "append", msg.files))
    late = stage_rows(job, iter([batch]), "t1")  # another attempt's files: no record names them
    abort_live(job, [msg, late])
    assert all(cluster.store.exists(f.key) for f in msg.files)
    assert not any(cluster.store.exists(f.key) for f in late.files)
    assert cluster.ingest("kept", job.job)["applied"] == 100
    cluster.refresh("kept")
    assert cluster.count("kept") == 100
    # a job that never got its record: an abort deletes every file it staged
    other = plan_live(opts, schema, "append")
    gone = stage_rows(other, iter([batch]), "t0")
    abort_live(other, [gone])
    assert not any(cluster.store.exists(f.key) for f in gone.files)


def test_the_python_sources_stream_writer_applies_each_batch_once_into_node_processes(spark, tmp_path: Path) -> None:
    """``writeStream.format("shardstore-arrow")`` (LiveStreamWriter, run in Spark's Python workers, which reach the
    nodes over the network): two runs from one checkpoint, each batch once, then a replayed batch applies nothing."""
    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'remote'}?create=true", 3)
    try:
        client = procs.client()
        client.create_index("arrow", shards=2, replicas=1)
        client.wait_for_health("green", timeout=60)
        hosts = ",".join(h.address for h in procs.nodes.values())
        source = tmp_path / "incoming"
        source.mkdir()
        checkpoint = str(tmp_path / "checkpoint")

        def run() -> None:
            q = (spark.readStream.schema("_id string, n long").json(str(source)).writeStream.format("shardstore-arrow")
                 .option("store", f"file://{tmp_path / 'remote'}").option("index", "arrow").option("hosts", hosts)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            q.awaitTermination(180)
            assert q.exception() is None

        (source / "a.json").write_text("".join(f'{{"_id": "a{i}", "n": {i}}}\n' for i in range(300)))
        run()
        (source / "b.json").write_text("".join(f'{{"_id": "b{i}", "n": {i}}}\n' for i in range(200)))
        run()  # restarted from its checkpoint: only the new file is a new batch
        client.refresh("arrow")
        assert client.count("arrow") == 500
        assert client.get("arrow", "a5")["_version"] == 1 and client.get("arrow", "b5")["_version"] == 1
        sid = stream_id({"checkpointLocation": checkpoint})
        assert client.ingest("arrow", f"{sid}-0")["replayed"]  # committed again: nothing applied
        assert client.get("arrow", "a5")["_version"] == 1
    finally:
        procs.close()


def test_an_append_of_mapped_columns_is_adopted_and_reads_as_the_row_path_would(spark, cluster: Cluster,
                                                                                  tmp_path: Path) -> None:
    """Every column mapped (the index created from the frame's schema): the job's files are adopted as segments
    (docs/design/adoption.md); each document reads back exactly as through the row path (``adopt=false``)."""
    url = f"file://{tmp_path / 'remote'}"
    frame = spark.range(0, 3000).selectExpr(
        "concat('a', cast(id as string)) as _id", "id as n", "cast(id as int) as i",
        "id / 4 as d",
        "case when id % 5 = 0 then null else concat('t', cast(id % 3 as string)) end as tag", "id % 2 = 0 as even",
        "cast(id / 10 as float) as f", "cast(id % 300 as smallint) as sm", "cast(id % 100 as tinyint) as ti")

    def write(index: str, df, **options: str) -> None:
        w = df.write.format("shardstore").option("store", url).option("index", index).option("shards", "2")
        for k, v in options.items():
            w = w.option(k, v)
        w.mode("append").save()

    write("adopted", frame)
    write("rows", frame, adopt="false")
    for index in ("adopted", "rows"):  # a NaN is refused by either path, with the same one-line reason
        nan = frame.limit(3).selectExpr("concat(_id, 'x') as _id", "n", "i", "double('NaN') as d", "tag", "even",
                                        "f", "sm", "ti")
        with pytest.raises(Exception, match="field 'd': is not a finite number") as refused:
            write(index, nan, **({} if index == "adopted" else {"adopt": "false"}))
        assert "Py4J" not in str(refused.value).splitlines()[0]
    store = open_store(url)
    markers = [b.key for b in store.list(f"{cluster.cluster_uuid}/ingest/") if "/adopted/" in b.key]
    assert len(markers) == 1 and f"/{cluster.index_meta('adopted').uuid}/" in markers[0]  # adopted; rows: not
    assert cluster.count("adopted") == cluster.count("rows") == 3000
    for i in (0, 1, 5, 7, 8, 999, 2999):
        got, want = cluster.get("adopted", f"a{i}"), cluster.get("rows", f"a{i}")
        assert got["_source"] == want["_source"], (i, got["_source"], want["_source"])
        assert got["_version"] == want["_version"] == 1
    # a second append updating half of the documents: re-applied rows, versions 2
    write("adopted", frame.filter("id % 2 = 0").selectExpr("_id", "n + 1 as n", "i", "d", "tag", "even", "f",
                                                           "sm", "ti"))
    assert cluster.count("adopted") == 3000
    assert (cluster.get("adopted", "a4")["_version"], cluster.get("adopted", "a4")["_source"]["n"]) == (2, 5)
    assert cluster.get("adopted", "a5")["_version"] == 1
    read = spark.read.format("shardstore").option("store", url).option("index", "adopted").load()
    assert read.count() == 3000 and read.filter("n = 5").select("_id").collect()[0]["_id"] in ("a4", "a5")
    # a timestamp column keeps the row layout (the bridge's writer would drop sub-millisecond digits the row path
    # refuses by name): milliseconds are indexed, microseconds refused, and no new adopted marker appears
    adopted = len([b.key for b in store.list(f"{cluster.cluster_uuid}/ingest/") if "/adopted/" in b.key])
    stamps = spark.range(0, 20).selectExpr("concat('s', cast(id as string)) as _id",
                                           "timestamp_millis(1700000000000 + id * 1001) as ts")
    write("stamps", stamps)
    assert cluster.count("stamps") == 20
    with pytest.raises(Exception, match="sub-millisecond"):
        write("stamps", spark.range(0, 3).selectExpr("concat('u', cast(id as string)) as _id",
                                                     "timestamp_micros(1700000000000001 + id) as ts"))
    assert len([b.key for b in store.list(f"{cluster.cluster_uuid}/ingest/") if "/adopted/" in b.key]) == adopted
