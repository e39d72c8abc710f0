"""The production node roles embedded in one process over the in-process transport (issue 42).

:class:`~shardstore.engine.cluster.Cluster` runs the very ``NodeProcess`` roles a
``shardstore node`` process runs (manager, coordinator, data, fault detection, elections), N
of them over one in-process transport: the faults a process campaign injects (a kill, a pause,
a partition cut "down" or blackholed) must hold here as they do between real processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.cluster_state import coordination
from shardstore.cluster_state.errors import NotMaster
from shardstore.engine.cluster import Cluster
from shardstore.engine.coordinator.routing import shard_id
from shardstore.engine.errors import ShardUnavailable
from shardstore.engine.node import data_role as node_service
from shardstore.engine.node.process import NodeProcess
from shardstore.net.local_link import LocalLink
from shardstore.testing.partition_campaign import wait_until
from shardstore.transport import NodeDisconnected, Transport, TransportClosed


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Cluster]:
    """Three embedded nodes over a file store."""
    with Cluster(f"file://{tmp_path / 'store'}?create=true", str(tmp_path / "nodes"), 3, cluster_managers=0,
                 names=["n1", "n2", "n3"], recovery_delay=0.2) as c:
        yield c


def _ids(table: pa.Table) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


def _masters(nodes: Cluster) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in nodes.names:
        try:
            out[name] = nodes.call(name, "discovery.hello", {}, timeout=1.0)["master"]
        except NodeDisconnected:
            out[name] = None
    return out


def _one_manager(nodes: Cluster) -> bool:
    m = _masters(nodes)
    return None not in m.values() and len(set(m.values())) == 1


def test_the_embedded_launcher_runs_the_node_process_roles_and_fails_over_a_killed_primary(
        nodes: Cluster) -> None:
    assert all(type(n) is NodeProcess for n in nodes.processes.values())
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    client.create_index("docs", shards=2, replicas=1)
    client.wait_for_health("green", timeout=30)
    first = client.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(500)])
    assert len(first.acknowledged) == 500
    victim = client.primary_of("docs", 0)
    nodes.kill(victim)
    later = client.bulk("docs", [{"_id": f"b{i}", "v": i} for i in range(500)])
    assert len(later.acknowledged) == 500  # the coordinator waited out the failover
    assert client.primary_of("docs", 0) != victim
    nodes.restart(victim)
    client.wait_for_health("green", timeout=60)
    client.refresh("docs")
    assert _ids(client.scan("docs", columns=["_id"])) == set(first.acknowledged) | set(later.acknowledged)
    assert client.count("docs") == 1000
    client.close()


@pytest.mark.parametrize("mode", ["down", "blackhole"])
def test_a_cut_off_manager_decides_nothing_and_the_majority_keeps_writing(nodes: Cluster, mode: str) -> None:
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    client.create_index("docs", shards=1, replicas=2)
    client.wait_for_health("green", timeout=30)
    manager = next(m for m in _masters(nodes).values() if m)
    majority = [n for n in nodes.names if n != manager]
    writer = nodes.client(majority)
    nodes.faults.isolate(manager, mode=mode)
    acked: set[str] = set()
    start = last = time.monotonic()
    gap, n = 0.0, 0
    while time.monotonic() < start + 10.0:
        result = writer.bulk("docs", [{"_id": f"d{n}", "v": n}])
        if result.acknowledged:
            gap, last = max(gap, time.monotonic() - last), time.monotonic()
        acked |= set(result.acknowledged)
        n += 1
    gap = max(gap, time.monotonic() - last)
    assert len(acked) > 10 and gap <= 8.0, f"the majority side stopped taking writes for {gap:.1f}s"
    assert _masters(nodes)[manager] != manager or mode == "blackhole"  # it stepped down (a blackhole: unanswered)
    nodes.faults.heal()
    wait_until(lambda: _one_manager(nodes), 30, "one manager after the heal")
    client.wait_for_health("green", timeout=60)
    client.refresh("docs")
    assert acked <= _ids(client.scan("docs", columns=["_id"]))
    writer.close()
    client.close()


def test_two_survivors_standing_at_once_agree_on_a_manager_soon(nodes: Cluster) -> None:
    """A split vote with the third voter silent (a blackholed manager) is settled in seconds, not stalled.

    Messages between the survivors are held so that two standing within 0.3 s of each other split the
    vote (a loaded CI host produced one by chance: 14 s without a manager). A vote waits at most a check's timeout on the silent voter and
    the back-off between elections grows (docs/design/engine.md, "Split votes")."""
    nodes.client().wait_for_health("green", timeout=30)
    manager = next(m for m in _masters(nodes).values() if m)
    survivors = [n for n in nodes.names if n != manager]
    # a pre-vote's answer and a vote request held 0.3 s each: two survivors standing within 0.3 s of each other
    # both pick the same term, vote for themselves and refuse each other
    nodes.transport.delay(0.3, "cs/pre_vote", sender=survivors, target=survivors, direction="response")
    nodes.transport.delay(0.3, "cs/start_join", sender=survivors, target=survivors)
    nodes.faults.isolate(manager, mode="blackhole")
    start = time.monotonic()

    def agreed() -> bool:
        named = {nodes.call(n, "discovery.hello", {}, timeout=1.0)["master"] for n in survivors}
        return len(named) == 1 and None not in named and manager not in named

    wait_until(agreed, 25.0, "the two survivors naming one new manager")  # typically 3-6 s; never, before
    assert time.monotonic() - start < 25.0
    nodes.faults.heal()
    wait_until(lambda: _one_manager(nodes), 30, "one manager after the heal")


def test_a_follower_that_applied_its_managers_commit_refuses_another_candidates_pre_vote(
        nodes: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed publication from the manager counts as an answered leader check for the pre-vote guard (as
    Elasticsearch's follower with a leader refuses pre-votes).  Before, a node that followed a new manager only
    through its publications (its first leader check not back yet) granted a returning old manager's pre-vote,
    and after a heal the old manager could depose the new one (docs/design/engine.md, "Split votes")."""
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    manager = next(m for m in _masters(nodes).values() if m)
    follower, other = [n for n in nodes.names if n != manager]
    process = nodes.processes[follower]
    # its leader checks neither succeed nor fail meanwhile (a dropped one would make it leave the manager at once)
    monkeypatch.setattr(process, "_check_leader", lambda master: None)
    time.sleep(0.3)  # a check already in flight has come back
    process._leader_ok_at = 0.0  # as if it had joined this manager just now: no leader check answered yet
    assert process.cm.master == manager and not process._has_live_leader(other)
    client.create_index("published", shards=1, replicas=0)  # a publication, then its commit, reach it
    wait_until(lambda: process._has_live_leader(other), 5.0, "the follower refusing other candidates")
    with pytest.raises(NotMaster):  # the guard every pre-vote passes through
        process.handle(coordination.PRE_VOTE, coordination.PreVote(other, process.cm.current_term))
    client.close()


def test_a_paused_primary_is_failed_over_and_its_messages_flow_again_on_resume(nodes: Cluster) -> None:
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    client.create_index("docs", shards=1, replicas=1)
    client.wait_for_health("green", timeout=30)
    victim = client.primary_of("docs", 0)
    others = [n for n in nodes.names if n != victim]
    writer = nodes.client(others)
    nodes.faults.pause(victim)
    start = time.monotonic()
    # a bulk in flight when the primary moved has an unknown outcome (reported, not acknowledged): sent again by id
    while not writer.bulk("docs", [{"_id": "after", "v": 1}]).acknowledged:
        assert time.monotonic() - start < 10.0, "no write acknowledged after the paused primary was failed over"
    assert writer.primary_of("docs", 0) != victim
    nodes.faults.resume(victim)
    wait_until(lambda: _one_manager(nodes), 30, "the paused node following the manager again")
    client.wait_for_health("green", timeout=60)
    assert client.get("docs", "after")["_source"] == {"v": 1}
    writer.close()
    client.close()


def test_a_write_reaching_a_published_primary_before_its_promotion_ran_is_sent_again_soon(
        nodes: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The routing names the new primary before ``shard.promote`` ran there (issue 41): a write meanwhile is
    refused ("holds no primary") and the routing will not move again; it was held for the whole failover wait.

    A promotion that takes 2 s is a slow handler (the manager may promote its own copy, no message to delay)."""
    promote = node_service._ACTIONS["shard.promote"]
    slow: list[float] = []

    def slow_promote(service: node_service.NodeService, req: dict) -> object:
        slow.append(time.monotonic())
        time.sleep(2.0)
        return promote(service, req)

    monkeypatch.setitem(node_service._ACTIONS, "shard.promote", slow_promote)
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    client.create_index("docs", shards=1, replicas=1)
    client.wait_for_health("green", timeout=30)
    assert client.bulk("docs", [{"_id": "before", "v": 0}]).acknowledged == ["before"]
    victim = client.primary_of("docs", 0)
    writer = nodes.client([n for n in nodes.names if n != victim])
    nodes.kill(victim)
    start = time.monotonic()
    while not writer.bulk("docs", [{"_id": "after", "v": 1}]).acknowledged:
        pass
    took = time.monotonic() - start
    assert slow, "no promotion ran"
    assert took < 6.0, f"the write waited {took:.1f}s for a promotion that took 2s"
    writer.close()
    client.close()


def test_a_link_resolves_seed_aliases_and_a_severed_link_sends_nothing() -> None:
    t = Transport()
    t.register("b", lambda action, request: ("b", action, request))
    link = LocalLink(t, action_timeouts={"fd.*": 0.5})
    link.set_peer("seed:b", "b")
    assert link.send("a", "seed:b", "x", 1) == ("b", "x", 1)
    assert link.timeout_for("fd.leader_check") == 0.5 and link.timeout_for("shard.bulk") is None
    link.register("a", lambda action, request: "a")
    link.sever()
    assert not t.is_registered("a")
    with pytest.raises(TransportClosed, match="a is stopped") as info:
        link.send("a", "b", "x", 1)
    assert not info.value.retryable and not isinstance(info.value, NodeDisconnected)  # no retry loop catches it


def test_a_refresh_that_missed_a_replica_reaches_it_before_it_serves_reads_as_the_primary(
        nodes: Cluster) -> None:
    """A refresh skipped a copy it took for a replica, which then was the primary a scan read: acknowledged,
    refreshed writes missing from the scan (process simulator seed 294: the manager cut off, its routing stale)."""
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    client.create_index("docs", shards=1, replicas=1)
    client.wait_for_health("green", timeout=30)
    written = client.bulk("docs", [{"_id": f"a{i}", "v": i} for i in range(50)]).acknowledged
    assert len(written) == 50
    primary = client.primary_of("docs", 0)
    replica = next(n for n in nodes.names if n != primary and nodes.call(n, "node.stats", {})["copies"])
    nodes.transport.drop("shard.refresh", target=replica, times=1)
    client.refresh("docs")
    writer = nodes.client([n for n in nodes.names if n != primary])
    nodes.kill(primary)
    wait_until(lambda: writer.primary_of("docs", 0) == replica, 30, "the replica promoted")
    assert _ids(writer.scan("docs", columns=["_id"])) == set(written)
    writer.close()
    client.close()


def test_a_primary_removed_at_once_serves_no_read_older_than_what_its_successor_acknowledged(
        nodes: Cluster) -> None:
    """A link taken down refuses like a dead process: the manager's follower check removes the node at once, well
    within the read lease the node holds from its last leader check; a promotion then must wait the lease out
    (process simulator seed 291).  Cut one way, manager to primary: the primary's own checks still succeed."""
    client = nodes.client()
    client.wait_for_health("green", timeout=30)
    uuid = client.create_index("docs", shards=3, replicas=1)
    client.wait_for_health("green", timeout=30)
    manager = next(m for m in _masters(nodes).values() if m)
    shard = next(s for s in range(3) if client.primary_of("docs", s) != manager)
    primary = client.primary_of("docs", shard)
    doc = next(f"d{i}" for i in range(1000) if shard_id(f"d{i}", 3) == shard)
    assert client.bulk("docs", [{"_id": doc, "v": 1}]).acknowledged == [doc]
    writer = nodes.client([n for n in nodes.names if n != primary])
    nodes.faults.cut(manager, primary, mode="down", one_way=True)
    wait_until(lambda: writer.primary_of("docs", shard) != primary, 15, "the cut-off primary replaced")
    start = time.monotonic()
    while not writer.bulk("docs", [{"_id": doc, "v": 2}]).acknowledged:
        assert time.monotonic() - start < 15.0, "the write was never acknowledged"
    try:
        old = nodes.call(primary, "shard.get", {"index_uuid": uuid, "shard": shard, "id": doc})
    except ShardUnavailable:
        old = None  # refused: outside its lease
    assert old is None or json.loads(old["_source"])["v"] == 2, f"the cut-off primary answered {old} after v=2 was acknowledged"
    nodes.faults.heal()
    writer.close()
    client.close()
