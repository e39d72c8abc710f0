"""The sink's fast write path (Spark's own Parquet writer makes the segments): routing, round trip, updates, abort, fencing.

Real Spark (the shared session, bridge jar loaded), a real file store, the real engine.
Which path wrote a segment is read from its Parquet footer: Spark's writer is parquet-mr,
the Python sink's is Arrow's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstore.blobstores import open_store
from shardstore.engine.cluster import Cluster
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.segments.errors import CommitNotFound
from shardstore.segments.reader import open_commit
from shardstore.segments.remote_store import latest_commit, latest_term, list_commit_keys, read_metadata
from shardstore.segments.segment import FORMAT_VERSION, UNSORTED_FORMAT_VERSION
from shardstore.spark.catalog import resolve_index
from shardstore.spark.fast_write import MAX_OPEN_SHARDS
from shardstore.spark.writer import make_writer
from tests.conftest import CLOUD
from tests.spark.test_spark_write import INDEX, _engine, _live_docs

SCHEMA = "_id string, n long, name string, score double, flag boolean, at timestamp, small int"


def _ids() -> list[str]:
    """Ids of every kind the router sees: ASCII of many lengths, accents, CJK, emoji (UTF-16 surrogate pairs)."""
    rng = random.Random(16)
    ids = [f"doc-{i}" for i in range(500)] + [str(i) for i in range(300)]
    ids += ["".join(rng.choice("abcXYZ0123-_") for _ in range(rng.randint(1, 40))) for _ in range(300)]
    ids += ["é", "café", "naïve-ü", "中文文档", "日本語のID", "Ω≈ç√", "😀", "a😀b", "😀😀😀", "𝄞music", "x" * 257,
            "ß" * 33, "\u00ff\u0100", "\ud7ff", "\ue000\uffff"]
    ids += ["".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x7ff), rng.randint(0x800, 0xd7ff),
                                    rng.randint(0x10000, 0x10ffff)])) for _ in range(rng.randint(1, 12)))
            for _ in range(400)]
    return ids


def test_jvm_routing_equals_the_engine(spark) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    ids = _ids()
    assert any(ord(c) > 0xFFFF for i in ids for c in i)  # surrogate pairs in Java strings
    gateway = spark.sparkContext._gateway
    routing = gateway.jvm.io.shardstore.spark.Routing
    sink = gateway.jvm.io.shardstore.spark.SinkFunctions
    jids = gateway.new_array(gateway.jvm.String, len(ids))
    for k, i in enumerate(ids):
        jids[k] = i
    df = spark.createDataFrame([(i,) for i in ids], "_id string")
    for shards in (1, 2, 3, 5, 7, 16, 64):
        expected = shard_ids(pa.array(ids, pa.string()), shards).to_pylist()
        assert list(routing.shards(jids, shards)) == expected, shards
        # the same through Spark rows (UTF-8 in the JVM, decoded to the Java string the router hashes)
        got = df.select("_id", Column(sink.route(F.col("_id")._jc, shards)).alias("s")).collect()
        assert {r["_id"]: r["s"] for r in got} == dict(zip(ids, expected)), shards
    assert len(set(shard_ids(pa.array(ids, pa.string()), 7).to_pylist())) == 7


@pytest.mark.parametrize("shards", [7, MAX_OPEN_SHARDS + 4])
def test_the_segment_writer_routes_every_id_as_the_engine(spark, tmp_path: Path, shards: int) -> None:
    """Each task routes its rows from their UTF-8 bytes (ASCII) or Java strings (the rest): every id lands in its shard.

    With more than MAX_OPEN_SHARDS shards each task's rows are sorted by shard first and the
    writer keeps one file open: still one file per task and shard, seq#s unique per shard.
    """
    ids = _ids()
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=shards)
    rows = [(i, k, None, None, None, None, None) for k, i in enumerate(ids)]
    _fast_write(spark, url, rows, partitions=3)
    expected = dict(zip(ids, shard_ids(pa.array(ids, pa.string()), shards).to_pylist()))
    seen: dict[str, int] = {}
    files: dict[int, int] = {}
    seqs: dict[int, list[int]] = {}
    for shard, reader in _spark_segments(url):
        got = reader.take(list(range(reader.info.doc_count)), columns=["_id", "n", "_seq_no"])
        for doc_id, n in zip(got.column("_id").to_pylist(), got.column("n").to_pylist()):
            assert expected[doc_id] == shard and ids[n] == doc_id, doc_id
            seen[doc_id] = shard
        files[shard] = files.get(shard, 0) + 1
        seqs.setdefault(shard, []).extend(got.column("_seq_no").to_pylist())
    assert seen == expected and len(set(seen.values())) == shards
    assert max(files.values()) <= 3  # one file per task and shard
    assert all(len(v) == len(set(v)) for v in seqs.values())


def test_a_new_index_with_repeated_ids_reads_them_back(spark, tmp_path: Path) -> None:
    """A fresh index (no base): the fingerprint screen sees the repeats, the ids are read back, the last write wins."""
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=2)
    first_task = _rows("a", 100) + [("dup", 1, "first", 1.0, True, None, 1), ("dup", 2, "second", 1.0, True, None, 1)]
    first_task += _rows("a", 99, 100)
    second_task = _rows("b", 200) + [("a7", 70, "again", 1.0, True, None, 1)]  # "a7" also in the first task
    _fast_write(spark, url, first_task + second_task, partitions=2)
    docs = _live_docs(url)
    by_id = {r["_id"]: r for r in docs.to_pylist()}
    assert docs.num_rows == len(by_id) == 400  # a0..a198, dup, b0..b199
    assert by_id["dup"]["name"] == "second" and by_id["a8"]["n"] == 8  # in one task the later row wins
    assert by_id["a7"]["n"] in (7, 70)  # across tasks the higher seq# (either task's copy), and only one copy
    # and a fresh index without a repeat: screened, no id read back, the same documents
    url2 = f"file://{tmp_path / 'remote2'}"
    _empty_index(url2, tmp_path / "two", shards=2)
    _fast_write(spark, url2, _rows("a", 200) + _rows("b", 200), partitions=2)
    docs2 = _live_docs(url2)
    assert docs2.num_rows == 400 and len(set(docs2.column("_id").to_pylist())) == 400
    for _shard, reader in _spark_segments(url2):
        info = reader.info
        ids = reader.take(list(range(info.doc_count)), columns=["_id", "_seq_no"])
        assert (info.min_id, info.max_id) == (min(ids.column(0).to_pylist()), max(ids.column(0).to_pylist()))
        assert (info.min_seq_no, info.max_seq_no) == (min(ids.column(1).to_pylist()), max(ids.column(1).to_pylist()))


def test_a_task_that_fails_half_way_and_is_retried_commits_only_the_retry(tmp_path: Path) -> None:
    """A task attempt that wrote part of its files, then failed: its files are never committed, its seq#s stay a gap.

    Runs tests/spark/retry_job.py in a Spark of its own (``local[2,2]``: a task gets a second
    attempt; the shared session's ``local[2]`` fails the job on the first task failure).
    """
    import subprocess
    import sys

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("retry_job.py")), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(got["ids"]) == sorted(f"d{i}" for i in range(4000))  # every row once, the failed attempt's none
    assert got["rows"] == 4000  # no segment of the failed attempt was committed (not even as deleted rows)
    assert all("parquet-mr" in c for c in got["created_by"])  # the fast path wrote them
    # the failed attempt took seq#s for the rows it wrote before failing: a gap, as documented
    assert sum(m + 1 for m in got["max_seq_no"]) > 4000 + 500


def test_a_temp_directory_with_a_space_percent_and_hash(spark, tmp_path: Path, monkeypatch) -> None:
    """The writer's files are named by plain local paths: a space, % or # in the temp directory changes nothing."""
    odd = tmp_path / "a b%20#c"
    odd.mkdir()
    monkeypatch.setenv("SHARDSTORE_SPARK_TMP", str(odd))
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=2)
    _fast_write(spark, url, _rows("t", 50))
    assert _live_docs(url).num_rows == 50 and _spark_segments(url)
    assert list(odd.iterdir()) == []  # the job's directory is gone, nothing was written anywhere else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a b%20#c", "remote"]


def test_the_segment_writer_refuses_a_frame_without_the_key_columns(spark, tmp_path: Path) -> None:
    """The JVM writer fills _seq_no and _primary_term in place: a frame whose first columns are not those refuses (and no open file)."""
    gateway = spark.sparkContext._gateway
    terms = gateway.new_array(gateway.jvm.long, 2)
    frame = spark.createDataFrame([("a", 1, 2)], "_id string, _primary_term long, _seq_no long")
    writer = gateway.jvm.io.shardstore.spark.SegmentWriter
    with pytest.raises(Exception, match=r"do not start with _id \(string\), _seq_no \(bigint\)"):
        writer.write(frame._jdf, str(tmp_path), "job", terms, False, 2, {})
    good = spark.createDataFrame([("a", 1, 2)], "_id string, _seq_no long, _primary_term long")
    with pytest.raises(Exception, match="maxOpen 0 must be at least 1"):
        writer.write(good._jdf, str(tmp_path), "job", terms, False, 0, {})
    assert list(tmp_path.iterdir()) == []
    # a frame that carries stamps: a stamp taken for another shard than the row routes to fails the task
    wrong = 1 - shard_ids(pa.array(["a"], pa.string()), 2).to_pylist()[0]
    stamped = spark.createDataFrame([("a", (5 << 16) | wrong, 0)], "_id string, _seq_no long, _primary_term long")
    with pytest.raises(Exception, match=f"a row stamped for shard {wrong} routes to shard {1 - wrong}"):
        writer.write(stamped._jdf, str(tmp_path / "w"), "job", terms, False, 2, {})


def _lru_files(shards: list[int], max_open: int) -> int:
    """How many files a task writes for rows routed to ``shards`` (in order), closing the least recently written."""
    open_at: dict[int, int] = {}
    files = 0
    for n, s in enumerate(shards):
        if s not in open_at:
            if len(open_at) == max_open:
                del open_at[min(open_at, key=open_at.get)]
            files += 1
        open_at[s] = n
    return files


def test_the_segment_writer_closes_the_oldest_file_when_too_many_are_open(spark, tmp_path: Path) -> None:
    """maxOpen below the shards a task routes unsorted rows to: the least recently written file is closed, a later
    row of its shard starts a new one (file counts equal a reference LRU), and every row is written once."""
    import numpy as np

    from shardstore.spark.segment_files import FINGERPRINTS

    gateway = spark.sparkContext._gateway
    sink = gateway.jvm.io.shardstore.spark.SinkFunctions
    writer = gateway.jvm.io.shardstore.spark.SegmentWriter
    assert writer.FINGERPRINTS == FINGERPRINTS  # the driver reads what the writer writes
    shards, n, max_open = 3, 300, 2
    ids = [f"r{i}" for i in range(n)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize([(i, 0, 0, k) for k, i in enumerate(ids)], 2),
                                  "_id string, _seq_no long, _primary_term long, k long")
    firsts = gateway.new_array(gateway.jvm.long, shards)
    terms = gateway.new_array(gateway.jvm.long, shards)
    for s in range(shards):
        firsts[s], terms[s] = 10 * (s + 1), 7
    sink.start("lru-job", firsts)
    try:
        written = [str(f).split("\t") for f in writer.write(frame._jdf, str(tmp_path), "lru-job", terms, True,
                                                              max_open, {})]
    finally:
        ends = list(sink.finish("lru-job"))
    routed = shard_ids(pa.array(ids, pa.string()), shards).to_pylist()
    assert len(written) == _lru_files(routed[:n // 2], max_open) + _lru_files(routed[n // 2:], max_open)
    assert len(written) > 2 * shards  # files were closed and reopened
    expected = dict(zip(ids, routed))
    seen, seqs = [], {s: [] for s in range(shards)}
    for shard, path, _sorted in written:
        t = pq.read_table(path)
        assert np.fromfile(path + FINGERPRINTS, dtype="<u8").size == t.num_rows
        assert set(t.column("_primary_term").to_pylist()) == {7}
        for doc_id, seq in zip(t.column("_id").to_pylist(), t.column("_seq_no").to_pylist()):
            assert expected[doc_id] == int(shard)
            seen.append(doc_id)
            seqs[int(shard)].append(seq)
    assert sorted(seen) == sorted(ids)
    for s in range(shards):  # every row took its shard's next seq#: contiguous from the counter's start
        assert sorted(seqs[s]) == list(range(10 * (s + 1), ends[s]))


def test_rows_batched_per_file_keep_their_order_with_rows_bigger_than_a_batch(spark, tmp_path: Path) -> None:
    """Each file batches its rows (BATCH_BYTES) before the Parquet writer: rows of every size, small ones and ones
    bigger than a whole batch, reach each shard's file whole and in input order (seq#s rise along the file)."""
    gateway = spark.sparkContext._gateway
    sink = gateway.jvm.io.shardstore.spark.SinkFunctions
    writer = gateway.jvm.io.shardstore.spark.SegmentWriter
    batch = int(writer.BATCH_BYTES)
    rng = random.Random(7)
    sizes = [rng.choice([1, 10, 500, batch // 3, batch - 64, batch + 1, 2 * batch]) for _ in range(300)]
    rows = [(f"b{i}", 0, 0, i, chr(97 + i % 26) * size) for i, size in enumerate(sizes)]
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, 1),
                                  "_id string, _seq_no long, _primary_term long, k long, body string")
    shards = 2
    firsts = gateway.new_array(gateway.jvm.long, shards)
    terms = gateway.new_array(gateway.jvm.long, shards)
    sink.start("batch-job", firsts)
    try:
        written = [str(f).split("\t") for f in writer.write(frame._jdf, str(tmp_path), "batch-job", terms, True,
                                                              shards, {})]
    finally:
        sink.finish("batch-job")
    routed = dict(zip((r[0] for r in rows), shard_ids(pa.array([r[0] for r in rows], pa.string()), shards).to_pylist()))
    assert len(written) == shards
    seen = 0
    for shard, path, _sorted in written:
        t = pq.read_table(path)
        ks, bodies, seqs = (t.column(c).to_pylist() for c in ("k", "body", "_seq_no"))
        assert ks == sorted(ks) and [routed[f"b{k}"] for k in ks] == [int(shard)] * len(ks)  # input order, its shard
        assert seqs == list(range(len(seqs)))  # the file's rows in the order their seq#s were taken
        assert bodies == [rows[k][4] for k in ks]  # whole
        seen += len(ks)
    assert seen == len(rows)


def test_dates_before_1582_in_a_session_with_legacy_rebase(spark, tmp_path: Path) -> None:
    """A session writing Parquet dates in LEGACY (Julian) mode: the fast path still writes proleptic Gregorian
    timestamps, as the Python sink and the engine do, and leaves the session's setting as it was."""
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=2, source="synthetic")
    old = dt.datetime(1000, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    rows = [("old", 1, "a", 1.0, True, old, 1), ("recent", 2, "b", 2.0, False, old.replace(year=2024), 2)]
    key = "spark.sql.parquet.datetimeRebaseModeInWrite"
    before = spark.conf.get(key)
    spark.conf.set(key, "LEGACY")
    try:
        _fast_write(spark, url, rows)
        assert spark.conf.get(key) == "LEGACY"
    finally:
        spark.conf.set(key, before)
    assert _spark_segments(url), "the fast path did not write the segments"
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    at = {}
    for s in range(loc.shards):
        for batch in open_commit(store, loc.address(s)).scan(columns=["_id", "at"]):
            at.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
    assert at == {"old": old, "recent": old.replace(year=2024)}


def test_many_shards_with_a_base_join(spark, tmp_path: Path) -> None:
    """More than MAX_OPEN_SHARDS shards and an update: stamped before the join, sorted by shard, versions right."""
    url = f"file://{tmp_path / 'remote'}"
    shards = MAX_OPEN_SHARDS + 4
    _empty_index(url, tmp_path, shards=shards)
    _fast_write(spark, url, _rows("u", 100))
    first: dict[int, int] = {}  # each shard's highest seq# of the first job, over all its files
    for shard, reader in _spark_segments(url):
        first[shard] = max(first.get(shard, -1), reader.info.max_seq_no)
    _fast_write(spark, url, _rows("u", 30, 50) + _rows("new", 10), partitions=3)
    docs = _live_docs(url)
    by_id = {r["_id"]: r for r in docs.to_pylist()}
    assert docs.num_rows == len(by_id) == 110
    routed = dict(zip(by_id, shard_ids(pa.array(list(by_id), pa.string()), shards).to_pylist()))
    for doc_id, r in by_id.items():
        assert r["shard"] == routed[doc_id]
        assert r["_version"] == (2 if doc_id.startswith("u") and 50 <= int(doc_id[1:]) < 80 else 1), doc_id
    second: dict[int, list[int]] = {}
    for shard, reader in _spark_segments(url):  # the fast path wrote both jobs (parquet-mr segments)
        if reader.info.min_seq_no > first.get(shard, -1):
            second.setdefault(shard, []).append(reader)
    assert second
    tasks = max(3, int(spark.conf.get("spark.sql.shuffle.partitions")))  # 3 input partitions, or the join's shuffle
    for shard, readers in second.items():
        assert len(readers) <= tasks  # sorted by shard in each task: one file per task and shard
        seqs = sorted(s for r in readers for s in r.take(list(range(r.info.doc_count)), columns=["_seq_no"])
                      .column(0).to_pylist())
        assert seqs == list(range(first.get(shard, -1) + 1, first.get(shard, -1) + 1 + len(seqs)))  # contiguous


def _empty_index(url: str, tmp_path: Path, shards: int, source: str = "stored") -> None:
    """Create the index (no documents) with a one-node cluster that is closed again."""
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, recovery_delay=0.05)
    try:
        cluster.create_index(INDEX, shards=shards, replicas=0, source=source)
    finally:
        cluster.close()


def _rows(prefix: str, n: int, start: int = 0) -> list[tuple]:
    base = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.timezone.utc)
    return [(f"{prefix}{i}", i, f"name {i} ü\"q\"", i / 4 if i % 9 else float("nan"), i % 2 == 0,
             base + dt.timedelta(minutes=i), i % 100) for i in range(start, start + n)]


def _spark_segments(url: str) -> list[tuple[int, object]]:
    """(shard, segment reader) of every segment of the newest commits that Spark's Parquet writer made."""
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    out = []
    for s in range(loc.shards):
        for reader, _live in open_commit(store, loc.address(s)).segments():
            if "parquet-mr" in (pq.ParquetFile(reader.path).metadata.created_by or ""):
                out.append((s, reader))
    return out


def _fast_write(spark, url: str, rows: list[tuple], partitions: int = 2, **options: str) -> None:
    """Rows of SCHEMA written with ``fastPath=true`` (the fast path for a stored-source index too) unless overridden."""
    options = {"fastPath": "true", **options}
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions), SCHEMA)
    df.write.format("shardstore").option("store", url).option("index", INDEX).options(**options).mode("append").save()


def test_round_trip_through_engine_and_spark_reader(spark, tmp_path: Path) -> None:
    url, cluster, acked = _engine(tmp_path)
    cluster.close()
    rows = _rows("f", 300) + [("e1", -1, "updated", 0.5, True, dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), 1)]
    # an id twice in one task: its last row wins
    _fast_write(spark, url, [("twice", 1, "first", 1.0, True, None, 1), ("twice", 2, "second", 2.0, False, None, 2)]
                + rows, partitions=2)
    written = _spark_segments(url)
    assert written, "the fast path did not write the segments"
    # rows stay in the tasks' input order ("f10" before "f2"): unsorted segments (format 2)
    assert any(not reader.info.id_sorted for _s, reader in written)
    twice = 0
    for shard, reader in written:
        reader.verify()  # size and CRC32C as the commit records them
        info = reader.info
        ids = reader.ids().to_pylist()
        assert len(ids) == info.doc_count
        assert info.format_version == (FORMAT_VERSION if ids == sorted(ids) else UNSORTED_FORMAT_VERSION)
        twice = max(twice, ids.count("twice"))  # both writes are rows of one segment; the older one is deleted
        assert shard_ids(pa.array(ids, pa.string()), 2).to_pylist() == [shard] * len(ids)
        assert (info.min_id, info.max_id) == (min(ids), max(ids)) and info.max_primary_term >= 3
        schema = reader.schema
        assert schema.names[:5] == ["_id", "_seq_no", "_primary_term", "_version", "_source"]
        assert schema.field("_id").type == pa.string()
        assert not any(schema.field(c).nullable for c in ("_id", "_seq_no", "_primary_term", "_version"))
        assert schema.field("at").type == pa.timestamp("ms", tz="UTC") and schema.field("small").type == pa.int64()
        import duckdb  # the footer rewrite kept the bloom filter on _id where readers find it

        con = duckdb.connect()
        probe = "SELECT bool_and(bloom_filter_excludes) FROM parquet_bloom_probe(?, '_id', ?)"
        assert con.execute(probe, [reader.path, "no-such-id"]).fetchone()[0] is True
        assert con.execute(probe, [reader.path, ids[0]]).fetchone()[0] is False
        footer = pq.ParquetFile(reader.path).metadata  # a sorting column declared only where the rows are sorted
        chunks = {footer.schema.column(c).name: footer.row_group(0).column(c) for c in range(footer.num_columns)}
        assert all(chunks[c].encodings == ("DELTA_BINARY_PACKED",) for c in ("_seq_no", "_primary_term", "_version"))
        assert not chunks["_source"].is_stats_set and chunks["name"].is_stats_set  # as the segment writer's
        declared = (pq.SortingColumn(0),) if info.id_sorted else ()
        assert all(tuple(footer.row_group(g).sorting_columns or ()) == declared for g in range(footer.num_row_groups))
        meta = reader.read_metadata_info()  # the footer's copy of the segment info, as the segment writer keeps it
        assert meta["sorted_by"] == ("_id" if info.id_sorted else None) and meta["name"] == info.name
        keys = ("doc_count", "row_groups", "min_seq_no", "max_seq_no", "min_id", "max_id", "format_version")
        assert {k: meta[k] for k in keys} == {k: getattr(info, k) for k in keys}
        assert meta["columns"] == {c.name: c.to_dict() for c in info.columns}
        stats = {c.name: c for c in info.columns}
        col = reader.take(list(range(info.doc_count)), columns=["n"]).column("n")
        assert (stats["n"].min, stats["n"].max) == (pa.compute.min(col).as_py(), pa.compute.max(col).as_py())
    assert twice == 2
    store = open_store(url)
    for s in range(2):
        for reader, live in open_commit(store, resolve_index(store, INDEX).address(s)).segments():
            ids = reader.ids().to_pylist()
            if ids.count("twice") == 2:
                rows = [k for k, i in enumerate(ids) if i == "twice"]
                got = sorted(zip(reader.take(rows, ["_seq_no"]).column("_seq_no").to_pylist(), rows))
                assert [live.is_live(r) for _seq, r in got] == [False, True]  # only the higher seq# is live
                assert reader.take([got[1][1]], ["name"]).column("name").to_pylist() == ["second"]
    docs = _live_docs(url)
    by_id = {r["_id"]: r for r in docs.to_pylist()}
    assert len(by_id) == docs.num_rows == 45 + 300 + 1
    assert by_id["twice"]["name"] == "second" and by_id["e1"]["_version"] == 2 and by_id["f3"]["_version"] == 1

    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=1, recovery_delay=0.05)
    try:
        restored.refresh(INDEX)
        assert restored.count(INDEX) == 346
        src = restored.get(INDEX, "f5")["_source"]
        assert src == {"n": 5, "name": 'name 5 ü"q"', "score": 1.25, "flag": False,
                       "at": "2024-05-01T12:05:00.123Z", "small": 5}
        assert "score" not in restored.get(INDEX, "f9")["_source"]  # NaN: absent from the source, null field
        assert restored.get(INDEX, "e1")["_source"]["name"] == "updated"
        # the id written twice in one task: one segment holds both rows, the older deleted through live docs
        assert restored.get(INDEX, "twice")["_source"]["name"] == "second"
        assert restored.bulk(INDEX, [{"_id": "twice", "n": 3}]).acknowledged and restored.get(INDEX, "twice")["_version"] == 2
        restored.refresh(INDEX)
        assert restored.get(INDEX, "twice")["_source"] == {"n": 3} and restored.count(INDEX) == 346
        assert restored.get(INDEX, "t2")["_source"]["n"] == 1002  # acknowledged only in the translog: kept
        res = restored.bulk(INDEX, [{"_id": "f5", "n": 1, "name": "after"}])
        assert len(res.acknowledged) == 1 and restored.get(INDEX, "f5")["_version"] == 2
    finally:
        restored.close()

    read = spark.read.format("shardstore").option("store", url).option("index", INDEX).load()
    got = {r["_id"]: r for r in read.select("_id", "n", "name", "score", "at", "_seq_no").collect()}
    assert got["f7"]["name"] == 'name 7 ü"q"' and got["f9"]["score"] is None
    assert got["f7"]["at"].timestamp() == dt.datetime(2024, 5, 1, 12, 7, 0, 123000, tzinfo=dt.timezone.utc).timestamp()
    assert {i for i in got if i.startswith("f")} == {f"f{i}" for i in range(300)}


@pytest.mark.parametrize("join", ["broadcast", "sort-merge"])
def test_second_append_updates_versions_and_seq_nos(spark, tmp_path: Path, join: str) -> None:
    """The base's versions joined in; with a sort-merge join the rows reach the files reordered, seq#s already taken."""
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=2)
    _fast_write(spark, url, _rows("u", 100))
    first = {r["_id"]: r for r in _live_docs(url).to_pylist()}
    # 30 ids updated (10 of them twice: in both tasks), 10 new
    again = _rows("u", 30, 50) + _rows("new", 10) + _rows("u", 10, 70)
    key = "spark.sql.autoBroadcastJoinThreshold"
    saved = spark.conf.get(key)
    spark.conf.set(key, "-1" if join == "sort-merge" else saved)
    try:
        _fast_write(spark, url, again, partitions=3)
    finally:
        spark.conf.set(key, saved)
    docs = _live_docs(url)
    by_id = {r["_id"]: r for r in docs.to_pylist()}
    assert docs.num_rows == len(by_id) == 110
    for i in range(100):
        assert by_id[f"u{i}"]["_version"] == (2 if 50 <= i < 80 else 1), i
    assert all(by_id[f"new{i}"]["_version"] == 1 for i in range(10))
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    for s in range(2):
        top1 = max(r["_seq_no"] for r in first.values() if r["shard"] == s)
        assert sorted(r["_seq_no"] for r in first.values() if r["shard"] == s) == list(range(top1 + 1))
        rewritten = {f"u{i}" for i in range(50, 80)} | {f"new{i}" for i in range(10)}
        seqs = [by_id[i]["_seq_no"] for i in rewritten if by_id[i]["shard"] == s]
        assert min(seqs) > top1 and len(set(seqs)) == len(seqs)
        md = latest_commit(store, loc.address(s))
        assert md.commit.max_seq_no == md.commit.local_checkpoint >= max(seqs)
        # every seq# the job handed out is one row of a new segment (the copy of an id two tasks wrote is deleted)
        new_rows = sum(seg.info.doc_count for seg in md.commit.segments if seg.info.min_seq_no > top1)
        assert md.commit.max_seq_no - top1 == new_rows
    # the Spark reader agrees
    read = spark.read.format("shardstore").option("store", url).option("index", INDEX).load()
    assert sorted((r["_id"], r["_version"]) for r in read.select("_id", "_version").collect()) == \
        sorted((i, r["_version"]) for i, r in by_id.items())


def _only_closed_marker_left(store, loc, before: list) -> None:
    for s in range(loc.shards):
        addr = loc.address(s)
        term = latest_term(store, addr)
        assert term > before[s].commit.primary_term  # the job's claim
        prefix = addr.segments_prefix(term).rstrip("/") + "/"
        named = {f.key for k in list_commit_keys(store, addr, term) for f in read_metadata(store, k).files.values()}
        assert {b.key for b in store.list(prefix + "data/")} == {k for k in named if k.startswith(prefix)}
        assert [b.key[len(prefix):] for b in store.list(prefix + "spark/")] == ["spark/closed"]


def test_failed_fast_job_leaves_nothing_visible(spark, tmp_path: Path) -> None:
    url, cluster, _acked = _engine(tmp_path)
    cluster.close()
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    before = [latest_commit(store, loc.address(s)) for s in range(loc.shards)]
    rows = _rows("ok", 80) + [(None, 1, "bad", 1.0, True, None, 1)]
    with pytest.raises(Exception, match="null _id"):
        _fast_write(spark, url, rows)
    _only_closed_marker_left(store, loc, before)
    assert _live_docs(url).num_rows == 45 and not _spark_segments(url)


@pytest.mark.parametrize("fast", ["true", "false"])
def test_an_id_longer_than_the_engine_takes_fails_the_job(spark, tmp_path: Path, fast: str) -> None:
    """An _id over 512 UTF-8 bytes (the engine's limit) fails the write naming its size; nothing becomes visible."""
    url, cluster, _acked = _engine(tmp_path)
    cluster.close()
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    _fast_write(spark, url, _rows("ok", 3) + [("é" * 256, 1, "at the limit", 1.0, True, None, 1)], fastPath=fast)
    assert _live_docs(url).num_rows == 45 + 3 + 1  # 512 bytes: taken
    before = [latest_commit(store, loc.address(s)) for s in range(loc.shards)]
    with pytest.raises(Exception, match="_id of 514 bytes .*longer than the 512 bytes"):
        _fast_write(spark, url, _rows("more", 40) + [("é" * 257, 1, "too long", 1.0, True, None, 1)], fastPath=fast)
    _only_closed_marker_left(store, loc, before)
    assert _live_docs(url).num_rows == 45 + 3 + 1


def test_a_later_claim_fences_the_fast_job(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    url, cluster, _acked = _engine(tmp_path)
    cluster.close()
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    before = [latest_commit(store, loc.address(s)) for s in range(loc.shards)]
    flag = tmp_path / "claimed"
    options = json.dumps({"store": url, "index": INDEX})
    schema = spark.createDataFrame([], "_id string, n long").schema

    def claim_once(n: int) -> int:
        # runs in a Python worker while the fast path's Spark job runs: another job claims every shard
        if not flag.exists():
            flag.touch()
            make_writer(json.loads(options), schema, False)
        return n

    df = spark.createDataFrame([(f"c{i}", i, "x") for i in range(40)], "_id string, n long, name string")
    df = df.withColumn("n", F.udf(claim_once, "long")("n"))
    with pytest.raises(Exception, match="ConcurrentShardWriter|claimed by term"):
        df.write.format("shardstore").option("store", url).option("index", INDEX).option("fastPath", "true") \
            .mode("append").save()
    assert flag.exists()
    for s in range(loc.shards):  # the refused job's term holds only its closed marker (the later claim's is empty)
        addr = loc.address(s)
        newest = latest_term(store, addr)
        assert newest > before[s].commit.primary_term + 2
        for term in range(before[s].commit.primary_term + 1, newest):
            prefix = addr.segments_prefix(term).rstrip("/") + "/"
            named = {f.key for k in list_commit_keys(store, addr, term) for f in read_metadata(store, k).files.values()}
            assert {b.key for b in store.list(prefix + "data/")} <= named
            assert {b.key[len(prefix):] for b in store.list(prefix + "spark/")} <= {"spark/closed"}
    assert "c1" not in _live_docs(url).column("_id").to_pylist()


def test_python_sink_still_writes_when_asked_or_when_the_fast_path_declines(spark, tmp_path: Path) -> None:
    url, cluster, _acked = _engine(tmp_path)
    cluster.close()
    _fast_write(spark, url, _rows("p", 20), fastPath="false")
    assert not _spark_segments(url)  # fastPath=false: the Python sink wrote
    _fast_write(spark, url, _rows("q", 20), fastPath="auto")
    assert not _spark_segments(url)  # auto, a stored-source index: the Python sink (measured faster with JSON sources)
    nested = spark.createDataFrame([("st1", 1, ("a", 2))], "_id string, n long, o struct<k: string, v: long>")
    nested.write.format("shardstore").option("store", url).option("index", INDEX).option("fastPath", "true") \
        .mode("append").save()
    assert not _spark_segments(url)  # a struct column: declined, the Python sink wrote it
    docs = {r["_id"]: r for r in _live_docs(url).to_pylist()}
    assert "st1" in docs and "p3" in docs and "q3" in docs and len(docs) == 45 + 20 + 20 + 1


def test_auto_takes_the_fast_path_for_a_synthetic_source_index(spark, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=2, source="synthetic")
    _fast_write(spark, url, _rows("y", 60), fastPath="auto")
    written = _spark_segments(url)
    assert written
    for _s, reader in written:  # no JSON copy of the documents: the fields are the documents
        table = reader.take(list(range(reader.info.doc_count)), columns=["_source", "n"])
        assert table.column("_source").null_count == reader.info.doc_count and table.column("n").null_count == 0
    read = spark.read.format("shardstore").option("store", url).option("index", INDEX).load()
    got = {r["_id"]: r for r in read.select("_id", "n", "name", "_version").collect()}
    assert len(got) == 60 and got["y7"]["name"] == 'name 7 ü"q"' and got["y7"]["_version"] == 1
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=1, recovery_delay=0.05)
    try:
        restored.refresh(INDEX)
        assert restored.count(INDEX) == 60
        assert restored.get(INDEX, "y5")["_source"]["n"] == 5  # rebuilt from the fields
    finally:
        restored.close()


@pytest.mark.parametrize("backend", CLOUD)
def test_fast_path_on_every_cloud_store(spark, store_factory, tmp_path: Path) -> None:
    """Store options reach the driver's uploads and commit; an update of an engine document gets version 2."""
    store_factory()  # starts the emulator, makes the bucket
    url = store_factory.url(store_factory.new_prefix())
    options = {k: str(v) for k, v in store_factory.options().items()}
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, recovery_delay=0.05, **store_factory.options())
    try:
        cluster.create_index(INDEX, shards=2, replicas=0, mappings={"n": "long", "name": "keyword"})
        assert not cluster.bulk(INDEX, [{"_id": f"e{i}", "n": i, "name": "engine"} for i in range(20)]).errors
        cluster.flush(INDEX)
    finally:
        cluster.close()
    df = spark.createDataFrame([(f"s{i}", 1000 + i, "spark") for i in range(12)] + [("e3", -3, "spark")],
                               "_id string, n long, name string")
    df.write.format("shardstore").option("store", url).option("index", INDEX).option("fastPath", "true") \
        .options(**options).mode("append").save()
    read = spark.read.format("shardstore").option("store", url).option("index", INDEX).options(**options).load()
    got = {r["_id"]: (r["n"], r["_version"]) for r in read.select("_id", "n", "_version").collect()}
    assert len(got) == 32 and got["s4"] == (1004, 1) and got["e3"] == (-3, 2) and got["e4"] == (4, 1)
    store = open_store(url, **store_factory.options())
    loc = resolve_index(store, INDEX)
    created = {pq.ParquetFile(r.path).metadata.created_by.split(" ")[0]
               for s in range(loc.shards) for r, _l in open_commit(store, loc.address(s)).segments()}
    assert any("parquet-mr" in c for c in created)  # Spark's writer made the new segments
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=1, recovery_delay=0.05,
                               **store_factory.options())
    try:
        restored.refresh(INDEX)
        assert restored.count(INDEX) == 32 and restored.get(INDEX, "s7")["_source"] == {"n": 1007, "name": "spark"}
    finally:
        restored.close()


def test_an_update_when_some_shards_have_no_commit_yet(spark, tmp_path: Path) -> None:
    """Base versions come from the commits the claim found: a shard nothing was ever written to has none."""
    url = f"file://{tmp_path / 'remote'}"
    _empty_index(url, tmp_path, shards=5)
    _fast_write(spark, url, _rows("one", 1))
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    with_commit = [s for s in range(5) if list_commit_keys(store, loc.address(s), latest_term(store, loc.address(s)))]
    assert len(with_commit) == 1  # one document, one shard committed
    _fast_write(spark, url, _rows("one", 1) + _rows("two", 3))
    got = {}
    for s in range(5):  # (the oracle of the other tests needs a commit on every shard)
        try:
            reader = open_commit(store, loc.address(s))
        except CommitNotFound:
            continue
        for b in reader.scan(columns=["_id", "_version"]):
            got.update(zip(b.column(0).to_pylist(), b.column(1).to_pylist()))
    assert got == {"one0": 2, "two0": 1, "two1": 1, "two2": 1}


def test_shards_claimed_at_different_terms(spark, tmp_path: Path) -> None:
    """A job that died after claiming shard 0 leaves it a term ahead: each shard's rows carry their own term."""
    from shardstore.spark.writer import claim_shard

    url, cluster, _acked = _engine(tmp_path)
    cluster.close()
    store = open_store(url)
    loc = resolve_index(store, INDEX)
    claim_shard(store, loc.address(0), loc.primary_terms[0], "sparkdiedafteritsclaim", loc.mappings)
    _fast_write(spark, url, _rows("m", 60))
    terms = {}
    for shard, reader in _spark_segments(url):
        column = reader.take(list(range(reader.info.doc_count)), columns=["_primary_term"]).column(0)
        assert not reader.schema.field("_primary_term").nullable
        terms[shard] = set(column.to_pylist())
        assert terms[shard] == {latest_term(store, loc.address(shard))} == {reader.info.max_primary_term}
    assert len(terms) == 2 and terms[0] != terms[1]
    assert _live_docs(url).num_rows == 45 + 60
