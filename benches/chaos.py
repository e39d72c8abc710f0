"""The engine's fault simulator over many seeds: ``python -m benches chaos --seeds N`` (issue 14).

Each seed draws a schedule (``shardstore.testing.chaos.schedule``) and runs it against a
real 3-node cluster over a fault-injecting store, alternating the file and memory stores.
``--chaos-jobs J`` runs J schedules at once in worker processes (a schedule mostly waits
on its cluster's timers, so more jobs than cores pays); a seed's schedule and outcome do
not depend on J.  Prints a progress line per seed, one figure per outcome total, then the
line

    N seeded schedules: L lost, W wrong, U unclean errors, S stuck shards

and fails (exit status 1) when any schedule broke a guarantee, naming its seed and step and
the minimised schedule that still breaks it (``--chaos-minimise``).

``--processes`` runs the process-mode schedules instead (issue 29;
``shardstore.testing.chaos.process_schedule`` and ``process_runner``): three ``shardstore
node`` processes per schedule over the local file store, faults as signals (SIGKILL,
SIGSTOP/SIGCONT, SIGTERM, the elected manager's node killed) and restarts on the node's
data dir, and network partitions (issue 41: a node or the manager isolated, a bridge, one
direction of a link; a fault proxy per link), checked by the same client model; each job
has its own processes (ports picked by the OS).  A failing or stalled schedule's node logs are copied under ``--chaos-logs``.

``--embedded-roles`` runs the same process-mode schedules on the same node roles embedded in
the bench's worker (``shardstore.engine.Cluster``, issue 42): one in-process transport
whose rules cut links (down: refused at once; blackhole: a call hangs until its timeout) and
pause a node (its messages hang); the roles log into the schedule's ``embedded.log``.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from benches.runner import Context, Figure

#: violation kinds, as the totals group them
LOST = ("lost", "resurrected")
WRONG = ("foreign", "duplicate", "count", "get", "order")


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--seeds", type=int, default=None, help="schedules to run (default 50, quick 5)")
    group.add_argument("--chaos-first-seed", type=int, default=0, help="the first seed (default 0)")
    group.add_argument("--chaos-steps", type=int, default=None, help="steps per schedule (default 60, quick 30)")
    group.add_argument("--chaos-stores", default="file,memory", help="stores to alternate over (default file,memory)")
    group.add_argument("--chaos-sources", default="stored,synthetic",
                       help="index source options to alternate over (default stored,synthetic; issue 16)")
    group.add_argument("--chaos-jobs", type=int, default=1, help="schedules run at once (worker processes)")
    group.add_argument("--chaos-dir", default=None,
                       help="where the schedules' stores and data dirs live (default /dev/shm when it exists: "
                            "a tmpfs makes the local fsyncs free, half the CPU per schedule)")
    group.add_argument("--chaos-minimise", action="store_true", help="minimise every failing schedule")
    group.add_argument("--processes", action="store_true",
                       help="process mode (issue 29): the nodes are real processes, faults are signals")
    group.add_argument("--embedded-roles", action="store_true",
                       help="process-mode schedules on the same node roles embedded in this process, over the "
                            "in-process transport (issue 42): no processes, no proxies")
    group.add_argument("--chaos-logs", default=None,
                       help="process mode: where a failing or stalled schedule's node logs are copied (default "
                            "<tmp>/shardstore-chaos-logs)")


def _run_one(seed: int, steps: int, store: str, tmp: str, source: str = "stored", logs: str | None = None,
             launcher: str = "processes") -> Any:
    """One seed's schedule, run in a worker (or in this process with one job); a crash of the simulator itself
    is reported as that seed's *unclean* violation, and the campaign goes on.  ``logs``: process mode, where a
    failing schedule's node logs go."""
    import logging
    import traceback

    from shardstore.testing.chaos import Outcome, Violation, draw_schedule, run_schedule

    logging.getLogger("shardstore").setLevel(logging.ERROR)  # the faults' expected warnings, once per seed
    try:
        if logs is not None:
            from shardstore.testing.chaos.process_runner import run_process_seed

            return run_process_seed(seed, steps, Path(tmp) / f"seed-{seed}", logs_to=Path(logs), launcher=launcher)
        return run_schedule(seed, draw_schedule(seed, steps), Path(tmp) / f"seed-{seed}", store, source=source)
    except Exception as exc:  # noqa: BLE001 - one broken schedule must not stop the other 9,999
        out = Outcome(seed, 0)
        out.violations.append(Violation("unclean", -1, f"the simulator itself failed: {exc!r}\n"
                                                       f"{traceback.format_exc(limit=8)}"))
        return out


def _outcomes(jobs: int, work: list[tuple[int, str, str]], steps: int, tmp: str, logs: str | None = None,
              launcher: str = "processes") -> Iterator[tuple[int, str, str, Any]]:
    """(seed, store, source, outcome) as schedules finish; at most ``2 * jobs`` queued at a time."""
    if jobs <= 1:
        for seed, store, source in work:
            yield seed, store, source, _run_one(seed, steps, store, tmp, source, logs, launcher)
        return
    ctx = multiprocessing.get_context("spawn")  # a worker starts clean: no threads inherited
    todo = iter(work)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        running: dict[Future, tuple[int, str, str]] = {}
        while True:
            while len(running) < 2 * jobs:
                nxt = next(todo, None)
                if nxt is None:
                    break
                running[pool.submit(_run_one, nxt[0], steps, nxt[1], tmp, nxt[2], logs, launcher)] = nxt
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                seed, store, source = running.pop(fut)
                yield seed, store, source, fut.result()


def run(ctx: Context) -> Iterator[Figure]:
    """Run the seeds; figures of the totals; raise if any schedule broke a guarantee."""
    from shardstore.testing.chaos import draw_schedule, minimise
    from shardstore.testing.chaos.runner import SLOW_STEP

    a = ctx.args
    seeds = a.seeds if a.seeds is not None else (5 if ctx.quick else 50)
    steps = a.chaos_steps or (30 if ctx.quick else 60)
    stores = [s.strip() for s in a.chaos_stores.split(",") if s.strip()]
    sources = [s.strip() for s in a.chaos_sources.split(",") if s.strip()]
    draw, shorten = draw_schedule, minimise
    logs = None
    processes = a.processes or a.embedded_roles
    launcher = "embedded" if a.embedded_roles else "processes"
    if processes:  # the node processes run over the local file store, an index of stored source
        from shardstore.testing.chaos.process_runner import minimise_process
        from shardstore.testing.chaos.process_schedule import draw_process_schedule

        stores, sources = ["file"], ["stored"]
        logs = a.chaos_logs or str(Path(tempfile.gettempdir()) / "shardstore-chaos-logs")
        draw = draw_process_schedule

        def shorten(seed: int, schedule: Any, workdir: Path, store: str, source: str) -> Any:
            return minimise_process(seed, schedule, workdir, launcher=launcher)
    # every store meets every source option: the source turns once per round of stores
    work = [(seed, stores[n % len(stores)], sources[(n // len(stores)) % len(sources)]) for n, seed in
            enumerate(range(a.chaos_first_seed, a.chaos_first_seed + seeds))]
    totals: Counter = Counter()
    errors: Counter = Counter()
    failures = []
    t0 = time.monotonic()
    base = a.chaos_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)
    if a.chaos_dir:
        Path(a.chaos_dir).mkdir(parents=True, exist_ok=True)  # a new folder named on the command line
    with tempfile.TemporaryDirectory(prefix="shardstore-chaos-", dir=base) as tmp:
        for n, (seed, store, source, out) in enumerate(_outcomes(max(1, a.chaos_jobs), work, steps, tmp, logs, launcher), 1):
            totals["acked"] += out.acked
            totals["failed"] += out.failed
            totals["restores"] += out.restores
            totals["refused"] += out.refused
            totals["faults"] += out.faults
            totals["slow"] += out.slow_steps
            totals["partitions"] += len(getattr(out, "partitions", ()))  # process mode (issue 41)
            totals["partitions_over_fd"] += getattr(out, "partitions_over_fd", 0)
            errors.update(out.errors)
            for kind in (*LOST, *WRONG, "unclean", "stuck"):
                totals[kind] += out.count(kind)
            status = "ok" if out.clean else f"{len(out.violations)} violation(s), first: {out.violations[0]}"
            mode = ("embedded roles" if a.embedded_roles else "processes") if processes else f"{store}, {source} source"
            faults = (f"{out.faults} faults ({len(getattr(out, 'partitions', ()))} partitions), " if processes
                      else "")
            ctx.progress(f"[{n}/{seeds}] seed {seed} ({mode}, {steps} steps): {out.acked} acked, "
                         f"{out.failed} failed, {faults}{out.restores} restores, {out.seconds:.1f}s: {status}")
            if not out.clean:
                failures.append((seed, store, source, out.violations))
        shortened = []
        for seed, store, source, violations in sorted(failures):
            schedule = draw(seed, steps)
            short = (shorten(seed, schedule, Path(tmp) / f"min-{seed}", store, source=source) if a.chaos_minimise
                     else schedule)
            shortened.append((seed, f"{launcher}, node logs in " + str(Path(logs) / f"seed-{seed}") if processes
                              else f"{store}, {source} source", violations, short))
    seconds = time.monotonic() - t0
    lost = sum(totals[k] for k in LOST)
    wrong = sum(totals[k] for k in WRONG)
    yield ctx.figure("schedules", seeds, "schedules", steps=steps, stores=",".join(stores),
                     sources=",".join(sources), jobs=a.chaos_jobs,
                     **({"launcher": launcher} if processes else {}))
    yield ctx.figure("acknowledged writes", totals["acked"], "ops")
    yield ctx.figure("failed writes (documented errors)", totals["failed"], "ops")
    yield ctx.figure("injected faults that fired", totals["faults"], "faults")
    if processes:
        yield ctx.figure("network partitions (of the faults)", totals["partitions"], "faults",
                         outlasting_fault_detection=totals["partitions_over_fd"])
    yield ctx.figure("restores checked", totals["restores"], "restores")
    yield ctx.figure("restores refused naming the lost blob (after a corruption)", totals["refused"], "restores")
    yield ctx.figure("lost or resurrected", lost, "violations", target="== 0", met=lost == 0)
    yield ctx.figure("wrong (foreign, duplicate, count, get, order)", wrong, "violations", target="== 0",
                     met=wrong == 0)
    yield ctx.figure("unclean errors", totals["unclean"], "violations", target="== 0", met=totals["unclean"] == 0)
    yield ctx.figure("stuck shards", totals["stuck"], "violations", target="== 0", met=totals["stuck"] == 0)
    yield ctx.figure(f"steps that stalled over {SLOW_STEP:.0f} s (a timeout waited out)", totals["slow"], "steps")
    yield ctx.figure("wall time per schedule", seconds / max(seeds, 1), "s")
    ctx.progress("documented errors seen: " + ", ".join(f"{k} {v}" for k, v in errors.most_common()))
    ctx.progress(f"{seeds} seeded schedules: {lost} lost, {wrong} wrong, {totals['unclean']} unclean errors, "
                 f"{totals['stuck']} stuck shards")
    for seed, store, violations, short in shortened:
        ctx.progress(f"FAILED seed {seed} ({store}): " + "; ".join(str(v) for v in violations[:5]))
        ctx.progress(f"  schedule ({len(short)} steps{', minimised' if a.chaos_minimise else ''}): "
                     + " | ".join(str(s) for s in short))
    if failures:
        raise AssertionError(f"{len(failures)} of {seeds} schedules broke a guarantee: seeds "
                             f"{sorted(f[0] for f in failures)}")
