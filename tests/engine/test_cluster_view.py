"""The operator's view of a running cluster (issue 45): ``shardstore cluster health | nodes | shards``.

The view is built and printed by pure functions (checked here on plain data), and served by any
node's coordinator (checked against real node processes through the installed command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from shardstore.core.path_strategy import PlainPathStrategy
from shardstore.engine.coordinator.cluster_view import build_view, format_health, format_nodes, format_shards
from shardstore.engine.manager.metadata import IndexMeta, ShardRouting
from shardstore.testing.node_processes import ProcessCluster

HEALTH = {"status": "yellow", "active_primaries": 2, "active_shards": 3, "initializing_shards": 0,
          "unassigned_shards": 1, "red_shards": [], "causes": [], "data_nodes": 2, "settled": False,
          "green_possible": True}


def _copy(uuid: str, shard: int, primary: bool, docs: int, max_seq_no: int, committed: int) -> dict:
    return {"index_uuid": uuid, "shard": shard, "primary": primary, "state": "started", "term": 1,
            "local_checkpoint": max_seq_no, "global_checkpoint": max_seq_no, "max_seq_no": max_seq_no,
            "committed_checkpoint": committed, "docs": docs, "bytes": 2048, "disk_failure": None}


def _view(held: dict) -> dict:
    meta = IndexMeta("logs", "u1", 2, 1, {}, "request", PlainPathStrategy(), (
        ShardRouting(0, "n1", 1, ("n1", "n2"), ("n1", "n2")),
        ShardRouting(1, "n2", 3, ("n2",), ("n2",))))
    return build_view(cluster_uuid="c", manager="n1", term=4, version=9, answered_by="n2",
                      nodes={"n1": "127.0.0.1:1", "n2": "127.0.0.1:2", "n3": "127.0.0.1:3"}, indices={"logs": meta},
                      held=held, health=HEALTH)


def test_the_view_names_every_copy_its_role_state_and_backlog_and_the_missing_ones() -> None:
    view = _view({"n1": [_copy("u1", 0, True, 10, 14, 9)],
                  "n2": [_copy("u1", 0, False, 10, 14, 14), _copy("u1", 1, True, 7, 6, -1)],
                  "n3": TimeoutError("no answer in 2s")})
    rows = {(s["shard"], s["node"]): s for s in view["shards"]}
    assert rows[(0, "n1")]["role"] == "primary" and rows[(0, "n1")]["backlog"] == 5
    assert rows[(0, "n2")]["role"] == "replica" and rows[(0, "n2")]["backlog"] == 0
    assert rows[(1, "n2")]["backlog"] == 7 and rows[(1, None)]["state"] == "unassigned"
    nodes = {n["name"]: n for n in view["nodes"]}
    assert nodes["n1"]["manager"] and not nodes["n2"]["manager"]
    assert nodes["n2"]["copies"] == 2 and nodes["n2"]["primaries"] == 1 and nodes["n2"]["docs"] == 7
    assert not nodes["n3"]["answered"] and "no answer in 2s" in nodes["n3"]["error"]
    text = format_nodes(view)
    assert text.splitlines()[0].split()[:3] == ["name", "address", "manager"] and "NO" in text
    shards = format_shards(view).splitlines()
    assert len(shards) == 1 + 4 and any("unassigned" in line for line in shards)
    assert format_health(view).splitlines()[1].split()[0] == "yellow"


def test_a_copy_its_node_does_not_hold_or_that_did_not_answer_is_shown_so() -> None:
    view = _view({"n1": [], "n2": [_copy("u1", 1, True, 7, 6, 6)]})
    rows = {(s["shard"], s["node"]): s for s in view["shards"]}
    assert rows[(0, "n1")]["state"] == "missing" and rows[(0, "n1")]["docs"] is None
    assert rows[(0, "n2")]["state"] == "missing"
    view = _view({"n2": [_copy("u1", 0, False, 1, 0, 0)]})
    assert {(s["shard"], s["node"]): s for s in view["shards"]}[(0, "n1")]["state"] == "no answer"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDSTORE_HOSTS"}
    return subprocess.run([sys.executable, "-m", "shardstore", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_the_cluster_commands_show_a_running_cluster(procs: ProcessCluster, tmp_path: Path) -> None:
    client = procs.client()
    client.create_index("logs", shards=2, replicas=1)
    client.wait_for_health("green", timeout=60)
    assert not client.bulk("logs", [{"_id": str(k), "v": k} for k in range(30)]).errors
    client.refresh("logs")
    hosts = ",".join(procs.nodes[n].address for n in procs.names)

    health = _cli("cluster", "health", "--hosts", hosts)
    assert health.returncode == 0, health.stderr
    assert health.stdout.splitlines()[1].split()[0] == "green"
    nodes = json.loads(_cli("cluster", "nodes", "--hosts", hosts, "--format", "json").stdout)
    assert sorted(n["name"] for n in nodes) == sorted(procs.names)
    assert sum(n["manager"] for n in nodes) == 1 and all(n["answered"] for n in nodes)
    shards = json.loads(_cli("cluster", "shards", "--hosts", procs.nodes[procs.names[0]].address,
                             "--format", "json").stdout)
    assert len(shards) == 4 and {s["state"] for s in shards} == {"started"}
    assert sum(s["docs"] for s in shards if s["role"] == "primary") == 30
    assert all(s["backlog"] == s["local_checkpoint"] + 1 for s in shards)  # nothing flushed yet

    wrong = _cli("cluster", "health", "--hosts", "127.0.0.1:abc")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--hosts" in wrong.stderr

    # the quorum lost (2 of 3 nodes killed): the views still answer, and say there is no manager
    survivor = procs.names[-1]
    for name in procs.names[:-1]:
        procs.kill(name)
    alone = procs.nodes[survivor].address
    deadline = time.monotonic() + 30
    while True:
        health = _cli("cluster", "health", "--hosts", alone)
        if "no elected cluster manager" in health.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert health.returncode == 1 and "no elected cluster manager" in health.stdout, (health.stdout, health.stderr)
    assert "Traceback" not in health.stdout + health.stderr
    nodes = json.loads(_cli("cluster", "nodes", "--hosts", alone, "--format", "json").stdout)
    assert [n["name"] for n in nodes if n["answered"]] == [survivor]
