"""A flush of a copy that changed nothing makes no request (issue 30; engine/shard/flush_policy.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.engine.shard.flush_policy import FlushMark, flush_needed


def test_flush_needed_against_every_single_change() -> None:
    base = FlushMark(primary_term=2, primary=True, max_seq_no=10, local_checkpoint=10, global_checkpoint=9)
    assert flush_needed(None, base)  # never flushed since opened or promoted
    assert not flush_needed(base, base)
    assert flush_needed(base, base, older_terms_pending=True)
    changes = {"primary_term": 3, "primary": False, "max_seq_no": 11, "local_checkpoint": 11, "global_checkpoint": 10,
               "merges": 1}
    for k in range(1, len(changes) + 1):
        for names in itertools.combinations(changes, k):  # every combination of fields that moved
            assert flush_needed(base, replace(base, **{n: changes[n] for n in names})), names


def _restored_count(tmp_path: Path, index: str) -> int:
    """The documents of ``index`` in a cluster restored from the store under ``tmp_path`` (one node)."""
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=1)
    try:
        restored.refresh(index)
        return restored.count(index)
    finally:
        restored.close()


def _requests(cluster: Cluster) -> int:
    return sum(cluster.store.metrics()["requests"].values())


def test_a_flush_touches_only_the_shards_that_changed(tmp_path: Path) -> None:
    shards = 20
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}?create=true", data_dir=str(tmp_path / "data"), nodes=1)
    try:
        cluster.create_index("i", shards=shards, replicas=0)
        assert not cluster.bulk("i", [{"_id": str(k), "v": k} for k in range(2_000)]).errors
        cluster.flush("i")
        cluster.flush("i")  # the first flush after it: every shard settled (its purge gate, its GC)
        before = _requests(cluster)
        cluster.flush("i")
        assert _requests(cluster) == before  # nothing changed: no request at all
        ids = [f"x{k}" for k in range(400)]
        routed = shard_ids(pa.array(ids, pa.string()), shards).to_pylist()
        one = [i for i, s in zip(ids, routed) if s == 0][:10]
        assert not cluster.bulk("i", [{"_id": i, "v": 1} for i in one]).errors
        before = _requests(cluster)
        cluster.flush("i")
        flushed = _requests(cluster) - before
        assert 0 < flushed <= 5, flushed  # one shard's commit (segment, fence, commit, translog metadata, purge)
        cluster.refresh("i")
        assert cluster.count("i") == 2_010
    finally:
        cluster.close()
    assert _restored_count(tmp_path, "i") == 2_010


def test_the_remote_purge_gate_keeps_one_commit_to_fall_back_to_except_on_a_shards_first() -> None:
    """Every short history of commit checkpoints (pure: engine/shard/flush_policy.py, ``remote_purge_gate``)."""
    from itertools import product

    from shardstore.engine.shard.flush_policy import FALLBACK_COMMITS, remote_purge_gate

    for n in range(1, 4):
        for recent in product(range(-1, 4), repeat=n):
            recent = sorted(recent)
            first = remote_purge_gate(recent, first_of_shard=True)
            normal = remote_purge_gate(recent, first_of_shard=False)
            assert first == recent[-1]  # the first commit covers its whole translog
            assert normal == (recent[-FALLBACK_COMMITS] if n >= FALLBACK_COMMITS else -1)
            assert normal <= first  # never purges more than the newest commit covers
    with pytest.raises(ValueError):
        remote_purge_gate([], first_of_shard=False)


def test_a_new_shards_first_flush_leaves_no_remote_translog_behind(tmp_path) -> None:
    """Issue 31: after the first flush the store holds the commit, not the shard a second time as translog;
    the second flush keeps the translog above the first commit (its fallback), as before."""
    from shardstore.engine import Cluster

    remote = tmp_path / "remote"
    cluster = Cluster(store=f"file://{remote}", data_dir=str(tmp_path / "n"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(50)]).errors
        cluster.flush("docs")
        translog = [p for p in remote.rglob("*") if p.is_file() and "node_translog" in p.parts and "data" in p.parts]
        assert translog == [], translog
        assert not cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(50, 60)]).errors
        cluster.flush("docs")
        kept = [p for p in remote.rglob("*") if p.is_file() and "node_translog" in p.parts and "data" in p.parts]
        assert len(kept) == 1  # the second round's: above the first commit, the fallback of the second
    finally:
        cluster.close()


def test_a_merge_installed_after_its_flush_is_committed_by_the_next_one(tmp_path: Path) -> None:
    """Merges run after the flush that asked for them (segments/merge_scheduler.py): on a shard that takes no more
    writes, the next flush still commits the merged segment (it is not skipped as unchanged), and a restore of the
    store finds every document."""
    from shardstore.segments.merge_scheduler import merges

    cluster = Cluster(store=f"file://{tmp_path / 'remote'}?create=true", data_dir=str(tmp_path / "data"), nodes=1)
    try:
        cluster.create_index("i", shards=1, replicas=0)
        for b in range(25):  # 25 small segments: more than the tiered policy allows
            assert not cluster.bulk("i", [{"_id": f"{b}-{k}", "v": k} for k in range(20)]).errors
            cluster.refresh("i")
        cluster.flush("i")
        copy = cluster.nodes[cluster.primary_of("i", 0)].copies[(cluster.indices["i"].uuid, 0)]
        committed = len(copy.directory.last_commit.segments)
        assert merges.wait_idle(30) and copy.directory.merges_installed > 0
        cluster.flush("i")  # nothing written since: only the merge changed
        assert len(copy.directory.last_commit.segments) < committed == 25
    finally:
        cluster.close()
    assert _restored_count(tmp_path, "i") == 500


@pytest.mark.parametrize(("err", "fails"), [(28, False), (5, True)])  # ENOSPC, EIO
def test_a_merge_out_of_space_is_retried_and_an_io_error_fails_the_copy(tmp_path: Path, monkeypatch, err: int,
                                                                        fails: bool) -> None:
    """A mock for faults no real disk produces on demand (said so here): the merge thread's ``maybe_merge`` raises.
    Out of space changes nothing (the next flush merges again); an I/O error fails the copy as a write's would (every
    later call on the copy raises its LocalDiskError) and the node reports it at once (test_engine_local_disk.py)."""
    from shardstore.errors import LocalDiskError

    cluster = Cluster(store=f"file://{tmp_path / 'remote'}?create=true", data_dir=str(tmp_path / "data"), nodes=1)
    try:
        cluster.create_index("i", shards=1, replicas=0)
        assert not cluster.bulk("i", [{"_id": "a", "v": 1}]).errors
        copy = cluster.nodes[cluster.primary_of("i", 0)].copies[(cluster.indices["i"].uuid, 0)]
        monkeypatch.setattr(copy.directory, "maybe_merge", lambda: (_ for _ in ()).throw(OSError(err, "injected")))
        copy._merge()
        assert (copy.disk_failure is not None) is fails
        if fails:
            with pytest.raises(LocalDiskError, match="local merge failed"):
                copy.flush()
    finally:
        cluster.close()
