"""Local disk faults fail the copy that hit them, never the cluster (issue 14: the simulator's missing fault surface).

A failed fsync (``EIO``), a full disk (``ENOSPC``) or a torn write in a copy's translog or
segment files used to surface as a raw ``OSError`` from ``bulk``/``flush``, and the copy
stayed in service with a torn frame in its translog.  Now the copy is failed for good
(:class:`~shardstore.errors.LocalDiskError`, retryable): a primary fails over to its in-sync
replica like a killed node, a replica is dropped and rebuilt, and what was not acknowledged
is not; every acknowledged document survives, on the live cluster and after a restore.

The faults are injected through :class:`shardstore.testing.disk.DiskFaults`: no real disk
fails one chosen fsync on demand (a mock of exactly that fault, as the project's rules allow).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstore.engine import Cluster
from shardstore.engine.shard.shard_copy import ShardCopy
from shardstore.errors import LocalDiskError
from shardstore.testing.disk import DiskFaults
from shardstore.testing.partition_campaign import wait_until


def _docs(cluster: Cluster) -> dict[str, int]:
    cluster.refresh("docs")
    return {d["_id"]: d["v"] for d in cluster.scan("docs", columns=["_id", "v"]).to_pylist()}


def _restored(url: str, data_dir: Path) -> dict[str, int]:
    restored = Cluster.restore(store=url, data_dir=str(data_dir), nodes=2)
    try:
        return _docs(restored)
    finally:
        restored.close()


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=3,
                recovery_delay=0.05)
    c.create_index("docs", shards=1, replicas=1)
    assert not c.bulk("docs", [{"_id": str(i), "v": 0} for i in range(10)]).errors
    yield c
    c.close()


@pytest.mark.parametrize(("op", "action"), [("fsync", "eio"), ("write", "enospc"), ("write", "torn")])
def test_a_primary_whose_translog_fails_fails_over_and_loses_nothing(cluster: Cluster, tmp_path: Path, op: str,
                                                                     action: str) -> None:
    primary = cluster.primary_of("docs", 0)
    with DiskFaults() as faults:
        faults.inject(op=op, path=f"*/{primary}/*/translog/*", action=action)
        failed = cluster.bulk("docs", [{"_id": "x", "v": 1}])
        assert faults.fired_total == 1
    assert failed.errors and "LocalDiskError" in failed.items.column("error")[0].as_py()
    assert cluster.primary_of("docs", 0) != primary, "the failed primary must be replaced by its replica"
    # the client retries: the promoted replica acknowledges it
    assert not cluster.bulk("docs", [{"_id": "x", "v": 2}, {"_id": "y", "v": 2}]).errors
    cluster.wait_for_health("green", timeout=60)
    expected = {**{str(i): 0 for i in range(10)}, "x": 2, "y": 2}
    assert _docs(cluster) == expected
    cluster.close()
    assert _restored(f"file://{tmp_path / 'remote'}", tmp_path / "fresh") == expected


def test_a_replica_whose_disk_is_full_is_dropped_and_the_write_acknowledged(cluster: Cluster, tmp_path: Path) -> None:
    replica = next(n for n in cluster.live_nodes() if n != cluster.primary_of("docs", 0)
                   and any(k[1] == 0 for k in cluster.nodes[n].copies))
    with DiskFaults() as faults:
        faults.inject(op="write", path=f"*/{replica}/*/translog/*", action="enospc")
        res = cluster.bulk("docs", [{"_id": "x", "v": 1}])
        assert faults.fired_total == 1
    assert not res.errors, res.items.column("error").to_pylist()
    assert not any(k[1] == 0 for k in cluster.nodes[replica].copies)
    cluster.wait_for_health("green", timeout=60)
    expected = {**{str(i): 0 for i in range(10)}, "x": 1}
    assert _docs(cluster) == expected
    cluster.close()
    assert _restored(f"file://{tmp_path / 'remote'}", tmp_path / "fresh") == expected


def test_a_full_disk_during_flush_fails_the_primary_and_the_retried_flush_works(cluster: Cluster,
                                                                              tmp_path: Path) -> None:
    primary = cluster.primary_of("docs", 0)
    with DiskFaults() as faults:
        faults.inject(op="write", path=f"*/{primary}/*/index/*", action="enospc")
        with pytest.raises(LocalDiskError, match="local flush failed"):
            cluster.flush("docs")
    # the node reported its failed copy: the manager promotes the replica
    wait_until(lambda: cluster.indices["docs"].routing[0].primary not in (primary, None), what="the promotion")
    cluster.flush("docs")  # the retry reaches the promoted copy
    assert not cluster.bulk("docs", [{"_id": "z", "v": 3}]).errors
    cluster.wait_for_health("green", timeout=60)
    expected = {**{str(i): 0 for i in range(10)}, "z": 3}
    assert _docs(cluster) == expected
    cluster.close()
    assert _restored(f"file://{tmp_path / 'remote'}", tmp_path / "fresh") == expected


def test_disk_fault_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown action"):
        DiskFaults().inject(action="melt")


def test_a_promotion_whose_candidate_disk_fails_rebuilds_the_shard_from_the_store(cluster: Cluster,
                                                                                 tmp_path: Path) -> None:
    """The only in-sync replica's translog fails while it is promoted: it is dropped (retrying it would fail
    forever: the shard stayed red for good, fault simulator seed 5279), and the retry rebuilds the shard from
    the store on a live node; every acknowledged document is there."""
    primary = cluster.primary_of("docs", 0)
    replica = next(n for n in cluster.live_nodes() if n != primary and any(k[1] == 0 for k in cluster.nodes[n].copies))
    with DiskFaults() as faults:
        faults.inject(op="fsync", path=f"*/{replica}/*/translog/*", action="eio")
        cluster.kill_node(primary)
        assert faults.fired_total == 1
    assert cluster.health().status == "red" and "LocalDiskError" in " ".join(cluster.health().causes)
    cluster.wait_for_health("yellow", timeout=60)
    assert cluster.primary_of("docs", 0) not in (primary, None)
    assert not cluster.bulk("docs", [{"_id": "after", "v": 5}]).errors
    expected = {**{str(i): 0 for i in range(10)}, "after": 5}
    assert _docs(cluster) == expected
    cluster.close()
    assert _restored(f"file://{tmp_path / 'remote'}", tmp_path / "fresh") == expected


def test_a_write_whose_copy_closes_under_it_gets_a_typed_answer_not_a_raw_oserror(tmp_path: Path) -> None:
    """Chaos seed 1367: a node killed while its primary's write hit a disk error -- the segment a full indexing
    buffer's refresh writes while the upload is in flight -- and the copy was closed by then, so the error was
    not this disk's and went back raw (``OSError`` in the bulk item).  Now the client gets WriteNotAcknowledged
    (it may have been applied; retry by id).  The close is marked from the fault hook itself (no real kill can
    be timed into that one write; the chaos runner kills the node on a thread).  Since issue 44 that refresh runs
    beside the writes and no write waits for it: the bulk is answered either way, never with a raw error."""
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=1,
                index_buffer_bytes=1)  # every bulk fills the buffer: its refresh runs beside the write
    try:
        c.create_index("docs", shards=1, replicas=0)
        primary = c.primary_of("docs", 0)
        copy = c.nodes[primary].copies[(c.indices["docs"].uuid, 0)]
        with DiskFaults(on_crash=lambda _path: copy._closing.set()) as faults:
            faults.inject(op="write", path=f"*/{primary}/*/index/*.parquet", action="crash")
            failed = c.bulk("docs", [{"_id": "x", "v": 1}])
            wait_until(lambda: faults.fired_total == 1, timeout=30, what="the refresh's write")
        # acknowledged once its translog landed, or refused with a typed answer if the close reached its upload
        # first; never a raw OSError, and the closed copy's error is not taken for its disk's
        error = failed.items.column("error")[0].as_py()
        assert error is None or (error.startswith("WriteNotAcknowledged") and "closed during the write" in error), \
            error
        wait_until(lambda: copy.directory._sealed is None or copy.directory._sealed_failed, timeout=30,
                   what="the refresh beside the write to end")
        assert copy.disk_failure is None
    finally:
        c.close()


def test_a_rebuild_the_manager_asks_for_never_deadlocks_with_a_finalizing_recovery(tmp_path: Path) -> None:
    """Found by the simulator (seeds 1111 and 1360 of issue 42's run hung for good): a peer recovery's finalize held
    the shard's write lock on the primary's node and asked the manager to mark the replica in sync, while the manager,
    under its own lock, had that same node rebuild the shard from the store (its primary's disk had failed): each
    waited for the other's lock.  The interleaving is forced here with the two real locks; no scheduler does it on
    demand."""
    import threading

    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=1,
                      recovery_delay=0.05)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "v": 0} for i in range(10)]).errors
        node, meta, manager = cluster.primary_of("docs", 0), cluster.index_meta("docs"), cluster.manager()
        service, key = cluster.nodes[node], (cluster.index_meta("docs").uuid, 0)
        holding = threading.Event()

        def finalize() -> None:  # data_role._recovery_finalize: the write lock, then the manager
            with service.write_lock(key):
                holding.set()
                with manager._lock:
                    pass

        asked: list = []

        def copy_failed() -> None:  # the manager's side: its lock, then a rebuild on that node
            with manager._lock:
                finalizing = threading.Thread(target=finalize, daemon=True)
                finalizing.start()
                assert holding.wait(10)
                try:
                    asked.append(cluster.call(manager.name, "cm.copy_failed", {
                        "index_uuid": meta.uuid, "shard": 0, "node": node, "reason": "disk failed (test)"}))
                except Exception as exc:  # noqa: BLE001 - judged below
                    asked.append(exc)
            finalizing.join(10)

        worker = threading.Thread(target=copy_failed, daemon=True)
        worker.start()
        worker.join(60)
        assert not worker.is_alive(), "the manager's rebuild and the finalizing recovery deadlocked"
        # the shard comes back from the store (the manager retries it) and every document is there
        wait_until(lambda: cluster.primary_of("docs", 0) is not None, 60, "the shard rebuilt from the store")
        assert not cluster.bulk("docs", [{"_id": "x", "v": 2}]).errors
        assert _docs(cluster) == {**{str(i): 0 for i in range(10)}, "x": 2}
    finally:
        cluster.close()


def _merge_failed_primary(cluster: Cluster, faults: DiskFaults) -> tuple[str, ShardCopy]:
    """Many small segments on the primary, then a flush whose merge (the merge thread) hits EIO on its new segment
    file; the primary's name and its copy, once failed."""
    primary = cluster.primary_of("docs", 0)
    for round_ in range(14):
        assert not cluster.bulk("docs", [{"_id": f"m{round_}-{i}", "v": round_} for i in range(20)]).errors
        cluster.refresh("docs")
    copy = next(c for k, c in cluster.nodes[primary].copies.items() if k[1] == 0)
    faults.inject(op="write", path=f"*/{primary}/*/index/*.parquet", action="eio")
    cluster.flush("docs")  # its commit point is no parquet file: the flush works, the merge it asks for fails
    wait_until(lambda: copy.disk_failure is not None, what="the merge's disk failure")
    assert "local merge failed" in str(copy.disk_failure)
    return primary, copy


def test_a_copy_a_background_merge_failed_leaves_the_routing_before_a_request_meets_it(cluster: Cluster,
                                                                                     tmp_path: Path) -> None:
    """The merge thread reports the failed copy itself (chaos seed 11494): the replica is promoted while no client
    request reaches the shard, and every acknowledged document is still there."""
    with DiskFaults() as faults:
        primary, failed = _merge_failed_primary(cluster, faults)
        wait_until(lambda: cluster.indices["docs"].routing[0].primary not in (primary, None), what="the promotion")
    wait_until(lambda: failed.closed, what="the failed copy's close")
    assert failed not in cluster.nodes[primary].copies.values(), "the failed copy is dropped"
    cluster.wait_for_health("green", timeout=60)
    expected = {**{str(i): 0 for i in range(10)}, **{f"m{r}-{i}": r for r in range(14) for i in range(20)}}
    assert _docs(cluster) == expected
    cluster.close()
    assert _restored(f"file://{tmp_path / 'remote'}", tmp_path / "fresh") == expected


def test_a_request_that_meets_a_copy_failed_in_the_background_is_routed_to_the_new_primary(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window before the merge thread's report lands (held open here: the merge thread tells no one) is no
    error for the client: the request that meets the failed copy has it reported and waits for the promotion
    (chaos seed 11494: the final refresh got the merge's LocalDiskError)."""
    monkeypatch.setattr(ShardCopy, "_tell_background_failure", lambda self: None)
    with DiskFaults() as faults:
        primary, failed = _merge_failed_primary(cluster, faults)
    assert cluster.primary_of("docs", 0) == primary, "nothing reported the failure yet"
    cluster.refresh("docs")  # reaches the failed copy first, then the promoted one
    assert cluster.primary_of("docs", 0) != primary and failed.closed
    assert not cluster.bulk("docs", [{"_id": "after", "v": 9}]).errors
    docs = _docs(cluster)
    assert docs["after"] == 9 and len(docs) == 10 + 14 * 20 + 1


def test_a_refresh_that_meets_its_failure_inside_the_call_is_routed_on_too(cluster: Cluster,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrower window: the merge fails between the request's check of the copy and its call, so the call
    raises the merge's LocalDiskError (a mock of that timing, which no real part produces on demand: the
    refresh raises what the failed copy raises).  It is no error of the refresh: the copy is reported and the
    refresh reaches the promoted one."""
    primary = cluster.primary_of("docs", 0)
    copy = next(c for k, c in cluster.nodes[primary].copies.items() if k[1] == 0)
    merge_failure = LocalDiskError(copy.path, "merge", OSError(5, "injected"))

    def refresh_meeting_the_merge() -> None:
        copy.disk_failure = merge_failure
        raise merge_failure

    monkeypatch.setattr(copy, "refresh", refresh_meeting_the_merge)
    cluster.refresh("docs")
    assert cluster.primary_of("docs", 0) != primary and copy.closed
    assert _docs(cluster) == {str(i): 0 for i in range(10)}


def test_a_flush_whose_copy_is_closed_under_it_is_routed_on(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy another thread failed and closed while a flush ran on it (a mock of that timing): the flush's error is
    the close's, so the flush waits for the routing and reaches the promoted copy instead of raising it."""
    primary = cluster.primary_of("docs", 0)
    node = cluster.nodes[primary]
    key, copy = next((k, c) for k, c in node.copies.items() if k[1] == 0)

    def flush_closed_under() -> None:
        node._report_disk_failure(key, copy, LocalDiskError(copy.path, "merge", OSError(5, "injected")))
        raise ValueError("I/O operation on closed file")

    monkeypatch.setattr(copy, "flush", flush_closed_under)
    cluster.flush("docs")
    assert cluster.primary_of("docs", 0) != primary and copy.closed
    assert _docs(cluster) == {str(i): 0 for i in range(10)}


@pytest.mark.parametrize("closed", [False, True])
@pytest.mark.parametrize("error", ["TranslogError", "ValueError", "ShardUnavailable", "WriteNotAcknowledged",
                                   "LocalDiskError"])
def test_a_write_on_a_copy_closed_under_it_gets_a_typed_answer(closed: bool, error: str) -> None:
    """``closed_under`` (engine/coordinator/bulk_parts.py): the raw error of a close ("the translog is closed") becomes
    WriteNotAcknowledged, naming the copy and keeping the cause; typed answers, and any error of an open copy, stay."""
    from types import SimpleNamespace

    from shardstore.engine.coordinator.bulk_parts import closed_under
    from shardstore.engine.errors import ShardUnavailable, WriteNotAcknowledged
    from shardstore.translog.errors import TranslogError

    made = {"TranslogError": lambda: TranslogError("/d/translog: the translog is closed"),
            "ValueError": lambda: ValueError("I/O operation on closed file"),
            "ShardUnavailable": lambda: ShardUnavailable("u", 0, "moved"),
            "WriteNotAcknowledged": lambda: WriteNotAcknowledged("u", 0, "replica failed"),
            "LocalDiskError": lambda: LocalDiskError("/d", "write", OSError(5, "eio"))}
    exc = made[error]()
    copy = SimpleNamespace(closed=closed, path="/d/u/0")
    got = closed_under(("u", 0), copy, exc)  # type: ignore[arg-type]
    if closed and error in ("TranslogError", "ValueError"):
        assert isinstance(got, WriteNotAcknowledged) and got.__cause__ is exc
        assert "/d/u/0" in str(got) and str(exc) in str(got)
    else:
        assert got is exc
