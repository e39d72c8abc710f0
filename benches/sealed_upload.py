"""A large sealed generation uploaded by the node translog round, in a child process: its peak RSS (issue 46).

``python -m benches translog`` runs it last (``--translog-sealed-mb``, default 1024; quick 64): the
child appends that many MB of incompressible documents to one shard's local translog at
``request`` durability inside one ``staging()`` hold, so the round that follows uploads them as
ONE sealed generation read back from its file, streamed to the file store
(translog/chained.py).  The figures: the child's peak RSS (``ru_maxrss``) and its RSS before the
round, so what the round added is their difference.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from benches.runner import Context, Figure

#: what the round may add to the RSS (MB): a read chunk, a copy buffer and a frame, not the generation
BOUND_MB = 64


def _rss_mb() -> float:
    """This process's resident set now (MB), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def child(mb: int, directory: str) -> dict[str, float]:
    """Append ``mb`` MB to one shard in one round, upload it, read the peaks (run in a fresh process)."""
    from shardstore.blobstores import open_store
    from shardstore.translog.local import LocalTranslog
    from shardstore.translog.node_translog import NodeTranslog
    from shardstore.translog.operations import index_batch, stamp

    store = open_store(f"file://{directory}/store")
    node = NodeTranslog(store, "c", node="n1")
    local = LocalTranslog(f"{directory}/tl", primary_term=1, durability="request")
    handle = node.open_shard(local, "c/1/idx/0/translog", "idx", 0)
    rng = random.Random(46)
    first, last = 0, None
    try:
        with node.staging():  # one round for all of it: one sealed generation
            while first * 60_000 < mb * 1_000_000:
                n = 60  # 3.6 MB a batch: plain frames, not compressed
                bodies = [b'{"v":"' + rng.randbytes(30_000).hex().encode() + b'"}' for _ in range(n)]
                last = handle.append(stamp(index_batch([f"d{first + i}" for i in range(n)], bodies), first, 1))
                first += n
            del bodies
        size = sum(os.path.getsize(os.path.join(local.directory, f)) for f in os.listdir(local.directory))
        before = _rss_mb()
        t0 = time.perf_counter()
        handle.wait_uploaded(last)
        seconds = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KB on Linux
        return {"generation_mb": size / 1e6, "rss_before_round_mb": before, "peak_rss_mb": peak,
                "upload_s": seconds, "ops": first}
    finally:
        handle.close()
        node.close()
        local.close()


def figures(ctx: Context, mb: int) -> Iterator[Figure]:
    """Run :func:`child` in a fresh process and yield its figures."""
    with tempfile.TemporaryDirectory(prefix="shardstore-bench-sealed-", dir=os.environ.get("SHARDSTORE_BENCH_DIR")) as d:
        ctx.progress(f"a {mb} MB sealed generation: appending, then one round streams it to the file store")
        out = subprocess.run([sys.executable, "-c", f"import json; from benches.sealed_upload import child; "
                              f"print(json.dumps(child({mb}, {d!r})))"], capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
    added = got["peak_rss_mb"] - got["rss_before_round_mb"]
    params = {"generation_mb": round(got["generation_mb"], 1), "store": "file", "upload_s": round(got["upload_s"], 2)}
    yield ctx.figure("sealed_upload_peak_rss_mb", got["peak_rss_mb"], "MB",
                     target=f"< {BOUND_MB} MB above the RSS before the round, whatever the size",
                     met=added < BOUND_MB, rss_before_round_mb=round(got["rss_before_round_mb"], 1), **params)
    ctx.progress(f"{got['generation_mb']:.0f} MB sealed generation uploaded in {got['upload_s']:.2f}s; peak RSS "
                 f"{got['peak_rss_mb']:.0f} MB ({got['rss_before_round_mb']:.0f} MB before the round)")


__all__ = ["child", "figures"]
