"""The fault simulator in process mode (issue 29): real node processes, faults as signals, the same client model.

The long campaign is ``python -m benches chaos --processes --seeds N``; here the schedule
is checked to be pure, and a few fixed seeds (each with a SIGKILL, a SIGSTOP, a SIGTERM
and the elected manager's node killed between them) run against three ``shardstore node``
processes and must break no guarantee.  A fixed schedule of network partitions (issue 41:
the manager isolated, a bridge, each outlasting fault detection, writes and deletes in
flight and between) must break none either.  One test plants a real loss and checks that
the checker reports it, so a silent checker cannot pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstore.testing.chaos.process_runner import (
    FD_INTERVAL,
    FD_RETRIES,
    FD_TIMEOUT,
    ProcessSimulation,
    run_process_schedule,
)
from shardstore.testing.chaos.process_schedule import FAULTS, PARTITIONS, SIGNAL_FAULTS, draw_process_schedule
from shardstore.testing.chaos.schedule import Step, draw_schedule

#: steps per fixed seed: each runs in about 15-35 s on two cores
STEPS = 40


def test_the_same_seed_draws_the_same_process_schedule_with_one_fault_at_a_time():
    assert draw_process_schedule(7, 50) == draw_process_schedule(7, 50)
    assert [s.args for s in draw_process_schedule(7, 50)] == [s.args for s in draw_process_schedule(7, 50)]
    assert [str(s) for s in draw_process_schedule(7, 50)] != [str(s) for s in draw_process_schedule(8, 50)]
    kinds = set()
    for seed in range(20):
        active = False
        for step in draw_process_schedule(seed, 60):
            kinds.add(step.kind)
            if step.kind in FAULTS:
                assert not active, f"seed {seed}: a second fault while one is active at {step}"
                active = True
            elif step.kind == "recover":
                assert active, f"seed {seed}: recover with no fault active at {step}"
                active = False
    assert {"bulk", "concurrent", "delete", "index_doc", "get", "refresh", "flush", "verify", *FAULTS,
            "recover"} <= kinds
    assert set(PARTITIONS) <= set(FAULTS)
    partitions = [s for seed in range(20) for s in draw_process_schedule(seed, 60) if s.kind in PARTITIONS]
    assert {s.args["mode"] for s in partitions} == {"blackhole", "down"}
    assert {s.args["early"] for s in partitions} == {True, False}
    assert max(s.args["seconds"] for s in partitions) > 1.5 * FD_RETRIES * (FD_INTERVAL + FD_TIMEOUT)
    # the in-process draws are untouched by the process mode
    assert [str(s) for s in draw_schedule(7, 5)] == [str(s) for s in draw_schedule(7, 5)]


@pytest.mark.parametrize("seed", [136, 186, 355])
def test_fixed_process_seeds_break_no_guarantee(tmp_path: Path, seed: int):
    steps = draw_process_schedule(seed, STEPS)
    assert set(SIGNAL_FAULTS) <= {s.kind for s in steps}  # these seeds draw every kind of signal fault
    out = run_process_schedule(seed, steps, tmp_path / "run", logs_to=tmp_path / "logs")
    assert out.clean, "\n".join(str(v) for v in out.violations) + f"\nnode logs: {tmp_path / 'logs'}"
    assert out.acked > 0 and out.restores == 1
    assert out.faults >= 3


def test_the_checker_reports_a_planted_loss_in_process_mode(tmp_path: Path):
    sim = ProcessSimulation(99, tmp_path / "run")
    try:
        sim.apply(Step(0, "bulk", {"ids": ["d1", "d2", "d3"]}))
        sim.apply(Step(1, "get", {"ids": ["d1"]}))
        assert sim.outcome.acked == 3 and sim.outcome.clean
        sim.model.acknowledged("d4", "99:1:d4")  # the model believes a write that never happened: lost
        sim.model.acknowledged("d2", None)  # and a delete that never happened: d2 is back
        sim.apply(Step(2, "verify"))
    finally:
        sim.close()
    assert sorted(v.kind for v in sim.outcome.violations) == ["lost", "resurrected"], sim.outcome.violations


def _partition_steps() -> list[Step]:
    """The manager isolated, then a bridge, each over fault detection, with writes and deletes in flight and between."""
    over = 1.5 * FD_RETRIES * (FD_INTERVAL + FD_TIMEOUT)  # a node is declared failed after ~4.5 s: cut for longer
    kinds: list[tuple[str, dict]] = [
        ("bulk", {"ids": [f"d{i}" for i in range(10)]}),
        ("isolate_manager", {"mode": "blackhole", "seconds": over, "early": False, "ids": ["d10", "d11", "d12"],
                             "delay": 0.1}),
        ("bulk", {"ids": ["d1", "d2", "d13"]}),
        ("delete", {"id": "d3"}),
        ("index_doc", {"id": "d4", "cas": True}),
        ("concurrent", {"a": ["d5", "d14"], "b": ["d6", "d15"]}),
        ("get", {"ids": ["d1", "d3", "d5"]}),
        ("delete", {"id": "d7"}),
        ("bulk", {"ids": ["d16", "d17"]}),
        ("verify", {}),
        ("bridge", {"via": "n2", "mode": "down", "seconds": over, "early": False, "ids": ["d8", "d18"], "delay": 0.0}),
        ("bulk", {"ids": ["d0", "d19", "d20"]}),
        ("delete", {"id": "d9"}),
        ("index_doc", {"id": "d1", "cas": False}),
        ("get", {"ids": ["d9", "d19"]}),
        ("flush", {}),
        ("bulk", {"ids": ["d21", "d22"]}),
        ("delete", {"id": "d21"}),
        ("verify", {}),
        ("recover", {}),
        ("one_way", {"src": "n1", "dst": "n3", "mode": "blackhole", "seconds": 2.0, "early": True}),
        ("bulk", {"ids": ["d2", "d23"]}),
        ("delete", {"id": "d0"}),
    ]
    return [Step(i, kind, args) for i, (kind, args) in enumerate(kinds)]


def test_a_partition_schedule_breaks_no_guarantee(tmp_path: Path):
    steps = _partition_steps()
    assert {"isolate_manager", "bridge"} <= {s.kind for s in steps}
    out = run_process_schedule(41, steps, tmp_path / "run", keep=True, logs_to=tmp_path / "logs")
    timeline = (tmp_path / "run" / "nodes" / "steps.log").read_text()
    assert out.clean, "\n".join(str(v) for v in out.violations) + f"\nnode logs: {tmp_path / 'logs'}\n{timeline}"
    assert (out.count("lost", "resurrected"), out.count("unclean"), out.count("stuck")) == (0, 0, 0)
    assert out.acked > 0 and out.restores == 1
    assert out.faults == 3 and out.partitions_over_fd >= 2, out.partitions  # the manager isolated, the bridge
    assert timeline.count("  cut: ") == 3 and timeline.count("  healed: ") == 3, timeline


def test_a_start_that_lost_its_port_to_another_process_starts_afresh(tmp_path: Path):
    """The harness picks a port, then the node binds it: a process beside it (a CI run) can take it between.
    That start is retried on a fresh cluster (the half-started one's files kept aside); any other failure is not."""
    from types import SimpleNamespace

    from shardstore.engine.launcher import NodeStartFailed

    starts: list[str] = []

    def linked(root: str, store: str, nodes: int, **_: object) -> str:
        starts.append(root)
        (Path(root) / "n1.log").write_text("half started")
        (tmp_path / "remote").mkdir(exist_ok=True)
        if len(starts) < 3:
            raise NodeStartFailed("node n3 did not start: OSError: [Errno 98] Address already in use")
        return "cluster"

    (tmp_path / "nodes").mkdir()
    sim = SimpleNamespace(workdir=tmp_path, store_url="file:///nowhere")
    assert ProcessSimulation._linked_cluster(sim, linked) == "cluster"
    assert len(starts) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nodes", "nodes.port-taken-1", "nodes.port-taken-2",
                                                          "remote", "remote.port-taken-1", "remote.port-taken-2"]

    def broken(root: str, store: str, nodes: int, **_: object) -> str:
        raise NodeStartFailed("node n1 did not start: no store")

    with pytest.raises(NodeStartFailed, match="no store"):
        ProcessSimulation._linked_cluster(sim, broken)
