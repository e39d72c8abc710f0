"""First failover of an *unflushed* shard, small against large: ``python -m benches failover`` (issue 14, case 7).

For each store (the file store, and moto's S3 server with 20 ms injected per request during
the failover) and each shard size (10,000 and 336,776 docs by default), a 3-node cluster
indexes the docs in bulks of 5,000 into 1 shard with 1 replica and never flushes, so the
replica retains the whole log locally.  Then the primary's node is killed and one 1-doc bulk
is acknowledged: that time (kill to first acknowledged write) is the figure, and the ratio of
the largest to the smallest size has the target <= 1.5.  Before the fix the promotion
uploaded the replica's whole retained translog under the new term inside ``kill_node``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benches.engine import INDEX, _Docs, acked_bulk
from benches.runner import Context, Figure

RATIO_TARGET = round(1 / 1.5, 3)  # the largest shard's first failover takes at most 1.5x the smallest's
LATENCY = 0.020
BULK = 5_000


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--failover-docs", default=None, help="comma-separated sizes (default 10000,336776; quick "
                                                              "2000,20000)")
    group.add_argument("--failover-stores", default="file,s3", help="file and/or s3 (moto, 20 ms per request)")


def _store(kind: str, base: Path, emulators: dict[str, Any]) -> Any:
    from shardstore.blobstores import open_store
    from shardstore.testing import FaultyStore

    if kind == "file":
        return FaultyStore(open_store(f"file://{base / 'remote'}"))
    from shardstore.testing.emulators import start_emulator

    if "s3" not in emulators:
        emulators["s3"] = start_emulator("s3")
    emu = emulators["s3"]
    bucket = f"failover-{int(time.time() * 1000) % 10**9}"
    emu.make_bucket(bucket)
    return FaultyStore(open_store(emu.store_url(bucket, "p"), **emu.store_options()))


def _one(ctx: Context, kind: str, n: int, base: Path, docs: _Docs, emulators: dict[str, Any]) -> tuple[float, float]:
    """(kill_node seconds, kill to first acknowledged write seconds) for one unflushed shard of ``n`` docs."""
    from shardstore.engine import Cluster

    store = _store(kind, base, emulators)
    cluster = Cluster(store=store, data_dir=str(base / "nodes"), nodes=3, recovery_delay=30.0)
    try:
        cluster.create_index(INDEX, shards=1, replicas=1)
        t0 = last = time.perf_counter()
        for done in range(0, n, BULK):
            acked_bulk(cluster, docs.table(min(BULK, n - done)))
            if time.perf_counter() - last > 3:
                last = time.perf_counter()
                ctx.progress(f"{kind}: building {n:,} unflushed docs: {done + BULK:,} in {last - t0:.1f}s")
        if kind == "s3":
            store.inject(op="*", key="*", action="delay", delay=LATENCY, times=None)
        one = docs.table(1)
        k0 = time.perf_counter()
        cluster.kill_node(cluster.primary_of(INDEX, 0))
        k1 = time.perf_counter()
        acked_bulk(cluster, one)
        k2 = time.perf_counter()
        store.clear()
        return k1 - k0, k2 - k0
    finally:
        cluster.close()


def run(ctx: Context) -> Iterator[Figure]:
    """Failover figures per store and size, and the large/small ratio per store."""
    a = ctx.args
    sizes = [int(x) for x in (a.failover_docs or ("2000,20000" if ctx.quick else "10000,336776")).split(",")]
    kinds = [k.strip() for k in a.failover_stores.split(",") if k.strip()]
    docs = _Docs()
    emulators: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="shardstore-bench-failover-"))
    try:
        for kind in kinds:
            totals = {}
            for n in sizes:
                work = base / f"{kind}-{n}"
                kill_s, total_s = _one(ctx, kind, n, work, docs, emulators)
                shutil.rmtree(work, ignore_errors=True)
                totals[n] = total_s
                ctx.progress(f"{kind} {n:,} unflushed docs: kill_node {kill_s:.3f}s, to first acked write {total_s:.3f}s")
                latency = f"{LATENCY * 1000:g} ms/request" if kind == "s3" else "none"
                yield ctx.figure("first_failover_seconds", total_s, "s", store=kind, shard_docs=n, latency=latency,
                                 kill_node_s=round(kill_s, 3), how="kill_node(primary) + first acked 1-doc bulk")
            lo, hi = min(sizes), max(sizes)
            ratio = totals[lo] / totals[hi]  # higher is better, as every ratio: 1.0 is flat in the shard size
            yield ctx.figure("first_failover_ratio", ratio, "ratio", target=f">= {RATIO_TARGET:g}",
                             met=ratio >= RATIO_TARGET, store=kind, impl=f"{lo}/{hi} docs")
    finally:
        for emu in emulators.values():
            emu.stop()
        shutil.rmtree(base, ignore_errors=True)
