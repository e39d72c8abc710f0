"""The point-read path (issue 31) answers what the batch paths it bypasses answer.

A segment written from generated rows (repeated ids, ids that differ by one character,
non-ASCII ids, nulls in every column, several row groups) is read both ways: every id,
present or not, must give the rows ``lookup`` gives, and every row the values ``take``
gives.  A forced hash collision must still give only the row of the id asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.segments.point_read import PointIndex
from shardstore.segments.segment import SegmentReader, write_segment

IDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6)


def _segment(tmp: Path, ids: list[str], name: str) -> SegmentReader:
    n = len(ids)
    table = pa.table({
        "_id": pa.array(ids, pa.string()),
        "_seq_no": pa.array(np.arange(n), pa.int64()),
        "_primary_term": pa.array(np.ones(n, dtype=np.int64)),
        "_version": pa.array(np.ones(n, dtype=np.int64)),
        "_source": pa.array([None if i % 3 else f'{{"i":{i}}}'.encode() for i in range(n)], pa.binary()),
        "n": pa.array([None if i % 4 == 1 else i * 7 for i in range(n)], pa.int64()),
        "s": pa.array([None if i % 5 == 2 else f"v{i}\u00e9" for i in range(n)], pa.string()),
        "t": pa.array([None if i % 2 else i * 1000 for i in range(n)], pa.timestamp("ms", tz="UTC")),
    })
    path = str(tmp / f"{name}.parquet")
    info = write_segment(path, table, name=name, row_group_size=7, sort=False, fsync=False)
    return SegmentReader(path, info)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(IDS, min_size=1, max_size=40), st.lists(IDS, max_size=10))
def test_point_rows_and_row_values_match_the_batch_paths(tmp_path: Path, ids: list[str], absent: list[str]) -> None:
    name = f"seg_{abs(hash((tuple(ids), tuple(absent)))) % 10**12}"
    reader = _segment(tmp_path, ids, name)
    try:
        for doc_id in [*ids, *absent]:
            _q, rows = reader.lookup(pa.array([doc_id], pa.string()))
            assert reader.point_rows(doc_id) == sorted(rows.to_pylist()), doc_id
        for r in range(len(ids)):
            assert reader.row(r) == reader.take([r]).to_pylist()[0]
        with pytest.raises(IndexError):
            reader.row(len(ids))
    finally:
        reader.close()


def test_a_hash_collision_never_yields_another_ids_row(monkeypatch: pytest.MonkeyPatch) -> None:
    index = PointIndex(pa.array(["a", "b", "a", "c"]))
    assert index.rows("a") == [0, 2] and index.rows("b") == [1] and index.rows("zz") == []
    index._hashes = np.zeros(4, dtype=np.int64)  # every id in one bucket: only the id comparison tells them apart
    index._rows = np.arange(4, dtype=np.int64)
    monkeypatch.setattr("builtins.hash", lambda _s: 0)  # a collision no real pair of ids produces on demand
    assert index.rows("a") == [0, 2] and index.rows("c") == [3] and index.rows("zz") == []
