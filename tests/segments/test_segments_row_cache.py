"""The decoded row-group cache for point reads (issue 16): a warm get decodes nothing, a segment
rewritten at the same path is never served from the old one's cache, and scans bypass it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardstore.segments import directory as directory_module
from shardstore.segments import row_cache
from shardstore.segments.segment import SegmentReader, write_segment
from tests.segments.test_segments_files import _docs, _segment_table


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> row_cache.RowGroupCache:
    fresh = row_cache.RowGroupCache(64 << 20)
    monkeypatch.setattr(row_cache, "row_groups", fresh)
    return fresh


@pytest.fixture(autouse=True)
def _one_segment_per_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests read *the* segment of a 60,000-row refresh: no parts on two cores (``FOREGROUND_PART_DOCS``)."""
    monkeypatch.setattr(directory_module, "FOREGROUND_PART_DOCS", 1 << 30)


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


# -- warming (issue 16: a first get of a fresh segment is a hit) -----------------------------------


@pytest.fixture
def warm(monkeypatch: pytest.MonkeyPatch) -> row_cache.Warmer:
    fresh = row_cache.RowGroupCache(64 << 20)
    monkeypatch.setattr(row_cache, "row_groups", fresh)
    w = row_cache.Warmer(fresh, enabled=True)
    monkeypatch.setattr(row_cache, "warmer", w)
    return w


def _directory_with(tmp_path: Path, n: int):
    import json

    from shardstore.segments.directory import ShardDirectory
    from shardstore.translog.operations import index_batch, stamp

    d = ShardDirectory(str(tmp_path / "shard"), fsync=False)
    ids = [f"d{i:05d}" for i in range(n)]
    d.apply(stamp(index_batch(ids, [json.dumps({"n": i, "pad": "x" * 200}).encode() for i in range(n)]), 0, 1))
    return d


def test_a_refreshed_segment_is_warmed_so_its_first_get_decodes_nothing(tmp_path: Path,
                                                                         warm: row_cache.Warmer) -> None:
    with _directory_with(tmp_path, 20_000) as d:
        d.refresh()
        assert warm.wait_idle(60)
        (reader, _live), = d.searchable_segments()
        assert reader.info.row_groups > 1 and warm.warmed_groups == reader.info.row_groups
        misses = warm.cache.misses
        for i in (0, 7_777, 19_999):  # one id per region of the segment: every row group is warm
            assert d.get(f"d{i:05d}", realtime=False)["_id"] == f"d{i:05d}"
        assert warm.cache.misses == misses, "a first get after a refresh decoded a row group"
    assert warm.cache.size_bytes == 0  # a closed copy's row groups do not keep budget


def test_a_copy_not_warming_queues_nothing_until_warming_is_turned_on(tmp_path: Path,
                                                                      warm: row_cache.Warmer) -> None:
    """A replica's directory (warming off: it serves no point reads) decodes nothing at refresh; turned on (its
    copy promoted) every current segment is warmed."""
    with _directory_with(tmp_path, 20_000) as d:
        d.set_warming(False)
        d.refresh()
        assert warm.wait_idle(60) and warm.warmed_groups == 0 and warm.cache.size_bytes == 0
        d.set_warming(True)
        assert warm.wait_idle(60)
        (reader, _live), = d.searchable_segments()
        assert warm.warmed_groups == reader.info.row_groups > 1


def test_warming_stops_short_of_the_budget_and_a_merged_segment_is_forgotten(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    small = row_cache.RowGroupCache(10 << 20)  # room for one decoded row group of this segment (8 MiB each) of 4
    w = row_cache.Warmer(small, enabled=True)
    monkeypatch.setattr(row_cache, "row_groups", small)
    monkeypatch.setattr(row_cache, "warmer", w)
    with _directory_with(tmp_path, 60_000) as d:
        d.refresh()
        assert w.wait_idle(60)
        (reader, _live), = d.searchable_segments()
        assert 0 < w.warmed_groups < reader.info.row_groups, (w.warmed_groups, reader.info.row_groups)
        assert small.size_bytes <= small.max_bytes
        first = reader.path
        d.apply(_more(60_000, 100))
        d.refresh()
        d.force_merge(1)
        assert w.wait_idle(60)
        assert not any(k[0] == first for k in list(small._items))  # the merged-away segment is gone from the cache


def _more(start: int, n: int):
    import json

    from shardstore.translog.operations import index_batch, stamp

    ids = [f"e{i:05d}" for i in range(n)]
    return stamp(index_batch(ids, [json.dumps({"n": i}).encode() for i in range(n)]), start, 1)


def test_warming_off_queues_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSTORE_ROW_CACHE_WARM", "0")
    w = row_cache.Warmer(row_cache.RowGroupCache(64 << 20))
    assert not w.enabled
    path = str(tmp_path / "s.parquet")
    t, _ = _segment_table(_docs(2000), seq_start=0, term=1)
    w.submit(SegmentReader(path, write_segment(path, t, name="s", row_group_size=512)))
    assert w.wait_idle(1) and w.warmed_groups == 0 and w.cache.size_bytes == 0


def test_the_warmer_never_reads_through_the_readers_own_file(tmp_path: Path, warm: row_cache.Warmer) -> None:
    """Two threads in one pyarrow ParquetFile hung (fault simulator, seed 147's schedule under a 1,000-seed
    campaign: a verify scan and the warmer's id-index read, both stuck); the warmer must use its own handle."""
    path = str(tmp_path / "s.parquet")
    t, _ = _segment_table(_docs(5000), seq_start=0, term=1)
    reader = SegmentReader(path, write_segment(path, t, name="s", row_group_size=512))
    opened_by: list[str] = []
    real = reader._file

    def watched():
        import threading

        opened_by.append(threading.current_thread().name)
        return real()

    reader._file = watched  # type: ignore[method-assign]
    warm.submit(reader)
    assert warm.wait_idle(60)
    assert "row-cache-warmer" not in opened_by
    assert warm.warmed_groups == reader.info.row_groups  # it did warm, through its own handle
    misses = warm.cache.misses
    assert reader.get("id000042").to_pylist()[0]["_id"] == "id000042"  # index installed, row group warm
    assert warm.cache.misses == misses


def _assert_all_warmed(warm: row_cache.Warmer, d, before: int = 0) -> None:
    """Once the warmer is idle, it decoded every row group of the directory's one segment (counted from ``before``)."""
    assert warm.wait_idle(60)
    (reader, _live), = d.searchable_segments()
    assert warm.warmed_groups - before == reader.info.row_groups


def test_the_warmer_yields_to_writes_but_is_not_starved_by_them(tmp_path: Path, warm: row_cache.Warmer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """While a shard copy applies or flushes (``foreground``) nothing new is decoded; when the writes end the
    segment is warmed, and writes that never end delay each row group by at most WARM_YIELD_MAX."""
    import time

    with _directory_with(tmp_path, 20_000) as d:
        with warm.foreground():
            d.refresh()
            time.sleep(0.3)
            assert warm.warmed_groups == 0, "the warmer decoded while a write was in flight"
        _assert_all_warmed(warm, d)
    monkeypatch.setattr(row_cache, "WARM_YIELD_MAX", 0.05)
    with _directory_with(tmp_path / "again", 20_000) as d:
        with warm.foreground():  # a write that outlasts the whole warming
            before = warm.warmed_groups
            d.refresh()
            _assert_all_warmed(warm, d, before)


def test_the_warmer_waits_for_a_quiet_moment_after_writes(tmp_path: Path, warm: row_cache.Warmer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes come in bursts (a bulk, then its flush): the warmer starts only WARM_QUIET after the last one."""
    import time

    monkeypatch.setattr(row_cache, "WARM_QUIET", 0.4)
    monkeypatch.setattr(row_cache, "WARM_YIELD_MAX", 5.0)
    with _directory_with(tmp_path, 20_000) as d:
        with warm.foreground():
            d.refresh()
        time.sleep(0.15)
        assert warm.warmed_groups == 0, "the warmer started right after a write"
        with warm.foreground():  # the next write of the burst restarts the quiet period
            time.sleep(0.3)
        time.sleep(0.15)
        assert warm.warmed_groups == 0
        _assert_all_warmed(warm, d)


def test_a_scan_takes_row_groups_the_cache_holds_and_gives_the_same_rows(tmp_path: Path,
                                                                         cache: row_cache.RowGroupCache,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a run of row groups decoded already (warmed, or by point reads) is not decoded again by a scan;
    the rows, the live mask and the filter come out the same."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardstore.segments.livedocs import LiveDocs
    from shardstore.segments.segment import scan_segments

    t, _ = _segment_table(_docs(3000), seq_start=0, term=1)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, t, name="s", row_group_size=256)
    reader = SegmentReader(path, info)
    live = LiveDocs.all_live(info.doc_count).delete(pa.array([3, 700, 2999], pa.int64()))
    cols = ["_id", "_seq_no"]
    flt = pc.field("_seq_no") > 1000

    def scans() -> list[pa.Table]:
        return [pa.Table.from_batches(list(scan_segments([(reader, lv)], columns=cols, filter=f)), schema=None)
                for lv, f in ((None, None), (live, None), (live, flt))]

    cold = scans()
    reads = []
    real = reader._file().read_row_groups
    monkeypatch.setattr(type(reader._file()), "read_row_groups",
                        lambda self, *a, **k: reads.append(a) or real(*a, **k), raising=True)
    for g in range(info.row_groups):  # decoded as point reads decode them
        cache.get((reader.path, info.checksum, g), lambda g=g: reader._file().read_row_group(g))
    reads.clear()
    warm = scans()
    assert reads == []  # nothing read from the file
    assert [w.equals(c) for w, c in zip(warm, cold)] == [True, True, True]
    assert [w.num_rows for w in warm][:2] == [3000, 2997] and 0 < warm[2].num_rows < 2997


def test_a_point_reads_column_split_lives_and_dies_with_its_cached_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                        ) -> None:
    """``RowGroupCache.columns`` splits a group once while it is cached, and drops the split with the group."""
    t, _ = _segment_table(_docs(3000), seq_start=0, term=1)
    path = str(tmp_path / "s.parquet")
    info = write_segment(path, t, name="s", row_group_size=1000)
    reader = SegmentReader(path, info)
    one_group = reader._file().read_row_group(0).nbytes
    cache = row_cache.RowGroupCache(one_group + one_group // 2)  # room for one group at a time
    monkeypatch.setattr(row_cache, "row_groups", cache)
    expected = [reader.take([r]).to_pylist()[0] for r in (5, 1500, 6)]
    assert reader.row(5) == expected[0]
    split = cache._columns[(path, info.checksum, 0)]
    assert reader.row(6) == expected[2] and cache._columns[(path, info.checksum, 0)] is split  # split once
    assert reader.row(1500) == expected[1]  # group 1 evicts group 0, and its split with it
    assert set(cache._columns) == {(path, info.checksum, 1)} == set(cache._items)
    assert reader.row(6) == expected[2]
    cache.forget(path)
    assert cache._columns == {} and cache._items == {}
    reader.row(5)
    cache.clear()
    assert cache._columns == {}
    assert reader.row(5) == expected[0] and cache._columns
    monkeypatch.setattr(row_cache, "warmer", row_cache.Warmer(cache, enabled=False))
    row_cache._after_fork_in_child()  # a forked child keeps no split of the parent's either
    assert cache._columns == {} and cache._items == {}
    assert reader.row(5) == expected[0] and set(cache._columns) == {(path, info.checksum, 0)}
    off = row_cache.RowGroupCache(0)  # nothing cached: nothing split is kept either
    monkeypatch.setattr(row_cache, "row_groups", off)
    assert reader.row(1500) == expected[1] and off._columns == {}
    reader.close()


def test_stop_ends_the_warming_between_two_row_groups_and_joins_the_thread(tmp_path: Path,
                                                                           warm: row_cache.Warmer) -> None:
    """``stop`` (run at interpreter exit) leaves the segment in hand between two row groups, unqueues the rest
    and joins the thread; nothing submitted afterwards is queued or starts a thread."""
    import time

    with _directory_with(tmp_path, 60_000) as d:
        warm.pace = 20.0  # long pauses between row groups: the stop lands mid-segment
        d.refresh()
        (reader, _live), = d.searchable_segments()
        deadline = time.monotonic() + 60
        while warm.warmed_groups == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert 0 < warm.warmed_groups < reader.info.row_groups
        thread = warm._thread
        assert thread is not None and thread.is_alive()
        assert warm.stop(timeout=10)
        assert not thread.is_alive()
        assert warm.warmed_groups < reader.info.row_groups  # it did not finish the segment first
        warm.submit(reader)
        assert not warm._queue and warm._thread is thread  # stopped for good: no new thread
        assert warm.wait_idle(1)


def test_the_process_warmer_is_stopped_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A process that exits while the row-cache warmer decodes: by the time the exit hooks ran, the warmer thread
    is joined (a daemon thread left inside a pyarrow decode is ended by pthread_exit at finalization, and that
    can abort the process with status -6)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import atexit, sys, threading, time
        seen = {}
        # registered before shardstore is imported: atexit runs last-in first-out, so this runs after its hooks
        atexit.register(lambda: print("warmer alive at exit:", seen["w"]._thread.is_alive(), flush=True))
        from shardstore.segments import row_cache
        from tests.segments.test_segments_row_cache import _directory_with
        from pathlib import Path
        w = row_cache.warmer
        seen["w"] = w
        w.pace = 5.0  # a pause after each row group: the exit finds it mid-segment
        d = _directory_with(Path(sys.argv[1]), 60_000)
        d.refresh()
        deadline = time.monotonic() + 60
        while w.warmed_groups == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        print("warming:", w.warmed_groups > 0 and w._thread.is_alive(), flush=True)
        sys.exit(0)  # the directory left open, the warmer mid-segment
    """)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, SHARDSTORE_ROW_CACHE_BYTES=str(1 << 30), SHARDSTORE_ROW_CACHE_WARM="1")
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", script, str(tmp_path / "d")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "warming: True" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "warmer alive at exit: False" in done.stdout, done.stdout + done.stderr[-3000:]
