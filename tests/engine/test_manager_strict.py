"""Where the embedded promotion was stricter than the node processes' manager, the manager now is too (issue 42).

Real node processes on 127.0.0.1 over a file store.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.segments.remote_store import RemoteSegmentStore, list_terms
from shardstore.spark.catalog import resolve_index
from shardstore.testing.node_processes import ProcessCluster


@pytest.fixture
def procs(tmp_path: Path):
    c = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3)
    try:
        yield c
    finally:
        c.close()


def test_a_term_another_writer_claimed_is_not_taken_from_it_by_a_promotion(procs: ProcessCluster,
                                                                           tmp_path: Path) -> None:
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("docs", shards=1, replicas=1)
    client.wait_for_health("green", timeout=60)
    assert len(client.bulk("docs", [{"_id": f"d{i}", "v": i} for i in range(20)]).acknowledged) == 20
    client.flush("docs")
    store = open_store(f"file://{tmp_path / 'store'}")
    address = resolve_index(store, "docs").address(0)
    job_term = 5  # a batch job (a Spark sink) owns the shard from term 5 on
    RemoteSegmentStore(store, address, job_term, writer="sparkjob").claim_term(exclusive=True)
    procs.kill(client.primary_of("docs", 0))
    deadline = time.monotonic() + 30
    health = client.health()
    while not any("another writer" in c for c in health.causes) and time.monotonic() < deadline:
        time.sleep(0.3)
        health = client.health()
    assert health.status == "red" and any("another writer owns the shard" in c for c in health.causes), \
        f"{health}\n{procs.logs()}"
    time.sleep(3)  # several retry rounds of the manager: still not taken
    assert client.health().status == "red"
    assert max(list_terms(store, address)) == job_term, "a promotion claimed a term above the other writer's"
    client.close()
