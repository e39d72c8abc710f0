"""Engine: ingest through a 3-node cluster, failover time by shard size, recovery from the store.

Documents: the segments bench's generator (``benches.segments._Docs``): random 19-digit
ids and five typed fields (``title`` keyword of 12 words, ``status`` keyword, ``count``
long, ``score`` double, ``ts`` date), about 200 bytes of JSON ``_source`` each.  Tables
(``pa.Table`` with ``_id``) are built before the clocks; ``Cluster.bulk`` turning them
into sources is part of what is measured, as it is part of a client's bulk.

1. **Ingest** (``ingest_ops_per_s``, ``bulk_p50_ms``, ``bulk_p99_ms``, ``puts_per_1k_ops``):
   a fresh ``Cluster(nodes=3)`` per cell, an index with 1 replica and ``request``
   durability, 1 shard and 2 shards; INGEST_DOCS documents in bulks of 1,000 (after one
   warm-up bulk), one bulk after the other from one thread.  Every item must be
   acknowledged.  PUTs (and LISTs, GETs) are the deltas of ``cluster.store.metrics()``
   over the timed bulks.  Backends: ``--engine-remote-backends`` (``file``: a local
   store in a temp directory; ``s3``: moto through ``shardstore.testing.emulators``);
   default file.
2. **Failover** (``failover_seconds`` and its parts): per shard size, a fresh 3-node
   cluster on a local file store, 1 shard, 1 replica, ``request`` durability; the
   documents are indexed in bulks of BUILD_BULK (refreshed after each bulk, flushed at
   the end: not measured).  Then FAILOVER_REPS times: ``kill_node(primary)`` (the
   promotion of the replica happens inside it; the rebuild of a new replica by peer
   recovery and the new primary's re-upload of its segments under the new term run in
   the background) then a one-document ``bulk`` until it is acknowledged;
   ``failover_seconds`` is kill + that write, median over the reps.  The promotion is
   timed by wrapping ``ShardCopy.promote``; ``replica_rebuild_seconds`` (node death to
   green) and ``reupload_seconds`` (node death to the re-upload's end) are the
   background work, waited for before the next rep.  The killed node is restarted between reps (nothing is allocated to it: the
   shard has its two copies again).  ``failover_ratio`` = smallest size / largest size
   of the median (higher is better, as every ratio); target (issue 5): >= 0.5, i.e. flat in the shard size.
3. **Recovery from the store** (``restore_seconds``, ``raw_download_seconds``,
   ``restore_ratio``): after the failovers of the biggest shard the cluster is closed
   (not flushed again: the newest commit is the one of the build, the translog above it
   holds the one-document writes) and ``Cluster.restore(store, fresh_dir, nodes=1)``
   is timed, then checked (refresh + count, not timed).  The raw side lists every blob
   under the cluster's prefix and ``store.get``s each into a file of a temp dir
   (written and fsynced, the directory fsynced once at the end), from one thread, as
   ``restore`` downloads one file after the other.  Both use a fresh store object;
   ``bytes`` is each side's ``bytes_in``.  Ratio = raw / restore seconds (> 1: restore
   faster; every ratio reads higher-is-better); no target.

Sizes: ingest 100,000 documents per cell (quick 5,000); failover shards of 10k, 100k
and 1M documents (quick 10k and 50k), 3 reps (quick 2); ``--engine-failover-docs``
changes the sizes.  Temp files go to ``SHARDSTORE_BENCH_DIR`` (default: the temp
directory).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from benches.runner import Context, Figure, run_cleanups

REMOTE_BACKENDS = ("file", "s3")
FAILOVER_RATIO_TARGET = 0.5  # the largest shard fails over in at most twice the smallest's time
BULK = 1_000
INDEX = "bench"


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of one run."""

    ingest_docs: int
    failover_docs: tuple[int, ...]
    build_bulk: int
    failover_reps: int
    restore_rounds: int


FULL = Plan(ingest_docs=100_000, failover_docs=(10_000, 100_000, 1_000_000), build_bulk=100_000, failover_reps=3,
            restore_rounds=3)
QUICK = Plan(ingest_docs=5_000, failover_docs=(10_000, 50_000), build_bulk=25_000, failover_reps=2,
             restore_rounds=2)


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--engine-remote-backends", default=None,
                       help=f"comma-separated subset of {','.join(REMOTE_BACKENDS)} for the ingest figures "
                            "(default file)")
    group.add_argument("--engine-failover-docs", default=None,
                       help="comma-separated shard sizes of the failover figures (default 10000,100000,1000000; "
                            "quick 10000,50000); the biggest is also restored")
    group.add_argument("--engine-ingest-docs", type=int, default=None,
                       help="documents per ingest cell (default 100,000, quick 5,000)")


# -- helpers ------------------------------------------------------------------------------------


class _Docs:
    """Bulk tables (``_id`` + five typed fields) from the segments bench's generator."""

    def __init__(self) -> None:
        from benches.segments import _Docs as SegmentDocs

        self._g = SegmentDocs(seed=0xE46)

    def table(self, n: int) -> Any:
        f = self._g.fields(n)
        return f.add_column(0, "_id", self._g.id_strings(self._g.new_ids(n)))


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _rounds(xs: list[float]) -> str:
    return "/".join(f"{x:.3f}" for x in xs)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _source_bytes(table: Any) -> float:
    """Mean JSON ``_source`` bytes per document of ``table`` (as ``Cluster.bulk`` builds them)."""
    import pyarrow.compute as pc

    from shardstore.segments.mapping import sources_from_table

    _ids, src = sources_from_table(table)
    return pc.mean(pc.binary_length(src)).as_py()


class _Timer:
    """Accumulates the time spent in wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
        return timed


@contextmanager
def _failover_split() -> Iterator[_Timer]:
    """Time ``ShardCopy.promote`` (this process only)."""
    from shardstore.engine.shard.shard_copy import ShardCopy

    promote = _Timer()
    orig_promote = ShardCopy.promote
    ShardCopy.promote = promote.wrap(orig_promote)  # type: ignore[method-assign]
    try:
        yield promote
    finally:
        ShardCopy.promote = orig_promote  # type: ignore[method-assign]


def _remote_kinds(ctx: Context) -> list[str]:
    text = getattr(ctx.args, "engine_remote_backends", None)
    if text is None:
        return ["file"]
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in REMOTE_BACKENDS]
    if bad or not names:
        raise ValueError(f"unknown remote backend(s) {bad}; known: {', '.join(REMOTE_BACKENDS)}")
    return names


def _failover_sizes(ctx: Context, plan: Plan) -> list[int]:
    text = getattr(ctx.args, "engine_failover_docs", None)
    if text is None:
        return list(plan.failover_docs)
    sizes = sorted({int(x.replace("_", "")) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--engine-failover-docs needs positive sizes, got {text!r}")
    return sizes


class _Stores:
    """Where clusters keep their blobs: a fresh store URL (+ options) per cluster, per backend kind."""

    def __init__(self, base: str, ctx: Context, cleanups: list[Callable[[], Any]]) -> None:
        self.base, self.ctx, self.cleanups = base, ctx, cleanups
        self._emu: dict[str, Any] = {}
        self._buckets: dict[str, str] = {}

    def fresh(self, kind: str) -> tuple[str, dict[str, Any]]:
        if kind == "file":
            d = tempfile.mkdtemp(prefix="store-", dir=self.base)
            return f"file://{d}/ss", {}
        if kind not in self._emu:
            from shardstore.testing.emulators import start_emulator

            self.ctx.progress(f"{kind}: starting emulator")
            t0 = time.monotonic()
            emu = start_emulator(kind)
            self.cleanups.append(emu.stop)
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            emu.make_bucket(bucket)
            self._emu[kind], self._buckets[kind] = emu, bucket
            self.ctx.progress(f"{kind}: emulator up at {emu.endpoint} in {time.monotonic() - t0:.1f}s")
        emu = self._emu[kind]
        return emu.store_url(self._buckets[kind], f"ss-{uuid.uuid4().hex[:8]}"), emu.store_options()


def _new_cluster(base: str, url: str, options: dict[str, Any], cleanups: list[Callable[[], Any]]) -> Any:
    from shardstore.engine.cluster import Cluster

    data = tempfile.mkdtemp(prefix="nodes-", dir=base)
    cleanups.append(lambda: shutil.rmtree(data, ignore_errors=True))
    cluster = Cluster(store=url, data_dir=data, nodes=3, **options)
    cleanups.append(cluster.close)
    cleanups.append(cluster.store.close)
    return cluster


def acked_bulk(cluster: Any, table: Any, attempts: int = 5, index: str = INDEX) -> int:
    """Bulk ``table`` into ``index`` (a Cluster or a Client), retrying unacknowledged items; the attempts it took."""
    import pyarrow.compute as pc

    for attempt in range(1, attempts + 1):
        res = cluster.bulk(index, table)
        if not res.errors:
            return attempt
        failed = pc.is_valid(res.items.column("error"))
        ids = res.items.filter(failed).column("_id").combine_chunks()
        table = table.filter(pc.is_in(table.column("_id"), value_set=ids))
    raise RuntimeError(f"items not acknowledged after {attempts} attempts: {res.items.filter(failed).to_pylist()[:3]}")


# -- 1. ingest ----------------------------------------------------------------------------------


def _ingest(ctx: Context, base: str, docs: _Docs, kinds: list[str], n_docs: int, stores: _Stores,
            cleanups: list[Callable[[], Any]]) -> Iterator[Figure]:
    n_bulks = max(1, n_docs // BULK)
    tables = [docs.table(BULK) for _ in range(n_bulks + 1)]  # + the warm-up bulk
    src = _source_bytes(tables[0])
    ctx.progress(f"ingest: {n_bulks} bulks of {BULK} docs per cell, ~{src:.0f} bytes of JSON per doc")
    for kind in kinds:
        for shards in (1, 2):
            url, options = stores.fresh(kind)
            cluster = _new_cluster(base, url, options, cleanups)
            cluster.create_index(INDEX, shards=shards, replicas=1, durability="request")
            acked_bulk(cluster, tables[0])  # warm-up: first translog uploads, term markers
            m0 = cluster.store.metrics()["requests"]
            lat: list[float] = []
            retries = 0
            last = t0 = time.perf_counter()
            for i, t in enumerate(tables[1:], 1):
                b0 = time.perf_counter()
                retries += acked_bulk(cluster, t) - 1
                b1 = time.perf_counter()
                lat.append(b1 - b0)
                if b1 - last >= 3:
                    last = b1
                    ctx.progress(f"ingest {kind} shards={shards}: {i}/{n_bulks} bulks, "
                                 f"{i * BULK / (b1 - t0):,.0f} ops/s")
            dt = time.perf_counter() - t0
            m1 = cluster.store.metrics()["requests"]
            ops = n_bulks * BULK
            per_k = {k: 1000 * (m1[k] - m0[k]) / ops for k in ("put", "list", "get", "delete") if k in m1}
            common = {"backend": kind, "shards": shards, "replicas": 1, "durability": "request", "bulk": BULK}
            rate = ops / dt
            ctx.progress(f"ingest {kind} shards={shards}: {rate:,.0f} ops/s, bulk p50 "
                         f"{1000 * statistics.median(lat):.0f} ms, PUTs/1k ops {per_k['put']:.2f}, "
                         f"LISTs/1k ops {per_k['list']:.2f}")
            yield ctx.figure("ingest_ops_per_s", rate, "ops/s", **common, docs=ops,
                             doc_bytes=round(src), seconds=round(dt, 2), retried_bulks=retries)
            yield ctx.figure("bulk_p50_ms", 1000 * statistics.median(lat), "ms", **common)
            yield ctx.figure("bulk_p99_ms", 1000 * _pct(lat, 0.99), "ms", **common)
            yield ctx.figure("puts_per_1k_ops", per_k["put"], "PUT", **common,
                             **{f"{k}s_per_1k_ops": round(v, 2) for k, v in per_k.items() if k != "put"})
            cluster.close()
            cluster.store.close()


# -- 2. failover --------------------------------------------------------------------------------


def _build(ctx: Context, cluster: Any, docs: _Docs, n: int, bulk: int) -> float:
    """Index ``n`` docs in bulks of ``bulk`` (refresh after each), then flush; returns the seconds."""
    t0 = last = time.perf_counter()
    done = 0
    while done < n:
        k = min(bulk, n - done)
        acked_bulk(cluster, docs.table(k))
        cluster.refresh(INDEX)
        done += k
        now = time.perf_counter()
        if now - last >= 3:
            last = now
            ctx.progress(f"failover: building {n:,} docs: {done:,} indexed in {now - t0:.1f}s")
    cluster.flush(INDEX)
    return time.perf_counter() - t0


def _failover(ctx: Context, base: str, docs: _Docs, sizes: list[int], reps: int, build_bulk: int,
              stores: _Stores, cleanups: list[Callable[[], Any]]) -> Iterator[Figure | dict[str, Any]]:
    """Failover figures per size; last, a dict describing the biggest shard's store (for the restore)."""
    medians: dict[int, float] = {}
    kept: dict[str, Any] = {}
    for n in sizes:
        url, options = stores.fresh("file")
        cluster = _new_cluster(base, url, options, cleanups)
        cluster.create_index(INDEX, shards=1, replicas=1, durability="request")
        ctx.progress(f"failover: building a shard of {n:,} docs (bulks of {min(build_bulk, n):,})")
        build_s = _build(ctx, cluster, docs, n, build_bulk)
        total, kill, write, promote_s, recover_s, attempts = [], [], [], [], [], []
        reupload_s: list[float] = []
        flush_s: list[float] = []
        flush_bytes: list[int] = []
        shard_bytes = _shard_bytes(cluster)
        for rep in range(reps):
            victim = cluster.primary_of(INDEX, 0)
            one = docs.table(1)
            os.sync()  # the build's dirty pages are written back before the kill, not during the failover
            with _failover_split() as promote:
                t0 = time.perf_counter()
                cluster.kill_node(victim)
                t1 = time.perf_counter()
                attempts.append(acked_bulk(cluster, one))
                t2 = time.perf_counter()
            cluster.wait_for_health("green", timeout=600)  # the replica rebuild runs in the background
            t3 = time.perf_counter()
            new_primary = cluster.primary_copy(INDEX, 0)
            new_primary.wait_background_upload(timeout=600)  # the full re-upload under the new term, too
            t4 = time.perf_counter()
            total.append(t2 - t0)
            kill.append(t1 - t0)
            write.append(t2 - t1)
            promote_s.append(promote.seconds)
            recover_s.append(t3 - t0)
            reupload_s.append(t4 - t0)
            ctx.progress(f"failover {n:,} docs rep {rep + 1}/{reps}: {victim} killed -> "
                         f"{cluster.primary_of(INDEX, 0)}: kill_node {t1 - t0:.3f}s (promote {promote.seconds:.3f}s), "
                         f"first write {t2 - t1:.3f}s; in the background: green after {t3 - t0:.3f}s, "
                         f"re-upload done after {t4 - t0:.3f}s")
            cluster.start_node(victim)
            # Flush on the new primary before the next kill: without it the third failover (peer recovery)
            # and a restore after two failovers fail on translog batches mixing terms (see the README).
            m0 = cluster.store.metrics()
            f0 = time.perf_counter()
            cluster.flush(INDEX)
            flush_s.append(time.perf_counter() - f0)
            flush_bytes.append(cluster.store.metrics()["bytes_out"] - m0["bytes_out"])
        cluster.refresh(INDEX)
        count = cluster.count(INDEX)
        expected = n + reps
        if count != expected:
            raise RuntimeError(f"failover {n}: count {count} after the failovers, expected {expected}")
        common = {"shard_docs": n, "replicas": 1, "durability": "request", "backend": "file", "reps": reps}
        med = statistics.median(total)
        medians[n] = med
        yield ctx.figure("failover_seconds", med, "s", **common, rounds=_rounds(total),
                         build_seconds=round(build_s, 1), write_attempts=max(attempts),
                         how="kill_node(primary) + first acknowledged 1-doc bulk")
        yield ctx.figure("failover_kill_seconds", statistics.median(kill), "s", **common, part="kill_node")
        yield ctx.figure("failover_promote_seconds", statistics.median(promote_s), "s", **common,
                         part="kill_node: ShardCopy.promote")
        yield ctx.figure("replica_rebuild_seconds", statistics.median(recover_s), "s", **common,
                         part="background: node death to green (peer recovery of a new replica)")
        yield ctx.figure("reupload_seconds", statistics.median(reupload_s), "s", **common,
                         part="background: node death to the new primary's segments uploaded under its term")
        yield ctx.figure("failover_first_write_seconds", statistics.median(write), "s", **common,
                         part="first 1-doc bulk on the new primary")
        yield ctx.figure("post_failover_flush_seconds", statistics.median(flush_s), "s", **common,
                         rounds=_rounds(flush_s), part="first flush of the new primary")
        yield ctx.figure("post_failover_flush_mb", statistics.median(flush_bytes) / 1e6, "MB", **common,
                         shard_mb=round(shard_bytes / 1e6, 2), vs_shard=round(statistics.median(flush_bytes)
                                                                                / max(1, shard_bytes), 2),
                         part="bytes_out of that flush")
        if n == sizes[-1]:
            kept = {"url": url, "options": options, "cluster_uuid": cluster.cluster_uuid, "docs": expected,
                    "shard_bytes": _shard_bytes(cluster), "term": cluster.index_meta(INDEX).routing[0].primary_term}
        cluster.close()
        cluster.store.close()
    lo, hi = sizes[0], sizes[-1]
    if hi != lo:
        ratio = medians[lo] / medians[hi]  # higher is better, as every ratio: 1.0 is flat in the shard size
        ctx.progress(f"failover: {hi:,} docs {medians[hi]:.3f}s vs {lo:,} docs {medians[lo]:.3f}s: ratio {ratio:.2f}")
        yield ctx.figure("failover_ratio", ratio, "ratio", target=f">= {FAILOVER_RATIO_TARGET:g}",
                         met=ratio >= FAILOVER_RATIO_TARGET, impl=f"{lo}/{hi} docs",
                         largest_s=round(medians[hi], 3), smallest_s=round(medians[lo], 3))
    yield kept


def _shard_bytes(cluster: Any) -> int:
    meta = cluster.index_meta(INDEX)
    commit = cluster.primary_copy(INDEX, 0).directory.last_commit
    return sum(size for size, _ in commit.files().values()) if commit is not None and meta else 0


# -- 3. recovery from the store -----------------------------------------------------------------


def _recovery(ctx: Context, base: str, kept: dict[str, Any], rounds: int,
              cleanups: list[Callable[[], Any]]) -> Iterator[Figure]:
    from shardstore.blobstores.open import open_store
    from shardstore.engine.cluster import Cluster

    url, options, cluster_uuid = kept["url"], kept["options"], kept["cluster_uuid"]
    common = {"shard_docs": kept["docs"], "backend": "file", "threads": 1}
    prefix = f"{cluster_uuid}/{kept['term']}/"  # the newest commit's files and its term's translog

    def restore() -> tuple[float, dict[str, Any]]:
        store = open_store(url, **options)
        data = tempfile.mkdtemp(prefix="restored-", dir=base)
        try:
            t0 = time.perf_counter()
            restored = Cluster.restore(store, data, nodes=1)
            dt = time.perf_counter() - t0
            try:
                m = store.metrics()
                restored.refresh(INDEX)
                count = restored.count(INDEX)
            finally:
                restored.close()
            if count != kept["docs"]:
                raise RuntimeError(f"restore: count {count}, expected {kept['docs']}")
            return dt, m
        finally:
            store.close()
            shutil.rmtree(data, ignore_errors=True)

    def raw() -> tuple[float, dict[str, Any]]:
        store = open_store(url, **options)
        out = tempfile.mkdtemp(prefix="raw-download-", dir=base)
        try:
            t0 = time.perf_counter()
            for i, info in enumerate(store.list(prefix)):
                data = store.get(info.key)
                with open(os.path.join(out, f"{i:06d}"), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            _fsync_dir(out)
            return time.perf_counter() - t0, store.metrics()
        finally:
            store.close()
            shutil.rmtree(out, ignore_errors=True)

    lister = open_store(url, **options)
    cleanups.append(lister.close)
    all_blobs = list(lister.list(f"{cluster_uuid}/"))
    ctx.progress(f"restore: Cluster.restore of {kept['docs']:,} docs vs a raw download of {prefix}, "
                 f"{rounds} rounds")
    times: dict[str, list[float]] = {"restore": [], "raw": []}
    metrics: dict[str, dict[str, Any]] = {}
    sides = {"restore": restore, "raw": raw}
    for rep in range(rounds):
        for side in (("restore", "raw") if rep % 2 == 0 else ("raw", "restore")):
            dt, metrics[side] = sides[side]()
            times[side].append(dt)
        ctx.progress(f"restore round {rep + 1}/{rounds}: restore {times['restore'][-1]:.2f}s "
                     f"({metrics['restore']['bytes_in'] / 1e6:.1f} MB), raw {times['raw'][-1]:.2f}s "
                     f"({metrics['raw']['bytes_in'] / 1e6:.1f} MB)")
    m, rm = metrics["restore"], metrics["raw"]
    restore_s, raw_s = statistics.median(times["restore"]), statistics.median(times["raw"])
    yield ctx.figure("restore_seconds", restore_s, "s", **common, impl="Cluster.restore(nodes=1)",
                     rounds=_rounds(times["restore"]), bytes=m["bytes_in"], gets=m["requests"]["get"],
                     lists=m["requests"]["list"], shard_bytes=kept["shard_bytes"])
    yield ctx.figure("raw_download_seconds", raw_s, "s", **common, impl="list + get each blob to a file",
                     rounds=_rounds(times["raw"]), prefix=f"<cluster>/{kept['term']}/", bytes=rm["bytes_in"],
                     gets=rm["requests"]["get"], cluster_prefix_blobs=len(all_blobs),
                     cluster_prefix_bytes=sum(b.size for b in all_blobs))
    yield ctx.figure("restore_mb_per_s", m["bytes_in"] / 1e6 / restore_s, "MB/s", **common, impl="restore")
    yield ctx.figure("raw_download_mb_per_s", rm["bytes_in"] / 1e6 / raw_s, "MB/s", **common, impl="raw")
    per_round = [b / a for a, b in zip(times["restore"], times["raw"])]  # higher is better: > 1, restore is faster
    yield ctx.figure("restore_ratio", statistics.median(per_round), "ratio", **common, impl="raw/restore seconds",
                     rounds=_rounds(per_round))


def run(ctx: Context) -> Iterator[Figure]:
    """Ingest per backend and shard count, failover per shard size, then restore of the biggest shard."""
    plan = QUICK if ctx.quick else FULL
    kinds = _remote_kinds(ctx)  # a bad name fails before anything is measured
    sizes = _failover_sizes(ctx, plan)
    n_ingest = getattr(ctx.args, "engine_ingest_docs", None) or plan.ingest_docs
    base = tempfile.mkdtemp(prefix="shardstore-bench-engine-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    try:
        docs = _Docs()
        ctx.progress(f"files in {base}")
        stores = _Stores(base, ctx, cleanups)
        yield from _ingest(ctx, base, docs, kinds, n_ingest, stores, cleanups)
        kept: dict[str, Any] = {}
        for item in _failover(ctx, base, docs, sizes, plan.failover_reps, plan.build_bulk, stores, cleanups):
            if isinstance(item, Figure):
                yield item
            else:
                kept = item
        yield from _recovery(ctx, base, kept, plan.restore_rounds, cleanups)
    finally:
        run_cleanups(cleanups, "[engine] cleanup")
