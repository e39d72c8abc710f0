"""The indexing buffer (issues 16, 44): a primary's bulk that fills it seals it, and its segments are written beside
the writes (``ShardDirectory.seal``, ``write_sealed``) while the bulk's translog upload is in flight and after.

A bulk is acknowledged only once its upload landed, never later for the refresh: a failed upload
is not acknowledged; a failed refresh fails the copy (``LocalDiskError`` for the next write) and
its replica takes over; every acknowledged document survives a restore.  The buffer threshold is lowered here so that small bulks fill it.  Faults come
from a FaultyStore around a real file store (a failed PUT) and from DiskFaults (a failed
fsync of a segment file), since no real store or disk fails one chosen call on demand.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.blobstores import open_store
from shardstore.engine import Cluster
from shardstore.engine.errors import InvalidRequest
from shardstore.testing import FaultyStore
from shardstore.testing.disk import DiskFaults
from shardstore.testing.partition_campaign import wait_until

SMALL = {"index_buffer_bytes": 1}  # every bulk fills the indexing buffer


def _restored_ids(url: str, data_dir: Path) -> dict[str, dict]:
    restored = Cluster.restore(store=url, data_dir=str(data_dir), nodes=2, **SMALL)
    try:
        restored.refresh("docs")
        return {d["_id"]: d for d in restored.scan("docs", columns=["_id", "v"]).to_pylist()}
    finally:
        restored.close()


@pytest.mark.parametrize("source", ["stored", "synthetic"])
def test_a_full_buffer_becomes_searchable_without_a_refresh_call(tmp_path: Path, source: str) -> None:
    """Its segments are written beside the writes (issue 44): the bulk returns once its translog landed, and the
    documents become searchable soon after with no refresh asked for; a get finds them all along."""
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=2, recovery_delay=0.05, **SMALL)
    try:
        cluster.create_index("docs", shards=2, replicas=1, source=source)
        for r in range(3):
            assert not cluster.bulk("docs", [{"_id": f"{r}-{i}", "v": r} for i in range(200)]).errors
            assert cluster.get("docs", f"{r}-7")["_source"] == {"v": r}  # realtime: sealed or not, it is found
            wait_until(lambda r=r: cluster.count("docs") == 200 * (r + 1), timeout=30,
                       what=f"the refresh beside bulk {r}")
        assert cluster.get("docs", "2-5")["_source"] == {"v": 2}
    finally:
        cluster.close()
    got = _restored_ids(url, tmp_path / "b")
    assert len(got) == 600 and got["1-7"]["v"] == 1


def test_a_quarter_full_buffer_is_sealed_while_no_refresh_runs_beside(tmp_path: Path) -> None:
    """A primary seals at ``SEAL_EARLY_SHARE`` of its budget when no sealed buffer is being written (issue 44), so
    the refreshes beside the writes keep pace with a steady stream: a bulk that leaves the buffer a third full makes
    its documents searchable with no refresh call; below the share they stay in the buffer."""
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(300)]).errors
        directory = cluster.primary_copy("docs", 0).directory
        one_bulk = directory._buffer.doc_bytes
        assert one_bulk > 0 and cluster.count("docs") == 0  # far below the default budget: buffered
        directory.index_buffer_bytes = 5 * one_bulk  # the buffer now holds a fifth of its budget
        assert not directory.ready_to_seal
        assert not cluster.bulk("docs", [{"_id": f"b{i}", "v": i} for i in range(300)]).errors  # two fifths
        wait_until(lambda: cluster.count("docs") == 600, timeout=30, what="the refresh beside the second bulk")
        assert not directory._buffer and cluster.get("docs", "b7")["_source"] == {"v": 7}
    finally:
        cluster.close()


def _started(store: object, data_dir: Path, nodes: int) -> tuple[Cluster, set[str]]:
    """A cluster with a synthetic-source index of one shard and one replica, and its first 50 acknowledged ids."""
    cluster = Cluster(store=store, data_dir=str(data_dir), nodes=nodes, recovery_delay=0.05, **SMALL)
    cluster.create_index("docs", shards=1, replicas=1, source="synthetic")
    result = cluster.bulk("docs", [{"_id": f"a{i}", "v": 1} for i in range(50)])
    assert not result.errors
    return cluster, set(result.acknowledged)


def test_a_failed_upload_is_not_acknowledged_and_a_retry_is(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    store = FaultyStore(open_store(url))
    cluster, acked = _started(store, tmp_path / "a", nodes=2)
    try:
        store.inject(op="put", key="*translog/*", action="fail", times=50)  # outlasts the uploader's retries
        failed = cluster.bulk("docs", [{"_id": f"b{i}", "v": 2} for i in range(50)])
        assert failed.errors and failed.acknowledged == []
        store.clear()
        for _attempt in range(5):  # the client retries, as real clients do
            retry = cluster.bulk("docs", [{"_id": f"b{i}", "v": 3} for i in range(50)])
            acked |= set(retry.acknowledged)
            if not retry.errors:
                break
        assert {f"b{i}" for i in range(50)} <= acked
        cluster.wait_for_health("green", timeout=60)
    finally:
        cluster.close()
    got = _restored_ids(url, tmp_path / "b")
    assert acked <= set(got) <= acked
    assert all(got[f"b{i}"]["v"] == 3 for i in range(50))


def test_a_failed_refresh_fails_the_primary_and_loses_nothing(tmp_path: Path) -> None:
    """The refresh of a full buffer runs beside the writes (issue 44): the bulk that filled it is acknowledged once
    its translog landed on every in-sync copy, whatever the refresh does; a disk error in that refresh fails the
    primary for good and the refresh's thread reports it, the replica takes over, and every acknowledged document
    survives, the failed refresh's included.  The bulk that filled the buffer is refused (LocalDiskError) only if
    the refresh failed the copy before its upload settled; a write that meets the copy failed before it is routed
    to the promoted replica, not refused (docs/design/engine.md, invariant 13)."""
    url = f"file://{tmp_path / 'remote'}"
    cluster, acked = _started(url, tmp_path / "a", nodes=3)
    try:
        primary = cluster.primary_of("docs", 0)
        copy = cluster.primary_copy("docs", 0)
        with DiskFaults() as faults:
            faults.inject(op="fsync", path=f"*/{primary}/*/index/*.parquet*", action="eio")
            filled = cluster.bulk("docs", [{"_id": f"b{i}", "v": 2} for i in range(50)])
            wait_until(lambda: copy.disk_failure is not None, timeout=30, what="the refresh's disk error")
            assert faults.fired_total == 1
        acked |= set(filled.acknowledged)
        if filled.errors:  # the refresh failed the copy before the bulk's upload settled: refused as a whole, with
            # the disk's error, or (the copy already closed by its report) as not acknowledged: never a raw error
            error = filled.items.column("error")[0].as_py()
            assert filled.acknowledged == [] and error.startswith(("LocalDiskError", "WriteNotAcknowledged")), error
        else:  # the next write meets a copy failed before it: it goes to the promoted replica
            after = cluster.bulk("docs", [{"_id": f"c{i}", "v": 2} for i in range(50)])
            assert not after.errors, after.items.column("error").to_pylist()
            acked |= set(after.acknowledged)
        wait_until(lambda: cluster.primary_of("docs", 0) not in (primary, None), timeout=30,
                   what="the failed primary replaced by its replica")
        retry = cluster.bulk("docs", [{"_id": f"b{i}", "v": 3} for i in range(50)])
        assert not retry.errors
        acked |= set(retry.acknowledged)
        cluster.wait_for_health("green", timeout=60)
    finally:
        cluster.close()
    got = _restored_ids(url, tmp_path / "b")
    assert set(got) == acked and all(got[f"b{i}"]["v"] == 3 for i in range(50))


def test_documents_without_fields(tmp_path: Path) -> None:
    """A document with no field (or only nulls) is an empty struct in the translog and {} when read back."""
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1, **SMALL)
    try:
        cluster.create_index("docs", shards=1, replicas=0, source="synthetic")
        assert not cluster.bulk("docs", [{"_id": "a"}, {"_id": "b", "v": None}]).errors
        assert not cluster.bulk("docs", [{"_id": "c", "v": 1}, {"_id": "d"}]).errors
        assert cluster.get("docs", "a")["_source"] == {} and cluster.get("docs", "c")["_source"] == {"v": 1}
    finally:
        cluster.close()
    assert set(_restored_ids(url, tmp_path / "b")) == {"a", "b", "c", "d"}


def test_a_bad_index_buffer_size_is_refused(tmp_path: Path) -> None:
    for bad in (0, -5, 1.5, True, "32MB"):
        with pytest.raises(InvalidRequest, match="index_buffer_bytes must be an int >= 1"):
            Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=1,
                    index_buffer_bytes=bad)


def test_a_table_bulk_that_needs_the_json_parse_on_a_synthetic_index(tmp_path: Path) -> None:
    """A struct column, or a value that does not fit its mapped type, takes the JSON path: it must work (review)."""
    cluster = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "a"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0, source="synthetic")
        assert not cluster.bulk("docs", [{"_id": "a", "n": 1}]).errors
        nested = pa.table({"_id": ["s1"], "obj": pa.array([{"p": 1}], pa.struct([("p", pa.int64())]))})
        assert not cluster.bulk("docs", nested).errors
        assert cluster.get("docs", "s1")["_source"] == {"obj": {"p": 1}}
        clash = cluster.bulk("docs", pa.table({"_id": ["b", "c"], "n": ["x", "y"]}))
        assert clash.acknowledged == [] and all("n" in e for e in clash.items.column("error").to_pylist())
        assert cluster.get("docs", "b") is None
    finally:
        cluster.close()


def _wait_for(check, timeout: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_full_buffers_segments_are_uploaded_before_the_flush(tmp_path: Path) -> None:
    """The segments a full buffer's refresh wrote go up at once (as OpenSearch uploads on refresh): the flush
    that follows sends no segment file again, only its commit, and a restore from that commit has every doc."""
    url = f"file://{tmp_path / 'remote'}"
    store = FaultyStore(open_store(url))
    data_puts = store.inject(op=("put", "put_stream"), key="*/segments/data/seg_*", action="delay", delay=0.0,
                             times=None)  # counts the segment file PUTs, delays nothing
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=1, **SMALL)
    try:
        cluster.create_index("docs", shards=1, replicas=0, source="synthetic")
        assert not cluster.bulk("docs", [{"_id": f"d{i}", "v": i} for i in range(300)]).errors
        assert _wait_for(lambda: data_puts.seen >= 1), "the refresh's segment was not uploaded before any flush"
        cluster.flush("docs")
        assert data_puts.seen == 1, "the flush uploaded the segment again"
    finally:
        cluster.close()
    got = _restored_ids(url, tmp_path / "b")
    assert len(got) == 300 and got["d17"]["v"] == 17


def test_a_failed_upload_ahead_is_made_good_by_the_flush(tmp_path: Path) -> None:
    """An upload ahead of the commit that fails is only logged: the bulk is acknowledged (its translog landed),
    and the next flush uploads the segment itself."""
    url = f"file://{tmp_path / 'remote'}"
    store = FaultyStore(open_store(url))
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=1, **SMALL)
    try:
        cluster.create_index("docs", shards=1, replicas=0, source="synthetic")
        failing = store.inject(op=("put", "put_stream"), key="*/segments/data/seg_*", action="fail", times=50)
        result = cluster.bulk("docs", [{"_id": f"d{i}", "v": i} for i in range(300)])
        assert not result.errors and len(result.acknowledged) == 300
        assert _wait_for(lambda: failing.fired >= 1)
        store.clear()
        cluster.flush("docs")
    finally:
        cluster.close()
    got = _restored_ids(url, tmp_path / "b")
    assert len(got) == 300 and got["d299"]["v"] == 299


def test_a_new_indexs_first_flush_makes_no_older_term_requests(tmp_path: Path) -> None:
    """A term-1 primary has no older term: its first flush lists no term markers and runs no GC pass over the
    store (issue 16: 8 LISTs and a GET became 2 LISTs, ~20 ms on moto S3); its commit is there."""
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=1)
    try:
        cluster.create_index("docs", shards=1, replicas=0)
        assert not cluster.bulk("docs", [{"_id": str(i), "v": i} for i in range(100)]).errors
        before = dict(cluster.store.metrics()["requests"])
        cluster.flush("docs")
        after = dict(cluster.store.metrics()["requests"])
        made = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert made.get("list", 0) <= 2 and made.get("get", 0) == 0, made  # fencing checks only
        assert made.get("put", 0) >= 2, made  # the segment and the commit
    finally:
        cluster.close()
    assert len(_restored_ids(url, tmp_path / "b")) == 100
