"""The segments' read plan: tasks split from a commit, read through the one verified cache (issue 17)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore.blobstores import open_store
from shardstore.core.address import ShardAddress
from shardstore.core.ops import OpType
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.errors import CommitConflict, CommitNotFound, SegmentCorrupted, TermAlreadyClaimed
from shardstore.segments.read_plan import CommitPlan, ReadTask, cache_path, fetch_verified
from shardstore.segments.reader import open_commit
from shardstore.segments.remote_store import RemoteSegmentStore
from shardstore.segments.segment import BASE_SCHEMA
from shardstore.translog.operations import index_batch, stamp, unstamped_batch

ADDR = ShardAddress("cluster-p", "index-p", 0)
SCHEMA = pa.schema([BASE_SCHEMA.field("_id"), BASE_SCHEMA.field("_seq_no"), pa.field("n", pa.int64())])


@pytest.fixture
def shard(tmp_path: Path):
    """A remote commit of 2 segments: d0..d99, then d100..d149 with d0..d9 deleted and d20 updated."""
    store = open_store(f"file://{tmp_path}/store", create="true")
    directory = ShardDirectory(str(tmp_path / "local"), keep_commits=2)
    directory.apply(stamp(index_batch([f"d{i}" for i in range(100)],
                                      [json.dumps({"n": i}).encode() for i in range(100)]), 0, 1))
    directory.refresh()
    directory.apply(stamp(index_batch([f"d{i}" for i in range(100, 150)] + ["d20"],
                                      [json.dumps({"n": i}).encode() for i in range(100, 150)] + [b'{"n":-20}']),
                          100, 1))
    directory.apply(stamp(unstamped_batch([OpType.DELETE] * 10, [f"d{i}" for i in range(10)], [2] * 10, [None] * 10),
                          151, 1))
    commit = directory.flush(local_checkpoint=160, primary_term=1, merge=False)
    remote = RemoteSegmentStore(store, ADDR, 1)
    md = remote.upload(directory.path, commit)
    directory.close()
    return store, md, tmp_path / "cache"


def _rows(tasks: list[ReadTask], store, cache: Path, **kw) -> dict[str, int]:
    return {r["_id"]: r["n"] for t in tasks for b in t.read(store, SCHEMA, cache_dir=str(cache), **kw)
            for r in b.to_pylist()}


def test_tasks_read_exactly_what_the_commit_scan_reads(shard) -> None:
    store, md, cache = shard
    plan = open_commit(store, ADDR, cache_dir=str(cache)).plan(shard=0)
    tasks = plan.tasks()
    assert len(tasks) == len([s for s in md.commit.segments if s.live_count])
    rows = _rows(tasks, store, cache)
    oracle = {r["_id"]: r["n"] for b in open_commit(store, ADDR, cache_dir=str(cache)).scan(["_id", "n"])
              for r in b.to_pylist()}
    assert rows == oracle and len(rows) == 140 and rows["d20"] == -20 and "d5" not in rows
    filtered = _rows(tasks, store, cache, filter=pc.field("n") >= 140)
    assert filtered == {f"d{i}": i for i in range(140, 150)}


def test_superseded_ids_and_row_group_ranges(shard) -> None:
    store, md, cache = shard
    plan = CommitPlan(0, md).with_superseded(pa.array(["d30", "d120", "zzz"]))
    tasks = plan.tasks()
    clipped = [i for t in tasks for i in (t.superseded.to_pylist() if t.superseded is not None else [])]
    assert set(clipped) == {"d120", "d30"}  # clipped to each segment's (string) id range: "zzz" is in none
    rows = _rows(tasks, store, cache)
    assert "d30" not in rows and "d120" not in rows and len(rows) == 138
    by_group = plan.tasks(row_groups_per_task=1)
    assert len(by_group) == sum(max(1, s.info.row_groups) for s in md.commit.segments if s.live_count)
    kept = plan.tasks(keep=lambda info: info.min_id >= "d100")  # pruned by the segments' stats
    assert kept and len(kept) < len(tasks) and all(t.info.min_id >= "d100" for t in kept)
    path, deleted = tasks[0].local_file(store, str(cache))
    assert os.path.exists(path) and deleted is not None and len(deleted) >= 1


def test_a_task_pickles_small_and_reads_on_another_process_side(shard) -> None:
    store, md, cache = shard
    task = CommitPlan(0, md).tasks()[0]
    blob = pickle.dumps(task)
    assert len(blob) < 4096 and b"PAR1" not in blob  # references and stats, never the segment's bytes
    assert _rows([pickle.loads(blob)], store, cache) == _rows([task], store, cache)


def test_the_verified_cache_refetches_a_damaged_copy_and_names_a_damaged_blob(shard) -> None:
    store, md, cache = shard
    remote = next(iter(md.files.values()))
    path = fetch_verified(store, remote, str(cache))
    assert path == cache_path(remote, str(cache))
    with open(path, "r+b") as f:  # rewritten in place behind the memo's back
        f.seek(4)
        f.write(b"\xff\xff\xff\xff")
    assert fetch_verified(store, remote, str(cache), recheck=True) == path
    with open(path, "rb") as f:
        assert len(f.read()) == remote.size
    os.remove(path)
    data = bytearray(store.get(remote.key))
    data[len(data) // 2] ^= 1
    store.put(remote.key, bytes(data))  # the blob itself is damaged: refused, naming it
    with pytest.raises(SegmentCorrupted, match=remote.key.split("/")[-1]):
        fetch_verified(store, remote, str(cache))


def test_a_cache_download_skips_the_fsyncs_and_a_torn_copy_is_fetched_again(shard, monkeypatch) -> None:
    """The verified cache is not made durable (every later use checks it: docs/design/segments.md, "Read plan");
    a restore's download is."""
    from shardstore.segments import read_plan
    from shardstore.segments.remote_store import download_file

    store, md, cache = shard
    remote = next(iter(md.files.values()))
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = fetch_verified(store, remote, str(cache))
    assert synced == [] and os.path.getsize(path) == remote.size
    download_file(store, remote, str(cache / "durable"))
    assert len(synced) >= 2  # the file and its directory
    with open(path, "r+b") as f:  # what a crash before the page cache reached the disk can leave: same size, zeros
        f.write(b"\0" * remote.size)
    monkeypatch.setattr(read_plan, "_VERIFIED", {})  # a new process remembers nothing
    assert fetch_verified(store, remote, str(cache)) == path
    with open(path, "rb") as f:
        assert f.read() == store.get(remote.key)


def test_open_commit_as_of_a_seq_no(shard) -> None:
    store, md, cache = shard
    assert open_commit(store, ADDR, max_seq_no=10_000).commit == md.commit
    with pytest.raises(CommitNotFound, match="up to seq# 5"):
        open_commit(store, ADDR, max_seq_no=5)


def test_publish_is_the_one_commit_write_and_exclusive_claims_conflict(shard) -> None:
    store, md, _cache = shard
    other = RemoteSegmentStore(store, ADDR, 1, writer="someone-else")
    with pytest.raises(TermAlreadyClaimed, match="claimed by another writer"):
        other.claim_term(exclusive=True)  # term 1's marker was written by the first uploader
    job = RemoteSegmentStore(store, ADDR, 3, writer="job")
    job.claim_term(exclusive=True)
    out = job.publish(md.commit, md.files)
    assert open_commit(store, ADDR).metadata.writer == "job" and out.files == md.files
    assert job.publish(md.commit, md.files).commit == md.commit  # our own retried PUT: the same bytes
    with pytest.raises(CommitConflict, match="claimed by primary term 3"):
        RemoteSegmentStore(store, ADDR, 2, writer="stale").publish(md.commit, md.files)
