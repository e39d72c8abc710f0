"""A flush of a copy that changed nothing makes no request (issue 30; engine/flush_policy.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from shardstore.engine import Cluster
from shardstore.engine.flush_policy import FlushMark, flush_needed
from shardstore.engine.routing import shard_ids


def test_flush_needed_against_every_single_change() -> None:
    base = FlushMark(primary_term=2, primary=True, max_seq_no=10, local_checkpoint=10, global_checkpoint=9)
    assert flush_needed(None, base)  # never flushed since opened or promoted
    assert not flush_needed(base, base)
    assert flush_needed(base, base, older_terms_pending=True)
    changes = {"primary_term": 3, "primary": False, "max_seq_no": 11, "local_checkpoint": 11, "global_checkpoint": 10}
    for k in range(1, len(changes) + 1):
        for names in itertools.combinations(changes, k):  # every combination of fields that moved
            assert flush_needed(base, replace(base, **{n: changes[n] for n in names})), names


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
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=1)
    try:
        restored.refresh("i")
        assert restored.count("i") == 2_010
    finally:
        restored.close()
