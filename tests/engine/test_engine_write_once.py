"""A big part of new documents written once (engine/shard/write_once.py), through a real cluster: the primary
places the part's segment file and logs it as a Parquet frame; what readers, replicas, a rebuild from the store
alone and a restore get is exactly what the row path gives.  The minimum is lowered through its environment
variable so parts of 300 real flights rows (every column) take the path."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore import datasets
from shardstore.engine import Cluster
from shardstore.engine.shard import write_once
from shardstore.engine.shard.write_once import ENV_MIN_ROWS
from shardstore.translog import frames as fr

ROWS = 300
PARTS = 3
META = ["_id", "_seq_no", "_primary_term", "_version"]


@pytest.fixture(scope="module")
def flights() -> pa.Table:
    return datasets.flights().slice(1_000, ROWS * PARTS).combine_chunks()


def frame_kinds(copy) -> list[bytes]:  # noqa: ANN001 - a ShardCopy
    directory = Path(copy.translog.directory)
    kinds: list[bytes] = []
    for path in sorted(directory.glob("translog-*.tlog")):
        kinds += [f.kind for f in fr.iter_frames(path.read_bytes(), fr.HEADER_SIZE, None, path)]
    return kinds


def load(cluster: Cluster, index: str, table: pa.Table) -> None:
    for off in range(0, table.num_rows, ROWS):
        result = cluster.bulk(index, table.slice(off, ROWS))
        assert not result.errors


def everything(cluster: Cluster, index: str) -> pa.Table:
    cluster.refresh(index)
    return cluster.scan(index).sort_by("_id")


def test_a_part_written_once_reads_as_the_row_path_writes_it(tmp_path: Path, flights: pa.Table,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=1)
    try:
        monkeypatch.setenv(ENV_MIN_ROWS, str(ROWS))
        cluster.create_index("once", shards=1, replicas=0)
        monkeypatch.setenv(ENV_MIN_ROWS, "0")  # copies opened from now on never write a part once
        cluster.create_index("rows", shards=1, replicas=0)
        load(cluster, "once", flights)
        load(cluster, "rows", flights)
        once, rows = cluster.primary_copy("once", 0), cluster.primary_copy("rows", 0)
        assert once._write_once.written == PARTS and rows._write_once.written == 0
        assert frame_kinds(once).count(fr.PARQUET_MAGIC) == PARTS and fr.PARQUET_MAGIC not in frame_kinds(rows)
        # a part of more rows is cut into pieces encoded side by side: a frame and a segment each
        monkeypatch.setattr(write_once, "PIECE_ROWS", ROWS // 2)
        pieces = len(write_once.piece_cuts(ROWS * PARTS)) - 1
        assert not cluster.bulk("once", flights.set_column(0, "_id", pc.binary_join_element_wise(
            "big-", flights.column("_id"), ""))).errors
        assert frame_kinds(once).count(fr.PARQUET_MAGIC) == PARTS + pieces
        assert not cluster.bulk("rows", flights.set_column(0, "_id", pc.binary_join_element_wise(
            "big-", flights.column("_id"), ""))).errors
        a, b = everything(cluster, "once"), everything(cluster, "rows")
        assert a.num_rows == 2 * ROWS * PARTS and a.schema == b.schema and a.equals(b)
        for doc_id in ("1000", "1299", "1300", "1899"):
            got, want = cluster.get("once", doc_id), cluster.get("rows", doc_id)
            assert got is not None and {**got, "_index": ""} == {**want, "_index": ""}
        assert cluster.get("once", "1000")["_version"] == 1 and cluster.get("once", "1899")["_seq_no"] == 899
        assert cluster.get("once", "big-1899")["_seq_no"] == 2 * ROWS * PARTS - 1

        # the same ids again are updates: the row path, each at version 2 (the encoding begun for it is dropped)
        changed = flights.set_column(flights.schema.get_field_index("dep_delay"), "dep_delay",
                                     pc.add(flights.column("dep_delay"), 1000))
        load(cluster, "once", changed)
        load(cluster, "rows", changed)
        assert once._write_once.written == PARTS + 1 and once._write_once.missed == 1
        a, b = everything(cluster, "once"), everything(cluster, "rows")
        a, b = a.filter(pc.invert(pc.starts_with(a.column("_id"), "big-"))), b.filter(
            pc.invert(pc.starts_with(b.column("_id"), "big-")))
        assert a.equals(b) and set(a.column("_version").to_pylist()) == {2}
        assert a.column("dep_delay").to_pylist() == changed.sort_by("_id").column("dep_delay").to_pylist()
    finally:
        cluster.close()


def test_parts_written_once_come_back_from_the_store_alone(tmp_path: Path, flights: pa.Table,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before any flush, the only copy is rebuilt from the store: its remote translog's Parquet frames."""
    monkeypatch.setenv(ENV_MIN_ROWS, str(ROWS))
    url = f"file://{tmp_path / 'store'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "nodes"), nodes=2, recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        load(cluster, "docs", flights)
        assert cluster.primary_copy("docs", 0)._write_once.written == PARTS
        want = everything(cluster, "docs").select(META + ["tailnum", "time_hour"])
        cluster.kill_node(cluster.primary_of("docs", 0))  # the only copy: rebuilt from the store
        cluster.wait_for_health("yellow", timeout=60)
        assert everything(cluster, "docs").select(META + ["tailnum", "time_hour"]).equals(want)
        assert not cluster.bulk("docs", [{"_id": "after", "year": 2030}]).errors
        assert cluster.get("docs", "after")["_seq_no"] == ROWS * PARTS
    finally:
        cluster.close()
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "fresh"), nodes=1)
    try:
        got = everything(restored, "docs")
        assert got.num_rows == ROWS * PARTS + 1
        assert got.filter(pc.not_equal(got.column("_id"), "after")).select(META + ["tailnum", "time_hour"]).equals(want)
    finally:
        restored.close()


def test_a_replica_promoted_after_parts_written_once_holds_them_all(tmp_path: Path, flights: pa.Table,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MIN_ROWS, str(ROWS))
    cluster = Cluster(store=f"file://{tmp_path / 'store'}", data_dir=str(tmp_path / "nodes"), nodes=2,
                      recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        cluster.wait_for_health("green", timeout=60)
        load(cluster, "docs", flights)
        assert cluster.primary_copy("docs", 0)._write_once.written == PARTS
        want = everything(cluster, "docs").select(META + ["dest", "arr_delay"])
        old = cluster.primary_of("docs", 0)
        cluster.kill_node(old)
        assert cluster.primary_of("docs", 0) not in (None, old)
        assert everything(cluster, "docs").select(META + ["dest", "arr_delay"]).equals(want)
        assert not cluster.bulk("docs", flights.slice(0, 10).set_column(0, "_id", pa.array(
            [f"n{i}" for i in range(10)]))).errors
        cluster.refresh("docs")
        assert cluster.count("docs") == ROWS * PARTS + 10
    finally:
        cluster.close()
