"""Index creation is all or nothing (issue 14, cases 5 and 6).

An index whose metadata the cluster managers did not commit must not exist: ``create_index``
raises a typed, retryable error and no write to it is ever acknowledged (before, it returned
normally, writes were acknowledged, and ``Cluster.restore`` then found nothing to restore).
With every data node down it raises the same kind of error instead of ``ZeroDivisionError``.
Both are real failures of a real cluster (managers and data nodes stopped), no mocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstore.engine import Cluster
from shardstore.engine.errors import IndexNotFound
from shardstore.errors import UnavailableError


def _cluster(tmp_path: Path, name: str = "a") -> Cluster:
    return Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / name), nodes=2,
                   recovery_delay=0.05)


def test_create_index_without_a_manager_quorum_raises_and_creates_nothing(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    cluster.create_index("kept", shards=1, replicas=1)
    cluster.bulk("kept", [{"_id": "k"}])
    down = ["cm-0", "cm-1"]
    for name in down:
        cluster.kill_node(name)
    with pytest.raises(UnavailableError, match="cluster manager") as info:
        cluster.create_index("docs", shards=2, replicas=1)
    assert info.value.retryable
    # a quorum again: the failed creation left nothing behind, and the same call succeeds; its writes survive
    # the loss of every node
    for name in down:
        cluster.start_node(name)
    assert "docs" not in cluster.indices
    with pytest.raises(IndexNotFound):
        cluster.bulk("docs", [{"_id": "1"}])
    assert cluster.wait_for_health("green").status == "green"
    cluster.create_index("docs", shards=2, replicas=1)
    assert not cluster.bulk("docs", [{"_id": str(i)} for i in range(10)]).errors
    cluster.flush("docs")
    cluster.close()
    restored = Cluster.restore(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "b"), nodes=2)
    try:
        restored.refresh("docs")
        restored.refresh("kept")
        assert restored.count("docs") == 10 and restored.count("kept") == 1
    finally:
        restored.close()


def test_create_index_with_every_data_node_down_names_the_cause(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    data_nodes = cluster.live_nodes()
    for name in data_nodes:
        cluster.kill_node(name)
    with pytest.raises(UnavailableError, match=r"\[docs\].*no live data node") as info:
        cluster.create_index("docs", shards=1, replicas=0)
    assert info.value.retryable
    assert "docs" not in cluster.indices
    cluster.start_node(data_nodes[0])
    cluster.create_index("docs", shards=1, replicas=0)
    assert not cluster.bulk("docs", [{"_id": "1"}]).errors
    cluster.refresh("docs")
    assert cluster.count("docs") == 1
    cluster.close()
