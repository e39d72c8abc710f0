"""The decoded row-group cache for point reads (issue 16): a warm get decodes nothing, a segment
rewritten at the same path is never served from the old one's cache, and scans bypass it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardstore.segments import row_cache
from shardstore.segments.segment import SegmentReader, write_segment
from tests.segments.test_segments_files import _docs, _segment_table


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> row_cache.RowGroupCache:
    fresh = row_cache.RowGroupCache(64 << 20)
    monkeypatch.setattr(row_cache, "row_groups", fresh)
    return fresh


def test_a_warm_point_read_decodes_nothing(tmp_path: Path, cache: row_cache.RowGroupCache) -> None:
    t, _ = _segment_table(_docs(5000), seq_start=100, term=3)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, t, name="s", row_group_size=512)
    reader = SegmentReader(path, info)
    first = reader.get("id000042").to_pylist()
    misses = cache.misses
    assert cache.misses >= 2 and cache.size_bytes > 0  # the _id column and the row group, decoded once
    for _ in range(3):
        assert SegmentReader(path, info).get("id000042").to_pylist() == first  # a new reader, same cache
    assert cache.misses == misses and cache.hits >= 6
    assert first[0]["_id"] == "id000042"
    before = cache.size_bytes
    assert sum(b.num_rows for b in SegmentReader(path, info).scan()) == 5000
    assert cache.size_bytes == before  # a scan does not fill (or evict) the point-read cache


def test_a_segment_rewritten_at_the_same_path_is_not_served_stale(tmp_path: Path,
                                                                  cache: row_cache.RowGroupCache) -> None:
    path = str(tmp_path / "s.parquet")
    t1, _ = _segment_table(_docs(2000), seq_start=0, term=1)
    info1 = write_segment(path, t1, name="s", row_group_size=512)
    one = SegmentReader(path, info1).get("id000007").to_pylist()
    os.remove(path)
    t2, _ = _segment_table(_docs(2000, prefix="id"), seq_start=5000, term=2)
    info2 = write_segment(path, t2, name="s", row_group_size=512)
    assert info2.checksum != info1.checksum
    two = SegmentReader(path, info2).get("id000007").to_pylist()
    assert one[0]["_seq_no"] != two[0]["_seq_no"] and two[0]["_primary_term"] == 2


def test_the_budget_bounds_the_cache_and_zero_turns_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t, _ = _segment_table(_docs(5000), seq_start=0, term=1)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, t, name="s", row_group_size=512)
    small = row_cache.RowGroupCache(200_000)
    monkeypatch.setattr(row_cache, "row_groups", small)
    for i in range(0, 5000, 250):
        assert SegmentReader(path, info).get(f"id{i:06d}").num_rows == 1
    assert 0 < small.size_bytes <= 200_000
    off = row_cache.RowGroupCache(0)
    monkeypatch.setattr(row_cache, "row_groups", off)
    assert SegmentReader(path, info).get("id000001").num_rows == 1
    assert off.size_bytes == 0
