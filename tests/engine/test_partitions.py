"""Network partitions between real node processes (issue 41): a per-link TCP fault proxy cuts nodes apart.

The repro of issue 41: the elected cluster manager is cut off from both other nodes while a
client writes (and deletes) through the majority and another client is pinned to the
manager.  Nothing acknowledged may be lost or come back, the cut-off manager must not
promote anything, and after the heal every shard must be green and writable, live and after
a restore from the store alone.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.client import Client
from shardstore.testing.partitions import LinkedCluster


def _ids(table: pa.Table) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


class Writer:
    """Bulks of 20 new ids and one delete of an acknowledged id per round, on a thread; remembers what was acked."""

    def __init__(self, client: Client, index: str, prefix: str) -> None:
        self.client, self.index, self.prefix = client, index, prefix
        self.acked: set[str] = set()
        self.deleted: set[str] = set()
        self.ack_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            docs = [{"_id": f"{self.prefix}{n + k}", "v": n + k} for k in range(20)]
            n += 20
            try:
                result = self.client.bulk(self.index, docs)
            except Exception:  # noqa: BLE001 - not acknowledged: nothing to remember
                time.sleep(0.05)
                continue
            if result.acknowledged:
                self.ack_times.append(time.monotonic())
            self.acked.update(result.acknowledged)
            victim = next(iter(sorted(self.acked - self.deleted)), None) if n % 100 == 0 else None
            if victim is not None:
                try:
                    res = self.client.delete(self.index, victim)
                    if res.acknowledged:
                        self.deleted.add(victim)
                except Exception:  # noqa: BLE001 - not acknowledged; it may or may not have been applied
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _manager(links: LinkedCluster) -> str | None:
    for name in links.names:
        try:
            master = links.call(name, "discovery.hello", {}, timeout=5)["master"]
        except Exception:  # noqa: BLE001
            continue
        if master and links.nodes[master].alive:
            return master
    return None


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _check(acked: set[str], deleted: set[str], present: set[str], where: str) -> None:
    missing = (acked - deleted) - present
    back = deleted & present
    assert not missing, f"{where}: {len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:5]}"
    assert not back, f"{where}: {len(back)} acknowledged deletes came back, e.g. {sorted(back)[:5]}"


@pytest.fixture
def links(tmp_path: Path):
    c = LinkedCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["blackhole", "down"])
def test_a_cut_off_manager_promotes_nothing_and_the_cluster_heals_by_itself(links: LinkedCluster, tmp_path: Path,
                                                                            mode: str) -> None:
    admin = links.client()
    admin.wait_for_health("green", timeout=60)
    if _manager(links) == "n1":  # a new index's shard 0 goes to n1: the manager must be another node
        links.kill("n1")
        _wait(lambda: _manager(links) not in (None, "n1"))
        links.restart("n1")
        admin.wait_for_health("green", timeout=60)
    manager = _manager(links)
    assert manager is not None
    admin.create_index("docs", shards=1, replicas=2)  # the primary on n1, a replica on the manager
    admin.wait_for_health("green", timeout=60)
    assert admin.primary_of("docs", 0) != manager
    majority = [n for n in links.names if n != manager]
    writers = [Writer(links.client_of(majority), "docs", "m"), Writer(links.client_of([manager]), "docs", "p")]
    try:
        time.sleep(2)
        links.isolate(manager, mode=mode)
        time.sleep(12)
        links.heal()
        time.sleep(3)
    finally:
        for w in writers:
            w.stop()
    times = writers[0].ack_times
    print(f"longest gap between the majority's acknowledged writes: "
          f"{max(b - a for a, b in zip(times, times[1:])):.1f} s")  # the figure; benches/partitions.py targets it
    acked = set().union(*(w.acked for w in writers))
    deleted = set().union(*(w.deleted for w in writers))
    assert any(a.startswith("m") for a in acked)
    health = admin.wait_for_health("green", timeout=60)
    assert health.status == "green", f"not green after the heal: {health}\n{links.logs()}"
    probe = [{"_id": f"probe-{i}", "v": i} for i in range(30)]  # green means every shard takes a write
    result = admin.bulk("docs", probe)
    assert len(result.acknowledged) == 30, f"{result.table.filter(result.table['error'].is_valid())}"
    acked.update(result.acknowledged)
    admin.refresh("docs")
    _check(acked, deleted, _ids(admin.scan("docs", columns=["_id"])), "live")
    admin.flush("docs")
    admin.close()
    links.close()
    restored = Cluster.restore(store=links.store, data_dir=str(tmp_path / "restored"), nodes=2)
    try:
        restored.refresh("docs")
        _check(acked, deleted, _ids(restored.scan("docs", columns=["_id"])), "after restore")
    finally:
        restored.close()


def test_a_primary_dropped_behind_the_managers_back_is_healed_and_health_is_not_green_meanwhile(
        links: LinkedCluster) -> None:
    """What a cut-off node can wake up to (its primary fenced or discarded): the routing check finds it."""
    admin = links.client()
    admin.wait_for_health("green", timeout=60)
    uuid = admin.create_index("docs", shards=1, replicas=1)
    admin.wait_for_health("green", timeout=60)
    first = admin.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(50)])
    assert len(first.acknowledged) == 50
    primary = admin.primary_of("docs", 0)
    assert links.call(primary, "shard.discard", {"index_uuid": uuid, "shard": 0}) is True
    assert admin.health().status != "green"  # health asks the members what they hold before it answers
    admin.wait_for_health("green", timeout=60)
    assert admin.primary_of("docs", 0) != primary  # the in-sync replica was promoted
    later = admin.bulk("docs", [{"_id": f"b{i}", "v": i} for i in range(50)])
    assert len(later.acknowledged) == 50
    admin.refresh("docs")
    assert _ids(admin.scan("docs", columns=["_id"])) == set(first.acknowledged) | set(later.acknowledged)
