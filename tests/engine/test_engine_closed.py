"""A cluster closed under its clients (the coordinator killed mid-request) answers with a typed error, never a raw one.

A bulk over two shards racing ``Cluster.close()`` raised ``RuntimeError: cannot schedule new futures
after shutdown`` from the bulk's thread pool; calls after the close went on as if nothing happened.
Now every call on a closed cluster raises ``ClusterClosed`` (an ``UnavailableError``: the same call
against a restarted cluster may succeed), and what was acknowledged before the close is restored.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.engine import Cluster
from shardstore.engine.errors import ClusterClosed
from shardstore.errors import ShardstoreError


def test_calls_on_a_closed_cluster_raise_cluster_closed(tmp_path: Path) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=2,
                      recovery_delay=0.05)
    cluster.create_index("docs", shards=2, replicas=1)
    assert not cluster.bulk("docs", [{"_id": str(i), "v": 1} for i in range(8)]).errors
    cluster.close()
    for call in (lambda: cluster.bulk("docs", [{"_id": str(i)} for i in range(8)]),
                 lambda: cluster.delete("docs", "1"), lambda: cluster.get("docs", "1"),
                 lambda: cluster.count("docs"), lambda: cluster.refresh("docs"), lambda: cluster.flush("docs"),
                 lambda: cluster.create_index("other")):
        with pytest.raises(ClusterClosed, match="closed"):
            call()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "fresh"), nodes=1)
    try:
        restored.refresh("docs")
        assert restored.count("docs") == 8
    finally:
        restored.close()


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.02])
def test_a_bulk_racing_close_gets_results_or_a_typed_error(tmp_path: Path, delay: float) -> None:
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=2,
                      recovery_delay=0.05)
    cluster.create_index("docs", shards=2, replicas=1)
    outcome: list[object] = []

    def client() -> None:
        try:
            outcome.append(cluster.bulk("docs", [{"_id": str(i), "v": 2} for i in range(8)]))
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    t = threading.Thread(target=client)
    t.start()
    threading.Event().wait(delay)
    cluster.close()
    t.join()
    result = outcome[0]
    if isinstance(result, BaseException):
        assert isinstance(result, ShardstoreError), repr(result)
        acked: set[str] = set()
    else:
        acked = set(result.acknowledged)
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "fresh"), nodes=1)
    try:
        restored.refresh("docs")
        got = {d["_id"] for d in restored.scan("docs", columns=["_id"]).to_pylist()}
        assert acked <= got
    finally:
        restored.close()


def test_a_closed_cluster_leaves_no_thread_behind_and_logs_no_failure(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """``close`` stops every node's loops before it stops the nodes: a manager outliving its members does not
    report them as failed nor step down for want of a majority (warnings an operator would chase after a
    normal shutdown), and no thread of the cluster is left running (thread pools, publishers)."""
    import logging
    import time

    before = set(threading.enumerate())
    with caplog.at_level(logging.INFO, logger="shardstore"):
        for k, (nodes, replicas) in enumerate(((1, 0), (2, 1))):  # two clusters in one process: nothing piles up
            cluster = Cluster(store=f"file://{tmp_path / f'remote{k}'}", data_dir=str(tmp_path / f"nodes{k}"),
                              nodes=nodes)
            cluster.create_index("docs", shards=2, replicas=replicas)
            assert not cluster.bulk("docs", [{"_id": str(i), "v": 1} for i in range(200)]).errors
            cluster.flush("docs")
            caplog.clear()
            cluster.close()
            time.sleep(1.0)  # longer than a follower check's interval: a manager still running would act by now
            noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                     or "left the cluster" in r.getMessage() or "steps down" in r.getMessage()]
            assert not noisy, noisy
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in before and t.name != "row-cache-warmer"]
        if not left:
            break
        time.sleep(0.05)
    assert not left, sorted(t.name for t in left)
