"""A bulk that fills the indexing buffer seals it; its segments are written beside the writes (issues 31, 44).

The sealed buffer's segments are written on a thread of their own while the bulk's translog frame is
encoded and uploaded, and while the next bulks are applied: the write is acknowledged once its
translog landed, without waiting for them.  Until they are installed, the sealed operations stay
visible to version lookups and realtime gets.  A refresh that fails off the local disk puts the
documents back in front of the buffer (the next refresh writes them) and the writes stay acknowledged.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.datasets import flights
from shardstore.engine import Cluster
from shardstore.segments import directory as directory_module
from shardstore.segments import row_cache
from shardstore.segments.directory import ShardDirectory
from shardstore.testing.partition_campaign import wait_until
from shardstore.translog.node_translog import NodeShardTranslog


def test_the_refresh_of_a_full_buffer_runs_beside_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer is sealed before the append, its segments written on a ``refresh-`` thread that the bulk does not
    wait for: it is acknowledged while they may still be written, and they are searchable soon after."""
    events: list[tuple[str, str]] = []
    seal, write_sealed, append = ShardDirectory.seal, ShardDirectory.write_sealed, NodeShardTranslog.append
    release = threading.Event()

    def spy_seal(self, *a, **k):
        events.append(("seal", threading.current_thread().name))
        return seal(self, *a, **k)

    def spy_write(self, *a, **k):
        events.append(("write", threading.current_thread().name))
        assert release.wait(30), "the test never let the refresh go on"
        return write_sealed(self, *a, **k)

    def spy_append(self, *a, **k):
        events.append(("append", threading.current_thread().name))
        return append(self, *a, **k)

    monkeypatch.setattr(ShardDirectory, "seal", spy_seal)
    monkeypatch.setattr(ShardDirectory, "write_sealed", spy_write)
    monkeypatch.setattr(NodeShardTranslog, "append", spy_append)
    table = flights(5_000)
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "n"), nodes=1,
                      index_buffer_bytes=64 << 10)
    try:
        cluster.create_index("f", shards=1, replicas=0)
        events.clear()
        result = cluster.bulk("f", table)  # returns while its refresh is held back by the spy
        assert not result.errors and len(result.acknowledged) == 5_000
        assert events[0][0] == "seal" and ("append", events[0][1]) in events, events  # sealed, then appended
        assert any(kind == "write" and name.startswith("refresh-") for kind, name in events), events
        copy = cluster.primary_copy("f", 0)
        assert not copy.directory._buffer and copy.directory._sealed is not None  # sealed, not yet written
        assert cluster.get("f", table.column("_id")[17].as_py()) is not None  # found in the sealed buffer
        assert copy.directory.count() == 0  # nothing searchable yet: the segments are still being written
        assert row_cache.warmer._writes >= 1  # the row-cache warmer yields to the refresh as to any write
        release.set()
        wait_until(lambda: copy.directory.count() == 5_000, timeout=30, what="the refresh beside the writes")
        assert copy.directory._sealed is None
        wait_until(lambda: row_cache.warmer._writes == 0, timeout=30, what="the warmer's writes count back at 0")
    finally:
        release.set()
        cluster.close()


def test_a_failed_early_refresh_keeps_the_documents_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no real part produces on demand: the refresh raises a non-disk error (a mock, said so here).  The
    write stays acknowledged, and the next refresh writes the sealed documents with the rest."""
    plan = directory_module.plan_refresh
    calls = {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected refresh failure")
        return plan(*a, **k)

    monkeypatch.setattr(directory_module, "plan_refresh", failing)
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "n"), nodes=1,
                      index_buffer_bytes=64 << 10)
    try:
        cluster.create_index("f", shards=1, replicas=0)
        result = cluster.bulk("f", flights(2_000))
        assert not result.errors and len(result.acknowledged) == 2_000
        wait_until(lambda: calls["n"] == 1 and cluster.primary_copy("f", 0).directory._sealed_failed,
                   timeout=30, what="the failed refresh")
        assert cluster.get("f", "17") is not None  # still found: the failed sealed buffer stays visible
        cluster.refresh("f")
        assert cluster.count("f") == 2_000
    finally:
        cluster.close()
