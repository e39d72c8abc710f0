"""The engine's fault simulator over many seeds: ``python -m benches chaos --seeds N`` (issue 14).

Each seed draws a schedule (``shardstore.testing.chaos.schedule``) and runs it against a
real 3-node cluster over a fault-injecting store, alternating the file and memory stores.
Prints a progress line per seed, one figure per outcome total, then the line

    N seeded schedules: L lost, W wrong, U unclean errors, S stuck shards

and fails (exit status 1) when any schedule broke a guarantee, naming its seed and step and
the minimised schedule that still breaks it (``--chaos-minimise``).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benches.runner import Context, Figure


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--seeds", type=int, default=None, help="schedules to run (default 50, quick 5)")
    group.add_argument("--chaos-first-seed", type=int, default=0, help="the first seed (default 0)")
    group.add_argument("--chaos-steps", type=int, default=None, help="steps per schedule (default 60, quick 30)")
    group.add_argument("--chaos-stores", default="file,memory", help="stores to alternate over (default file,memory)")
    group.add_argument("--chaos-minimise", action="store_true", help="minimise every failing schedule")


def run(ctx: Context) -> Iterator[Figure]:
    """Run the seeds; figures of the totals; raise if any schedule broke a guarantee."""
    from shardstore.testing.chaos import draw_schedule, minimise, run_schedule

    a = ctx.args
    seeds = a.seeds if a.seeds is not None else (5 if ctx.quick else 50)
    steps = a.chaos_steps or (30 if ctx.quick else 60)
    stores = [s.strip() for s in a.chaos_stores.split(",") if s.strip()]
    totals: Counter = Counter()
    errors: Counter = Counter()
    failures = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardstore-chaos-") as tmp:
        for n, seed in enumerate(range(a.chaos_first_seed, a.chaos_first_seed + seeds)):
            store = stores[n % len(stores)]
            schedule = draw_schedule(seed, steps)
            out = run_schedule(seed, schedule, Path(tmp) / f"seed-{seed}", store)
            totals["acked"] += out.acked
            totals["failed"] += out.failed
            totals["restores"] += out.restores
            errors.update(out.errors)
            for kind in ("lost", "resurrected", "foreign", "duplicate", "count", "get", "order", "unclean", "stuck"):
                totals[kind] += out.count(kind)
            status = "ok" if out.clean else f"{len(out.violations)} violation(s), first: {out.violations[0]}"
            ctx.progress(f"seed {seed} ({store}, {steps} steps): {out.acked} acked, {out.failed} failed, "
                         f"{out.restores} restores, {out.seconds:.1f}s: {status}")
            if not out.clean:
                short = minimise(seed, schedule, Path(tmp) / f"min-{seed}", store) if a.chaos_minimise else schedule
                failures.append((seed, store, out.violations, short))
    seconds = time.monotonic() - t0
    lost = totals["lost"] + totals["resurrected"]
    wrong = sum(totals[k] for k in ("foreign", "duplicate", "count", "get", "order"))
    yield ctx.figure("schedules", seeds, "schedules", steps=steps, stores=",".join(stores))
    yield ctx.figure("acknowledged writes", totals["acked"], "ops")
    yield ctx.figure("failed writes (documented errors)", totals["failed"], "ops")
    yield ctx.figure("restores checked", totals["restores"], "restores")
    yield ctx.figure("lost or resurrected", lost, "violations", target="== 0", met=lost == 0)
    yield ctx.figure("wrong (foreign, duplicate, count, get, order)", wrong, "violations", target="== 0",
                     met=wrong == 0)
    yield ctx.figure("unclean errors", totals["unclean"], "violations", target="== 0", met=totals["unclean"] == 0)
    yield ctx.figure("stuck shards", totals["stuck"], "violations", target="== 0", met=totals["stuck"] == 0)
    yield ctx.figure("time per schedule", seconds / max(seeds, 1), "s")
    ctx.progress("documented errors seen: " + ", ".join(f"{k} {v}" for k, v in errors.most_common()))
    ctx.progress(f"{seeds} seeded schedules: {lost} lost, {wrong} wrong, {totals['unclean']} unclean errors, "
                 f"{totals['stuck']} stuck shards")
    for seed, store, violations, short in failures:
        ctx.progress(f"FAILED seed {seed} ({store}): " + "; ".join(str(v) for v in violations[:5]))
        ctx.progress(f"  schedule ({len(short)} steps{', minimised' if a.chaos_minimise else ''}): "
                     + " | ".join(str(s) for s in short))
    if failures:
        raise AssertionError(f"{len(failures)} of {seeds} schedules broke a guarantee: seeds "
                             f"{[f[0] for f in failures]}")
