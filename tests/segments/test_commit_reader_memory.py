"""A remote commit read into memory (issue 44's cold scan): the same rows as through the disk cache, every byte
verified, nothing written to disk, nothing downloaded twice; big commits and ``cache=True`` still use the cache."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore.core.address import ShardAddress
from shardstore.core.ops import OpType
from shardstore.segments import reader as reader_mod
from shardstore.segments import remote_store
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.errors import SegmentCorrupted
from shardstore.segments.reader import IN_MEMORY_COMMIT_BYTES, open_commit, reads_in_memory
from shardstore.segments.remote_store import RemoteSegmentStore
from shardstore.segments.segment import SegmentReader
from shardstore.translog.operations import index_batch, stamp, unstamped_batch

ADDR = ShardAddress("cluster-m", "index-m", 0)


def _rows(reader, columns=("_id", "n", "tag"), **kw) -> dict[str, tuple]:
    return {r["_id"]: (r["n"], r["tag"]) for b in reader.scan(columns=list(columns), **kw) for r in b.to_pylist()}


@pytest.fixture
def committed(tmp_path: Path):
    """A file store holding one commit of 3 segments: 300 documents, 20 updated, 10 deleted (live docs files)."""
    from shardstore.blobstores import open_store

    store = open_store(f"file://{tmp_path / 'store'}")
    directory = ShardDirectory(str(tmp_path / "local"), keep_commits=2)
    seq = 0
    for part in range(3):
        ids = [f"d{part * 100 + i:04d}" for i in range(100)]
        src = [json.dumps({"n": part * 100 + i, "tag": "ab"[i % 2]}).encode() for i in range(100)]
        directory.apply(stamp(index_batch(ids, src), seq, 1))
        seq += 100
        directory.refresh()
    upd = [f"d{i:04d}" for i in range(20)]
    directory.apply(stamp(index_batch(upd, [json.dumps({"n": 1000 + i, "tag": "c"}).encode() for i in range(20)]), seq, 1))
    seq += 20
    gone = [f"d{i:04d}" for i in range(250, 260)]
    directory.apply(stamp(unstamped_batch([OpType.DELETE] * 10, gone, [None] * 10, [None] * 10), seq, 1))
    seq += 10
    commit = directory.flush(local_checkpoint=seq - 1, primary_term=1, merge=False)
    md = RemoteSegmentStore(store, ADDR, 1).upload(str(tmp_path / "local"), commit)
    yield store, md
    store.close()


M = IN_MEMORY_COMMIT_BYTES


@pytest.mark.parametrize(("cache", "total", "held"), [
    (None, 0, True), (None, M - 1, True), (None, M, True), (None, M + 1, False), (None, 10 * M, False),
    (False, 0, True), (False, M + 1, True), (False, 10 * M, True),
    (True, 0, False), (True, M, False), (True, M + 1, False),
])
def test_the_choice_of_memory_or_disk(cache: bool | None, total: int, held: bool) -> None:
    assert reads_in_memory([total // 2, total - total // 2], cache) is held
    assert reads_in_memory(iter([total]), cache) is held  # any iterable, read once


def test_a_small_commit_reads_from_memory_as_from_the_cache(committed, tmp_path: Path) -> None:
    store, md = committed
    assert any(s.livedocs_file for s in md.commit.segments)  # live docs files are involved
    cached = open_commit(store, ADDR, cache_dir=str(tmp_path / "c1"), cache=True)
    held = open_commit(store, ADDR, cache_dir=str(tmp_path / "c2"))
    want = _rows(cached)
    assert len(want) == 290 and want["d0003"] == (1003, "c") and "d0255" not in want
    assert _rows(held) == want
    # a filter pruned by row-group statistics goes through the in-memory dataset
    flt = pc.field("n") >= 1010
    assert _rows(held, filter=flt) == _rows(cached, filter=flt) and len(_rows(held, filter=flt)) == 10
    assert held.get("d0004")["n"] == 1004 and held.get("d0255") is None and held.get("nope") is None
    assert not os.path.exists(tmp_path / "c2")  # nothing written to disk
    assert os.listdir(tmp_path / "c1")
    for r, _live in held.segments():
        assert r.data is not None
        r.verify()
    assert not os.path.exists(tmp_path / "c2")
    # a caller asking for a segment's file (DuckDB, Parquet tools) gets it, written from the verified bytes
    first, _live = held.segments()[0]
    with open(first.path, "rb") as f:
        assert f.read() == first.data.to_pybytes()
    assert os.listdir(tmp_path / "c2") == [os.path.basename(first.path)]
    with open(first.path, "r+b") as f:  # a damaged copy there is written again, never handed out
        f.seek(100)
        f.write(b"\0\0\0\0")
    again = open_commit(store, ADDR, cache_dir=str(tmp_path / "c2")).segments()[0][0]
    with open(again.path, "rb") as f:
        assert f.read() == first.data.to_pybytes()


def test_a_held_commit_is_downloaded_once(committed, tmp_path: Path) -> None:
    store, md = committed
    held = open_commit(store, ADDR, cache_dir=str(tmp_path / "c"))
    store.reset_metrics()
    held.get("d0150")
    first = store.metrics()["requests"]["get"]
    assert first >= 1
    _rows(held)
    _rows(held)
    held.get("d0150")
    assert store.metrics()["requests"]["get"] == len(md.files), store.metrics()["requests"]


@pytest.mark.parametrize("which", ["segment", "live docs"])
def test_a_corrupt_blob_is_refused_by_name_and_never_read(committed, tmp_path: Path, which: str) -> None:
    store, md = committed
    seg = next(s for s in md.commit.segments if s.livedocs_file)
    key = md.files[seg.info.file_name if which == "segment" else seg.livedocs_file].key
    path = tmp_path / "store" / key
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(SegmentCorrupted) as err:
        _rows(open_commit(store, ADDR, cache_dir=str(tmp_path / "c")))
    assert key in str(err.value) and "CRC32C" in str(err.value)
    path.unlink()
    with pytest.raises(SegmentCorrupted, match="missing"):
        _rows(open_commit(store, ADDR, cache_dir=str(tmp_path / "c")))


def test_a_big_commit_and_a_big_file_go_through_the_disk_cache(committed, tmp_path: Path, monkeypatch) -> None:
    store, md = committed
    monkeypatch.setattr(reader_mod, "IN_MEMORY_COMMIT_BYTES", 100)
    big = open_commit(store, ADDR, cache_dir=str(tmp_path / "c1"))
    assert len(_rows(big)) == 290 and os.listdir(tmp_path / "c1")
    assert all(r.data is None for r, _ in big.segments())
    monkeypatch.setattr(remote_store, "STREAM_OVER", 100)  # every segment file is "big"; live docs files are not
    forced = open_commit(store, ADDR, cache_dir=str(tmp_path / "c2"), cache=False)
    assert len(_rows(forced)) == 290
    assert all(r.data is None for r, _ in forced.segments())
    on_disk = sorted(os.listdir(tmp_path / "c2"))
    live_keys = {md.files[s.livedocs_file].key.replace("/", "_") for s in md.commit.segments if s.livedocs_file}
    seg_keys = {md.files[s.info.file_name].key.replace("/", "_") for s in md.commit.segments}
    assert live_keys and set(on_disk) == seg_keys  # the small live-docs files stayed in memory


def test_readers_pickle_with_their_choice(committed, tmp_path: Path) -> None:
    store, _md = committed
    for cache in (None, True):
        again = pickle.loads(pickle.dumps(open_commit(store, ADDR, cache_dir=str(tmp_path / "c"), cache=cache)))
        assert again.cache is cache and len(_rows(again)) == 290
    held = open_commit(store, ADDR, cache_dir=str(tmp_path / "c"), cache=False)
    seg, _live = held.segments()[0]
    clone = pickle.loads(pickle.dumps(seg))  # an in-memory segment reader ships its bytes
    assert clone.data == seg.data and clone.ids().equals(seg.ids())


def test_an_in_memory_segment_reader_checks_its_bytes(committed, tmp_path: Path) -> None:
    store, _md = committed
    seg, _live = open_commit(store, ADDR, cache=False).segments()[0]
    raw = bytearray(seg.data.to_pybytes())
    raw[len(raw) // 2] ^= 0x01
    bad = SegmentReader(seg.path, seg.info, data=pa.py_buffer(bytes(raw)))
    with pytest.raises(SegmentCorrupted, match="checksum"):
        bad.verify()
    short = SegmentReader(seg.path, seg.info, data=pa.py_buffer(bytes(raw[:-10])))
    with pytest.raises(SegmentCorrupted, match="bytes"):
        short.verify()


def test_threads_sharing_a_reader_fetch_each_file_once(committed, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store, md = committed
    held = open_commit(store, ADDR, cache_dir=str(tmp_path / "c"))
    store.reset_metrics()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: held.segments() if i % 2 else held.get(f"d{i * 30:04d}"), range(16)))
    assert store.metrics()["requests"]["get"] == len(md.files), store.metrics()["requests"]
    firsts = {id(r) for out in got if isinstance(out, list) for r, _ in out}
    assert len(firsts) == len(md.commit.segments)  # one reader per segment, shared by every caller


def test_an_in_memory_segment_reads_as_its_file(committed, tmp_path: Path) -> None:
    store, _md = committed
    on_disk = open_commit(store, ADDR, cache_dir=str(tmp_path / "c"), cache=True).segments()
    in_mem = open_commit(store, ADDR, cache=False).segments()
    for (a, _la), (b, _lb) in zip(on_disk, in_mem):
        assert a.data is None and b.data is not None
        assert b.schema == a.schema
        assert pa.Table.from_batches(list(b.scan())).equals(pa.Table.from_batches(list(a.scan())))  # the dataset
        flt = pc.field("n") > 150
        assert (pa.Table.from_batches(list(b.scan(filter=flt)), schema=a.schema)
                .equals(pa.Table.from_batches(list(a.scan(filter=flt)), schema=a.schema)))
        assert b.ids().equals(a.ids()) and b.take([0, 5]).equals(a.take([0, 5]))
