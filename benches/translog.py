"""Local translog append throughput, next to a raw baseline that writes the same bytes.

What is measured: ``LocalTranslog.add(stamped_batch)`` of 1 KiB JSON documents in bulks
of 1, 100 and 1,000 operations, under ``request`` durability (every append returns
after its fsync + checkpoint replace) and ``async`` durability (a background fsync
every ``sync_interval``, default 5 s: the timed runs are shorter, so in practice no
fsync per append).  Documents, unstamped batches, stamped batches (distinct seq#s) and,
for the baseline, the encoded frames (``translog.frames.encode_frame`` of the very same
stamped batches) are all built before the timed region: the clock covers the appends
only (not opening or closing the log).

The raw baseline writes those frames to a buffered file with the same fsync pattern.
They are byte for byte the frames the translog appends (``tests/project/test_benches.py``
checks it): since format version 2 a frame is the frame header plus one Arrow IPC
record batch message, the schema being written once per generation file, after the
header.  Both sides write header and schema frame, and fsync them, before the clock.

- request: ``write``, ``flush``, ``fsync`` of the file, then a checkpoint-like replace
  of a 98-byte file (write a temp file, fsync it, ``os.replace``, fsync the directory),
  per append, as ``write_checkpoint`` does;
- async: ``write`` only.

So the ratio translog / raw is what the translog costs on top of the disk work it
cannot avoid (validation, encoding, checkpoint bookkeeping, seq# tracking).

Figures per (bulk, durability): ``ops_per_s`` and ``mb_per_s`` (frame bytes written, in
10^6 bytes/s) for ``impl=translog`` and ``impl=raw``, ``fsyncs_per_1k_ops`` for both
(``os.fsync`` is wrapped in this process only, so every fsync the translog or the
baseline issues is counted, rolls of a 64 MiB generation included), and ``ops_ratio``
(translog / raw ops/s, the median of the per-round ratios in ``rounds``).  The
``cpu`` parameter is process CPU seconds per wall second during the translog's timed
appends (1.0 = one core busy).  Targets (issue 3): bulk 1,000 async >= 100k ops/s on one
core and >= 0.5 of raw.

Group commit: 4 threads append bulks of 100 under ``request`` durability for a fixed
time; ``group_commit_ops_per_s`` and ``group_commit_fsyncs_per_append`` (3 fsyncs per
sync: file, checkpoint temp file, directory; < 3 means appends shared a sync), and
``group_commit_speedup`` over the single-thread bulk-100 request figure.

Remote: ``RemoteTranslog(local, store, prefix, buffer_interval=0.2)`` over a local
translog (``request`` durability), for the backends of ``--translog-remote-backends``
(``file``: a local store in a temp directory, fsync on; ``s3``: moto through
``shardstore.testing.emulators.start_emulator("s3")``).  ``add`` returns only once the
upload covering the batch (data blob + metadata blob) has landed, so the append latency
is about one buffer interval plus one upload.  Two runs per backend: THREADS (4)
appenders of bulk 100 for REMOTE_SECONDS (4 s; 1.5 s quick), and one appender of bulk
1,000 for the same time.  Figures: ``remote_ops_per_s``, ``remote_puts_per_s`` (the
store's ``metrics()["requests"]["put"]`` delta over the run's wall time, from the
start barrier until every appender returned), ``puts_per_1k_ops``, and
``remote_append_p50_ms`` / ``remote_append_p99_ms`` (each ``add`` timed on its own; with
~20 appends per thread the p99 is close to the maximum).  Target (issue 3):
remote PUTs per shard per second <= 2 / buffer interval (10/s at 200 ms) under steady
load.  Batches are stamped before the clock (more are stamped on the fly should an
appender run out).  Under ``--quick`` the remote runs are left out unless
``--translog-remote-backends`` is given (the s3 emulator alone takes seconds to start).

Method: a warm-up run of the translog for the time budget fixes the number of appends
of a cell (capped); then ``reps`` rounds (3) in which translog and raw each append that
many batches into a fresh directory, the order alternating round to round (A B, B A,
...), since one side's dirty pages can slow the other.  Medians over rounds.  The files
go to ``SHARDSTORE_BENCH_DIR`` (default: the temp directory); fsync cost depends on it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from benches.runner import Context, Figure, run_cleanups

DOC_BYTES = 1024
BULKS = (1, 100, 1000)
DURABILITIES = ("request", "async")
THREADS = 4
GROUP_BULK = 100
#: Targets of issue 3 for bulk 1,000 under async durability.
TARGET_OPS = 100_000
TARGET_RATIO = 0.5
_CKP_SIZE = 98  # bytes of translog.ckp (format versions 1 and 2)


@dataclass(frozen=True)
class Plan:
    """Time budget and counts of one run."""

    seconds: float  # warm-up run length, which fixes the appends per round
    reps: int
    max_ops: int  # cap of operations per run (memory of the pre-encoded frames)
    group_seconds: float


FULL = Plan(seconds=0.5, reps=3, max_ops=100_000, group_seconds=1.0)
QUICK = Plan(seconds=0.1, reps=2, max_ops=20_000, group_seconds=0.25)

REMOTE_BACKENDS = ("file", "s3")
BUFFER_INTERVAL = 0.2
REMOTE_SECONDS = 4.0
REMOTE_SECONDS_QUICK = 1.5
REMOTE_BULK_SINGLE = 1000
#: Issue 3: remote PUTs per shard per second <= 2 / buffer interval under steady load.
REMOTE_PUTS_TARGET = 2 / BUFFER_INTERVAL


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--translog-reps", type=int, default=None, help="rounds per measurement (default 3, quick 2)")
    group.add_argument("--translog-seconds", type=float, default=None,
                       help="warm-up run length that fixes the appends per round (default 0.5, quick 0.1)")
    group.add_argument("--translog-remote-backends", default=None,
                       help=f"comma-separated subset of {','.join(REMOTE_BACKENDS)} for the remote translog runs "
                            f"(default {','.join(REMOTE_BACKENDS)}; with --quick none unless given; '' or 'none' for none)")
    group.add_argument("--translog-sealed-mb", type=int, default=None,
                       help="size of the sealed generation one round uploads, in MB (default 1024, quick 64)")
    group.add_argument("--translog-remote-seconds", type=float, default=None,
                       help=f"length of each remote run (default {REMOTE_SECONDS:g}, quick {REMOTE_SECONDS_QUICK:g})")


# -- counting fsyncs ---------------------------------------------------------------------------


class _FsyncCounter:
    """Wraps ``os.fsync`` in this process (the translog calls it through ``os``) and counts calls."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._original: Callable[[int], None] | None = None

    def install(self) -> None:
        original = self._original = os.fsync

        def fsync(fd: int) -> None:
            with self._lock:
                self.count += 1
            original(fd)

        os.fsync = fsync  # type: ignore[assignment]

    def uninstall(self) -> None:
        if self._original is not None:
            os.fsync = self._original  # type: ignore[assignment]
            self._original = None


# -- building the inputs (outside every timed region) -----------------------------------------


def _documents(n: int) -> list[bytes]:
    """``n`` distinct JSON documents of exactly DOC_BYTES bytes each."""
    docs = []
    for i in range(n):
        doc = {"id": i, "title": f"document {i}", "tags": ["bench", f"t{i % 7}"], "n": i * 31, "body": ""}
        pad = DOC_BYTES - len(json.dumps(doc, separators=(",", ":")))
        doc["body"] = ("lorem ipsum %d " % i * 200)[:pad]
        raw = json.dumps(doc, separators=(",", ":")).encode()
        assert len(raw) == DOC_BYTES, len(raw)
        docs.append(raw)
    return docs


class _Inputs:
    """Distinct unstamped batches of one bulk size, stamped on demand with fresh seq#s."""

    def __init__(self, docs: list[bytes], bulk: int, distinct: int) -> None:
        from shardstore.translog.operations import index_batch

        self.bulk = bulk
        self.unstamped = []
        for k in range(distinct):
            start = (k * bulk) % len(docs)
            chunk = [docs[(start + j) % len(docs)] for j in range(bulk)]
            ids = [f"doc-{k}-{j}" for j in range(bulk)]
            self.unstamped.append(index_batch(ids, chunk))

    def stamped(self, index: int, stride: int = 1, offset: int = 0) -> Any:
        """The ``index``-th batch; seq#s interleave by ``stride`` batches (threads), shifted by ``offset``."""
        from shardstore.translog.operations import stamp

        slot = index * stride + offset
        return stamp(self.unstamped[slot % len(self.unstamped)], slot * self.bulk, 1)


# -- the two sides ----------------------------------------------------------------------------


@dataclass
class Sample:
    """One timed run: ``ops`` operations in ``count`` appends, ``nbytes`` frame bytes."""

    seconds: float
    cpu: float
    count: int
    ops: int
    nbytes: int
    fsyncs: int

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.seconds


def _translog_run(directory: str, batches: list[Any], durability: str, counter: _FsyncCounter,
                  nbytes: int) -> Sample:
    from shardstore.translog.local import LocalTranslog

    tl = LocalTranslog(directory, primary_term=1, durability=durability)  # type: ignore[arg-type]
    try:
        add = tl.add
        f0 = counter.count
        c0, t0 = time.process_time(), time.perf_counter()
        for b in batches:
            add(b)
        t1, c1 = time.perf_counter(), time.process_time()
        fsyncs = counter.count - f0
    finally:
        tl.close()  # syncs: the dirty pages do not spill into the next run
    ops = sum(b.num_rows for b in batches)
    return Sample(t1 - t0, c1 - c0, len(batches), ops, nbytes, fsyncs)


def _raw_run(directory: str, frames: list[bytes], ops: int, durability: str, counter: _FsyncCounter) -> Sample:
    """Write ``frames`` as the translog does, with the same fsync pattern, and nothing else."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "raw.tlog")
    ckp = os.path.join(directory, "raw.ckp")
    tmp = ckp + ".tmp"
    small = b"\0" * _CKP_SIZE
    request = durability == "request"
    f = open(path, "xb")
    try:
        f.write(_preamble())  # header and schema frame, written and fsynced before the clock as the translog does
        f.flush()
        os.fsync(f.fileno())
        write, flush, fileno = f.write, f.flush, f.fileno()
        fsync, replace = os.fsync, os.replace
        f0 = counter.count
        c0, t0 = time.process_time(), time.perf_counter()
        for fr in frames:
            write(fr)
            if request:
                flush()
                fsync(fileno)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, small)
                    fsync(fd)
                finally:
                    os.close(fd)
                replace(tmp, ckp)
                dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                try:
                    fsync(dfd)
                finally:
                    os.close(dfd)
        t1, c1 = time.perf_counter(), time.process_time()
        fsyncs = counter.count - f0
        f.flush()
        os.fsync(fileno)  # outside the clock, as the translog's close
    finally:
        f.close()
    return Sample(t1 - t0, c1 - c0, len(frames), ops, sum(len(fr) for fr in frames), fsyncs)


def _preamble() -> bytes:
    """The bytes a new generation file starts with: the 44-byte header and the schema frame."""
    import uuid

    from shardstore.translog.frames import GenerationHeader, encode_schema_frame
    from shardstore.translog.operations import SCHEMA

    return GenerationHeader(uuid.uuid4(), 1, 1).encode() + encode_schema_frame(SCHEMA)


# -- cells ------------------------------------------------------------------------------------


def _fresh(base: str, label: str) -> str:
    return tempfile.mkdtemp(prefix=f"{label}-", dir=base)


def _warmup_count(base: str, inputs: _Inputs, durability: str, plan: Plan, seconds: float) -> int:
    """Append (stamping as it goes) for ``seconds``; the count of appends done, capped."""
    from shardstore.translog.local import LocalTranslog

    cap = max(1, plan.max_ops // inputs.bulk)
    d = _fresh(base, "warm")
    tl = LocalTranslog(d, primary_term=1, durability=durability)  # type: ignore[arg-type]
    n = 0
    try:
        deadline = time.perf_counter() + seconds
        while n < cap and (n < 3 or time.perf_counter() < deadline):
            tl.add(inputs.stamped(n))
            n += 1
    finally:
        tl.close()
        shutil.rmtree(d, ignore_errors=True)
    return n


def _cell(base: str, inputs: _Inputs, durability: str, plan: Plan, seconds: float, reps: int,
          counter: _FsyncCounter, ctx: Context) -> dict[str, list[Sample]]:
    from shardstore.translog.frames import encode_frame

    bulk = inputs.bulk
    n = _warmup_count(base, inputs, durability, plan, seconds)
    batches = [inputs.stamped(i) for i in range(n)]
    frames = [encode_frame(b) for b in batches]
    nbytes = sum(len(fr) for fr in frames)
    ops = n * bulk
    samples: dict[str, list[Sample]] = {"translog": [], "raw": []}
    for rep in range(reps):
        order = ["translog", "raw"] if rep % 2 == 0 else ["raw", "translog"]
        ctx.progress(f"bulk={bulk} {durability}: {n} appends ({ops} ops) round {rep + 1}/{reps} ({' then '.join(order)})")
        for side in order:
            d = _fresh(base, side)
            try:
                if side == "translog":
                    samples[side].append(_translog_run(d, batches, durability, counter, nbytes))
                else:
                    samples[side].append(_raw_run(d, frames, ops, durability, counter))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    return samples


def _cell_figures(ctx: Context, bulk: int, durability: str, samples: dict[str, list[Sample]]) -> Iterator[Figure]:
    common = {"bulk": bulk, "durability": durability, "doc": "1KiB"}
    for impl in ("translog", "raw"):
        ss = samples[impl]
        ops_s = statistics.median(s.ops_per_s for s in ss)
        cpu = statistics.median(s.cpu / s.seconds for s in ss)
        extra: dict[str, Any] = {"impl": impl, "appends": ss[0].count, "cpu": round(cpu, 2)}
        if impl == "translog" and bulk == 1000 and durability == "async":
            yield ctx.figure("ops_per_s", ops_s, "ops/s", target=">= 100k ops/s on one core",
                             met=ops_s >= TARGET_OPS, **common, **extra)
        else:
            yield ctx.figure("ops_per_s", ops_s, "ops/s", **common, **extra)
        yield ctx.figure("mb_per_s", statistics.median(s.mb_per_s for s in ss), "MB/s", **common, impl=impl)
        fsyncs = sum(s.fsyncs for s in ss)
        ops = sum(s.ops for s in ss)
        # value 0 is a legitimate count (async appends), so report it as is
        yield ctx.figure("fsyncs_per_1k_ops", 1000 * fsyncs / ops, "fsync/1k ops", **common, impl=impl)
    rounds = [t.ops_per_s / r.ops_per_s for t, r in zip(samples["translog"], samples["raw"])]
    ratio = statistics.median(rounds)
    target: dict[str, Any] = {}
    if bulk == 1000 and durability == "async":
        target = {"target": ">= 0.5 of raw", "met": ratio >= TARGET_RATIO}
    yield ctx.figure("ops_ratio", ratio, "ratio", **target, **common, impl="translog/raw",
                     rounds="/".join(f"{x:.2f}" for x in rounds))


def _timed_threads(
    worker: Callable[[int], None], n: int, start: threading.Barrier, stop: threading.Event, seconds: float, name: str
) -> float:
    """Start ``n`` workers, release them together at ``start``, stop them after ``seconds``; the wall time."""
    threads = [threading.Thread(target=worker, args=(t,), name=f"{name}-{t}") for t in range(n)]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    stop.wait(seconds)  # a worker that fails sets ``stop`` early
    stop.set()
    for th in threads:
        th.join()
    return time.perf_counter() - t0


def _group_commit(base: str, inputs: _Inputs, plan: Plan, seconds: float, reps: int, counter: _FsyncCounter,
                  ctx: Context) -> list[tuple[float, float, int]]:
    """``reps`` runs of THREADS appenders for ``seconds``: (ops/s, fsyncs per append, appends) each."""
    from shardstore.translog.local import LocalTranslog

    per_thread = max(4, plan.max_ops // inputs.bulk)  # upper bound on appends per thread
    batches = [[inputs.stamped(i, THREADS, t) for i in range(per_thread)] for t in range(THREADS)]
    out = []
    for rep in range(reps):
        ctx.progress(f"group commit: {THREADS} threads x bulk={inputs.bulk} request, {seconds:.2f}s, round {rep + 1}/{reps}")
        d = _fresh(base, "group")
        tl = LocalTranslog(d, primary_term=1, durability="request")
        counts = [0] * THREADS
        errors: list[BaseException] = []
        start = threading.Barrier(THREADS + 1)
        stop = threading.Event()

        def worker(t: int) -> None:
            try:
                start.wait()
                add = tl.add
                for b in batches[t]:
                    if stop.is_set():
                        break
                    add(b)
                    counts[t] += 1
            except BaseException as exc:  # reported after the join
                errors.append(exc)

        try:
            f0 = counter.count  # the workers wait at the barrier until _timed_threads releases them
            elapsed = _timed_threads(worker, THREADS, start, stop, seconds, "bench-append")
            fsyncs = counter.count - f0
        finally:
            stop.set()
            tl.close()
            shutil.rmtree(d, ignore_errors=True)
        if errors:
            raise errors[0]
        appends = sum(counts)
        out.append((appends * inputs.bulk / elapsed, fsyncs / appends, appends))
    return out


# -- remote -------------------------------------------------------------------------------------


def _remote_backends(ctx: Context) -> list[str]:
    text = getattr(ctx.args, "translog_remote_backends", None)
    if text is None:
        return [] if ctx.quick else list(REMOTE_BACKENDS)
    names = [n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"]
    bad = [n for n in names if n not in REMOTE_BACKENDS]
    if bad:
        raise ValueError(f"unknown remote backend(s) {bad}; known: {', '.join(REMOTE_BACKENDS)}")
    return names


class _RemoteBackend:
    """A blob store to upload to and what to run when done (reverse order)."""

    def __init__(self, kind: str, base: str, ctx: Context) -> None:
        import uuid

        from shardstore.blobstores.open import open_store

        self.kind = kind
        self.cleanup: list[Callable[[], Any]] = []
        try:
            if kind == "file":
                d = _fresh(base, "store")
                self.store = open_store(f"file://{d}/ss")
                self.cleanup.append(lambda: shutil.rmtree(d, ignore_errors=True))
            else:
                from shardstore.testing.emulators import start_emulator

                ctx.progress(f"remote {kind}: starting emulator")
                t0 = time.monotonic()
                emu = start_emulator(kind)
                self.cleanup.append(emu.stop)
                bucket = f"bench-{uuid.uuid4().hex[:8]}"
                emu.make_bucket(bucket)
                self.store = open_store(emu.store_url(bucket, "ss"), **emu.store_options())
                ctx.progress(f"remote {kind}: emulator up at {emu.endpoint} in {time.monotonic() - t0:.1f}s")
            self.cleanup.append(self.store.close)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Run the cleanups in reverse order (failures reported, not raised)."""
        run_cleanups(self.cleanup, f"[translog] cleanup of {self.kind}")
        self.cleanup = []


@dataclass
class RemoteRun:
    """One remote run: ``appends`` of ``bulk`` ops by ``threads`` appenders in ``seconds``, ``puts`` PUTs."""

    threads: int
    bulk: int
    seconds: float
    appends: int
    puts: int
    uploads: int
    latencies: list[float]  # seconds, one per add

    @property
    def ops(self) -> int:
        return self.appends * self.bulk

    def latency_ms(self, q: float) -> float:
        xs = sorted(self.latencies)
        return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]


def _remote_run(base: str, backend: _RemoteBackend, inputs: _Inputs, threads: int, seconds: float,
                ctx: Context) -> RemoteRun:
    """``threads`` appenders through ``RemoteTranslog.add`` for ``seconds``; PUTs from the store's metrics."""
    import uuid

    from shardstore.translog.local import LocalTranslog
    from shardstore.translog.remote import RemoteTranslog

    bulk = inputs.bulk
    per_thread = int(2 * seconds / BUFFER_INTERVAL) + 20  # an append takes >= one buffer interval
    batches = [[inputs.stamped(i, threads, t) for i in range(per_thread)] for t in range(threads)]
    ctx.progress(f"remote {backend.kind}: {threads} thread(s) x bulk={bulk}, buffer {BUFFER_INTERVAL}s, {seconds:.1f}s")
    d = _fresh(base, f"remote-{backend.kind}")
    prefix = f"{uuid.uuid4()}/1/{uuid.uuid4()}/0/translog"
    local = LocalTranslog(d, primary_term=1, durability="request")
    remote = RemoteTranslog(local, backend.store, prefix, buffer_interval=BUFFER_INTERVAL)
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(t: int) -> None:
        try:
            start.wait()
            add, clock, mine, out = remote.add, time.perf_counter, batches[t], lat[t]
            i = 0
            while not stop.is_set():
                b = mine[i] if i < len(mine) else inputs.stamped(i, threads, t)
                a = clock()
                add(b)
                out.append(clock() - a)
                i += 1
        except BaseException as exc:  # reported after the join
            errors.append(exc)
            stop.set()

    try:
        p0 = backend.store.metrics()["requests"]["put"]
        u0 = remote.uploads
        elapsed = _timed_threads(worker, threads, start, stop, seconds, "bench-remote")
        puts = backend.store.metrics()["requests"]["put"] - p0
        uploads = remote.uploads - u0
    finally:
        stop.set()
        remote.close()
        local.close()
        shutil.rmtree(d, ignore_errors=True)
    if errors:
        raise errors[0]
    latencies = [x for xs in lat for x in xs]
    return RemoteRun(threads, bulk, elapsed, len(latencies), puts, uploads, latencies)


def _remote_figures(ctx: Context, kind: str, r: RemoteRun) -> Iterator[Figure]:
    params = {"backend": kind, "threads": r.threads, "bulk": r.bulk, "doc": "1KiB",
              "buffer_ms": round(BUFFER_INTERVAL * 1000)}
    yield ctx.figure("remote_ops_per_s", r.ops / r.seconds, "ops/s", **params, appends=r.appends,
                     seconds=round(r.seconds, 2))
    puts_s = r.puts / r.seconds
    yield ctx.figure("remote_puts_per_s", puts_s, "PUT/s",
                     target=f"<= {REMOTE_PUTS_TARGET:g}/s (2 per {BUFFER_INTERVAL * 1000:.0f} ms buffer)",
                     met=puts_s <= REMOTE_PUTS_TARGET, **params, puts=r.puts, uploads=r.uploads)
    yield ctx.figure("puts_per_1k_ops", 1000 * r.puts / r.ops, "PUT/1k ops", **params)
    yield ctx.figure("remote_append_p50_ms", r.latency_ms(0.50), "ms", **params)
    yield ctx.figure("remote_append_p99_ms", r.latency_ms(0.99), "ms", **params, samples=len(r.latencies))


def _remote(ctx: Context, base: str, kinds: list[str], inputs: dict[int, _Inputs]) -> Iterator[Figure]:
    """Both remote runs on every backend; a backend that fails is reported, the others go on."""
    seconds = getattr(ctx.args, "translog_remote_seconds", None) or (
        REMOTE_SECONDS_QUICK if ctx.quick else REMOTE_SECONDS)
    failed: list[str] = []
    for kind in kinds:
        t0 = time.monotonic()
        try:
            backend = _RemoteBackend(kind, base, ctx)
        except Exception as exc:
            ctx.progress(f"remote {kind}: SKIPPED, setup failed: {type(exc).__name__}: {exc}")
            failed.append(kind)
            continue
        try:
            for threads, bulk in ((THREADS, GROUP_BULK), (1, REMOTE_BULK_SINGLE)):
                r = _remote_run(base, backend, inputs[bulk], threads, seconds, ctx)
                ctx.progress(f"remote {kind}: {r.appends} appends ({r.ops} ops), {r.puts} PUTs, "
                             f"{r.uploads} uploads in {r.seconds:.2f}s")
                yield from _remote_figures(ctx, kind, r)
        except Exception as exc:
            import traceback

            ctx.progress(f"remote {kind}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            failed.append(kind)
        finally:
            backend.close()
        ctx.progress(f"remote {kind}: done in {time.monotonic() - t0:.1f}s")
    if failed:
        raise RuntimeError(f"remote backends failed: {', '.join(failed)}")


def run(ctx: Context) -> Iterator[Figure]:
    """Every (bulk, durability) cell, then the group-commit run, then the remote runs."""
    plan = QUICK if ctx.quick else FULL
    remote_kinds = _remote_backends(ctx)  # a bad name fails before anything is measured
    reps = getattr(ctx.args, "translog_reps", None) or plan.reps
    seconds = getattr(ctx.args, "translog_seconds", None) or plan.seconds
    base = tempfile.mkdtemp(prefix="shardstore-bench-translog-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    counter = _FsyncCounter()
    counter.install()
    try:
        t0 = time.monotonic()
        docs = _documents(2000)
        inputs = {bulk: _Inputs(docs, bulk, distinct=max(1, min(2000 // bulk, 200 if bulk == 1 else 8)))
                  for bulk in BULKS}
        ctx.progress(f"built {len(docs)} documents of {DOC_BYTES} bytes and the batches in {time.monotonic() - t0:.1f}s; "
                     f"files in {base}")
        single: dict[str, float] = {}
        for bulk in BULKS:
            for durability in DURABILITIES:
                samples = _cell(base, inputs[bulk], durability, plan, seconds, reps, counter, ctx)
                if bulk == GROUP_BULK and durability == "request":
                    single["ops"] = statistics.median(s.ops_per_s for s in samples["translog"])
                yield from _cell_figures(ctx, bulk, durability, samples)
        runs = _group_commit(base, inputs[GROUP_BULK], plan, plan.group_seconds if seconds == plan.seconds
                             else 2 * seconds, reps, counter, ctx)
        params = {"threads": THREADS, "bulk": GROUP_BULK, "durability": "request", "doc": "1KiB", "impl": "translog"}
        ops_s = statistics.median(r[0] for r in runs)
        yield ctx.figure("group_commit_ops_per_s", ops_s, "ops/s", **params,
                         appends=sum(r[2] for r in runs))
        yield ctx.figure("group_commit_fsyncs_per_append", statistics.median(r[1] for r in runs), "fsync/append",
                         **params)
        if single.get("ops"):
            yield ctx.figure("group_commit_speedup", ops_s / single["ops"], "ratio", **params,
                             vs="1 thread bulk=100 request")
        yield from _remote(ctx, base, remote_kinds, inputs)
        from benches.sealed_upload import figures as sealed_figures

        yield from sealed_figures(ctx, getattr(ctx.args, "translog_sealed_mb", None) or (64 if ctx.quick else 1024))
    finally:
        counter.uninstall()
        shutil.rmtree(base, ignore_errors=True)
