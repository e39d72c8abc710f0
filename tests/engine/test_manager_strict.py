"""Where the embedded promotion was stricter than the node processes' manager, the manager now is too (issue 42).

Real node processes on 127.0.0.1 over a file store.
"""

from __future__ import annotations

import time
from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.segments.remote_store import RemoteSegmentStore, list_terms
from shardstore.spark.catalog import resolve_index
from shardstore.testing.node_processes import ProcessCluster
from shardstore.testing.partition_campaign import manager_of


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


def test_a_rebuild_from_the_store_refuses_to_come_back_with_less_than_was_acknowledged(
        procs: ProcessCluster, tmp_path: Path) -> None:
    """Every copy gone and the store's translog gone with no trace: the manager knows what was acknowledged.

    (The manager samples it; a crash that takes the manager with the shard's only copy takes
    that knowledge too, which is why the primary here is not on the manager's node.)
    """
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    # one single-copy shard per node (the allocator places shard s on the s-th live node): pick
    # a shard whose only copy is not on the manager's node
    index = "docs"
    client.create_index(index, shards=3, replicas=0)
    client.wait_for_health("green", timeout=60)
    manager = manager_of(procs)
    shard = next(s for s in range(3) if client.primary_of(index, s) != manager)
    assert len(client.bulk(index, [{"_id": f"d{i}", "v": i} for i in range(120)]).acknowledged) == 120
    client.health()  # the manager's routing check (run before every health answer) samples the global checkpoint
    store = open_store(f"file://{tmp_path / 'store'}")
    data_cluster = resolve_index(store, index).data_cluster_uuid
    victim = client.primary_of(index, shard)
    procs.kill(victim)
    streams = [b.key for b in store.list(f"{data_cluster}/node_translog/")]
    assert streams, "the acknowledged writes were in the node translog"
    store.delete(streams)  # lost without a trace: the store alone now says the shard was empty
    deadline = time.monotonic() + 30
    health = client.health()
    while not any("RestoreDataLoss" in c for c in health.causes) and time.monotonic() < deadline:
        time.sleep(0.3)
        health = client.health()
    assert health.status == "red" and any("RestoreDataLoss" in c for c in health.causes), f"{health}\n{procs.logs()}"
    client.close()
