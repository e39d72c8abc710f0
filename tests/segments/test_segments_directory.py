"""The local shard directory and commit points: refresh, updates, deletes, out-of-order ops, flush, merge, reopen."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments import refresh_plan
from shardstore.segments.commit import CommitPoint, list_commit_generations, read_commit
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.errors import MappingConflict, SegmentCorrupted, SegmentError
from shardstore.segments.merge_policy import TieredMergePolicy
from shardstore.translog.operations import OpType, index_batch, stamp, unstamped_batch


def docs(first_seq: int, ids: list[str], term: int = 1, **fields) -> pa.RecordBatch:
    """Index ops for ``ids`` with sources {"n": seq, **fields}."""
    srcs = [json.dumps({"n": first_seq + i, **fields}).encode() for i in range(len(ids))]
    return stamp(index_batch(ids, srcs), first_seq, term)


def deletes(first_seq: int, ids: list[str], term: int = 1) -> pa.RecordBatch:
    return stamp(unstamped_batch([int(OpType.DELETE)] * len(ids), ids, [1] * len(ids), [None] * len(ids)), first_seq, term)


def live_ids(sd: ShardDirectory) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in sd.scan(columns=["_id", "_seq_no"]):
        for i, s in zip(b.column("_id").to_pylist(), b.column("_seq_no").to_pylist()):
            assert i not in out, f"{i} is live twice"
            out[i] = s
    return out


def test_updates_and_deletes_mark_older_copies_without_rewriting_segments(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, [f"d{i}" for i in range(100)]))
    first = sd.refresh()
    assert first.indexed == 100 and sd.count() == 100
    seg_file = tmp_path / f"{first.segment}.parquet"
    before = seg_file.read_bytes()
    sd.apply(docs(100, [f"d{i}" for i in range(10)]))
    sd.apply(deletes(110, [f"d{i}" for i in range(10, 15)]))
    r = sd.refresh()
    assert (r.indexed, r.deleted, r.stale) == (10, 15, 0)
    assert sd.count() == 95
    assert seg_file.read_bytes() == before  # never rewritten
    got = live_ids(sd)
    assert got["d3"] == 103 and "d12" not in got and got["d50"] == 50
    assert sd.get("d3")["n"] == 103 and sd.get("d12") is None


def test_out_of_order_ops_keep_the_highest_seq_no(tmp_path: Path) -> None:
    """A replica may receive seq# 7 after seq# 9 for the same id; the newer copy wins either way."""
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(9, ["a"]))
    sd.refresh()
    sd.apply(docs(7, ["a"]))  # older, arrives late
    r = sd.refresh()
    assert r.stale == 1 and r.indexed == 0
    assert sd.get("a")["_seq_no"] == 9
    # a delete at 20, then a late index op at 15: stays deleted (tombstone)
    sd.apply(deletes(20, ["a"]))
    sd.refresh()
    sd.apply(docs(15, ["a"]))
    assert sd.refresh().stale == 1
    assert sd.get("a") is None and sd.count() == 0
    # within one buffer: the highest seq# wins whatever the order
    sd.apply(docs(31, ["b"]))
    sd.apply(docs(30, ["b"]))
    sd.refresh()
    assert sd.get("b")["_seq_no"] == 31 and sd.count() == 1


def test_realtime_get_sees_the_buffer(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, ["x"]))
    assert sd.get("x")["n"] == 0
    assert sd.get("x", realtime=False) is None
    sd.apply(deletes(1, ["x"]))
    assert sd.get("x") is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from("abcde"), min_size=1, max_size=4),
                                st.booleans()), min_size=1, max_size=12), data=st.data())
def test_realtime_get_of_the_buffer_matches_a_model(tmp_path: Path, steps, data) -> None:
    """The buffer's lazy id index (built on a get, extended by later batches) gives what a full scan would:
    per id the operation with the highest seq#, batches applied out of seq# order, a get between any two."""
    sd = ShardDirectory(tempfile.mkdtemp(dir=tmp_path))
    try:
        _check_gets_against_model(sd, steps, data)
    finally:
        sd.close()


def _check_gets_against_model(sd: ShardDirectory, steps, data) -> None:
    seqs = data.draw(st.permutations(range(sum(len(ids) for _, ids, _ in steps))))
    model: dict[str, tuple[int, bool]] = {}  # id -> (seq#, live)
    pos = 0
    for is_index, ids, get_after in steps:
        batch_seqs = seqs[pos:pos + len(ids)]
        pos += len(ids)
        for i, s in zip(ids, batch_seqs):
            srcs = [json.dumps({"n": s}).encode()]
            one = stamp(index_batch([i], srcs), s, 1) if is_index else deletes(s, [i])
            sd.apply(one) if len(ids) == 1 else None
        if len(ids) > 1:  # one batch holding several ops, seq#s not in row order
            batches = [stamp(index_batch([i], [json.dumps({"n": s}).encode()]), s, 1) if is_index else deletes(s, [i])
                       for i, s in zip(ids, batch_seqs)]
            sd.apply(pa.Table.from_batches(batches).combine_chunks().to_batches()[0])
        for i, s in zip(ids, batch_seqs):
            if i not in model or s > model[i][0]:
                model[i] = (s, is_index)
        if get_after:
            for i in "abcdef":
                got = sd.get(i)
                want = model.get(i)
                if want is None or not want[1]:
                    assert got is None, (i, got, want)
                else:
                    assert got is not None and got["_seq_no"] == want[0] and got["n"] == want[0], (i, got, want)


def test_mapping_conflict_rejects_the_whole_batch(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path), mapping={"n": "long"})
    sd.apply(docs(0, ["a"]))
    bad = stamp(index_batch(["b", "c"], [b'{"n": 1}', b'{"n": "not a number"}']), 1, 1)
    with pytest.raises(MappingConflict) as err:
        sd.apply(bad)
    assert err.value.field == "n" and err.value.doc_id == "c"
    sd.refresh()
    assert set(live_ids(sd)) == {"a"}  # nothing of the bad batch
    assert sd.mapping["n"].value == "long"


def test_dynamic_fields_and_older_segments_scan_with_nulls(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, ["a"]))
    sd.refresh()
    sd.apply(docs(1, ["b"], color="red", dims={"w": 2.5}))
    sd.refresh()
    assert set(sd.mapping) >= {"n", "color", "dims.w"}
    rows = {r["_id"]: r for b in sd.scan(columns=["_id", "color", "dims.w"]) for r in b.to_pylist()}
    assert rows == {"a": {"_id": "a", "color": None, "dims.w": None}, "b": {"_id": "b", "color": "red", "dims.w": 2.5}}
    red = [r for b in sd.scan(columns=["_id"], filter=pc.field("color") == "red") for r in b.to_pylist()]
    assert red == [{"_id": "b"}]


def test_flush_writes_a_commit_point_and_reopen_sees_it(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, [f"d{i}" for i in range(50)]))
    sd.refresh()
    sd.apply(deletes(50, ["d1", "d2"]))
    c = sd.flush(local_checkpoint=51, primary_term=3, translog_uuid="tl-1", translog_generation=7,
                 user_data={"k": "v"}, merge=False)
    assert (c.generation, c.max_seq_no, c.local_checkpoint, c.primary_term) == (1, 51, 51, 3)
    assert (c.translog_uuid, c.translog_generation, c.user_data) == ("tl-1", 7, {"k": "v"})
    assert c.doc_count == 48
    assert [s.livedocs_generation for s in c.segments] == [1]
    assert read_commit(str(tmp_path), 1) == c
    sd.apply(docs(52, ["late"]))  # buffered, never refreshed: lost on close like an unflushed Lucene buffer
    sd.close()
    with pytest.raises(SegmentError, match="another writer"):
        two = ShardDirectory(str(tmp_path))
        ShardDirectory(str(tmp_path))
    two.close()
    sd = ShardDirectory(str(tmp_path))
    assert sd.count() == 48 and sd.get("d1") is None and sd.get("d3")["n"] == 3
    assert sd.last_commit == c and sd.max_seq_no == 51
    # plain Parquet: pyarrow reads the segment on its own
    seg = c.segments[0].info
    assert pq.read_table(tmp_path / seg.file_name).num_rows == 50
    sd.close()


def test_commit_history_keeps_last_k_plus_locked(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path), keep_commits=2)
    sd.apply(docs(0, ["a"]))
    sd.flush(local_checkpoint=0, primary_term=1, merge=False)
    sd.lock_commit(1)
    for i in range(1, 5):
        sd.apply(docs(i, [f"x{i}"]))
        sd.flush(local_checkpoint=i, primary_term=1, merge=False)
    assert list_commit_generations(str(tmp_path)) == [1, 4, 5]
    sd.release_commit(1)
    assert list_commit_generations(str(tmp_path)) == [4, 5]
    # every file a retained commit names is still there
    for g in (4, 5):
        for name in read_commit(str(tmp_path), g).files():
            assert (tmp_path / name).exists()
    sd.close()


def test_merges_drop_deleted_docs_and_old_files_go_after_their_commits(tmp_path: Path) -> None:
    policy = TieredMergePolicy(segments_per_tier=2, max_merge_at_once=2, floor_segment_bytes=1)
    sd = ShardDirectory(str(tmp_path), keep_commits=1, merge_policy=policy)
    seq = 0
    for r in range(6):
        sd.apply(docs(seq, [f"d{r}-{i}" for i in range(20)]))
        seq += 20
        sd.refresh()
    sd.apply(deletes(seq, [f"d0-{i}" for i in range(20)]))
    c1 = sd.flush(local_checkpoint=seq, primary_term=1, merge=False)
    assert len(c1.segments) == 6
    sd.force_merge(1)
    c2 = sd.flush(local_checkpoint=seq, primary_term=1, merge=False)
    assert len(c2.segments) == 1 and c2.segments[0].info.doc_count == 100 and c2.doc_count == 100
    on_disk = {n for n in os.listdir(tmp_path)}
    assert on_disk == set(c2.files()) | {c2.file_name, "write.lock"}
    assert len(live_ids(sd)) == 100
    sd.close()


def test_commit_point_damage_and_versions(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, ["a", "b"]))
    c = sd.flush(local_checkpoint=1, primary_term=1)
    sd.close()
    raw = (tmp_path / "segments_1").read_bytes()
    assert CommitPoint.decode(raw, "x") == c
    for pos in range(0, len(raw), max(1, len(raw) // 40)):
        flipped = bytearray(raw)
        flipped[pos] ^= 0x10
        with pytest.raises(SegmentCorrupted, match="segments_1"):
            CommitPoint.decode(bytes(flipped), str(tmp_path / "segments_1"))
    with pytest.raises(SegmentCorrupted):
        CommitPoint.decode(raw[:-5], "cut")
    newer = bytearray(raw)
    struct.pack_into("<H", newer, 4, 99)
    body = bytes(newer[:-4])
    with pytest.raises(UnsupportedFormatVersion):
        CommitPoint.decode(body + struct.pack("<I", google_crc32c.value(body)), "newer")
    # a damaged commit file is named when the directory opens
    (tmp_path / "segments_1").write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(SegmentCorrupted, match="segments_1"):
        ShardDirectory(str(tmp_path))


def test_a_missing_or_resized_segment_file_is_named_on_open(tmp_path: Path) -> None:
    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, ["a", "b"]))
    c = sd.flush(local_checkpoint=1, primary_term=1)
    sd.close()
    seg = tmp_path / c.segments[0].info.file_name
    data = seg.read_bytes()
    seg.write_bytes(data + b"x")
    with pytest.raises(SegmentCorrupted, match=seg.name):
        ShardDirectory(str(tmp_path))
    seg.unlink()
    with pytest.raises(SegmentCorrupted, match="missing"):
        ShardDirectory(str(tmp_path))


def test_scanning_an_unknown_column_names_it(tmp_path: Path) -> None:
    from shardstore.errors import InvalidError

    sd = ShardDirectory(str(tmp_path))
    sd.apply(docs(0, ["a"]))
    sd.refresh()
    with pytest.raises(InvalidError, match="nope"):
        list(sd.scan(columns=["_id", "nope"]))
    sd.close()


def test_a_big_refresh_is_written_as_one_segment_per_core(tmp_path, monkeypatch) -> None:
    """Contiguous runs of the buffer written in parallel (issue 16), each in buffer order (a descending run is an
    unsorted segment); every document found once, gets and counts exact."""
    import pyarrow as pa

    from shardstore.segments import directory as directory_module
    from shardstore.segments.directory import ShardDirectory
    from shardstore.translog.operations import index_batch, stamp

    monkeypatch.setattr(directory_module, "FOREGROUND_PART_DOCS", 100)  # a refresh its caller waits for
    monkeypatch.setattr(directory_module.os, "cpu_count", lambda: 3)
    ids = [f"k{i:05d}" for i in range(1000)][::-1]  # given in reverse: written as given, not sorted
    with ShardDirectory(str(tmp_path / "shard")) as shard:
        shard.apply(stamp(index_batch(ids, [f'{{"n":{i}}}'.encode() for i in range(1000)]), 0, 1))
        result = shard.refresh()
        assert len(result.segments) == 3 and result.segment == result.segments[0] and result.indexed == 1000
        readers = {r.info.name: r for r, _live in shard.searchable_segments()}
        parts = [readers[name] for name in result.segments]
        assert [r.info.doc_count for r in parts] == [333, 333, 334]
        assert [r.ids().to_pylist() for r in parts] == [ids[:333], ids[333:666], ids[666:]]  # runs of the buffer
        assert not any(r.info.id_sorted for r in parts)  # descending ids: format 2, found through the id index
        assert shard.count() == 1000
        assert shard.get("k00999")["n"] == 0 and shard.get("k00000")["n"] == 999
        got = pa.concat_tables(pa.Table.from_batches(list(r.scan(live=lv))) for r, lv in shard.searchable_segments())
        assert sorted(got.column("_id").to_pylist()) == sorted(ids)


def test_a_refresh_its_caller_waits_for_is_cut_finer_than_a_sealed_write(tmp_path, monkeypatch) -> None:
    """A flush's tail (a refresh nothing is written beside) takes a part per core from ``2 * FOREGROUND_PART_DOCS``
    documents; a sealed buffer of the same size is one segment until ``2 * PARALLEL_SEGMENT_DOCS`` (the writes run
    beside it)."""
    from shardstore.segments import directory as directory_module
    from shardstore.segments.directory import ShardDirectory
    from shardstore.translog.operations import index_batch, stamp

    monkeypatch.setattr(directory_module, "FOREGROUND_PART_DOCS", 100)
    monkeypatch.setattr(directory_module, "PARALLEL_SEGMENT_DOCS", 300)
    monkeypatch.setattr(directory_module.os, "cpu_count", lambda: 2)

    def batch(prefix: str, first: int, n: int = 400):
        return stamp(index_batch([f"{prefix}{i:04d}" for i in range(n)], [b'{"n":1}'] * n), first, 1)

    with ShardDirectory(str(tmp_path / "shard"), warm=False) as shard:
        shard.apply(batch("a", 0))
        assert [r.info.doc_count for r in _written(shard, shard.refresh())] == [200, 200]  # foreground: 2 parts
        shard.apply(batch("b", 400))
        sealed = shard.seal()
        assert sealed is not None
        assert [r.info.doc_count for r in _written(shard, shard.write_sealed(sealed))] == [400]  # < 2 * 300: one
        shard.apply(batch("c", 800, 600))
        sealed = shard.seal()
        assert sealed is not None
        assert [r.info.doc_count for r in _written(shard, shard.write_sealed(sealed))] == [300, 300]
        assert shard.count() == 1400


def _written(shard: object, result: object) -> list:
    """The readers of the segments a refresh result names, in its order."""
    readers = {r.info.name: r for r, _live in shard.searchable_segments()}  # type: ignore[attr-defined]
    return [readers[name] for name in result.segments]  # type: ignore[attr-defined]


def _ordered_ids(shard: object) -> list[str]:
    """Every live id of the shard's segments, segment by segment, in file order."""
    out: list[str] = []
    for reader, live in shard.searchable_segments():  # type: ignore[attr-defined]
        out += pa.Table.from_batches(list(reader.scan(live=live))).column("_id").to_pylist()
    return out


def _newest_in_buffer_order(ids: list[str]) -> list[str]:
    """What a refresh writes of a buffer holding ``ids`` (in this order): each id's last copy, in buffer order."""
    last = {doc_id: i for i, doc_id in enumerate(ids)}
    return [doc_id for i, doc_id in enumerate(ids) if last[doc_id] == i]


def test_a_refresh_takes_the_writers_id_order_and_checks_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A primary hands its bulk's id sort to ``apply`` (issue 16): the refresh uses it instead of sorting again,
    but only once the ids it orders are strictly ascending; a wrong or stale hint is ignored, never trusted."""
    general: list[int] = []
    sort_all = refresh_plan._winners
    monkeypatch.setattr(refresh_plan, "_winners", lambda *a: general.append(1) or sort_all(*a))
    ids = [f"k{i}" for i in range(300)][::-1]
    sources = [f'{{"n":{i}}}'.encode() for i in range(300)]
    right = pc.array_sort_indices(pa.array(ids))
    wrong = pa.array(list(range(300)), pa.uint64())  # the identity: these ids are not in that order
    for name, hint, sorts in (("right", right, 0), ("wrong", wrong, 1), ("none", None, 1)):
        general.clear()
        with ShardDirectory(str(tmp_path / name)) as shard:
            shard.apply(stamp(index_batch(ids, sources), 0, 1), id_order=hint)
            assert shard.refresh().indexed == 300
            assert len(general) == sorts, name
            assert _ordered_ids(shard) == ids, name  # written in buffer order, whichever way the winners were found
            assert shard.get("k7")["n"] == 292
    # an id twice in the batch: the hint's order is not strictly ascending, the newest op wins as always
    twice = ["b", "a", "b"]
    with ShardDirectory(str(tmp_path / "twice")) as shard:
        shard.apply(stamp(index_batch(twice, [b'{"n":0}', b'{"n":1}', b'{"n":2}']), 0, 1),
                    id_order=pc.array_sort_indices(pa.array(twice)))
        assert shard.refresh().indexed == 2
        assert _ordered_ids(shard) == ["a", "b"] and shard.get("b")["n"] == 2
    # a delete buffered beside the hinted batch: the general path decides
    with ShardDirectory(str(tmp_path / "deleted")) as shard:
        shard.apply(stamp(index_batch(ids, sources), 0, 1), id_order=right)
        shard.apply(stamp(unstamped_batch([OpType.DELETE], ["k5"], [None], [None]), 300, 1))
        shard.refresh()
        assert "k5" not in _ordered_ids(shard) and len(_ordered_ids(shard)) == 299


def test_a_refresh_merges_several_hinted_batches_without_the_general_sort(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's slices reach a primary as several batches, each with its id sort: the refresh merges those runs
    (one stable sort of ids already in runs) instead of the general two-key sort.  An id in two batches (an update
    of a steady-state bulk, issue 44) keeps its last, newest copy on that path too; a batch without a hint goes the
    general way; the newest op wins either way."""
    general: list[int] = []
    sort_all = refresh_plan._winners
    monkeypatch.setattr(refresh_plan, "_winners", lambda *a: general.append(1) or sort_all(*a))

    def batch(ids: list[str], first: int) -> tuple[pa.RecordBatch, pa.Array]:
        sources = [f'{{"n":{first + i}}}'.encode() for i in range(len(ids))]
        return stamp(index_batch(ids, sources), first, 1), pc.array_sort_indices(pa.array(ids))

    runs = [[f"k{i:03d}" for i in range(j, 300, 3)][::-1] for j in range(3)]  # interleaved, each reversed
    cases = {"disjoint": (runs, [True] * 3, 0), "unhinted": (runs, [True, False, True], 1),
             "updated": ([runs[0], runs[1], runs[0][:5]], [True] * 3, 0)}
    for name, (parts, hinted, sorts) in cases.items():
        general.clear()
        with ShardDirectory(str(tmp_path / name)) as shard:
            first = 0
            for ids, hint in zip(parts, hinted):
                ops, order = batch(ids, first)
                shard.apply(ops, id_order=order if hint else None)
                first += len(ids)
            expected = _newest_in_buffer_order([i for ids in parts for i in ids])
            assert shard.refresh().indexed == len(expected), name
            assert len(general) == sorts, name
            assert _ordered_ids(shard) == expected, name
            if name == "updated":  # the third batch re-indexed runs[0]'s first five ids: its ops are newest
                assert shard.get(runs[0][0])["n"] == 200 and shard.get(runs[0][5])["n"] == 5
            else:  # runs[1] (ids k001, k004, ... k298) reversed, from seq# 100: k001 is its last row
                assert shard.get("k001")["n"] == 199 and shard.get("k299")["n"] == 200 and shard.get("k297")["n"] == 0
