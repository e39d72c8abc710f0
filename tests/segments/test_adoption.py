"""Adopting a file as a stamped segment (``ShardDirectory.adopt``, segments/adoption.py): the shard ends as if the
file's rows had been indexed as one bulk in file order at seq#s ``S..`` (docs/design/adoption.md)."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.core.ops import OpType
from shardstore.segments.adoption import reapply_plan
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.errors import MappingConflict, SegmentError
from shardstore.segments.stamp import Stamp
from shardstore.translog.operations import index_batch, stamp, unstamped_batch

MAPPING = {"v": {"type": "long"}, "s": {"type": "keyword"}}


# -- the decision, against a plain Python oracle -----------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.sampled_from("abcdefg"), max_size=30), seen=st.sets(st.sampled_from("abcdefg")),
       versions=st.dictionaries(st.sampled_from("abcdefg"), st.integers(1, 9)))
def test_reapply_plan_is_a_bulk_in_file_order(ids, seen, versions) -> None:
    counts = Counter(ids)
    so_far: Counter = Counter()
    want_rows, want_versions = [], []
    for r, i in enumerate(ids):
        if i in seen or counts[i] > 1:
            want_rows.append(r)
            want_versions.append(versions.get(i, 0) + so_far[i] + 1)
        so_far[i] += 1
    got = reapply_plan(pa.array(ids, pa.string()), np.array([i in seen for i in ids], dtype=bool),
                       pa.array([versions.get(i) for i in ids], pa.int64()))
    assert got.rows.tolist() == want_rows and got.versions.tolist() == want_versions


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 10**6), unique=True, max_size=80), seen=st.lists(st.booleans(), max_size=80),
       given_versions=st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=80, max_size=80)))
def test_reapply_plan_of_distinct_ids_skips_the_sort_and_answers_the_same(ids, seen, given_versions) -> None:
    """``distinct`` (the caller's id index saw no repeat) gives the plan the full pass gives."""
    arr = pa.array([f"d{i}" for i in ids], pa.string())
    flags = np.array((seen + [False] * len(ids))[:len(ids)], dtype=bool)
    versions = pa.array([3 if f else None for f in flags], pa.int64())
    given_np = None if given_versions is None else np.array(given_versions[:len(ids)], dtype=np.int64)
    want = reapply_plan(arr, flags, versions, given_np)
    got = reapply_plan(arr, flags, versions, given_np, distinct=True)
    assert got.rows.tolist() == want.rows.tolist() and got.versions.tolist() == want.versions.tolist()


def test_reapply_plan_refuses_columns_of_other_lengths() -> None:
    with pytest.raises(ValueError, match="2 ids, 1 seen flags"):
        reapply_plan(pa.array(["a", "b"]), np.array([True]), pa.array([1, 2]))


# -- the directory: adopt vs. the same rows indexed --------------------------------------------------------------

def _source(i: str, v: int | None, s: str | None) -> bytes:
    return json.dumps({k: x for k, x in (("v", v), ("s", s)) if x is not None}).encode()


def _history(d: ShardDirectory, steps: list[tuple[str, str, int]]) -> int:
    """Index/delete ops one at a time at seq# 0.., versions as a primary gives them; refresh on 'r'; the next seq#."""
    seq = 0
    for kind, doc_id, v in steps:
        if kind == "r":
            d.refresh()
            continue
        version = int(d.current_version_numbers([doc_id], pa.array([doc_id]))[0]) + 1
        if kind == "i":
            batch = index_batch([doc_id], [_source(doc_id, v, f"s{v % 3}")], [version])
        else:
            batch = unstamped_batch([OpType.DELETE], [doc_id], [version], [None])
        d.apply(stamp(batch, seq, 1))
        seq += 1
    return seq


def _state(d: ShardDirectory, ids: list[str]) -> dict:
    gets = {}
    for i in ids:
        doc = d.get(i)
        gets[i] = None if doc is None else (doc["_seq_no"], doc["_primary_term"], doc["_version"],
                                            json.loads(doc["_source"]), doc["v"], doc["s"])
    rows = [r for b in d.scan(["_id", "_seq_no", "_version", "v", "s"]) for r in b.to_pylist()]
    return {"gets": gets, "count": d.count(), "scan": sorted(rows, key=lambda r: r["_id"])}


_step = st.tuples(st.sampled_from("iidr"), st.sampled_from([f"k{j}" for j in range(8)]), st.integers(0, 99))
_row = st.tuples(st.sampled_from([f"k{j}" for j in range(12)]), st.one_of(st.none(), st.integers(-5, 5)),
                 st.one_of(st.none(), st.sampled_from(["x", "y"])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(_step, max_size=14), rows=st.lists(_row, min_size=1, max_size=16), term=st.integers(1, 3),
       with_source=st.booleans())
def test_an_adopted_file_reads_as_its_rows_indexed_in_order(tmp_path_factory, history, rows, term,
                                                            with_source) -> None:
    tmp = tmp_path_factory.mktemp("adopt")
    ids = sorted({i for _k, i, _v in history} | {r[0] for r in rows})
    with ShardDirectory(str(tmp / "a"), mapping=MAPPING, fsync=False, warm=False) as a, \
            ShardDirectory(str(tmp / "b"), mapping=MAPPING, fsync=False, warm=False) as b:
        first = _history(a, history)
        assert _history(b, history) == first
        path = str(tmp / "file.parquet")
        columns = {"_id": pa.array([r[0] for r in rows], pa.string()),
                   "v": pa.array([r[1] for r in rows], pa.int64()), "s": pa.array([r[2] for r in rows], pa.string())}
        if with_source:  # a file that keeps each row's JSON (rows rebuild the same document either way)
            columns["_source"] = pa.array([_source(*r) for r in rows], pa.binary())
        pq.write_table(pa.table(columns), path, row_group_size=5)
        done = a.adopt(path, Stamp(first, term))
        assert done.rows == len(rows)
        for r, (doc_id, v, s) in enumerate(rows):  # the oracle: the same rows, one bulk in file order
            version = int(b.current_version_numbers([doc_id], pa.array([doc_id]))[0]) + 1
            b.apply(stamp(index_batch([doc_id], [_source(doc_id, v, s)], [version]), first + r, term))
        assert a.max_seq_no == b.max_seq_no == first + len(rows) - 1
        assert _state(a, ids)["gets"] == _state(b, ids)["gets"]  # realtime (a's rows are searchable already)
        a.refresh()
        b.refresh()
        assert _state(a, ids) == _state(b, ids)
        a.flush(local_checkpoint=a.max_seq_no, primary_term=1)
        b.flush(local_checkpoint=b.max_seq_no, primary_term=1)
    with ShardDirectory(str(tmp / "a"), fsync=False, warm=False) as a, \
            ShardDirectory(str(tmp / "b"), fsync=False, warm=False) as b:  # reopened from their commits
        assert _state(a, ids) == _state(b, ids)
        a.force_merge(1)
        b.force_merge(1)
        assert _state(a, ids) == _state(b, ids)


_big_step = st.tuples(st.sampled_from("iiidr"), st.integers(0, 199).map(lambda j: f"k{j}"), st.integers(0, 99))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(_big_step, max_size=40), picks=st.permutations(range(300)), size=st.integers(65, 300))
def test_a_file_of_distinct_ids_is_found_through_its_own_sorted_fingerprints(tmp_path_factory, history, picks,
                                                                             size) -> None:
    """More distinct ids than a small lookup takes (65 and up): the directory finds them through the file's own id
    index (``ShardIdIndex.lookup``'s ``presorted``, ``reapply_plan``'s ``distinct``).  The primary's adoption
    reads as the same rows indexed one by one, and a replica's (the primary's versions given) as the primary's."""
    tmp = tmp_path_factory.mktemp("adopt-big")
    rows = [(f"k{j}", j % 7, f"s{j % 3}") for j in picks[:size]]
    ids = sorted({i for _k, i, _v in history} | {r[0] for r in rows})
    with ShardDirectory(str(tmp / "a"), mapping=MAPPING, fsync=False, warm=False) as a, \
            ShardDirectory(str(tmp / "b"), mapping=MAPPING, fsync=False, warm=False) as b, \
            ShardDirectory(str(tmp / "c"), mapping=MAPPING, fsync=False, warm=False) as c:
        first = _history(a, history)
        assert _history(b, history) == first == _history(c, history)
        path = str(tmp / "file.parquet")
        pq.write_table(pa.table({"_id": pa.array([r[0] for r in rows], pa.string()),
                                 "v": pa.array([r[1] for r in rows], pa.int64()),
                                 "s": pa.array([r[2] for r in rows], pa.string())}), path, row_group_size=50)
        done = a.adopt(path, Stamp(first, 1))
        replica = c.adopt(path, Stamp(first, 1), versions=done.versions)
        assert replica.versions.tolist() == done.versions.tolist()
        for r, (doc_id, v, s) in enumerate(rows):
            version = int(b.current_version_numbers([doc_id], pa.array([doc_id]))[0]) + 1
            assert done.versions[r] == version, (doc_id, r)
            b.apply(stamp(index_batch([doc_id], [_source(doc_id, v, s)], [version]), first + r, 1))
        for d in (a, b, c):
            d.refresh()
        assert _state(a, ids) == _state(b, ids) == _state(c, ids)


def test_an_adopted_segment_survives_a_reopen_and_a_merge_writes_its_columns(tmp_path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"_id": [f"d{i}" for i in range(100)], "v": list(range(100)),
                             "s": ["a"] * 100}), path)
    with ShardDirectory(str(tmp_path / "d"), mapping=MAPPING, fsync=False, warm=False) as d:
        d.apply(stamp(index_batch(["d5"], [b'{"v": -5}']), 0, 1))
        done = d.adopt(path, Stamp(1, 1))
        pq.write_table(pa.table({"_id": ["zz"], "v": [0], "s": ["b"]}), path)  # rewritten in place: a copy was taken
        d.verify()
        assert (done.rows, done.reapplied) == (100, 1)  # d5 was there: applied again at seq# 6, version 2
        assert d.get("d5")["_seq_no"] == 6 and d.get("d5")["_version"] == 2 and d.get("d7")["_seq_no"] == 8
        commit = d.flush(local_checkpoint=100, primary_term=1, merge=False)
        stamped = [s for s in commit.segments if s.info.stamp is not None]
        assert len(stamped) == 1 and stamped[0].info.stamp == Stamp(1, 1) and stamped[0].deleted_count == 1
    os.unlink(path)  # the directory holds its own link
    with ShardDirectory(str(tmp_path / "d"), fsync=False, warm=False) as d:
        assert d.count() == 100 and d.get("d99")["_seq_no"] == 100
        d.force_merge(1)
        merged = [s for s in d.flush(local_checkpoint=100, primary_term=1).segments]
        assert len(merged) == 1 and merged[0].info.stamp is None
        assert d.get("d99")["_seq_no"] == 100 and d.count() == 100


def test_adopt_refuses_and_changes_nothing(tmp_path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"_id": ["a", "b"], "v": [1, 2], "w": [1.0, 2.0]}), path)
    with ShardDirectory(str(tmp_path / "d"), mapping=MAPPING, fsync=False, warm=False) as d:
        d.apply(stamp(index_batch(["z"], [b'{"v": 1}']), 0, 1))
        with pytest.raises(SegmentError, match="at or below the directory's max seq# 0"):
            d.adopt(path, Stamp(0, 1))
        with pytest.raises(MappingConflict, match="'w'"):  # an unmapped field
            d.adopt(path, Stamp(1, 1))
        pq.write_table(pa.table({"_id": ["a"], "v": ["not a long"]}), path)
        with pytest.raises(MappingConflict, match="'v'"):
            d.adopt(path, Stamp(1, 1))
        pq.write_table(pa.table({"_id": ["a"], "_seq_no": [4], "v": [1]}), path)
        with pytest.raises(ValueError, match="no \\['_seq_no'\\]"):
            d.adopt(path, Stamp(1, 1))
        pq.write_table(pa.table({"_id": ["a"], "_source": ['{"v": 1}'], "v": [1]}), path)  # a string _source
        with pytest.raises(ValueError, match="_source is string"):
            d.adopt(path, Stamp(1, 1))
        pq.write_table(pa.table({"_id": pa.array(["a"]).dictionary_encode(), "v": [1]}), path)
        with pytest.raises(ValueError, match="_id is dictionary"):
            d.adopt(path, Stamp(1, 1))
        assert d.max_seq_no == 0 and d.count() == 0 and d.get("a") is None
        assert sorted(f for f in os.listdir(d.path) if f.endswith(".parquet")) == []
    shutil.rmtree(tmp_path / "d")


@pytest.mark.parametrize("replica", [False, True])
def test_a_held_view_shows_an_adopted_file_only_at_its_release(tmp_path, replica: bool) -> None:
    """A job holds the view (a replica's hold defers its pin: segments/held_view.py); a file adopted meanwhile shows
    at the release, not before, on a primary and on a replica whose deferred view pins at the adopt."""
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"_id": [f"d{i}" for i in range(50)], "v": list(range(50))}), path)
    with ShardDirectory(str(tmp_path / "d"), mapping=MAPPING, fsync=False, warm=False) as d:
        d.apply(stamp(index_batch(["a", "b"], [b'{"v": 1}', b'{"v": 2}']), 0, 1))
        d.hold_view("job", 30.0, refresh=not replica)
        d.adopt(path, Stamp(2, 1))
        assert d.count() == 2  # what was acknowledged before the job, not the file
        assert d.get("d7")["_seq_no"] == 9  # gets are realtime
        d.release_view("job", refresh=True)
        assert d.count() == 52
