"""Object-store requests and threads as shards grow: ``python -m benches cost`` (issue 30).

Each cell opens a fresh embedded ``Cluster`` on its own store (the local file store, and
moto S3 with ``--cost-stores file,s3``) and counts the store's own requests
(``store.metrics()``) around one piece of work.  All bulks are of small documents with
random ids at ``request`` durability; every index has 0 replicas unless said.

1. ``bulk_requests`` (``shards`` 1 / 10 / 100): requests of one bulk of 1,000 documents
   spread over every shard of a 1-node index (target: <= 3 PUT and <= 1 LIST whatever the
   shard count), and ``bulk_seconds`` for it.  ``bulk_puts_per_node``: the same bulk over
   100 shards on 3 nodes with 1 replica, PUTs per node (target <= 3).
2. ``concurrent_puts_per_bulk``: 4 client threads each sending bulks of 1,000 into one
   shard; PUTs per bulk (target < 1: the uploads are shared).
3. ``flush_requests`` (``changed`` 0 / 1 of 100 shards): the requests of a flush of a
   100-shard index after a bulk into none / one of its shards (target: <= 5 with one changed;
   0 with none), after two settling flushes.
4. ``shard_docs_per_s``: a 100-shard index, bulks of 1,000 from one thread, docs/s (target
   >= 20k on the file store).
5. ``threads`` (``shards`` 100 / 1,000; 5,000 as five indices of 1,000): threads of this process once the index is created,
   written to once and idle for the uploader threads' idle time (``just_after_a_bulk_over_all``:
   right after the bulk); target <= 64 at 5,000 shards, which ``--cost-big`` measures.
   ``fds_per_copy``: open files per shard copy then (its lock; the translog file is released
   when idle).

6. ``node_translog_streams``, ``node_translog_bytes``: a 3-node index of 2 shards with 1 replica,
   10 cycles (quick: 4) of 20 bulks of 200 then a SIGKILL of a primary's node and its restart,
   then one flush and a bulk and a second flush: the node-translog streams and bytes left in the store once the
   manager's collection of dead streams ran after each (target after the second: no more streams
   than live data nodes; after the first, a dead stream keeps what the restore's fallback commit
   needs, as a live one does: docs/design/translog.md, "Collecting dead streams").

Sizes: 10 bulks per cell (quick: 3).  Temp files go to ``SHARDSTORE_BENCH_DIR``.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from benches.runner import Context, Figure, run_cleanups

BULK = 1_000


#: shards per index when a cell needs more than one index holds (MAX_SHARDS is 1,024)
MAX_PER_INDEX = 1_000


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--cost-stores", default="file", help="stores to measure on: file, s3 (default file)")
    group.add_argument("--cost-big", action="store_true", help="also count threads at 5,000 shards")


def _docs(n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"_id": uuid.UUID(int=rng.getrandbits(128)).hex, "n": k, "s": "x" * 20} for k in range(n)]


def _requests(cluster: Any) -> dict[str, int]:
    return dict(cluster.store.metrics()["requests"])


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0)}


class _Stores:
    """A fresh store URL (and options) per cell on each store kind; emulators started once."""

    def __init__(self, base: str, cleanups: list[Callable[[], Any]]) -> None:
        self.base, self.cleanups = base, cleanups
        self._emu: Any = None
        self._bucket = f"cost-{uuid.uuid4().hex[:8]}"

    def url(self, kind: str) -> tuple[str, dict[str, Any]]:
        if kind == "file":
            return f"file://{self.base}/store-{uuid.uuid4().hex[:8]}?create=true", {}
        if kind != "s3":
            raise ValueError(f"--cost-stores: unknown store {kind!r} (file, s3)")
        if self._emu is None:
            from shardstore.testing.emulators import start_emulator

            self._emu = start_emulator("s3")
            self.cleanups.append(self._emu.stop)
            self._emu.make_bucket(self._bucket)
        return self._emu.store_url(self._bucket, f"ss-{uuid.uuid4().hex[:8]}"), self._emu.store_options()


def _dead_streams(ctx: Context, stores: _Stores, base: str, rng: random.Random, cycles: int) -> Iterator[Figure]:
    """Node-translog bytes and streams in the store after ``cycles`` SIGKILL-and-restart cycles of a primary's
    node, then a flush: before and after the manager's collection of dead streams (issue 46)."""
    from shardstore.engine import Cluster
    from shardstore.engine.manager.translog_gc import list_streams

    url, options = stores.url("file")
    c = Cluster(store=url, data_dir=os.path.join(base, f"data-{uuid.uuid4().hex[:8]}"), nodes=3, recovery_delay=0.05,
                translog_gc_grace=0.0, **options)
    try:
        c.create_index("i", shards=2, replicas=1)
        c.wait_for_health("green", timeout=60)

        def streams() -> tuple[int, int]:
            listing = list_streams(c.store, c.index_meta("i").data_cluster_uuid)
            return len(listing.rounds), listing.total_bytes

        for cycle in range(cycles):
            for _ in range(20):
                assert not c.bulk("i", _docs(200, rng)).errors
            victim = c.primary_of("i", cycle % 2)
            c.kill_node(victim)
            c.start_node(victim)
            c.wait_for_health("green", timeout=60)
            n, size = streams()
            ctx.progress(f"cycle {cycle + 1}/{cycles}: {n} streams, {size:,} bytes of node translog")
        before = streams()
        live = len(c.live_nodes())
        ctx.progress(f"after {cycles} kill-and-restart cycles: {before[0]} streams, {before[1]:,} bytes ({live} live "
                     "data nodes)")
        for flushes in (1, 2):
            manager = c.manager()
            passes = manager.translog_gc.passes if manager is not None else 0
            if flushes == 2:
                assert not c.bulk("i", _docs(200, rng)).errors  # a flush of an unchanged shard commits nothing
            c.flush("i")  # asks the manager for a collection pass
            deadline = time.monotonic() + 30
            while manager is not None and manager.translog_gc.passes == passes and time.monotonic() < deadline:
                time.sleep(0.05)
            if manager is not None:
                manager.translog_gc.run_once()  # the pass the flush asked for may have started before its commit
            after = streams()
            yield ctx.figure("node_translog_streams", after[0], "streams",
                             target=f"<= {live} (one per live data node)" if flushes == 2 else None,
                             met=after[0] <= live if flushes == 2 else None, store="file", cycles=cycles,
                             flushes=flushes, before=before[0])
            yield ctx.figure("node_translog_bytes", after[1], "bytes", store="file", cycles=cycles, flushes=flushes,
                             before=before[1])
            ctx.progress(f"after {flushes} flush(es) and the collection: {after[0]} streams, {after[1]:,} bytes")
    finally:
        c.close()


def run(ctx: Context) -> Iterator[Figure]:
    """The cells above, per store kind."""
    import pyarrow as pa

    from shardstore.engine import Cluster
    from shardstore.engine.coordinator.routing import shard_ids
    from shardstore.engine.node.file_budget import open_files
    from shardstore.translog.remote import UPLOADER_IDLE_SECONDS

    bulks = 3 if ctx.quick else 10
    kinds = [k.strip() for k in str(getattr(ctx.args, "cost_stores", "file") or "file").split(",") if k.strip()]
    base = tempfile.mkdtemp(prefix="shardstore-bench-cost-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    stores = _Stores(base, cleanups)
    rng = random.Random(30)

    def cluster(kind: str, shards: int, replicas: int = 0, nodes: int = 1) -> Any:
        url, options = stores.url(kind)
        c = Cluster(store=url, data_dir=os.path.join(base, f"data-{uuid.uuid4().hex[:8]}"), nodes=nodes, **options)
        c.create_index("i", shards=min(shards, MAX_PER_INDEX), replicas=replicas, durability="request")
        assert not c.bulk("i", _docs(BULK, rng)).errors  # the mapping committed, every shard written once
        for extra in range(1, -(-shards // MAX_PER_INDEX)):  # an index holds at most 1,024 shards: more indices
            c.create_index(f"i{extra}", shards=min(MAX_PER_INDEX, shards - extra * MAX_PER_INDEX), replicas=replicas,
                           durability="request")
            assert not c.bulk(f"i{extra}", _docs(BULK, rng)).errors
        return c

    try:
        for kind in kinds:
            # 1. one bulk over 1 / 10 / 100 shards
            for shards in (1, 10, 100):
                c = cluster(kind, shards)
                try:
                    per: list[dict[str, int]] = []
                    secs: list[float] = []
                    for _ in range(bulks):
                        docs = _docs(BULK, rng)
                        m0, t0 = _requests(c), time.perf_counter()
                        assert not c.bulk("i", docs).errors
                        secs.append(time.perf_counter() - t0)
                        per.append(_delta(m0, _requests(c)))
                    puts = statistics.median(p.get("put", 0) for p in per)
                    lists = statistics.median(p.get("list", 0) for p in per)
                    total = statistics.median(sum(p.values()) for p in per)
                    yield ctx.figure("bulk_requests", total, "requests", target="<= 3 PUT, <= 1 LIST",
                                     met=puts <= 3 and lists <= 1, store=kind, shards=shards, bulk=BULK,
                                     puts=puts, lists=lists)
                    yield ctx.figure("bulk_seconds", statistics.median(secs), "s", store=kind, shards=shards, bulk=BULK)
                    ctx.progress(f"{kind}: a bulk of {BULK} over {shards} shards: {total:.0f} requests ({puts:.0f} "
                                 f"PUT, {lists:.0f} LIST), {statistics.median(secs):.3f}s")
                    if shards == 100:
                        t0 = time.perf_counter()
                        n = 0
                        for _ in range(bulks):
                            assert not c.bulk("i", _docs(BULK, rng)).errors
                            n += BULK
                        rate = n / (time.perf_counter() - t0)
                        yield ctx.figure("shard_docs_per_s", rate, "docs/s", target=">= 20000" if kind == "file" else None,
                                         met=rate >= 20_000 if kind == "file" else None, store=kind, shards=shards,
                                         bulk=BULK)
                        # 3. flushes of 100 shards, none / one changed
                        c.flush("i")
                        c.flush("i")
                        for changed in (0, 1):
                            if changed:
                                docs = _docs(400, rng)
                                routed = shard_ids(pa.array([d["_id"] for d in docs], pa.string()), shards).to_pylist()
                                assert not c.bulk("i", [d for d, s in zip(docs, routed) if s == 0]).errors
                            m0 = _requests(c)
                            c.flush("i")
                            d = _delta(m0, _requests(c))
                            yield ctx.figure("flush_requests", sum(d.values()), "requests",
                                             target="== 0" if not changed else "<= 5",
                                             met=sum(d.values()) <= (0 if not changed else 5), store=kind,
                                             shards=shards, changed=changed, **{f"{k}s": v for k, v in sorted(d.items())})
                            ctx.progress(f"{kind}: a flush of {shards} shards, {changed} changed: {d}")
                finally:
                    c.close()
            # 1b. the same over 3 nodes with 1 replica: PUTs per node (every node holds primaries)
            c = cluster(kind, 100, replicas=1, nodes=3)
            try:
                per = []
                for _ in range(bulks):
                    m0 = _requests(c)
                    assert not c.bulk("i", _docs(BULK, rng)).errors
                    per.append(_delta(m0, _requests(c)))
                puts = statistics.median(p.get("put", 0) for p in per) / 3
                lists = statistics.median(p.get("list", 0) for p in per) / 3
                yield ctx.figure("bulk_puts_per_node", puts, "PUT", target="<= 3", met=puts <= 3, store=kind,
                                 shards=100, nodes=3, replicas=1, bulk=BULK, lists_per_node=lists)
                ctx.progress(f"{kind}: a bulk of {BULK} over 100 shards, 3 nodes, 1 replica: {puts:.1f} PUT and "
                             f"{lists:.1f} LIST per node")
            finally:
                c.close()
            # 2. four clients on one shard
            c = cluster(kind, 1)
            try:
                m0 = _requests(c)
                errors: list[BaseException] = []

                def client() -> None:
                    try:
                        local = random.Random()
                        for _ in range(bulks):
                            assert not c.bulk("i", _docs(BULK, local)).errors
                    except BaseException as exc:  # noqa: BLE001 - reported below
                        errors.append(exc)

                threads = [threading.Thread(target=client) for _ in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise errors[0]
                d = _delta(m0, _requests(c))
                per_bulk = d.get("put", 0) / (4 * bulks)
                yield ctx.figure("concurrent_puts_per_bulk", per_bulk, "PUT", target="< 1", met=per_bulk < 1,
                                 store=kind, clients=4, shards=1, bulk=BULK)
                ctx.progress(f"{kind}: 4 clients on one shard: {per_bulk:.2f} PUT per bulk")
            finally:
                c.close()
        # 6. the streams of killed processes after 10 kill-and-restart cycles plus a flush (file store)
        yield from _dead_streams(ctx, stores, base, rng, cycles=4 if ctx.quick else 10)
        # 5. threads as shards grow (file store)
        for shards in (100, 1_000, *((5_000,) if getattr(ctx.args, "cost_big", False) else ())):
            before, fds_before = threading.active_count(), open_files()
            c = cluster("file", shards)
            try:
                busy = threading.active_count()
                time.sleep(UPLOADER_IDLE_SECONDS + 1.0)  # the shards' uploader threads end when idle
                n = threading.active_count()
                yield ctx.figure("threads", n, "threads", target="<= 64" if shards >= 5_000 else None,
                                 met=n <= 64 if shards >= 5_000 else None, shards=shards, before=before,
                                 just_after_a_bulk_over_all=busy, when=f"idle {UPLOADER_IDLE_SECONDS + 1:.0f}s")
                fds = open_files()
                if fds is not None and fds_before is not None:
                    per_copy = (fds - fds_before) / shards
                    yield ctx.figure("fds_per_copy", per_copy, "fds", shards=shards,
                                     when=f"idle {UPLOADER_IDLE_SECONDS + 1:.0f}s")
                    ctx.progress(f"{shards} shards: {per_copy:.2f} open files per idle shard copy")
                ctx.progress(f"{shards} shards: {busy} threads in this process right after a bulk over all of "
                             f"them, {n} once idle")
            finally:
                c.close()
    finally:
        run_cleanups(cleanups, "[cost] cleanup")
