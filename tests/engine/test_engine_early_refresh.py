"""A bulk that fills the indexing buffer starts its refresh before its translog append (issue 31).

The segments are then written while the frame is encoded, and the write's ``settle`` joins
the refresh: the documents are searchable when the bulk returns.  A refresh that fails off
the local disk leaves the documents buffered and the write acknowledged, as before.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.datasets import flights
from shardstore.engine import Cluster
from shardstore.segments.directory import ShardDirectory
from shardstore.translog.node_translog import NodeShardTranslog


def test_the_refresh_of_a_full_buffer_runs_beside_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    refresh, append = ShardDirectory.refresh, NodeShardTranslog.append

    def spy_refresh(self, *a, **k):
        events.append(("refresh", threading.current_thread().name))
        return refresh(self, *a, **k)

    def spy_append(self, *a, **k):
        events.append(("append", threading.current_thread().name))
        return append(self, *a, **k)

    monkeypatch.setattr(ShardDirectory, "refresh", spy_refresh)
    monkeypatch.setattr(NodeShardTranslog, "append", spy_append)
    table = flights(5_000)
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "n"), nodes=1,
                      index_buffer_bytes=64 << 10)
    try:
        cluster.create_index("f", shards=1, replicas=0)
        events.clear()
        assert not cluster.bulk("f", table).errors
        kinds = [e[0] for e in events]
        assert kinds[:2] == ["refresh", "append"], events  # begun first, on a thread of its own
        assert events[0][1].startswith("refresh-")
        # joined before the bulk returned: the documents are in a segment, nothing is buffered
        copy = cluster.primary_copy("f", 0)
        assert not copy.directory._buffer and copy.directory.count() == 5_000
    finally:
        cluster.close()


def test_a_failed_early_refresh_keeps_the_documents_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no real part produces on demand: the refresh raises a non-disk error (a mock, said so here)."""
    refresh = ShardDirectory.refresh
    calls = {"n": 0}

    def failing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected refresh failure")
        return refresh(self, *a, **k)

    monkeypatch.setattr(ShardDirectory, "refresh", failing)
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "n"), nodes=1,
                      index_buffer_bytes=64 << 10)
    try:
        cluster.create_index("f", shards=1, replicas=0)
        result = cluster.bulk("f", flights(2_000))
        assert not result.errors and len(result.acknowledged) == 2_000
        assert calls["n"] == 1
        cluster.refresh("f")
        assert cluster.count("f") == 2_000
    finally:
        cluster.close()
