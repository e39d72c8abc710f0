"""The engine's fault simulator (issue 14): its schedule and model (pure), and fixed seeds against a real cluster.

The long campaign is ``python -m benches chaos --seeds N``; here a few fixed seeds run on
the file and memory stores and must break no guarantee, including seeds that found bugs
(seed 0 and 6: a shard that lost every in-sync copy stayed red although the store held all
of it; seed 687: restore took the newest term's commit, a new primary's re-upload of an old
local commit, over an older term's commit that covered more, and the translog between them
was purged: refused, although the store held it all; seed 23: one corrupt customs entity, shared by every
cluster-state manifest, made the cluster state unrestorable; seed 5000: a failed fsync in the translog
uploader's roll left appends waiting out the upload timeout; seed 5111: a segment file every commit shared
was truncated and the refusal did not name it; seed 5279: a promotion candidate whose disk failed was
retried for good, the shard stuck red; seed 295: a stale listing hid the newest commit from remote GC, which
deleted the files only it named; seed 20033: a shard that lost every copy was rebuilt from a store whose newest
translog metadata was damaged and whose data listing lagged, and came back without two acknowledged writes;
seed 7220: closing the cluster while a crash killed one of its nodes raised "dictionary changed size during
iteration"; seed 9641: the newest term marker deleted while the cluster state's term lagged hid that term's
data from a restore, which claimed the same term again and refused the shard; seed 9614, synthetic source: a
shard's only commit metadata deleted after a flush purged its whole translog, and a restore brought the shard back
empty, without a word, losing 15 acknowledged writes; it must refuse, naming the range).  One test plants a real loss (the remote translog deleted behind the cluster's back)
and checks that the checker reports it, so a silent checker cannot pass.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.testing.chaos import ClientModel, draw_schedule, run_schedule
from shardstore.testing.chaos.runner import Simulation
from shardstore.testing.chaos.schedule import Step

# -- schedule ---------------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_schedule():
    assert draw_schedule(7, 50) == draw_schedule(7, 50)
    assert [s.args for s in draw_schedule(7, 50)] == [s.args for s in draw_schedule(7, 50)]
    assert [str(s) for s in draw_schedule(7, 50)] != [str(s) for s in draw_schedule(8, 50)]
    kinds = {s.kind for seed in range(20) for s in draw_schedule(seed, 60)}
    assert {"bulk", "delete", "conditional", "kill", "store_fault", "drop", "restore", "heal", "corrupt",
            "concurrent", "disk_fault", "partition", "delay", "kill_at_send", "kill_coordinator", "ingest"} <= kinds
    # issue 43's ingest steps are bulk steps written another way: every other step is the one drawn before
    from shardstore.testing.chaos.schedule import draw_step

    for seed in range(20):
        rng = random.Random(seed)
        before = [draw_step(rng, i) for i in range(60)]
        after = draw_schedule(seed, 60)
        assert [(s.kind if s.kind != "ingest" else "bulk", s.args) for s in after] == [(s.kind, s.args) for s in before]
    actions = {s.args["action"] for seed in range(20) for s in draw_schedule(seed, 60) if s.kind == "store_fault"}
    assert "stale_list" in actions


# -- model ------------------------------------------------------------------------------------


def _rows(**values):
    return [{"_id": k, "v": v} for k, v in values.items() if v is not None]


def test_model_pins_acknowledged_writes_and_allows_failed_ones():
    m = ClientModel()
    m.acknowledged("a", "1:0:a")
    m.uncertain("b", "1:1:b")
    assert m.check(2, _rows(a="1:0:a"), 1, {}) == []
    assert m.check(2, _rows(a="1:0:a", b="1:1:b"), 2, {}) == []
    lost = m.check(2, [], 0, {})
    assert [v.kind for v in lost] == ["lost"] and "a" in lost[0].detail


def test_model_names_each_kind_of_violation():
    m = ClientModel()
    m.acknowledged("a", "1:0:a")
    m.acknowledged("a", "1:3:a")
    m.acknowledged("d", "1:1:d")
    m.acknowledged("d", None)
    kinds = [v.kind for v in m.check(5, _rows(a="1:0:a", d="1:1:d", x="bogus"), 3, {})]
    assert kinds == ["lost", "resurrected", "foreign"]
    dup = m.check(5, [{"_id": "a", "v": "1:3:a"}, {"_id": "a", "v": "1:3:a"}], 2, {"a": "1:3:a"})
    assert [v.kind for v in dup] == ["duplicate"]
    assert [v.kind for v in m.check(5, _rows(a="1:3:a"), 7, {})] == ["count"]
    assert [v.kind for v in m.check(5, _rows(a="1:3:a"), 1, {"a": None})] == ["get"]
    assert m.stamp("a", 1, 5, 2, 6) is None
    assert m.stamp("a", 1, 4, 3, 7).kind == "order"


# -- real runs --------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "store"), [(0, "file"), (6, "file"), (3, "memory"), (11, "memory"), (687, "memory"),
                                             (23, "memory"), (295, "memory"), (5000, "file"), (5111, "memory"),
                                             (5279, "memory"), (7220, "file"), (9641, "memory"), (20033, "memory")])
def test_fixed_seeds_break_no_guarantee(tmp_path: Path, seed: int, store: str):
    out = run_schedule(seed, draw_schedule(seed, 60), tmp_path / "run", store)
    assert out.clean, "\n".join(str(v) for v in out.violations)
    assert out.acked > 0 and out.restores >= 1


@pytest.mark.parametrize(("seed", "store"), [(0, "file"), (3, "memory"), (687, "memory"), (5000, "file"),
                                             (5111, "memory"), (9614, "file"), (20033, "memory")])
def test_fixed_seeds_on_a_synthetic_source_index_break_no_guarantee(tmp_path: Path, seed: int, store: str):
    """The same schedules on an index whose translog carries typed fields (FT frames) and no JSON (issue 16)."""
    out = run_schedule(seed, draw_schedule(seed, 60), tmp_path / "run", store, source="synthetic")
    assert out.clean, "\n".join(str(v) for v in out.violations)
    assert out.acked > 0 and out.restores >= 1


def test_the_checker_reports_a_planted_loss(tmp_path: Path):
    sim = Simulation(99, tmp_path / "run", "file")
    try:
        sim.apply(Step(0, "bulk", {"ids": ["d1", "d2", "d3"]}))
        assert sim.outcome.acked == 3
        # behind the cluster's back: every remote translog blob of the index is deleted
        store = open_store(f"file://{tmp_path / 'run' / 'remote'}")
        doomed = [b.key for b in store.list("") if "translog/" in b.key]  # per-shard and node-level
        assert doomed
        store.delete(doomed)
        sim.apply(Step(1, "restore"))
    finally:
        sim.close()
    assert sim.outcome.count("lost") >= 1, sim.outcome.violations
