"""Stamped segments (format 3, segments/stamp.py): a file with no metadata columns reads exactly as the same rows
written out with ``_seq_no = base + row``, one term, version 1 and a null ``_source`` (docs/design/adoption.md)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.blobstores import open_store
from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments.errors import SegmentCorrupted
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.read_plan import ReadTask
from shardstore.segments.remote_metadata import RemoteFile
from shardstore.segments.row_cache import row_groups
from shardstore.segments.scan_readers import scan_readers
from shardstore.segments.segment import (
    MAX_FORMAT_VERSION,
    SegmentInfo,
    SegmentReader,
    lookup_segments,
    write_segment,
)
from shardstore.segments.segment_info import STAMPED_FORMAT_VERSION
from shardstore.segments.segment_writer import stamped_info
from shardstore.segments.stamp import Stamp

T0 = datetime(2013, 1, 1, tzinfo=timezone.utc)


def _fields(ids: list[str], seed: int) -> pa.Table:
    """Rows as another engine writes them: ``_id`` and typed fields, no metadata columns."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    v = rng.integers(-50, 50, n)
    return pa.table({
        "_id": pa.array(ids, pa.string()),
        "v": pa.array([None if x % 7 == 0 else int(x) for x in v], pa.int64()),
        "carrier": pa.array([["UA", "AA", "B6", None][int(x) % 4] for x in v], pa.string()),
        "time_hour": pa.array([T0 + timedelta(hours=int(x)) for x in v], pa.timestamp("ms", tz="UTC")),
    })


def _pair(tmp_path, ids: list[str], base: int, term: int, rg: int, seed: int = 0
          ) -> tuple[SegmentReader, SegmentReader]:
    """The same rows as a stamped segment and as a segment written out with its stamp's values."""
    fields = _fields(ids, seed)
    stamped_path = str(tmp_path / "stamped.parquet")
    pq.write_table(fields, stamped_path, row_group_size=rg)  # as Spark's writer would: no shardstore metadata
    info = stamped_info(stamped_path, "stamped", Stamp(base, term))
    n = len(ids)
    full = pa.table({
        "_id": fields.column("_id"),
        "_seq_no": pa.array(np.arange(base, base + n), pa.int64()),
        "_primary_term": pa.array([term] * n, pa.int64()),
        "_version": pa.array([1] * n, pa.int64()),
        "_source": pa.nulls(n, pa.binary()),
        **{c: fields.column(c) for c in ("v", "carrier", "time_hour")},
    })
    written = write_segment(str(tmp_path / "written.parquet"), full, name="written", sort=False, fsync=False,
                            row_group_size=rg)
    return SegmentReader(stamped_path, info), SegmentReader(str(tmp_path / "written.parquet"), written)


def _scan(reader: SegmentReader, **kw) -> pa.Table:
    batches = list(reader.scan(**kw))
    return pa.Table.from_batches(batches, schema=reader.schema if not kw.get("columns") else None) if batches \
        else pa.table({})


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.column_names == b.column_names
    assert a.to_pylist() == b.to_pylist()


_ids = st.lists(st.text(alphabet="abcdé", min_size=1, max_size=3), min_size=1, max_size=120)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=_ids, base=st.integers(0, 10_000), term=st.integers(1, 9), rg=st.integers(1, 40),
       deleted=st.lists(st.integers(0, 119), max_size=30), seed=st.integers(0, 3))
def test_a_stamped_segment_reads_as_the_same_rows_written_out(tmp_path_factory, ids, base, term, rg, deleted,
                                                                 seed) -> None:
    tmp = tmp_path_factory.mktemp("s")
    stamped, written = _pair(tmp, ids, base, term, rg, seed)
    n = len(ids)
    assert stamped.info.format_version == STAMPED_FORMAT_VERSION and not stamped.info.id_sorted
    assert (stamped.info.min_seq_no, stamped.info.max_seq_no, stamped.info.max_primary_term) == \
        (written.info.min_seq_no, written.info.max_seq_no, written.info.max_primary_term)
    assert (stamped.info.min_id, stamped.info.max_id) == (written.info.min_id, written.info.max_id)
    assert {c.name: (c.min, c.max, c.null_count) for c in stamped.info.columns} == \
        {c.name: (c.min, c.max, c.null_count) for c in written.info.columns}
    assert stamped.schema.names == written.schema.names
    # whole scans, with and without deletions, and filters on a stamped column and on a field
    live = LiveDocs.all_live(n).delete(sorted({r for r in deleted if r < n}))
    for kw in ({}, {"live": live}, {"columns": ["_seq_no", "v"], "filter": pc.field("_seq_no") >= base + n // 2},
               {"columns": ["_id", "_version", "_primary_term"], "filter": pc.field("v") > 0, "live": live},
               {"filter": (pc.field("_seq_no") < base + 3) | (pc.field("v") < 0)}):
        _same(_scan(stamped, **kw), _scan(written, **kw))
    # version lookups, takes and point reads (through the row cache)
    for a, b in zip(stamped.version_columns(), written.version_columns()):
        assert a.equals(b)
    assert stamped.seq_nos().equals(written.seq_nos())
    rows = np.random.default_rng(seed).integers(0, n, size=min(n, 10))
    _same(stamped.take(rows), written.take(rows))
    _same(stamped.take(rows, ["_seq_no", "carrier"]), written.take(rows, ["_seq_no", "carrier"]))
    for r in rows.tolist():
        assert stamped.row(r) == written.row(r)
    q = pa.array(sorted(set(ids))[:70] + ["zz"], pa.string())
    assert [x.to_pylist() for x in lookup_segments([stamped], q)] == \
        [x.to_pylist() for x in lookup_segments([written], q)]


def test_a_stamped_segment_rebuilds_its_source_and_reads_through_a_read_task(tmp_path) -> None:
    ids = [f"d{i}" for i in range(50)] + ["d3"]
    stamped, written = _pair(tmp_path, ids, 100, 2, 8)
    mapping = Mapping.from_dict({"v": {"type": "long"}, "carrier": {"type": "keyword"},
                                 "time_hour": {"type": "date"}})
    live = LiveDocs.all_live(len(ids))
    got = pa.Table.from_batches(list(scan_readers([(stamped, live)], mapping, ["_id", "_seq_no", "_source"])))
    want = pa.Table.from_batches(list(scan_readers([(written, live)], mapping, ["_id", "_seq_no", "_source"])))
    _same(got, want)
    row = written.row(1)
    source = json.loads(got.column("_source")[1].as_py())  # rebuilt from the row's fields, null ones left out
    hour = row["time_hour"]
    assert source["time_hour"] == hour.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert {k: source.get(k) for k in ("v", "carrier")} == {"v": row["v"], "carrier": row["carrier"]}
    # a read task (Spark's Python path) fetches the file from the store, checks it, and makes the columns too
    store = open_store(f"file://{tmp_path}/store", create="true")
    tasks = []
    for reader in (stamped, written):
        with open(reader.path, "rb") as f:
            store.put(f"seg/{reader.info.file_name}", f.read())
        remote = RemoteFile(f"seg/{reader.info.file_name}", reader.info.size, reader.info.checksum)
        tasks.append(ReadTask(0, reader.info, remote, None, (0, reader.info.row_groups), order=tuple(mapping.order)))
    schema = pa.schema([pa.field("_id", pa.string()), pa.field("_seq_no", pa.int64()), pa.field("_version", pa.int64()),
                        pa.field("_source", pa.binary()), pa.field("v", pa.int64())])
    reads = [pa.Table.from_batches(list(t.read(store, schema, filter=pc.field("_seq_no") > 110,
                                               cache_dir=str(tmp_path / "cache")))) for t in tasks]
    _same(reads[0], reads[1])
    assert reads[0].num_rows == len(ids) - 11 and reads[0].column("_source").null_count == 0


def test_a_stamped_segment_merges_into_one_with_real_columns(tmp_path) -> None:
    ids = [f"d{i:03d}" for i in range(200)]
    stamped, _written = _pair(tmp_path, ids, 7, 3, 16)
    live = LiveDocs.all_live(200)
    merged_rows = pa.Table.from_batches(list(stamped.scan(live=live)))
    merged = write_segment(str(tmp_path / "m.parquet"), merged_rows, name="m", fsync=False)
    reader = SegmentReader(str(tmp_path / "m.parquet"), merged)
    assert merged.stamp is None and (merged.min_seq_no, merged.max_seq_no, merged.max_primary_term) == (7, 206, 3)
    assert pq.read_table(reader.path, columns=["_seq_no"]).column(0).to_pylist() == list(range(7, 207))


def test_a_stamp_is_refused_where_it_does_not_belong(tmp_path) -> None:
    written = write_segment(str(tmp_path / "w.parquet"), pa.table({
        "_id": ["a"], "_seq_no": [0], "_primary_term": [1], "_version": [1], "_source": pa.nulls(1, pa.binary())}),
        name="w", fsync=False)
    with pytest.raises(ValueError, match="holds _id and no"):
        stamped_info(str(tmp_path / "w.parquet"), "w", Stamp(0, 1))
    with pytest.raises(ValueError, match="seq_no_base >= 0"):
        Stamp(-1, 1)
    d = written.to_dict()
    d["format_version"] = STAMPED_FORMAT_VERSION  # format 3 with no stamp: a corrupt entry, named
    with pytest.raises(SegmentCorrupted, match="segment x"):
        SegmentInfo.from_dict(d, "segment x")
    d["stamp"] = {"seq_no_base": 0, "primary_term": 1}
    assert SegmentInfo.from_dict(d).stamp == Stamp(0, 1)
    d["format_version"] = MAX_FORMAT_VERSION + 1
    with pytest.raises(UnsupportedFormatVersion):
        SegmentInfo.from_dict(d)
    assert SegmentInfo.from_dict(stamped_info(*_pair_file(tmp_path), "s", Stamp(5, 1)).to_dict()).stamp == Stamp(5, 1)


def _pair_file(tmp_path) -> tuple[str]:
    path = str(tmp_path / "only_ids.parquet")
    pq.write_table(pa.table({"_id": ["a", "b"]}), path)
    return (path,)


def test_the_row_cache_holds_a_stamped_groups_virtual_columns(tmp_path) -> None:
    stamped, written = _pair(tmp_path, [f"d{i}" for i in range(30)], 40, 1, 10)
    assert stamped.row(25)["_seq_no"] == 65 == written.row(25)["_seq_no"]
    cached = row_groups.peek((stamped.path, stamped.info.checksum, 2))
    assert cached is not None and cached.column("_seq_no").to_pylist() == list(range(60, 70))
    assert os.path.getsize(stamped.path) == stamped.info.size


def test_a_commit_holding_an_adopted_file_reads_back_from_the_store(tmp_path) -> None:
    from shardstore.core.address import ShardAddress
    from shardstore.segments.directory import ShardDirectory
    from shardstore.segments.reader import open_commit
    from shardstore.segments.remote_store import RemoteSegmentStore
    from shardstore.translog.operations import index_batch, stamp

    address = ShardAddress("cluster-s", "index-s", 0)
    store = open_store(f"file://{tmp_path}/store", create="true")
    path = str(tmp_path / "f.parquet")
    pq.write_table(_fields([f"d{i:03d}" for i in range(300)], 1), path, row_group_size=64)
    mapping = {"v": {"type": "long"}, "carrier": {"type": "keyword"}, "time_hour": {"type": "date"}}
    with ShardDirectory(str(tmp_path / "local"), mapping=mapping, fsync=False, warm=False) as d:
        d.apply(stamp(index_batch(["d001", "x"], [b'{"v": 7}', b'{"v": 8}']), 0, 1))
        d.adopt(path, Stamp(2, 1))
        commit = d.flush(local_checkpoint=d.max_seq_no, primary_term=1, merge=False)
        RemoteSegmentStore(store, address, 1).upload(d.path, commit)
        local = {r["_id"]: r for b in d.scan(["_id", "_seq_no", "_version", "v", "carrier"]) for r in b.to_pylist()}
    reader = open_commit(store, address, cache_dir=str(tmp_path / "cache"))
    assert any(s.info.stamp == Stamp(2, 1) for s in reader.commit.segments)
    remote = {r["_id"]: r for b in reader.scan(["_id", "_seq_no", "_version", "v", "carrier"]) for r in b.to_pylist()}
    assert remote == local and len(remote) == 301
    assert remote["d000"]["_seq_no"] == 2 and remote["d001"]["_seq_no"] == 3 and remote["d001"]["_version"] == 2
    assert reader.get("d299")["_seq_no"] == 301
    tasks = reader.plan().tasks(row_groups_per_task=2)
    schema = pa.schema([pa.field("_id", pa.string()), pa.field("_seq_no", pa.int64()), pa.field("_source", pa.binary())])
    read = {r["_id"]: r for t in tasks for b in t.read(store, schema, cache_dir=str(tmp_path / "cache2"))
            for r in b.to_pylist()}
    assert {i: r["_seq_no"] for i, r in read.items()} == {i: r["_seq_no"] for i, r in remote.items()}
    assert all(r["_source"] is not None for r in read.values())
