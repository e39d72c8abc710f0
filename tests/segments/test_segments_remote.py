"""The remote segment store on real stores: incremental upload, metadata last, fencing, restore, GC, locks."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import google_crc32c
import pyarrow as pa
import pytest

from shardstore.core.address import ShardAddress
from shardstore.core.path_strategy import HashedPrefixPathStrategy
from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.errors import CommitConflict, CommitNotFound, SegmentCorrupted
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import (
    RemoteSegmentStore,
    latest_commit,
    latest_term,
    list_commit_keys,
    restore,
)
from shardstore.testing import FaultRule, FaultyStore, SimulatedCrash
from shardstore.translog.operations import index_batch, stamp

REMOTE = pytest.mark.parametrize("backend", ["memory", "file", "s3", "gcs", "azure"], indirect=True)
ADDR = ShardAddress("cluster-a", "index-a", 0)


def docs(first_seq: int, ids: list[str], term: int = 1) -> pa.RecordBatch:
    return stamp(index_batch(ids, [json.dumps({"n": first_seq + i}).encode() for i in range(len(ids))]), first_seq, term)


class Shard:
    """A local directory writing commits, for the tests."""

    def __init__(self, path: Path, term: int = 1) -> None:
        self.path = str(path)
        self.dir = ShardDirectory(self.path, keep_commits=2)
        self.seq = 0
        self.term = term

    def commit(self, n: int = 50, *, update: int = 0):
        ids = [f"d{self.seq + i}" for i in range(n)] + [f"d{i}" for i in range(update)]
        self.dir.apply(docs(self.seq, ids, self.term))
        self.seq += len(ids)
        return self.dir.flush(local_checkpoint=self.seq - 1, primary_term=self.term, merge=False)


def puts(store) -> Counter:
    return Counter({k: v for k, v in store.metrics()["requests"].items() if v})


@REMOTE
def test_upload_is_incremental_and_restore_verifies(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(store, ADDR, 1)
    for _ in range(3):
        c = shard.commit()
        remote.upload(shard.path, c)
    # one more commit adding one segment to a shard of 3: 1 data PUT + 1 metadata PUT
    c = shard.commit()
    store.reset_metrics()
    md = remote.upload(shard.path, c)
    req = puts(store)
    assert req["put"] == 2, req
    assert req["list"] <= 1 and req["get"] == 0, req
    assert set(md.files) == set(c.files())
    assert latest_term(store, ADDR) == 1
    assert latest_commit(store, ADDR).commit == c
    # restore into an empty directory from the store alone
    result = restore(store, ADDR, str(tmp_path / "restored"))
    assert result.commit == c and result.skipped == ()
    back = ShardDirectory(str(tmp_path / "restored"))
    assert back.count() == shard.dir.count() == 200
    assert back.get("d7")["n"] == 7


@REMOTE
def test_a_crash_after_any_put_then_retry_gives_one_valid_commit(store_factory, tmp_path: Path) -> None:
    inner = store_factory(raw=True)
    shard = Shard(tmp_path / "local")
    shard.commit()
    c = shard.commit(30, update=5)  # two segments, one with live docs
    n_puts = 1 + len(c.files()) + 1  # term marker, files, metadata
    for k in range(n_puts):
        faulty = FaultyStore(inner, [FaultRule(op=("put", "put_stream"), action="crash_after", after=k, times=1)])
        counting = _CountingPuts(faulty)
        remote = RemoteSegmentStore(counting, ShardAddress("c", f"crash{k}", 0), 1)
        with pytest.raises(SimulatedCrash):
            remote.upload(shard.path, c)
        md = remote.upload(shard.path, c)  # the retry resumes
        assert md.commit == c
        data_puts = [key for key in counting.keys if "/data/" in key]
        assert len(data_puts) == len(set(data_puts)), f"a file was sent twice: {data_puts}"
        assert len(set(data_puts)) == len(c.files()), "a file was uploaded under two keys"
        # the commit is valid: every file it names exists with the right bytes
        restored = restore(inner, ShardAddress("c", f"crash{k}", 0), str(tmp_path / f"r{k}"))
        assert restored.commit == c and restored.skipped == ()


class _CountingPuts:
    """Records the keys PUT through it (a pass-through around a real store)."""

    def __init__(self, store) -> None:
        self._store, self.keys = store, []

    def put(self, key, data, **kw):
        self.keys.append(key)
        return self._store.put(key, data, **kw)

    def put_stream(self, key, readable, **kw):
        self.keys.append(key)
        return self._store.put_stream(key, readable, **kw)

    def __getattr__(self, name):
        return getattr(self._store, name)


@REMOTE
def test_a_commit_is_invisible_until_its_metadata_lands(store_factory, tmp_path: Path) -> None:
    inner = store_factory(raw=True)
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(inner, ADDR, 1)
    first = shard.commit()
    remote.upload(shard.path, first)
    second = shard.commit()
    faulty = FaultyStore(inner, [FaultRule(op="put", key="*/metadata/*", action="crash_before")])
    with pytest.raises(SimulatedCrash):
        RemoteSegmentStore(faulty, ADDR, 1).upload(shard.path, second)
    assert latest_commit(inner, ADDR).commit == first


@REMOTE
def test_corrupt_or_missing_blobs_are_named_and_restore_falls_back(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(store, ADDR, 1)
    good = remote.upload(shard.path, shard.commit())
    newest = remote.upload(shard.path, shard.commit())
    new_file = next(f for n, f in newest.files.items() if n not in good.files)
    # flip a byte of a segment blob only the newest commit has
    data = bytearray(store.get(new_file.key))
    data[len(data) // 2] ^= 0xFF
    store.delete([new_file.key])
    store.put(new_file.key, bytes(data))
    result = restore(store, ADDR, str(tmp_path / "r1"))
    assert result.commit == good.commit
    assert len(result.skipped) == 1 and new_file.key in result.skipped[0][1] and "CRC32C" in result.skipped[0][1]
    # a missing blob is named too
    store.delete([new_file.key])
    result = restore(store, ADDR, str(tmp_path / "r2"))
    assert result.commit == good.commit and "missing" in result.skipped[0][1]
    # corrupt metadata is named; nothing restorable at all -> CommitNotFound with every reason
    keys = list_commit_keys(store, ADDR, 1)
    for key in keys:
        raw = bytearray(store.get(key))
        raw[20] ^= 1
        store.delete([key])
        store.put(key, bytes(raw))
    with pytest.raises(CommitNotFound) as err:
        restore(store, ADDR, str(tmp_path / "r3"))
    assert all(k in str(err.value) for k in keys)


def test_metadata_codec_versions_and_damage(tmp_path: Path) -> None:
    shard = Shard(tmp_path / "local")
    c = shard.commit()
    from shardstore.segments.remote_metadata import RemoteFile

    md = RemoteCommitMetadata(c, "w1", {n: RemoteFile(f"k/{n}", s, crc) for n, (s, crc) in c.files().items()})
    raw = md.encode()
    assert RemoteCommitMetadata.decode(raw, "k") == md
    newer = bytearray(raw)
    struct.pack_into("<H", newer, 4, 2)
    body = bytes(newer[:-4])
    with pytest.raises(UnsupportedFormatVersion):
        RemoteCommitMetadata.decode(body + struct.pack("<I", google_crc32c.value(body)), "k")
    with pytest.raises(SegmentCorrupted, match="the-key"):
        RemoteCommitMetadata.decode(raw[:-1], "the-key")
    lying = RemoteCommitMetadata(c, "w1", {n: RemoteFile(f"k/{n}", s + 1, crc) for n, (s, crc) in c.files().items()})
    with pytest.raises(SegmentCorrupted, match="records size"):
        RemoteCommitMetadata.decode(lying.encode(), "k")


@REMOTE
def test_a_stale_primary_is_fenced_and_readers_follow_the_newest_term(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    old_shard = Shard(tmp_path / "old", term=1)
    old = RemoteSegmentStore(store, ADDR, 1)
    old.upload(old_shard.path, old_shard.commit())
    # failover: the new primary restores, claims term 2 and commits
    restore(store, ADDR, str(tmp_path / "new"))
    new_dir = ShardDirectory(str(tmp_path / "new"))
    new_dir.apply(docs(50, ["n1"], term=2))
    c2 = new_dir.flush(local_checkpoint=50, primary_term=2, merge=False)
    new = RemoteSegmentStore(store, ADDR, 2)
    new.upload(str(tmp_path / "new"), c2)
    assert latest_term(store, ADDR) == 2
    # the zombie old primary tries to commit: refused, and readers never pick its commit
    with pytest.raises(CommitConflict, match="stale"):
        old.upload(old_shard.path, old_shard.commit())
    assert latest_commit(store, ADDR).commit == c2
    # GC by the zombie deletes nothing; GC by the new primary keeps the new commit complete
    assert old.plan_gc(keep_last=1).files == frozenset()
    new.gc(keep_last=1)
    result = restore(store, ADDR, str(tmp_path / "after-gc"))
    assert result.commit == c2
    assert ShardDirectory(str(tmp_path / "after-gc")).count() == 51


@REMOTE
def test_gc_keeps_the_last_n_and_locked_commits(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(store, ADDR, 1)
    mds = []
    for i in range(5):
        mds.append(remote.upload(shard.path, shard.commit(20, update=10 if i else 0)))
    keys = list_commit_keys(store, ADDR, 1)
    assert len(keys) == 5
    oldest = keys[-1]
    lock = remote.lock(oldest, "snapshot-1")
    plan = remote.gc(keep_last=2)
    left = list_commit_keys(store, ADDR, 1)
    assert oldest in left and keys[0] in left and keys[1] in left and len(left) == 3
    assert plan.commits == frozenset(keys[2:4])
    # every file of every retained commit is still there
    for key in left:
        md = RemoteCommitMetadata.decode(store.get(key), key)
        for f in md.files.values():
            assert store.exists(f.key), f.key
    remote.unlock(lock)
    remote.gc(keep_last=2)
    assert list_commit_keys(store, ADDR, 1) == keys[:2]


@pytest.mark.parametrize("backend", ["memory", "s3"], indirect=True)
def test_hashed_prefix_layout_round_trip(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    addr = ShardAddress("cluster-h", "index-h", 3, HashedPrefixPathStrategy(bits=8))
    shard = Shard(tmp_path / "local")
    md = RemoteSegmentStore(store, addr, 1).upload(shard.path, shard.commit())
    assert all(not f.key.startswith("cluster-h/") for f in md.files.values())
    assert restore(store, addr, str(tmp_path / "r")).commit == md.commit


def test_remote_segment_store_pickles_cheaply(tmp_path: Path) -> None:
    import pickle

    from shardstore.blobstores import open_store

    remote = RemoteSegmentStore(open_store(f"file://{tmp_path}/s"), ADDR, 4)
    clone = pickle.loads(pickle.dumps(remote))
    assert (clone.address, clone.primary_term, clone.writer) == (remote.address, 4, remote.writer)
    assert len(pickle.dumps(remote)) < 2000


@REMOTE
@pytest.mark.parametrize("cache", [True, None], ids=["disk-cache", "in-memory"])
def test_open_commit_reads_live_docs_and_time_travels(store_factory, tmp_path: Path, cache: bool | None) -> None:
    import pyarrow.compute as pc

    from shardstore.segments.reader import open_commit

    store = store_factory()
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(store, ADDR, 1)
    first = remote.upload(shard.path, shard.commit(40))
    second = remote.upload(shard.path, shard.commit(10, update=5))  # d0..d4 updated
    reader = open_commit(store, ADDR, cache_dir=str(tmp_path / "cache"), cache=cache)
    assert reader.commit == second.commit and reader.count() == 50
    rows = {r["_id"]: r["n"] for b in reader.scan(columns=["_id", "n"]) for r in b.to_pylist()}
    assert len(rows) == 50 and rows["d3"] == 53 and rows["d20"] == 20
    small = [r["_id"] for b in reader.scan(columns=["_id"], filter=pc.field("n") < 3) for r in b.to_pylist()]
    assert sorted(small) == []  # d0..d2 now hold 50..52
    assert reader.get("d3")["n"] == 53 and reader.get("nope") is None
    old = open_commit(store, ADDR, generation=first.generation, cache_dir=str(tmp_path / "cache"), cache=cache)
    assert {r["_id"]: r["n"] for b in old.scan(columns=["_id", "n"]) for r in b.to_pylist()}["d3"] == 3
    # a cached file that no longer matches its checksum is fetched again, never read
    import os
    import pickle

    if cache is None:  # a small commit is held in memory: nothing was written to the disk cache
        assert not os.path.exists(tmp_path / "cache")
        return
    for name in os.listdir(tmp_path / "cache"):
        with open(tmp_path / "cache" / name, "r+b") as f:
            f.seek(10)
            f.write(b"\0\0\0\0")
    again = pickle.loads(pickle.dumps(open_commit(store, ADDR, cache_dir=str(tmp_path / "cache"), cache=True)))
    assert sum(b.num_rows for b in again.scan(columns=["_id"])) == 50


@pytest.mark.parametrize("backend", ["memory", "s3"], indirect=True)
def test_the_path_strategy_is_recorded_once_per_index(store_factory, tmp_path: Path) -> None:
    from shardstore.core.path_strategy import PlainPathStrategy
    from shardstore.segments.remote_store import load_path_strategy

    store = store_factory()
    hashed = ShardAddress("cluster-p", "index-p", 0, HashedPrefixPathStrategy(bits=6))
    shard = Shard(tmp_path / "local")
    RemoteSegmentStore(store, hashed, 1).upload(shard.path, shard.commit())
    assert load_path_strategy(store, "cluster-p", "index-p") == HashedPrefixPathStrategy(bits=6)
    for other in (PlainPathStrategy(), HashedPrefixPathStrategy(bits=8)):
        with pytest.raises(CommitConflict, match="never changes"):
            RemoteSegmentStore(store, ShardAddress("cluster-p", "index-p", 1, other), 1).claim_term()
    RemoteSegmentStore(store, ShardAddress("cluster-p", "index-p", 1, HashedPrefixPathStrategy(bits=6)), 1).claim_term()
    with pytest.raises(CommitNotFound):
        load_path_strategy(store, "cluster-p", "never-written")


@pytest.mark.parametrize("backend", ["file", "s3", "azure"], indirect=True)
def test_big_files_stream_up_and_down_with_checksums(store_factory, tmp_path: Path, monkeypatch) -> None:
    """Files above the streaming threshold go through put_stream / open_read (threshold lowered for the test)."""
    from shardstore.segments import remote_store

    monkeypatch.setattr(remote_store, "STREAM_OVER", 1024)
    store = store_factory()
    shard = Shard(tmp_path / "local")
    c = shard.commit(300)
    assert max(size for size, _ in c.files().values()) > 1024
    md = RemoteSegmentStore(store, ADDR, 1).upload(shard.path, c)
    result = restore(store, ADDR, str(tmp_path / "r"))
    assert result.commit == c
    assert ShardDirectory(str(tmp_path / "r")).count() == 300
    big = next(f for f in md.files.values() if f.size > 1024)
    data = bytearray(store.get(big.key))
    data[-100] ^= 1
    store.delete([big.key])
    store.put(big.key, bytes(data))
    with pytest.raises(CommitNotFound, match="CRC32C"):
        restore(store, ADDR, str(tmp_path / "r2"))
    assert not [p for p in (tmp_path / "r2").iterdir() if p.name.endswith(".part")]


def test_big_metadata_bodies_are_compressed_and_checked(tmp_path: Path) -> None:
    from shardstore.core.records import COMPRESS_OVER, RecordCorrupted, decode_record, encode_record

    body = {"files": {f"seg_{i:05d}.parquet": [f"cluster/1/index/0/segments/data/seg_{i:05d}__x", i, i * 7]
                      for i in range(500)}}
    raw = encode_record(b"TEST", 1, body)
    assert len(raw) < len(str(body)) / 3 and len(str(body)) > COMPRESS_OVER
    assert decode_record(raw, magic=b"TEST", supported=1, where="w", what="t") == (1, body)
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 4
    with pytest.raises(RecordCorrupted, match="CRC32C"):
        decode_record(bytes(flipped), magic=b"TEST", supported=1, where="w", what="t")
    with pytest.raises(SegmentCorrupted, match="CRC32C"):  # the segments' decoders name their subsystem
        decode_record(bytes(flipped), magic=b"TEST", supported=1, where="w", what="t", corrupt=SegmentCorrupted)
    small = encode_record(b"TEST", 1, {"a": 1})
    assert b'{"a":1}' in small  # small bodies stay plain JSON


def test_gc_under_a_stale_listing_keeps_every_file_of_the_commits_it_wrote(tmp_path: Path) -> None:
    """A LIST of the commit metadata that lags the newest PUT (an eventually consistent listing, injected with
    FaultyStore: no real service lags on demand) hid the newest commit from GC, which then deleted the files
    only that commit names: the newest commit was unrestorable (fault simulator, seed 295).  The uploader
    knows the commits it wrote itself, so GC keeps them whatever the listing says."""
    from shardstore.blobstores import open_backend
    from shardstore.testing import FaultyStore

    store = FaultyStore(open_backend(f"memory://stale-gc-{tmp_path.name}"))
    shard = Shard(tmp_path / "local")
    remote = RemoteSegmentStore(store, ADDR, 1)
    for i in range(3):
        newest = remote.upload(shard.path, shard.commit(20, update=10 if i else 0))
    store.inject(op="list", key="*segments/metadata*", action="stale_list", lag=1)
    remote.gc(keep_last=1)
    for f in newest.files.values():
        assert store.exists(f.key), f"{f.key}: a file of the newest commit was deleted"
    restore(store, ADDR, str(tmp_path / "restored"))


@REMOTE
def test_a_local_segment_that_changed_since_its_commit_is_not_uploaded(store_factory, tmp_path: Path) -> None:
    """A segment file whose bytes no longer match its commit (a flipped byte on the local disk) is refused before
    it leaves the node, naming the file; nothing of the commit is written (its other files may be)."""
    store = store_factory()
    shard = Shard(tmp_path / "local")
    c = shard.commit()
    seg = next(n for n in c.files() if n.endswith(".parquet"))
    path = Path(shard.path) / seg
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    remote = RemoteSegmentStore(store, ADDR, 1)
    with pytest.raises(SegmentCorrupted, match=f"{seg}.*CRC32C.*not uploading it"):
        remote.upload(shard.path, c)
    with pytest.raises(CommitNotFound):
        latest_commit(store, ADDR)
    assert not [b.key for b in store.list() if seg in b.key]
