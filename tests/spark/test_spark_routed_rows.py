"""The Python data source's routed staging (spark/routed_rows.py, issue 43): which Arrow schemas take the routed
layout, and two task attempts' batches staged as routed files that a real 3-node embedded cluster adopts, with
the same documents and versions as the same rows bulked in the same order.  No Spark session: the tasks' side
(``stage_rows``) and the driver's commit (``commit_live``) are called as Spark calls them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.spark.live_sink import LiveJob, commit_live, stage_rows
from shardstore.spark.routed_rows import arrow_layout

MAPPING = {"properties": {"n": {"type": "long"}, "i": {"type": "integer"}, "d": {"type": "double"},
                          "s": {"type": "keyword"}, "b": {"type": "boolean"}, "t": {"type": "date"}}}


def test_arrow_layout_takes_exact_columns_and_refuses_the_rest() -> None:
    ok = pa.schema([("_id", pa.large_string()), ("n", pa.int32()), ("i", pa.int16()), ("d", pa.float32()),
                    ("s", pa.string()), ("b", pa.bool_()), ("t", pa.timestamp("us", tz="UTC")), ("_version", pa.int64())])
    layout = arrow_layout(ok, MAPPING)
    assert layout is not None and layout.names == ["_id", "n", "i", "d", "s", "b", "t"]
    assert [f.type for f in layout] == [pa.string(), pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_(),
                                        pa.timestamp("ms", tz="UTC")]
    for bad in ([("n", pa.string())], [("x", pa.int64())], [("i", pa.int64())], [("n", pa.float64())],
                [("s", pa.struct([("a", pa.int64())]))], [("n", pa.uint64())], [("t", pa.date32())]):
        assert arrow_layout(pa.schema([("_id", pa.string()), *bad]), MAPPING) is None, bad
    assert arrow_layout(pa.schema([("_id", pa.int64()), ("n", pa.int64())]), MAPPING) is None
    assert arrow_layout(pa.schema([("n", pa.int64())]), MAPPING) is None


def _batch(ids: list[str], n: list[int], tag: str) -> pa.RecordBatch:
    return pa.record_batch({"_id": pa.array(ids, pa.string()), "n": pa.array(n, pa.int32()),
                            "s": pa.array([tag] * len(ids), pa.string())})


def _docs(c: Cluster, index: str) -> dict[str, tuple]:
    c.refresh(index)
    return {r["_id"]: (r["_version"], r["n"], r["s"])
            for r in c.scan(index, columns=["_id", "_version", "n", "s"]).to_pylist()}


@pytest.mark.parametrize("adopt", ["auto", "false"])
def test_python_tasks_stage_routed_files_the_cluster_adopts(tmp_path: Path, adopt: str) -> None:
    url = f"file://{tmp_path / 'remote'}"
    c = Cluster(store=f"{url}?create=true", data_dir=str(tmp_path / "data"), nodes=3)
    try:
        mapping = {"properties": {"n": {"type": "long"}, "s": {"type": "keyword"}}}
        for index in ("docs", "oracle"):
            c.create_index(index, shards=2, replicas=1, mappings=mapping)
            assert not c.bulk(index, [{"_id": f"d{k}", "n": -k, "s": "old"} for k in range(0, 600, 7)]).errors
        tasks = [  # task 0 writes d10 twice in one batch, d5 in two (the later row wins); preloaded ids updated
            [_batch([f"d{k}" for k in range(0, 300)] + ["d10"], list(range(0, 300)) + [1010], "t0a"),
             _batch(["d5", "n0"], [55, 1], "t0b")],
            [_batch([f"d{k}" for k in range(300, 600)], list(range(300, 600)), "t1")],
        ]
        job = LiveJob({"store": url, "adopt": adopt}, (), "docs", c.index_meta("docs").uuid, "py-job",
                      c.ingest_prefix("docs", "py-job"), "append", layout=c.index_mapping("docs"))
        messages = [stage_rows(job, iter(batches), f"t{k}") for k, batches in enumerate(tasks)]
        files = [f for m in messages for f in m.files]
        if adopt == "auto":
            assert sorted(f.shard for f in files) == [0, 0, 1, 1]  # one file per task and shard
        else:
            assert all(f.shard is None for f in files)
        out = commit_live(job, messages)
        assert out["path"] == ("adopt" if adopt == "auto" else "rows") and out["applied"] == 603
        for batches in tasks:  # the oracle: the same rows bulked in the same order
            for b in batches:
                assert not c.bulk("oracle", pa.Table.from_batches([b])).errors
        assert _docs(c, "docs") == _docs(c, "oracle")
        docs = _docs(c, "docs")
        assert docs["d5"] == (2, 55, "t0b") and docs["d10"] == (2, 1010, "t0a") and docs["d7"] == (2, 7, "t0a")
    finally:
        c.close()


def _routed(shards: int, file_rows: int) -> tuple[object, list[tuple[int, pa.Table]]]:
    """RoutedFiles whose staging keeps each file's table in memory (no store)."""
    from shardstore.engine.coordinator.ingest_job import StagedFile
    from shardstore.spark.routed_rows import RoutedFiles

    staged: list[pa.Table] = []

    def stage(store, prefix, name, table):
        staged.append(table)
        return StagedFile(f"{prefix}{name}", 1, 0, table.num_rows)

    layout = arrow_layout(pa.schema([("_id", pa.string()), ("n", pa.int64()), ("t", pa.timestamp("us"))]), MAPPING)
    return RoutedFiles(None, "p/", "t0", layout, shards, file_rows, stage=stage), staged


def test_a_task_holds_about_one_files_rows_whatever_the_shard_count() -> None:
    """32 shards, files of 64 rows: each file is staged once the task holds 64 rows, never 32 x 64; every row is in
    exactly one file, of the shard its id routes to, in input order."""
    from shardstore.engine.coordinator.routing import shard_ids

    routed, staged = _routed(32, 64)
    ids = [f"k{i}" for i in range(1000)]
    for lo in range(0, 1000, 100):
        routed.add(pa.record_batch({"_id": ids[lo:lo + 100], "n": list(range(lo, lo + 100)),
                                    "t": pa.array([0] * 100, pa.timestamp("us"))}))
        assert sum(routed._rows.values()) < 64
    files = routed.finish()
    assert sum(t.num_rows for t in staged) == 1000 and all(t.num_rows <= 100 for t in staged)
    want = dict(zip(ids, shard_ids(pa.array(ids), 32).to_pylist()))
    for f, t in zip(files, staged):
        assert {want[i] for i in t.column("_id").to_pylist()} == {f.shard}
        assert t.column("n").to_pylist() == sorted(t.column("n").to_pylist())  # input order within a file
        assert t.schema.field("t").type == pa.timestamp("ms", tz="UTC")


def test_sub_millisecond_dates_and_null_ids_are_kept_for_the_coordinators_check() -> None:
    """A timestamp with sub-millisecond digits is not truncated (its file keeps microseconds: not adoptable, the row
    path refuses the row), and a null id goes into shard 0's file (the coordinator's check names it)."""
    routed, staged = _routed(4, 10_000)
    routed.add(pa.record_batch({"_id": ["a", "b"], "n": [1, 2], "t": pa.array([1_000, 2_000], pa.timestamp("us"))}))
    routed.add(pa.record_batch({"_id": ["c", None], "n": [3, 4], "t": pa.array([3_001, 4_000], pa.timestamp("us"))}))
    files = routed.finish()
    types = {t.schema.field("t").type for t in staged}
    assert pa.timestamp("us", tz="UTC") in types  # the file holding "c" keeps 3,001 us
    held = {i for t in staged for i in t.column("_id").to_pylist()}
    assert held == {"a", "b", "c", None}
    assert [f.shard for f, t in zip(files, staged) if None in t.column("_id").to_pylist()] == [0]
    with_c = [t for t in staged if "c" in t.column("_id").to_pylist()]
    assert len(with_c) == 1 and with_c[0].schema.field("t").type == pa.timestamp("us", tz="UTC")
    row = with_c[0].column("_id").to_pylist().index("c")
    assert with_c[0].column("t").cast(pa.int64())[row].as_py() == 3_001


@pytest.mark.parametrize(("batch", "why"), [
    (pa.record_batch({"_id": ["a", "b"], "n": [1, 2], "t": pa.array([1_000, 2_001], pa.timestamp("us"))}),
     "sub-millisecond"),
    (pa.record_batch({"_id": ["a", None], "n": [1, 2], "t": pa.array([1_000, 2_000], pa.timestamp("us"))}),
     "null _id"),
    (pa.record_batch({"_id": ["a", "b"], "n": [1, 2], "t": pa.array([1_000, 253_402_300_800_000_000],
                                                                    pa.timestamp("us"))}),
     "field 't': is a date outside years 1 to 9999"),
])
def test_a_job_the_row_path_refuses_is_refused_and_nothing_is_applied(tmp_path: Path, batch, why: str) -> None:
    from shardstore.engine.errors import IngestRejected

    url = f"file://{tmp_path / 'remote'}"
    c = Cluster(store=f"{url}?create=true", data_dir=str(tmp_path / "data"), nodes=1)
    try:
        c.create_index("docs", shards=2, replicas=0, mappings={"properties": {"n": {"type": "long"},
                                                                             "t": {"type": "date"}}})
        job = LiveJob({"store": url}, (), "docs", c.index_meta("docs").uuid, "bad", c.ingest_prefix("docs", "bad"),
                      "append", layout=c.index_mapping("docs"))
        message = stage_rows(job, iter([batch]), "t0")
        assert all(f.shard is not None for f in message.files)
        with pytest.raises(IngestRejected, match=why):
            commit_live(job, [message])
        c.refresh("docs")
        assert c.count("docs") == 0
    finally:
        c.close()
