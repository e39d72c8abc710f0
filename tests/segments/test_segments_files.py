"""Live docs and segment files (shardstore.segments.livedocs / .segment)."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.errors import CorruptError, UnsupportedFormatVersion
from shardstore.segments.errors import SegmentCorrupted
from shardstore.segments.livedocs import FORMAT_VERSION, LiveDocs, livedocs_file_name, parse_livedocs_file_name
from shardstore.segments.mapping import Mapping, parse_sources, sources_from_pylist
from shardstore.segments.segment import SegmentInfo, SegmentReader, write_segment

# -- live docs --------------------------------------------------------------------------------


def test_livedocs_basics():
    ld = LiveDocs.all_live(10)
    assert ld.live_count == 10 and ld.deleted_count == 0
    d = ld.delete(pa.array([3, 3, 9]))
    assert ld.live_count == 10  # immutable
    assert d.live_count == 8 and d.deleted_count == 2
    assert d.mask().to_pylist() == [True, True, True, False, True, True, True, True, True, False]
    assert d.deleted_rows().to_pylist() == [3, 9]
    assert not d.is_live(3) and d.is_live(4)
    assert d.delete([]) is d
    with pytest.raises(IndexError):
        d.delete([10])
    with pytest.raises(IndexError):
        d.delete([-1])
    assert LiveDocs.from_mask(d.mask()) == d
    assert LiveDocs.all_live(0).encode() and LiveDocs.decode(LiveDocs.all_live(0).encode(), "x") == LiveDocs.all_live(0)


def test_livedocs_file_names():
    assert livedocs_file_name("seg_7", 3) == "seg_7_3.liv"
    assert parse_livedocs_file_name("seg_7_3.liv") == ("seg_7", 3)
    with pytest.raises(ValueError):
        livedocs_file_name("s", 0)
    with pytest.raises(ValueError):
        parse_livedocs_file_name("seg.parquet")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000).flatmap(lambda n: st.tuples(st.just(n), st.lists(st.lists(st.integers(0, max(n - 1, 0)), max_size=50), max_size=4))))
def test_livedocs_random_deletions_round_trip(case):
    n, batches = case
    ld = LiveDocs.all_live(n)
    expect = set()
    for batch in batches:
        if n == 0:
            break
        ld = ld.delete(pa.array(batch, pa.int64()))
        expect |= set(batch)
        back = LiveDocs.decode(ld.encode(), "f.liv")
        assert back == ld
    assert ld.deleted_count == len(expect)
    assert set(ld.deleted_rows().to_pylist()) == expect
    mask = ld.mask().to_pylist()
    assert len(mask) == n and [i for i, v in enumerate(mask) if not v] == sorted(expect)


def test_livedocs_compressed_when_it_helps():
    big = LiveDocs.all_live(1_000_000).delete(pa.array([5, 500_000]))
    assert len(big.encode()) < 200
    assert LiveDocs.decode(big.encode(), "x") == big


def _damage(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x40
    return bytes(b)


def test_livedocs_corruption_detected():
    data = LiveDocs.all_live(1000).delete([1, 2, 999]).encode()
    for pos in range(0, len(data)):
        with pytest.raises(SegmentCorrupted) as err:
            LiveDocs.decode(_damage(data, pos), "seg_1.liv")
        assert err.value.where == "seg_1.liv" and isinstance(err.value, CorruptError)
    for cut in (0, 10, len(data) - 1):
        with pytest.raises(SegmentCorrupted):
            LiveDocs.decode(data[:cut], "seg_1.liv")
    with pytest.raises(SegmentCorrupted):
        LiveDocs.decode(data + b"\0", "seg_1.liv")


def test_livedocs_newer_version_refused():
    data = bytearray(LiveDocs.all_live(10).encode()[:-4])
    struct.pack_into("<H", data, 4, FORMAT_VERSION + 1)
    data += struct.pack("<I", google_crc32c.value(bytes(data)))
    with pytest.raises(UnsupportedFormatVersion) as err:
        LiveDocs.decode(bytes(data), "seg_2.liv")
    assert err.value.found == FORMAT_VERSION + 1


# -- segments ---------------------------------------------------------------------------------


def _segment_table(docs, mapping=Mapping(), seq_start=0, term=1):
    ids, src = sources_from_pylist(docs)
    fields, m = parse_sources(ids, src, mapping)
    n = len(docs)
    t = pa.table(
        {
            "_id": ids,
            "_seq_no": pa.array(range(seq_start, seq_start + n), pa.int64()),
            "_primary_term": pa.array([term] * n, pa.int64()),
            "_version": pa.array([1] * n, pa.int64()),
            "_source": src,
        }
    )
    for name in fields.column_names:
        t = t.append_column(name, fields.column(name))
    return t, m


def _docs(n, prefix="id"):
    return [{"_id": f"{prefix}{(i * 7919) % n:06d}", "a": i, "s": f"v{i % 5}", "x": i / 4, "d": "2024-01-02T00:00:00Z", "o": {"b": i % 2 == 0}} for i in range(n)]


@pytest.fixture
def seg(tmp_path):
    t, m = _segment_table(_docs(5000), seq_start=100, term=3)
    path = str(tmp_path / "s0.parquet")
    info = write_segment(path, t, name="s0", row_group_size=512)
    return path, info, t


def test_segment_round_trip_and_stats(seg):
    path, info, t = seg
    assert info.doc_count == 5000 and info.row_groups == 10 and info.name == "s0" and info.file_name == "s0.parquet"
    assert info.size == os.path.getsize(path)
    with open(path, "rb") as f:
        assert info.checksum == google_crc32c.value(f.read())
    assert (info.min_seq_no, info.max_seq_no, info.max_primary_term) == (100, 5099, 3)
    assert (info.min_id, info.max_id) == ("id000000", "id004999")
    a = info.column("a")
    assert (a.min, a.max, a.null_count) == (0, 4999, 0)
    assert info.column("s").min == "v0" and info.column("d").min == 1704153600000
    assert "_source" not in {c.name for c in info.columns}
    d = json.loads(json.dumps(info.to_dict()))
    assert SegmentInfo.from_dict(d) == info
    r = SegmentReader(path, info)
    r.verify()
    meta = r.read_metadata_info()
    assert meta["doc_count"] == 5000 and meta["min_id"] == "id000000"
    assert "columns" not in meta  # the Parquet footer's statistics are the file's copy of the column stats
    assert [c.to_dict() for c in info.columns] == [c.to_dict() for c in _stats_from_data(t)]
    # sorted by _id, and every row there
    back = pq.read_table(path)
    assert back.column("_id").to_pylist() == sorted(t.column("_id").to_pylist())
    assert back.sort_by("_seq_no").select(t.column_names).to_pylist() == t.sort_by("_seq_no").to_pylist()
    assert r.ids().to_pylist() == back.column("_id").to_pylist()
    # picklable without open state
    r.lookup(pa.array(["id000001"]))
    r2 = pickle.loads(pickle.dumps(r))
    assert r2._pf is None and r2.info == info
    assert len(pickle.dumps(r)) < 4000


def test_segment_info_newer_version_refused(seg):
    d = seg[1].to_dict()
    d["format_version"] = 99
    with pytest.raises(UnsupportedFormatVersion):
        SegmentInfo.from_dict(d)
    with pytest.raises(SegmentCorrupted):
        SegmentInfo.from_dict({"name": "x"})


def test_plain_pyarrow_reads_with_pushdown(seg):
    path, info, t = seg
    md = pq.ParquetFile(path).metadata
    assert md.row_group(0).column(0).compression == "ZSTD"
    assert md.row_group(0).column(0).statistics.has_min_max
    dset = ds.dataset(path, format="parquet")
    got = dset.to_table(filter=pc.field("a") < 10, columns=["_id", "a"])
    assert sorted(got.column("a").to_pylist()) == list(range(10))
    frag = next(iter(dset.get_fragments()))
    pruned = frag.split_by_row_group(pc.field("_id") == "id000042")
    assert len(pruned) == 1  # sorted by _id: one row group can hold it
    assert dset.to_table(filter=pc.field("o.b") == True).num_rows == 2500  # noqa: E712


def test_lookup_take_get(seg):
    path, info, t = seg
    r = SegmentReader(path, info)
    q = pa.array(["nope", "id000042", "id004999", "id000000", "zzz", "id000042"])
    qp, rows = r.lookup(q)
    assert qp.to_pylist() == [1, 2, 3, 5]
    got = r.take(rows, ["_id", "a"])
    assert got.column("_id").to_pylist() == ["id000042", "id004999", "id000000", "id000042"]
    # small path (row-group statistics) and index path agree
    r.SMALL_LOOKUP = 0
    qp2, rows2 = SegmentReader(path, info).lookup(q)
    assert qp2.equals(qp) and rows2.equals(rows)
    one = r.get("id000042")
    assert one.num_rows == 1 and json.loads(one.column("_source")[0].as_py())["a"] == t.filter(pc.field("_id") == "id000042").column("a")[0].as_py()
    assert r.get("absent").num_rows == 0
    assert r.take([], ["a"]).num_rows == 0
    with pytest.raises(IndexError):
        r.take([5000])


def test_duplicate_ids_in_one_segment(tmp_path):
    docs = [{"_id": "dup", "a": 1}, {"_id": "x", "a": 2}, {"_id": "dup", "a": 3}]
    t, _ = _segment_table(docs)
    info = write_segment(str(tmp_path / "d.parquet"), t, name="d")
    for small in (64, 0):
        r = SegmentReader(str(tmp_path / "d.parquet"), info)
        r.SMALL_LOOKUP = small
        qp, rows = r.lookup(pa.array(["dup"]))
        assert qp.to_pylist() == [0, 0]
        assert r.take(rows, ["a", "_seq_no"]).to_pylist() == [{"a": 1, "_seq_no": 0}, {"a": 3, "_seq_no": 2}]


_ids = st.text(alphabet="abcé\x00z", min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_ids, min_size=1, max_size=300, unique=True), st.lists(_ids, max_size=80), st.integers(1, 64),
       st.sampled_from(["small", "index", "loaded"]))
def test_lookup_matches_brute_force(tmp_path, seg_ids, queries, rg, mode):
    docs = [{"_id": i, "n": k} for k, i in enumerate(seg_ids)]
    t, _ = _segment_table(docs)
    path = str(tmp_path / f"h{abs(hash((tuple(seg_ids), rg)))}.parquet")
    info = write_segment(path, t, name="h", row_group_size=rg, fsync=False)
    r = SegmentReader(path, info)
    if mode == "index":
        r.SMALL_LOOKUP = 0  # always the fingerprint index
    elif mode == "loaded":
        assert len(r.ids()) == len(seg_ids)  # index loaded, few ids: bisect over all ids
    qp, rows = r.lookup(pa.array(queries, pa.string()))
    got = {(q, r.take([row], ["_id"]).column("_id")[0].as_py()) for q, row in zip(qp.to_pylist(), rows.to_pylist())}
    want = {(k, q) for k, q in enumerate(queries) if q in set(seg_ids)}
    assert got == want
    assert qp.to_pylist() == sorted(qp.to_pylist())


def _collect(batches):
    batches = list(batches)
    return pa.Table.from_batches(batches) if batches else None


@pytest.mark.parametrize("flt", [None, pc.field("a") < 700, (pc.field("s") == "v1") & (pc.field("x") > 200), pc.field("_id") >= "id004000"])
def test_scan_with_filters_and_deletions(seg, flt):
    path, info, t = seg
    r = SegmentReader(path, info)
    sorted_t = pq.read_table(path)
    deleted = list(range(0, 5000, 3)) + list(range(1000, 1600))
    live = LiveDocs.all_live(5000).delete(deleted)
    mask = live.mask()
    want = sorted_t.filter(mask)
    if flt is not None:
        want = want.filter(flt)
    for live_arg, expect in ((live, want), (None, sorted_t.filter(flt) if flt is not None else sorted_t)):
        got = _collect(r.scan(["_id", "a"], flt, live_arg, batch_size=200))
        n = 0 if got is None else got.num_rows
        assert n == expect.num_rows
        if got is not None:
            assert got.column_names == ["_id", "a"]
            assert sorted(got.column("_id").to_pylist()) == sorted(expect.column("_id").to_pylist())


def test_scan_everything_deleted_and_wrong_live_size(seg):
    path, info, _ = seg
    r = SegmentReader(path, info)
    assert _collect(r.scan(live=LiveDocs.all_live(5000).delete(range(5000)))) is None
    with pytest.raises(ValueError):
        list(r.scan(live=LiveDocs.all_live(10)))


def test_corruption_names_the_file(seg, tmp_path):
    path, info, _ = seg
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(SegmentCorrupted) as err:
        SegmentReader(path, info).verify()
    assert err.value.where == path and "checksum" in str(err.value)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(SegmentCorrupted) as err:
        SegmentReader(path, info).verify()
    assert path in str(err.value)
    with open(path, "wb") as f:
        f.write(b"not parquet at all")
    with pytest.raises(SegmentCorrupted) as err:
        SegmentReader(path, info).take([0])
    assert err.value.where == path
    os.unlink(path)
    with pytest.raises(SegmentCorrupted):
        SegmentReader(path, info).verify()


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    t, _ = _segment_table(_docs(10))
    write_segment(str(tmp_path / "a.parquet"), t, name="a")
    assert sorted(os.listdir(tmp_path)) == ["a.parquet"]
    with pytest.raises(ValueError):
        write_segment(str(tmp_path / "b.parquet"), t.drop_columns(["_seq_no"]), name="b")
    assert sorted(os.listdir(tmp_path)) == ["a.parquet"]


def test_empty_segment(tmp_path):
    t, _ = _segment_table([])
    info = write_segment(str(tmp_path / "e.parquet"), t, name="e")
    r = SegmentReader(str(tmp_path / "e.parquet"), info)
    r.verify()
    assert info.doc_count == 0 and info.min_id is None
    assert r.lookup(pa.array(["x"]))[0].to_pylist() == []
    assert _collect(r.scan()) is None


def test_scan_positional_fallback_when_seq_nos_repeat(tmp_path):
    t, _ = _segment_table(_docs(3000))
    t = t.set_column(t.column_names.index("_seq_no"), "_seq_no", pa.array([7] * 3000, pa.int64()))
    path = str(tmp_path / "r.parquet")
    info = write_segment(path, t, name="r", row_group_size=256)
    r = SegmentReader(path, info)
    live = LiveDocs.all_live(3000).delete(range(0, 3000, 2))
    assert r.live_filter(live) is None
    flt = pc.field("a") < 1000
    got = _collect(r.scan(["_id"], flt, live, batch_size=100))
    want = pq.read_table(path).filter(live.mask()).filter(flt)
    assert sorted(got.column("_id").to_pylist()) == sorted(want.column("_id").to_pylist())
    assert got.num_rows == want.num_rows > 0


def test_scan_segments_in_order_with_deletions(tmp_path):
    from shardstore.segments.segment import scan_segments

    items, expect = [], []
    for k in range(3):
        t, _ = _segment_table(_docs(2000, prefix=f"s{k}-"), seq_start=k * 10_000)
        path = str(tmp_path / f"m{k}.parquet")
        info = write_segment(path, t, name=f"m{k}", row_group_size=128)
        live = LiveDocs.all_live(2000).delete(range(k, 2000, 5)) if k != 1 else None
        items.append((SegmentReader(path, info), live))
        full = pq.read_table(path)
        expect.append(full if live is None else full.filter(live.mask()))
    flt = pc.equal(pc.bit_wise_and(pc.field("a"), 3), 0)
    for f in (None, flt):
        got = pa.Table.from_batches(list(scan_segments(items, ["_id", "a"], f, batch_size=300, readahead=2)))
        want = pa.concat_tables([e.filter(f) if f is not None else e for e in expect]).select(["_id", "a"])
        assert got.to_pylist() == want.to_pylist()  # same rows, same (segment, row) order
    one = pa.Table.from_batches(list(scan_segments(items[:1], ["a"], readahead=0)))
    assert one.num_rows == expect[0].num_rows


def test_live_filter_expression_matches_mask(seg):
    path, info, _ = seg
    r = SegmentReader(path, info)
    live = LiveDocs.all_live(5000).delete(range(0, 5000, 7))
    expr = r.live_filter(live)
    assert r.live_filter(LiveDocs.all_live(5000)) is None
    got = ds.dataset(path).to_table(filter=expr, columns=["_id"])
    assert sorted(got.column("_id").to_pylist()) == sorted(pq.read_table(path).filter(live.mask()).column("_id").to_pylist())


def test_lookup_segments_across_segments(tmp_path):
    from shardstore.segments.segment import lookup_segments

    readers = []
    for k in range(3):
        docs = [{"_id": f"id{i}", "n": i} for i in range(k * 50, k * 50 + 100)]  # overlapping ids
        t, _ = _segment_table(docs)
        info = write_segment(str(tmp_path / f"l{k}.parquet"), t, name=f"l{k}", row_group_size=16)
        readers.append(SegmentReader(str(tmp_path / f"l{k}.parquet"), info))
    queries = [f"id{i}" for i in range(0, 260, 3)] + ["zz", "id75"]
    qp, segs, rows = lookup_segments(readers, pa.array(queries))
    got = {(q, s, readers[s].take([r], ["_id"]).column("_id")[0].as_py()) for q, s, r in zip(qp.to_pylist(), segs.to_pylist(), rows.to_pylist())}
    want = {(j, k, q) for j, q in enumerate(queries) for k in range(3) if q.startswith("id") and k * 50 <= int(q[2:]) < k * 50 + 100}
    assert got == want


def _stats_from_data(t: pa.Table) -> list:
    """Every scalar field column's min/max/null count computed from the data itself (what the info must say)."""
    from shardstore.segments.segment_info import _BASE_NAMES, ColumnStats, _json_value

    out = []
    for name in t.column_names:
        col = t.column(name)
        if name in _BASE_NAMES or not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
                                       or pa.types.is_boolean(col.type) or pa.types.is_timestamp(col.type)
                                       or pa.types.is_string(col.type)):
            continue
        mm = pc.min_max(col)
        out.append(ColumnStats(name, str(col.type), _json_value(mm["min"]), _json_value(mm["max"]), col.null_count))
    return out


@pytest.mark.parametrize("rows", [0, 1, 3, 20_000])
def test_the_column_stats_from_the_footer_are_those_of_the_data(tmp_path: Path, rows: int) -> None:
    """The segment info's per-column stats are read from the Parquet statistics the writer computed; they equal
    min/max/null counts over the data for every scalar type, nulls, all-null columns, and strings too long
    for Parquet statistics (which then come from the data)."""
    import datetime as dt

    rng = range(rows)
    t = pa.table({
        "_id": [f"d{i:06d}" for i in rng], "_seq_no": pa.array(list(rng), pa.int64()),
        "_primary_term": pa.array([1] * rows, pa.int64()), "_version": pa.array([1] * rows, pa.int64()),
        "_source": pa.nulls(rows, pa.binary()),
        "l": pa.array([(i * 7919) % 1000 - 500 if i % 5 else None for i in rng], pa.int64()),
        "i": pa.array([i % 300 for i in rng], pa.int32()),
        "f": pa.array([i / 3 - 7 if i % 4 else None for i in rng], pa.float64()),
        "b": pa.array([i % 3 == 0 for i in rng], pa.bool_()),
        "k": pa.array([f"v{(i * 31) % 977}" for i in rng], pa.string()),
        "long": pa.array([("z" * 5000 + str(i)) if i % 2 else "a" for i in rng], pa.string()),
        "n": pa.nulls(rows, pa.int64()),
        "d": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i) for i in rng],
                      pa.timestamp("ms", "UTC")),
    })
    info = write_segment(str(tmp_path / "s.parquet"), t, name="s")
    assert [c.to_dict() for c in info.columns] == [c.to_dict() for c in _stats_from_data(t)]
    assert SegmentInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


def test_a_segment_of_some_rows_taken_a_row_group_at_a_time(tmp_path: Path) -> None:
    """``write_segment(rows=...)`` (a refresh's rows, in _id order) writes what writing those rows taken first
    would, one row group at a time; rows out of _id order are refused, no rows make an empty segment."""
    n = 30_000
    t = pa.table({
        "_id": [f"d{(i * 7919) % n:06d}" for i in range(n)], "_seq_no": pa.array(range(n), pa.int64()),
        "_primary_term": pa.array([2] * n, pa.int64()), "_version": pa.array([1] * n, pa.int64()),
        "_source": pa.nulls(n, pa.binary()), "v": pa.array([i % 1000 for i in range(n)], pa.int64()),
        "k": pa.array([f"k{i % 13}" for i in range(n)]),
    })
    order = pc.array_sort_indices(t.column("_id"))
    rows = order.filter(pc.not_equal(pc.bit_wise_and(order.cast(pa.int64()), 3), 0))  # 3 of 4, still in _id order
    got = write_segment(str(tmp_path / "a.parquet"), t, rows=rows, name="a", row_group_size=4096)
    ref = write_segment(str(tmp_path / "b.parquet"), t.take(rows), name="b", row_group_size=4096)
    assert got.doc_count == ref.doc_count == len(rows) and got.row_groups == ref.row_groups > 1
    assert (got.min_id, got.max_id, got.min_seq_no, got.max_seq_no) == (ref.min_id, ref.max_id, ref.min_seq_no,
                                                                        ref.max_seq_no)
    assert got.columns == ref.columns
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    with pytest.raises(ValueError, match="not in _id order"):
        write_segment(str(tmp_path / "c.parquet"), t, rows=pa.array(range(100)), name="c")
    empty = write_segment(str(tmp_path / "d.parquet"), t, rows=pa.array([], pa.int64()), name="d")
    assert empty.doc_count == 0 and pq.read_table(tmp_path / "d.parquet").num_rows == 0
