"""Issue 46's scenario on 3 ``shardstore node`` processes: node-translog bytes and streams after each step.

``python -m benches.dead_streams [--grace SECONDS]``: an index of 2 shards with 1 replica; 4 rounds of
20 bulks of 200 documents, each ending with a SIGKILL of a primary's process and its restart on its
data directory; then 4 bulks each with a flush, then two flushes (then, with a grace, a wait for the
manager's timer).  After each step: the store's node-translog bytes and streams, and how many of
them belong to processes that are gone.  ``--grace`` sets the nodes' ``translog_gc_grace`` (default:
the nodes' own, 30 s).  Exit status 1 if dead bytes are left at the end or a document is missing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run the scenario and print one line per step."""
    from shardstore.blobstores import open_store
    from shardstore.engine.manager.translog_gc import GRACE_SECONDS, list_streams
    from shardstore.testing.node_processes import ProcessCluster
    from shardstore.translog.node_format import stream_owner

    ap = argparse.ArgumentParser(prog="python -m benches.dead_streams", description=__doc__.splitlines()[0])
    ap.add_argument("--grace", type=float, default=GRACE_SECONDS, help="the nodes' translog_gc_grace in seconds")
    args = ap.parse_args(argv)
    d = Path(tempfile.mkdtemp(prefix="shardstore-dead-streams-"))
    procs = ProcessCluster(str(d / "nodes"), f"file://{d / 'store'}?create=true", 3,
                           env={"SHARDSTORE_NODE_TRANSLOG_GC_GRACE": str(args.grace)})
    store = open_store(f"file://{d / 'store'}")
    t0 = time.monotonic()

    def report(step: str) -> int:
        cluster = next((p.name for p in (d / "store").iterdir() if (p / "node_translog").is_dir()), None)
        if cluster is None:
            print(f"[{time.monotonic() - t0:5.1f}s] {step}: no stream yet", flush=True)
            return 0
        listing = list_streams(store, cluster)
        live = {procs.call(n, "node.stats", {})["process"] for n in procs.names}
        dead = [s for s in listing.rounds if stream_owner(s) not in live]
        dead_bytes = sum(size for key, size in listing.sizes.items()
                         if stream_owner(key.split("/node_translog/")[1].split("/")[0]) not in live)
        print(f"[{time.monotonic() - t0:5.1f}s] {step}: {listing.total_bytes / 1e6:.2f} MB in {len(listing.rounds)} "
              f"streams ({len(dead)} dead: {dead_bytes / 1e6:.2f} MB)", flush=True)
        return dead_bytes

    try:
        client = procs.client()
        client.create_index("i", shards=2, replicas=1)
        client.wait_for_health("green", timeout=60)
        n = 0
        for r in range(4):
            for _ in range(20):
                assert not client.bulk("i", [{"_id": f"{n + k}", "v": "x" * 100} for k in range(200)]).errors
                n += 200
            primary = next(s["node"] for s in client.cluster()["shards"] if s["role"] == "primary" and s["shard"] == r % 2)
            procs.kill(primary)
            procs.restart(primary)
            client.wait_for_health("green", timeout=90)
            report(f"round {r + 1} (SIGKILL {primary}, restart)")
        for b in range(4):
            assert not client.bulk("i", [{"_id": f"{n + k}", "v": "y"} for k in range(200)]).errors
            n += 200
            client.flush("i")
            report(f"bulk + flush {b + 1}/4")
        dead = 0
        for f in range(2):
            client.flush("i")
            time.sleep(2)
            dead = report(f"flush {f + 1}/2")
        deadline = time.monotonic() + (2 * args.grace + 15 if args.grace else 0)
        while dead and time.monotonic() < deadline:
            time.sleep(5)
            dead = report("waiting for the manager's timer")
        client.refresh("i")
        count = client.count("i")
        print(f"count {count:,} (acknowledged {n:,}); dead bytes left {dead}", flush=True)
        return 0 if dead == 0 and count == n else 1
    finally:
        procs.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
