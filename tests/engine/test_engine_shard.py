"""Shard copies: primary/replica writes, flush with remote commit and translog purge, promotion, fencing, recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine.errors import OperationTermTooOld, StalePrimary
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.translog.operations import index_batch

REMOTE = pytest.mark.parametrize("backend", ["file", "s3"], indirect=True)


def bulk(ids: list[str], tag: str = "") -> pa.RecordBatch:
    return index_batch(ids, [json.dumps({"tag": tag, "n": i}).encode() for i, _ in enumerate(ids)])


def visible(copy: ShardCopy) -> dict[str, str]:
    copy.directory.refresh()
    out: dict[str, str] = {}
    if "tag" not in copy.directory.mapping:
        return out
    for b in copy.directory.scan(columns=["_id", "tag"]):
        out.update(zip(b.column("_id").to_pylist(), b.column("tag").to_pylist()))
    return out


@REMOTE
def test_failover_and_recovery_keep_every_acknowledged_write(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    spec = ShardSpec("cluster-e", "index-e", 0, buffer_interval=0.01)
    primary = ShardCopy(spec, str(tmp_path / "n1"), store, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "n2"), store, primary_term=1, primary=False)
    acked: dict[str, str] = {}

    def write(p: ShardCopy, r: ShardCopy | None, ids: list[str], tag: str) -> None:
        stamped = p.primary_apply(bulk(ids, tag))
        if r is not None:
            lc = r.replica_apply(stamped, p.primary_term, p.global_checkpoint)
            p.update_global_checkpoint(min(lc, p.local_checkpoint))
        acked.update({i: tag for i in ids})

    write(primary, replica, [f"a{i}" for i in range(300)], "one")
    primary.flush()
    write(primary, replica, [f"a{i}" for i in range(100)] + [f"b{i}" for i in range(200)], "two")
    # the old primary goes away; the replica is promoted with term 2 and writes on
    primary.close()
    replica.promote(2)
    write(replica, None, [f"c{i}" for i in range(50)] + ["a1"], "three")
    assert visible(replica) == acked
    # the zombie old primary cannot commit any more: the new term claimed the shard
    zombie = ShardCopy(spec, str(tmp_path / "n1"), store, primary_term=1, primary=False)
    zombie.primary = True
    from shardstore.segments.remote_store import RemoteSegmentStore

    zombie.remote_segments = RemoteSegmentStore(store, spec.address, 1)
    with pytest.raises(StalePrimary, match="superseded"):
        zombie.flush()
    zombie.close()
    # losing every disk: recovery from the blob store alone gives back exactly the acknowledged writes
    replica.flush()
    write(replica, None, [f"d{i}" for i in range(20)], "after-flush")  # only in the remote translog
    replica.close()
    restored = ShardCopy.recover_from_remote(spec, str(tmp_path / "fresh"), store, primary_term=3)
    assert visible(restored) == acked
    assert restored.primary and restored.primary_term == 3
    restored.close()


def test_a_replica_refuses_an_older_term(tmp_path: Path) -> None:
    spec = ShardSpec("cluster-t", "index-t", 0)
    replica = ShardCopy(spec, str(tmp_path / "r"), None, primary_term=2, primary=False)
    old = ShardCopy(spec, str(tmp_path / "p"), None, primary_term=1, primary=True)
    stamped = old.primary_apply(bulk(["x"]))
    with pytest.raises(OperationTermTooOld, match="term 1"):
        replica.replica_apply(stamped, 1, -1)
    assert visible(replica) == {}
    with pytest.raises(StalePrimary):
        replica.primary_apply(bulk(["y"]))
    old.close()
    replica.close()


def test_promotion_fills_seq_no_gaps_with_no_ops(tmp_path: Path) -> None:
    spec = ShardSpec("cluster-g", "index-g", 0)
    primary = ShardCopy(spec, str(tmp_path / "p"), None, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "r"), None, primary_term=1, primary=False)
    batches = [primary.primary_apply(bulk([f"k{i}"])) for i in range(5)]
    for b in (batches[0], batches[1], batches[4]):  # seq# 2 and 3 never reached the replica
        replica.replica_apply(b, 1, -1)
    assert (replica.local_checkpoint, replica.max_seq_no) == (1, 4)
    replica.promote(2)
    assert replica.local_checkpoint == 4  # gaps 2..3 filled with no-ops of term 2
    assert set(visible(replica)) == {"k0", "k1", "k4"}
    ops = [b for b in replica.translog.read_operations(0)]
    terms = {s: t for b in ops for s, t in zip(b.column("seq_no").to_pylist(), b.column("primary_term").to_pylist())}
    assert terms[2] == 2 and terms[3] == 2 and terms[4] == 1
    primary.close()
    replica.close()


@REMOTE
def test_a_stale_primary_without_replicas_never_acknowledges_a_lost_write(store_factory, tmp_path: Path) -> None:
    """0 replicas: the old primary did not hear of its demotion; its next write fails, and no reader keeps it."""
    store = store_factory()
    spec = ShardSpec("cluster-z", "index-z", 0, buffer_interval=0.01)
    old = ShardCopy(spec, str(tmp_path / "old"), store, primary_term=1, primary=True)
    old.primary_apply(bulk([f"a{i}" for i in range(20)], "acked"))
    # the cluster manager lost contact and rebuilt the shard from the store on another node
    new = ShardCopy.recover_from_remote(spec, str(tmp_path / "new"), store, primary_term=2)
    with pytest.raises(StalePrimary, match="stale"):
        old.primary_apply(bulk(["lost"], "never-acked"))
    new.primary_apply(bulk(["b0"], "new"))
    assert set(visible(new)) == {f"a{i}" for i in range(20)} | {"b0"}
    new.flush()
    new.close()
    old.close()
    again = ShardCopy.recover_from_remote(spec, str(tmp_path / "again"), store, primary_term=3)
    got = visible(again)
    assert "lost" not in got and got["b0"] == "new" and len(got) == 21
    again.close()


def test_a_replica_warms_no_row_group_until_it_is_promoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica serves no point reads: its refreshed segments are not decoded into the row cache (issue 43: that
    was a core's half of the ingest's background work); promoted, its segments are warmed for the gets it answers."""
    from shardstore.segments import row_cache

    cache = row_cache.RowGroupCache(64 << 20)
    warmer = row_cache.Warmer(cache, enabled=True)
    monkeypatch.setattr(row_cache, "row_groups", cache)
    monkeypatch.setattr(row_cache, "warmer", warmer)
    spec = ShardSpec("cluster-w", "index-w", 0)
    primary = ShardCopy(spec, str(tmp_path / "n1"), None, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "n2"), None, primary_term=1, primary=False)
    try:
        stamped = primary.primary_apply(bulk([f"d{i}" for i in range(2_000)], "x"))
        replica.replica_apply(stamped, 1, primary.global_checkpoint)
        primary.refresh()
        replica.refresh()
        assert warmer.wait_idle(60)
        warmed_by_primary = warmer.warmed_groups
        assert warmed_by_primary >= 1
        replica.promote(2)
        assert warmer.wait_idle(60)
        assert warmer.warmed_groups == 2 * warmed_by_primary  # the promoted copy's segment, warmed only now
    finally:
        primary.close()
        replica.close()
