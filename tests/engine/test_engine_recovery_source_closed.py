"""A peer recovery whose source closes stops with a typed, retryable error (issue 14, case 6b).

Before, it died inside the allocation worker with a raw ``FileNotFoundError`` or
``ValueError: flush of closed file``.  Here the source copy is closed (as ``kill_node`` or a
failover closes it) before its recovery runs: a real closed copy, no mock.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.engine import Cluster
from shardstore.engine.errors import RecoverySourceClosed
from shardstore.engine.recovery import peer_recover


@pytest.mark.parametrize("flushed", [True, False])
def test_recovery_from_a_closed_source_raises_a_typed_error(tmp_path: Path, flushed: bool) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=1,
                      recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i)} for i in range(100)]).errors
        if flushed:
            cluster.flush("docs")
        source = cluster._primary_copy("docs", 0)
        spec = cluster._spec(cluster.indices["docs"], 0)
        source.close()
        with pytest.raises(RecoverySourceClosed, match=r"source .* closed") as info:
            peer_recover(source, spec, str(tmp_path / "target"), cluster.store, shard_lock=threading.RLock(),
                         finalize=lambda replica: True)
        assert info.value.retryable
    finally:
        cluster.close()
