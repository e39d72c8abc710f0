"""A refresh writes in buffer order (docs/design/segments.md, "Refreshed segments keep the buffer's order").

``buffer_order`` is the pure decision: the winners' rows (found in ``_id`` order) put back in buffer order, and
the permutation that does it, which the sealed write applies to the winners' staleness flags too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.segments.refresh_plan import buffer_order
from shardstore.segments.segment import SegmentReader, write_segment


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)), st.integers(0, n))))
def test_buffer_order_is_keep_ascending_and_its_permutation(case: tuple[int, list[int], int]) -> None:
    n, shuffled, k = case
    keep = pa.array(shuffled[:k], pa.int64())  # any subset of the rows, in any order (a winner's row once)
    rows, perm = buffer_order(keep, n)
    got = rows.to_pylist()
    assert got == sorted(shuffled[:k])
    assert got == [shuffled[i] for i in perm]  # rows == keep[perm]: flags per keep entry follow with [perm]
    assert sorted(perm.tolist()) == list(range(k))


def test_buffer_order_refuses_a_row_named_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        buffer_order(pa.array([3, 1, 3], pa.int64()), 5)


def _docs(ids: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table({"_id": pa.array(ids, pa.string()), "_seq_no": pa.array(np.arange(n), pa.int64()),
                     "_primary_term": pa.array(np.ones(n, np.int64)), "_version": pa.array(np.ones(n, np.int64)),
                     "_source": pa.array([b"{}"] * n, pa.binary())})


def test_a_segment_of_rows_in_buffer_order_is_unsorted_unless_its_ids_ascend(tmp_path) -> None:
    """``write_segment(rows=..., sort=False)``: rows not in id order make format 2 with the right bounds; a run of
    consecutive rows is written as a slice, the same rows as a take; ``sort=True`` still refuses them."""
    ids = [f"d{(i * 7) % 50:02d}" for i in range(50)]  # not in id order
    table = _docs(ids)
    run = pa.array(np.arange(10, 40), pa.int64())  # consecutive rows: sliced
    gaps = pa.array(np.arange(0, 50, 2), pa.int64())  # ascending with gaps: taken
    for name, rows in (("run", run), ("gaps", gaps)):
        path = str(tmp_path / f"{name}.parquet")
        info = write_segment(path, table, name=name, rows=rows, sort=False, fsync=False)
        want = [ids[i] for i in rows.to_pylist()]
        assert not info.id_sorted and (info.min_id, info.max_id) == (min(want), max(want))
        reader = SegmentReader(path, info)
        assert reader.ids().to_pylist() == want
        assert reader.seq_nos().to_pylist() == rows.to_pylist()
        q, r = reader.lookup(pa.array([want[3], "nope"], pa.string()))
        assert q.to_pylist() == [0] and r.to_pylist() == [3]
    with pytest.raises(ValueError, match="not in _id order"):
        write_segment(str(tmp_path / "refused.parquet"), table, name="refused", rows=run, fsync=False)
    ascending = pa.array([i for i in np.argsort(ids)[:20]], pa.int64())  # ids ascending, rows in any order
    info = write_segment(str(tmp_path / "sorted.parquet"), table, name="sorted", rows=ascending, sort=False,
                         fsync=False)
    assert info.id_sorted  # ids that happen to ascend stay format 1
    want = sorted(ids)[:20]
    reader = SegmentReader(str(tmp_path / "sorted.parquet"), info)
    assert reader.ids().to_pylist() == want, (reader.ids().to_pylist(), want)
    assert reader.get(want[7]).column("_id").to_pylist() == [want[7]]


@pytest.mark.parametrize("rows", [[1, 0, 2], [0, 2, 1], [2, 3, 4], [4], [0, 1, 3], [3, 2]])
def test_take_rows_slices_only_a_run_of_consecutive_ascending_rows(rows: list[int]) -> None:
    """``take_rows`` equals ``take`` always; only rows ``first, first + 1, ...`` share the table's buffers."""
    from shardstore.core.arrays import take_rows

    table = _docs([f"d{i}" for i in range(6)])
    got = take_rows(table, pa.array(rows, pa.int64()))
    assert got.equals(table.take(pa.array(rows, pa.int64())))
    run = rows == list(range(rows[0], rows[0] + len(rows)))
    ids = got.column("_id").chunk(0)
    shares = ids.buffers()[2].address == table.column("_id").chunk(0).buffers()[2].address
    assert shares == run


def test_a_sealed_write_in_parts_kills_each_stale_row_in_its_own_part(tmp_path, monkeypatch) -> None:
    """A big sealed write is cut into runs of the buffer written on a thread each; the stale winners' rows (every
    third id, the buffer shuffled) die where they were written, across part boundaries, and stay dead after a
    flush and a reopen."""
    import json
    import random

    from shardstore.segments import directory as directory_module
    from shardstore.segments.directory import ShardDirectory
    from shardstore.translog.operations import index_batch, stamp

    monkeypatch.setattr(directory_module, "PARALLEL_SEGMENT_DOCS", 50)
    monkeypatch.setattr(directory_module.os, "cpu_count", lambda: 3)
    ids = [f"k{i:03d}" for i in range(300)]
    random.Random(7).shuffle(ids)
    stale = {doc_id for doc_id in ids if int(doc_id[1:]) % 3 == 0}
    newer = sorted(stale)
    path = str(tmp_path / "d")
    with ShardDirectory(path) as shard:
        shard.apply(stamp(index_batch(newer, [json.dumps({"v": 2}).encode()] * len(newer)), 1000, 1))
        shard.refresh()
        shard.apply(stamp(index_batch(ids, [json.dumps({"v": 1}).encode()] * len(ids)), 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        result = shard.write_sealed(sealed)
        assert len(result.segments) == 3 and (result.indexed, result.stale) == (300 - len(stale), len(stale))
        for doc_id in ids:
            assert shard.get(doc_id)["v"] == (2 if doc_id in stale else 1), doc_id
        assert shard.count() == 300
        shard.flush(local_checkpoint=1000 + len(newer) - 1, primary_term=1)
    with ShardDirectory(path) as reopened:
        assert reopened.count() == 300
        assert all(reopened.get(doc_id)["v"] == (2 if doc_id in stale else 1) for doc_id in ids)
