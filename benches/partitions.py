"""The partition campaign of issue 41: ``python -m benches partitions``.

Each round (``shardstore.testing.partition_campaign.run_round``) starts three node
processes whose every link runs through its own TCP fault proxy, writes and deletes through
two clients (one on the majority side, one pinned to the cut-off node), cuts the link(s)
for ``--partition-seconds`` (default 12; quick 10), heals, and checks live and after a
restore from the store alone.  Rounds: every kind (the primary's node isolated, the elected
manager isolated, a bridge n1-n3 with both still reaching n2) in both modes (``blackhole``:
bytes dropped, calls time out; ``down``: connections reset and refused), alternating 1 and 2
replicas, ``--partition-rounds`` times over (default 1: 6 rounds, about 5 minutes).

Figures: lost and resurrected (acknowledged deletes back) live and after the restore, stuck
(not green or a shard refusing writes ``--partition-heal-wait`` seconds after the heal), the
time from the heal to green and writable, and the longest gap between acknowledged writes on
a shard whose primary stayed on the majority side while the primary's node or the manager was
cut off (target <= 8 s, issue 41).  A bridge's gaps are printed without a target: there every
node is in a majority, and a primary cut off from the manager only (not from the others)
holds its shard's writes until the manager removes it and its own report of the failed
replica gives up (fault detection, then the primary's 10 s wait for a manager).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benches.runner import Context, Figure

GAP_TARGET = 8.0


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--partition-rounds", type=int, default=1, help="times over every kind and mode (default 1)")
    group.add_argument("--partition-seconds", type=float, default=None, help="how long a cut lasts (default 12)")
    group.add_argument("--partition-kinds", default="isolate_primary,isolate_manager,bridge",
                       help="kinds of cut (default all three)")
    group.add_argument("--partition-modes", default="blackhole,down", help="blackhole,down (default both)")
    group.add_argument("--partition-heal-wait", type=float, default=60.0,
                       help="seconds after the heal before a shard not green and writable counts as stuck")


def run(ctx: Context) -> Iterator[Figure]:
    """Every round's findings, then the campaign's totals."""
    import logging

    from shardstore.testing.partition_campaign import run_round

    logging.getLogger("shardstore").setLevel(logging.ERROR)
    a = ctx.args
    seconds = a.partition_seconds or (10.0 if ctx.quick else 12.0)
    kinds = [k.strip() for k in a.partition_kinds.split(",") if k.strip()]
    modes = [m.strip() for m in a.partition_modes.split(",") if m.strip()]
    rounds = [(kind, mode) for _ in range(max(1, a.partition_rounds)) for kind in kinds for mode in modes]
    if ctx.quick:
        rounds = rounds[:2]
    totals = {"lost": 0, "resurrected": 0, "stuck": 0, "acked": 0}
    worst_gap = bridge_gap = 0.0
    heal = []
    base = Path(tempfile.mkdtemp(prefix="shardstore-bench-partitions-"))
    for i, (kind, mode) in enumerate(rounds):
        replicas = 1 + i % 2
        r = run_round(base / f"round-{i}", kind, mode, seconds, replicas=replicas, heal_wait=a.partition_heal_wait,
                      progress=ctx.progress)
        lost = len(set(r.lost) | set(r.lost_after_restore))
        back = len(set(r.resurrected) | set(r.resurrected_after_restore))
        gap = max(r.gaps.values(), default=0.0)
        if kind == "bridge":
            bridge_gap = max(bridge_gap, gap)
        else:
            worst_gap = max(worst_gap, gap)
        heal.append(r.heal_seconds)
        totals["lost"] += lost
        totals["resurrected"] += back
        totals["stuck"] += len(r.stuck)
        totals["acked"] += r.acked
        ctx.progress(f"round {i + 1}/{len(rounds)} {kind} ({mode}, {replicas} replica(s), {seconds:g} s): "
                     f"{r.acked:,} acked, {lost} lost, {back} resurrected, stuck {r.stuck or 0}, green and "
                     f"writable {r.heal_seconds:.1f} s after the heal, longest majority-side gap {gap:.1f} s "
                     f"{ {s: round(g, 1) for s, g in r.gaps.items()} }")
        targeted = kind != "bridge"
        if gap > GAP_TARGET:
            ctx.progress(f"round {i + 1}: what the writers of the long gaps saw: {r.gap_errors}")
        if not r.clean:
            ctx.progress(f"round {i + 1} failed; node logs:\n{r.logs[-6000:]}")
        yield ctx.figure("round_longest_gap_s", gap, "s", target=f"<= {GAP_TARGET:g}" if targeted else None,
                         met=gap <= GAP_TARGET if targeted else None,
                         kind=kind, mode=mode, replicas=replicas, lost=lost, resurrected=back, stuck=len(r.stuck),
                         heal_s=round(r.heal_seconds, 1))
    n = len(rounds)
    yield ctx.figure("lost", totals["lost"], "docs", target="== 0", met=totals["lost"] == 0, rounds=n,
                     acked=totals["acked"])
    yield ctx.figure("resurrected", totals["resurrected"], "docs", target="== 0", met=totals["resurrected"] == 0,
                     rounds=n)
    yield ctx.figure("stuck", totals["stuck"], "rounds", target="== 0", met=totals["stuck"] == 0, rounds=n)
    yield ctx.figure("longest_majority_gap_s", worst_gap, "s", target=f"<= {GAP_TARGET:g}",
                     met=worst_gap <= GAP_TARGET, rounds=n, seconds=seconds)
    yield ctx.figure("bridge_longest_gap_s", bridge_gap, "s", rounds=n, seconds=seconds)
    yield ctx.figure("heal_to_green_writable_s", max(heal, default=0.0), "s", rounds=n)
