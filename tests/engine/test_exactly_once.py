"""Writes retried through a lost answer or a failover are applied exactly once (issue 45).

Every write carries a request id (engine/shard/request_ledger.py).  Here, on the embedded cluster
(the production roles over the in-process transport), answers are lost on purpose: the client's
(``client.bulk`` answer dropped: the coordinator applied it), and the primary's to the coordinator
with the primary's node killed at once (the retry lands on the promoted replica).  A document
applied twice would read ``_version`` 2 and take two seq#s; each must read 1, once.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from shardstore.engine import Cluster
from shardstore.engine.shard.request_ledger import RequestLedger
from shardstore.translog.operations import unstamped_batch


@pytest.fixture
def cluster(embedded: Cluster) -> Cluster:
    """Three embedded nodes (tests/engine/conftest.py)."""
    return embedded


def _once(cluster: Cluster, index: str, ids: list[str]) -> None:
    cluster.refresh(index)
    assert cluster.count(index) == len(ids)
    for doc_id in ids:
        doc = cluster.get(index, doc_id)
        assert doc is not None and doc["_version"] == 1, (doc_id, doc)


def test_a_bulk_whose_answer_to_the_client_is_lost_is_applied_once(cluster: Cluster) -> None:
    cluster.create_index("once", shards=2, replicas=1)
    rng = random.Random(45)
    ids: list[str] = []
    for round_ in range(12):
        batch = [f"r{round_}-{k}" for k in range(rng.randint(1, 40))]
        rule = cluster.transport.drop("client.bulk", direction="response", times=1)
        result = cluster.bulk("once", [{"_id": i, "v": round_} for i in batch])
        assert rule.fired == 1 and not result.errors, result.items.column("error").to_pylist()[:3]
        ids += batch
    rule = cluster.transport.drop("client.index_doc", direction="response", times=1)
    assert not cluster.index_doc("once", {"_id": "single", "v": 1}).errors and rule.fired == 1
    _once(cluster, "once", [*ids, "single"])


@pytest.mark.parametrize("seed", range(4))
def test_the_primary_killed_between_its_apply_and_its_answer_applies_the_write_once(cluster: Cluster,
                                                                                     seed: int) -> None:
    cluster.create_index("once", shards=1, replicas=2)
    cluster.wait_for_health("green", timeout=30)
    rng = random.Random(seed)
    before = [f"b{k}" for k in range(rng.randint(1, 20))]
    assert not cluster.bulk("once", [{"_id": i, "v": 0} for i in before]).errors
    primary = cluster.primary_of("once", 0)
    rule = cluster.transport.drop("shard.bulk*", target=primary, direction="response", times=1)
    killed: list[str] = []

    def kill_after_apply() -> None:  # the primary applied and replicated, its answer was dropped: it dies now
        deadline = time.monotonic() + 30
        while rule.fired == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        cluster.kill(primary)
        killed.append(primary)

    killer = threading.Thread(target=kill_after_apply)
    killer.start()
    batch = [f"k{seed}-{k}" for k in range(rng.randint(1, 30))]
    # through another node's coordinator: the primary's answer crosses the transport (and is lost there)
    client = cluster.client([next(n for n in cluster.names if n != primary)])
    result = client.bulk("once", [{"_id": i, "v": 1} for i in batch])
    killer.join(60)
    assert not result.errors, result.items.column("error").to_pylist()[:3]
    assert killed and rule.fired == 1 and cluster.primary_of("once", 0) != primary
    _once(cluster, "once", [*before, *batch])


def test_the_ledger_keeps_the_newest_requests_and_ignores_writes_without_an_id() -> None:
    ledger = RequestLedger(capacity=2)
    stamped = unstamped_batch([1, 1], ["a", "b"], [1, 1], [b"{}", b"{}"])
    import pyarrow as pa

    stamped = pa.RecordBatch.from_arrays([pa.array([7, 8], pa.int64()), pa.array([2, 2], pa.int64()),
                                          *stamped.columns], names=["seq_no", "primary_term", *stamped.schema.names])
    ledger.record(None, stamped)
    ledger.record("w:1", stamped)
    ledger.record("w:2", stamped)
    ledger.record("w:3", stamped)
    assert len(ledger) == 2 and ledger.get("w:1") is None and ledger.get(None) is None
    first = ledger.get("w:3")
    assert first is not None and first.max_seq_no == 8 and first.reply.column("version").to_pylist() == [1, 1]
    with pytest.raises(ValueError, match="at least one"):
        RequestLedger(capacity=0)
