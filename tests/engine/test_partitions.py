"""Network partitions between real node processes (issue 41): a per-link TCP fault proxy cuts nodes apart.

The repro of issue 41 is a round of the partition campaign
(:mod:`shardstore.testing.partition_campaign`): the elected cluster manager is cut off from
both other nodes while a client writes (and deletes) through the majority and another
client is pinned to the manager; the manager holds a replica of a primary on the majority
side.  Before the fix the cut-off manager promoted that replica, claimed its term in the
store and fenced the majority's primary: acknowledged writes were trimmed and the shard
stayed "holds no primary" after the heal.  Nothing acknowledged may be lost or come back,
and after the heal every shard must be green and writable, live and after a restore.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine.errors import ShardUnavailable
from shardstore.testing.partition_campaign import run_round, wait_until
from shardstore.testing.partitions import LinkedCluster


def _ids(table: pa.Table) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


@pytest.mark.parametrize(("kind", "mode", "replicas"), [("isolate_manager", "blackhole", 2),
                                                        ("isolate_manager", "down", 2),
                                                        ("bridge", "blackhole", 1)])
def test_a_partition_loses_nothing_and_the_cluster_heals_by_itself(tmp_path: Path, kind: str, mode: str,
                                                                   replicas: int) -> None:
    r = run_round(tmp_path / "round", kind, mode, seconds=12.0, shards=1 if kind == "isolate_manager" else 3,
                  replicas=replicas)
    where = f"{kind} ({mode}): {r.acked} acknowledged"
    assert r.acked > 100, where
    assert not r.lost and not r.lost_after_restore, f"{where}, lost {r.lost[:5]} / {r.lost_after_restore[:5]}\n{r.logs}"
    assert not r.resurrected and not r.resurrected_after_restore, f"{where}, deletes back {r.resurrected[:5]}"
    assert not r.stuck, f"{where}, stuck after the heal: {r.stuck}\n{r.logs}"



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


def _masters(links: LinkedCluster) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in links.names:
        try:
            out[name] = links.call(name, "discovery.hello", {}, timeout=2)["master"]
        except Exception:  # noqa: BLE001 - not answering counts as following nobody
            out[name] = None
    return out


def _one_manager(links: LinkedCluster) -> bool:
    m = _masters(links)
    return None not in m.values() and len(set(m.values())) == 1


@pytest.mark.parametrize("mode", ["blackhole", "down"])
def test_a_follower_cut_one_way_from_the_manager_rejoins_after_the_heal(links: LinkedCluster, mode: str) -> None:
    """Its leader checks fail, the manager's checks of it do not: it must still follow the manager again."""
    admin = links.client()
    admin.wait_for_health("green", timeout=60)
    manager = next(v for v in _masters(links).values() if v)
    follower = next(n for n in links.names if n != manager)
    assert links.stop(follower) == 0  # a restarted follower (seeds 2, 4, 17 of the process simulator)
    links.restart(follower)
    wait_until(lambda: _one_manager(links), 30, "one manager after the restart")
    links.cut(follower, manager, mode=mode, one_way=True)
    wait_until(lambda: _masters(links)[follower] is None, 15, "the follower dropping its manager")
    links.heal()
    wait_until(lambda: _one_manager(links), 15, "the follower following the manager again")
    admin.close()


@pytest.mark.parametrize("action", ["shard.get", "shard.count", "shard.scan"])
def test_a_cut_off_primary_serves_no_read_once_its_lease_is_out(links: LinkedCluster, action: str) -> None:
    """A stale primary answering a count or a scan is as wrong as a stale get (process simulator seed 253)."""
    admin = links.client()
    admin.wait_for_health("green", timeout=60)
    uuid = admin.create_index("docs", shards=1, replicas=1)
    admin.wait_for_health("green", timeout=60)
    assert len(admin.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(20)]).acknowledged) == 20
    admin.refresh("docs")
    primary = admin.primary_of("docs", 0)
    request = {"index_uuid": uuid, "shard": 0, "id": "a1", "columns": ["_id"]}
    def served() -> bool:
        try:
            return links.call(primary, action, request) is not None
        except ShardUnavailable:  # its lease not renewed yet since the last publication that concerned it
            return False
    wait_until(served, 10, "the primary serving reads while in contact")
    links.isolate(primary)
    time.sleep(4.0)  # the read lease: (retries - 1) * (interval + timeout) = 3 s
    with pytest.raises(ShardUnavailable, match="majority"):
        links.call(primary, action, request, timeout=5)
    links.heal()
    admin.close()
