"""flush/refresh while a copy of the shard fails (issue 14, case 4).

They used to read the routing once and then raise ``KeyError`` or ``ValueError: flush of
closed file`` part-way when a replica was failed (a node killed) meanwhile.  A copy that is
gone is skipped; the copies still routed are flushed; nothing acknowledged is lost.  Real
threads and a real node kill; the kill lands while the primary is still flushing, a window
widened here by a large buffer, not by a mock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shardstore.engine import Cluster

N = 30_000


@pytest.mark.parametrize("operation", ["flush", "refresh"])
def test_a_replica_killed_during_flush_or_refresh_is_skipped(tmp_path: Path, operation: str) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=2,
                      recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        assert not cluster.bulk("docs", [{"_id": str(i), "n": i, "s": "x" * 50} for i in range(N)]).errors
        replica = next(n for n in cluster.indices["docs"].routing[0].copies if n != cluster.primary_of("docs", 0))
        errors: list[BaseException] = []

        def run() -> None:
            try:
                getattr(cluster, operation)("docs")
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(0.02)  # the primary's flush/refresh is under way
        cluster.kill_node(replica)
        worker.join()
        assert errors == [], errors
        cluster.flush("docs")
        cluster.refresh("docs")
        assert cluster.count("docs") == N
        cluster.start_node(replica)
        cluster.wait_for_health("green", timeout=60)
        cluster.flush("docs")  # every copy of the new routing
    finally:
        cluster.close()
