"""Unsorted segments (format 2): rows in any order, an id possibly twice; every lookup goes through the id index."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments.errors import SegmentCorrupted
from shardstore.segments.segment import (
    FORMAT_VERSION,
    MAX_FORMAT_VERSION,
    UNSORTED_FORMAT_VERSION,
    SegmentInfo,
    SegmentReader,
    in_id_order,
    lookup_segments,
    write_segment,
)


def _table(ids: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table({
        "_id": pa.array(ids, pa.string()),
        "_seq_no": pa.array(range(n), pa.int64()),
        "_primary_term": pa.array([1] * n, pa.int64()),
        "_version": pa.array([1] * n, pa.int64()),
        "_source": pa.nulls(n, pa.binary()),
        "n": pa.array(range(n), pa.int64()),
    })


def test_unsorted_write_records_format_2_and_true_id_bounds(tmp_path) -> None:
    ids = ["m", "b", "z", "a", "b", "q"]
    path = str(tmp_path / "u.parquet")
    info = write_segment(path, _table(ids), name="u", sort=False, row_group_size=2, fsync=False)
    assert info.format_version == UNSORTED_FORMAT_VERSION and not info.id_sorted
    assert (info.min_id, info.max_id) == ("a", "z")  # not the first and last rows
    r = SegmentReader(path, info)
    assert r.take(list(range(6)), ["_id"]).column("_id").to_pylist() == ids  # the given order is kept
    meta = r.read_metadata_info()
    assert meta["format_version"] == UNSORTED_FORMAT_VERSION and meta["sorted_by"] is None
    md = pq.ParquetFile(path).metadata
    assert not any(md.row_group(g).sorting_columns for g in range(md.num_row_groups))  # declares no order
    back = SegmentInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert back == info and not back.id_sorted


def test_sorted_input_stays_format_1(tmp_path) -> None:
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, _table(["a", "b", "b", "c"]), name="s", sort=False, fsync=False)
    assert info.format_version == FORMAT_VERSION and info.id_sorted
    info = write_segment(str(tmp_path / "t.parquet"), _table(["c", "a"]), name="t", fsync=False)  # sorted here
    assert info.format_version == FORMAT_VERSION and info.id_sorted


def test_a_newer_format_is_refused_with_its_version_and_one_below_1_as_corrupt() -> None:
    d = SegmentInfo("x", "x.parquet", 1, 0, 0, -1, -1, 0, None, None).to_dict()
    d["format_version"] = MAX_FORMAT_VERSION + 1
    with pytest.raises(UnsupportedFormatVersion, match=str(MAX_FORMAT_VERSION + 1)):
        SegmentInfo.from_dict(d, "commit c")
    d["format_version"] = 0
    with pytest.raises(SegmentCorrupted, match="format version 0"):
        SegmentInfo.from_dict(d, "commit c")


def test_ids_with_a_null_are_never_in_order() -> None:
    assert in_id_order(pa.array(["a", "b"])) and not in_id_order(pa.array(["a", None, "b"]))


_ids = st.text(alphabet="abcé\x00z", min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ids, min_size=2, max_size=200), st.lists(_ids, max_size=90), st.integers(1, 40),
       st.sampled_from(["cold", "loaded"]))
def test_unsorted_lookup_matches_brute_force(tmp_path, seg_ids, queries, rg, mode) -> None:
    """Every row of every queried id, small (a get) and batch lookups, index cold or loaded.

    Through the sorted format's binary searches these rows are missed (seen failing before
    lookups checked the format).
    """
    assume(not in_id_order(pa.array(seg_ids, pa.string())))  # an unsorted segment
    path = str(tmp_path / f"h{abs(hash((tuple(seg_ids), rg)))}.parquet")
    info = write_segment(path, _table(seg_ids), name="h", sort=False, row_group_size=rg, fsync=False)
    assert not info.id_sorted
    r = SegmentReader(path, info)
    if mode == "loaded":
        assert r.ids().to_pylist() == seg_ids  # row order, as written
    qp, rows = r.lookup(pa.array(queries, pa.string()))
    got = list(zip(qp.to_pylist(), rows.to_pylist()))
    want = sorted((k, row) for k, q in enumerate(queries) for row, i in enumerate(seg_ids) if i == q)
    assert got == want  # every pair, ascending by query position then row
    for q in queries[:3]:  # get: every copy of the id
        assert sorted(r.get(q, ["n"]).column("n").to_pylist()) == [k for k, i in enumerate(seg_ids) if i == q]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_ids, min_size=2, max_size=120), st.lists(_ids, min_size=2, max_size=120),
       st.lists(_ids, min_size=65, max_size=150))
def test_lookup_segments_over_unsorted_segments_matches_brute_force(tmp_path, a, b, queries) -> None:
    """Over SMALL_LOOKUP ids over two unsorted segments: the queries' fingerprints computed once, as a refresh does."""
    readers = []
    for k, seg_ids in enumerate((a, b)):
        path = str(tmp_path / f"m{k}{abs(hash((tuple(a), tuple(b))))}.parquet")
        readers.append(SegmentReader(path, write_segment(path, _table(seg_ids), name=f"m{k}", sort=False,
                                                         row_group_size=7, fsync=False)))
    q = pa.array(queries, pa.string())
    qpos, seg, rows = lookup_segments(readers, q)
    got = sorted(zip(qpos.to_pylist(), seg.to_pylist(), rows.to_pylist()))
    want = sorted((p, k, row) for p, x in enumerate(queries) for k, seg_ids in enumerate((a, b))
                  for row, i in enumerate(seg_ids) if i == x)
    assert got == want


def test_a_shard_directory_over_an_unsorted_segment_updates_deletes_and_merges_it_sorted(tmp_path) -> None:
    """What the engine does with a Spark fast-path segment: gets, a refresh's version lookups, a merge back to format 1."""
    import os

    from shardstore.core.records import crc32c
    from shardstore.segments.commit import CommitPoint, CommittedSegment, write_commit
    from shardstore.segments.directory import ShardDirectory
    from shardstore.segments.livedocs import LiveDocs, livedocs_file_name
    from shardstore.segments.segment import segment_file_name
    from tests.segments.test_segments_directory import deletes, docs, live_ids

    ids = [f"k{i}" for i in range(40, 0, -1)] + ["k7", "k3"]  # descending, then k7 and k3 again (their later writes)
    n = len(ids)
    t = _table(ids).drop_columns(["_source", "n"])
    t = t.append_column("_source", pa.array([json.dumps({"n": s}).encode() for s in range(n)], pa.binary()))
    t = t.append_column("n", pa.array(range(n), pa.int64()))
    directory = str(tmp_path / "shard")
    os.makedirs(directory)
    info = write_segment(os.path.join(directory, segment_file_name("seg_spark")), t, name="seg_spark", sort=False,
                         row_group_size=8, fsync=False)
    assert not info.id_sorted
    live = LiveDocs.all_live(n).delete([ids.index("k7"), ids.index("k3")])  # the older copies, as the sink commits
    data = live.encode()
    lname = livedocs_file_name("seg_spark", 1)
    with open(os.path.join(directory, lname), "wb") as f:
        f.write(data)
    cs = CommittedSegment(info, 1, lname, len(data), crc32c(data), live.deleted_count)
    write_commit(directory, CommitPoint(1, 1, (cs,), n - 1, n - 1, "", 0, "h", {"n": "long"}, {}))

    with ShardDirectory(directory, fsync=False, warm=False) as sd:
        assert sd.count() == 40 and sd.get("k7")["n"] == n - 2 and sd.get("k3")["n"] == n - 1  # the later writes
        assert sd.get("k40")["n"] == 0 and sd.get("nope") is None
        sd.apply(docs(n, ["k7", "k20", "new"]))  # updates: the live copies are found in the unsorted segment
        sd.apply(deletes(n + 3, ["k3", "k40"]))
        r = sd.refresh()
        assert (r.indexed, r.deleted, r.stale) == (3, 4, 0)  # old copies of k7, k20; k3, k40 deleted
        got = live_ids(sd)  # one live copy per id
        assert len(got) == 39 and got["k7"] == n and got["k20"] == n + 1 and "k3" not in got and "k40" not in got
        merged = sd.force_merge(1)
        assert len(merged) == 1 and live_ids(sd) == got
        [(reader, _live)] = sd.searchable_segments()
        assert reader.info.id_sorted and reader.ids().to_pylist() == sorted(got)  # merged back into format 1
        assert sd.get("k7")["n"] == n and sd.get("k3") is None
