"""Blob store throughput: shardstore's stores next to the raw fsspec filesystem they wrap.

For each backend (memory, file, s3, oci, gcs, azure) and two sizes (many 4 KiB blobs,
a few 64 MiB blobs) it times ``store.put``/``store.get`` (through ``open_store``, so with
the retrying wrapper) and the same bytes through the raw filesystem
(``pipe_file``/``cat_file``): fsspec's MemoryFileSystem and LocalFileSystem, and
``emu.raw_fs()`` on the same emulator for the cloud backends.

Method: every implementation is warmed up first (connections, imports, first-call
paths), then ``reps`` rounds (3) are run.  Within a phase (say the 200 small puts of a
round) the implementations take turns key by key, the turn order reversing at every key
(A B, B A, A B, ...), and each call is timed on its own: a service that slows down
during the phase (garbage collection, the other core busy) then costs every side alike.
(Timing whole phases one after the other showed a 0.83 / 1.8 swing by who went first.)
The large blobs are 2 per round for the same reason; the starting side rotates per
round.  Throughputs are the median over rounds; a ratio is the median of the per-round
ratios shardstore/raw (throughput over throughput: > 1 means shardstore is faster), the
per-round values listed in its ``rounds`` parameter.

Requests per op come from ``store.metrics()`` (what shardstore counts) and, for the
cloud backends, from a counter of HTTP requests actually sent by aiohttp (what went on
the wire; s3fs, gcsfs and adlfs all send through aiohttp), for both implementations.

The local store fsyncs by default and raw LocalFileSystem does not: the file backend is
measured with ``fsync=true`` (the real figure) and ``fsync=false`` (apples to apples).
"""

from __future__ import annotations

import io
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benches.runner import Context, Figure, run_cleanups

BACKENDS = ("memory", "file", "s3", "oci", "gcs", "azure")
CLOUD = {"s3", "oci", "gcs", "azure"}
KiB = 1024
MiB = 1024 * 1024
ENV_BACKENDS = "SHARDSTORE_BENCH_BACKENDS"
#: Ratio targets (shardstore throughput / raw throughput), by size class.
TARGETS = {"small": 0.8, "large": 0.9}


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of one run."""

    small_size: int
    small_count: int
    large_size: int
    large_count: int
    reps: int
    warm_small: int


#: large_count=2 so that each round runs the large blobs A B then B A.
FULL = Plan(small_size=4 * KiB, small_count=200, large_size=64 * MiB, large_count=2, reps=3, warm_small=20)
QUICK = Plan(small_size=4 * KiB, small_count=40, large_size=8 * MiB, large_count=2, reps=3, warm_small=5)


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated subset of {','.join(BACKENDS)} (default all; env {ENV_BACKENDS})",
    )
    group.add_argument("--reps", type=int, default=None, help="rounds per measurement (default 3)")


# -- counting HTTP requests on the wire ------------------------------------------------------


class _Wire:
    """Counts requests sent through aiohttp (s3fs/aiobotocore, gcsfs and adlfs/azure-core use it)."""

    count = 0
    installed = False

    @classmethod
    def install(cls) -> bool:
        if cls.installed:
            return True
        try:
            import aiohttp
        except ImportError:
            return False
        original = aiohttp.ClientSession._request

        async def _request(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.count += 1
            return await original(self, *args, **kwargs)

        aiohttp.ClientSession._request = _request  # type: ignore[method-assign]
        cls.installed = True
        return True


# -- implementations under test --------------------------------------------------------------


@dataclass
class Impl:
    """One way of putting and getting blobs: a shardstore store or a raw filesystem."""

    label: str  # unique within a backend
    params: dict[str, Any]  # impl=..., and fsync=... for the file backend
    put: Callable[[str, bytes], Any]
    get: Callable[[str], bytes]
    delete: Callable[[list[str]], None]
    store: Any = None  # the BlobStore, for metrics() (None for raw)
    put_stream: Callable[[str, bytes], Any] | None = None
    open_read: Callable[[str], int] | None = None


def _store_impl(label: str, store: Any, **params: Any) -> Impl:
    def put_stream(key: str, data: bytes) -> Any:
        return store.put_stream(key, io.BytesIO(data))

    def open_read(key: str) -> int:
        n = 0
        with store.open_read(key) as f:
            while chunk := f.read(8 * MiB):
                n += len(chunk)
        return n

    return Impl(
        label,
        {"impl": "shardstore", **params},
        put=store.put,
        get=store.get,
        delete=store.delete,
        store=store,
        put_stream=put_stream,
        open_read=open_read,
    )


def _raw_impl(fs: Any, root: str) -> Impl:
    def delete(keys: list[str]) -> None:
        for k in keys:
            try:
                fs.rm_file(f"{root}/{k}")
            except FileNotFoundError:
                pass

    return Impl(
        "raw",
        {"impl": "raw"},
        put=lambda k, d: fs.pipe_file(f"{root}/{k}", d),
        get=lambda k: fs.cat_file(f"{root}/{k}"),
        delete=delete,
    )


@dataclass
class Backend:
    """One backend under test: its implementations and the cleanups to run when done."""

    name: str
    impls: list[Impl]
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Run the cleanups in reverse order; a failing one is reported, not raised."""
        run_cleanups(self.cleanup, f"[blobstore] cleanup of {self.name}")


def _setup(kind: str, ctx: Context) -> Backend:
    from shardstore.blobstores.open import open_store

    run_id = uuid.uuid4().hex[:8]
    if kind == "memory":
        from fsspec.implementations.memory import MemoryFileSystem

        from shardstore.plugins.memory import MemoryStore

        space = f"bench-{run_id}"
        store = open_store(f"memory://{space}/ss")
        raw = MemoryFileSystem()
        root = f"/bench-{run_id}/raw"
        b = Backend(kind, [_store_impl("shardstore", store), _raw_impl(raw, root)])
        b.cleanup.append(lambda: MemoryStore.drop(space))
        b.cleanup.append(lambda: raw.rm(f"/bench-{run_id}", recursive=True) if raw.exists(f"/bench-{run_id}") else None)
        return b
    if kind == "file":
        from fsspec.implementations.local import LocalFileSystem

        tmp = tempfile.mkdtemp(prefix="shardstore-bench-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
        synced = open_store(f"file://{tmp}/ss-fsync", fsync=True)
        unsynced = open_store(f"file://{tmp}/ss-nofsync", fsync=False)
        os.makedirs(f"{tmp}/raw")
        raw = _raw_impl(LocalFileSystem(), f"{tmp}/raw")
        raw.params["fsync"] = False
        b = Backend(
            kind,
            [
                _store_impl("shardstore-fsync", synced, fsync=True),
                _store_impl("shardstore-nofsync", unsynced, fsync=False),
                raw,
            ],
        )
        b.cleanup.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
        return b
    from shardstore.testing.emulators import start_emulator

    ctx.progress(f"{kind}: starting emulator")
    t0 = time.monotonic()
    emu = start_emulator(kind)
    b = Backend(kind, [])
    b.cleanup.append(emu.stop)
    try:
        bucket = f"bench-{run_id}"
        emu.make_bucket(bucket)
        store = open_store(emu.store_url(bucket, "ss"), **emu.store_options())
        b.cleanup.append(store.close)  # closed before the emulator stops (cleanup runs in reverse)
        b.impls = [_store_impl("shardstore", store), _raw_impl(emu.raw_fs(), f"{bucket}/raw")]
    except BaseException:
        b.close()
        raise
    ctx.progress(f"{kind}: emulator up at {emu.endpoint} in {time.monotonic() - t0:.1f}s")
    return b


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Sample:
    """One implementation's timing of one phase of one round: ``count`` calls, ``nbytes`` moved."""

    seconds: float
    count: int
    nbytes: int
    requests: dict[str, int] | None  # store.metrics() requests by kind (shardstore only)
    wire: int | None  # HTTP requests sent (cloud only)
    retries: int = 0


def _op_fn(impl: Impl, op: str, data: bytes) -> Callable[[str], Any]:
    """``op`` of ``impl`` as a one-key call; reads check the length they got back."""

    def check(key: str, n: int) -> None:
        if n != len(data):
            raise AssertionError(f"{impl.label} {op} {key}: {n} bytes, expected {len(data)}")

    if op == "put":
        return lambda k: impl.put(k, data)
    if op == "get":
        return lambda k: check(k, len(impl.get(k)))
    if op == "put_stream":
        assert impl.put_stream is not None
        return lambda k: impl.put_stream(k, data)  # type: ignore[misc]
    if op == "open_read":
        assert impl.open_read is not None
        return lambda k: check(k, impl.open_read(k))  # type: ignore[misc]
    raise ValueError(op)


def _interleaved(impls: list[Impl], op: str, keys: dict[str, list[str]], data: bytes, wire: bool) -> dict[str, Sample]:
    """Do ``op`` on key j with every impl in turn, j = 0, 1, ..., reversing the turn order
    at every j (A B, B A, A B, ...), and time each call on its own: a drift of the service
    during the phase (garbage collection, a growing key space, the other core busy) then
    hits every impl alike instead of whichever runs second."""
    fns = {i.label: _op_fn(i, op, data) for i in impls}
    secs = dict.fromkeys(fns, 0.0)
    wires = dict.fromkeys(fns, 0)
    for impl in impls:
        if impl.store is not None:
            impl.store.reset_metrics()
    count = len(keys[impls[0].label])
    clock = time.perf_counter
    for j in range(count):
        for impl in impls if j % 2 == 0 else impls[::-1]:
            w0 = _Wire.count
            t0 = clock()
            fns[impl.label](keys[impl.label][j])
            secs[impl.label] += clock() - t0
            wires[impl.label] += _Wire.count - w0
    out = {}
    for impl in impls:
        requests = retries = None
        if impl.store is not None:
            m = impl.store.metrics()
            requests, retries = m["requests"], m["retries"]
        out[impl.label] = Sample(
            secs[impl.label], count, count * len(data), requests, wires[impl.label] if wire else None, retries or 0
        )
    return out


def _size_label(n: int) -> str:
    return f"{n // MiB}MiB" if n >= MiB else f"{n // KiB}KiB"


def _bench_backend(kind: str, b: Backend, plan: Plan, ctx: Context) -> Iterator[Figure]:
    wire = kind in CLOUD and _Wire.install()
    small = os.urandom(plan.small_size)
    large = os.urandom(plan.large_size)
    sizes = [("small", small, plan.small_count), ("large", large, plan.large_count)]

    # Warm-up: every impl puts and gets a few small blobs and one large one; round trip checked.
    for impl in b.impls:
        keys = [f"warm-{impl.label}-{i}" for i in range(plan.warm_small)]
        for k in keys:
            impl.put(k, small)
        for k in keys:
            if impl.get(k) != small:
                raise AssertionError(f"{kind}/{impl.label}: warm-up read back different bytes")
        impl.put(f"warm-{impl.label}-large", large)
        if impl.get(f"warm-{impl.label}-large") != large:
            raise AssertionError(f"{kind}/{impl.label}: warm-up read back different large bytes")
        keys.append(f"warm-{impl.label}-large")
        if impl.put_stream is not None:
            impl.put_stream(f"warm-{impl.label}-stream", large)
            impl.open_read(f"warm-{impl.label}-stream")  # type: ignore[misc]
            keys.append(f"warm-{impl.label}-stream")
        impl.delete(keys)
    ctx.progress(f"{kind}: warmed up {', '.join(i.label for i in b.impls)}")

    samples: dict[tuple[str, str, str], list[Sample]] = {}
    n_impl = len(b.impls)
    for rep in range(plan.reps):
        # Rotate who starts, round to round (within a round the turn order alternates per key).
        order = b.impls[rep % n_impl :] + b.impls[: rep % n_impl]
        streamers = [i for i in order if i.put_stream is not None]
        for cls, data, count in sizes:
            size = _size_label(len(data))
            keys = {i.label: [f"r{rep}-{cls}-{i.label}-{j:05d}" for j in range(count)] for i in order}
            # Streaming (shardstore only, no raw counterpart to balance against): one blob a round.
            skeys = {lbl: [f"{k}-stream" for k in ks[:1]] for lbl, ks in keys.items()}
            phases = [("put", order, keys), ("get", order, keys)]
            if cls == "large":
                phases += [("put_stream", streamers, skeys), ("open_read", streamers, skeys)]
            for op, impls, ks in phases:
                ctx.progress(f"{kind} {size} {op} x{len(ks[order[0].label])} round {rep + 1}/{plan.reps}")
                for label, s in _interleaved(impls, op, ks, data, wire).items():
                    if s.retries:
                        ctx.progress(f"{kind} {size} {op} {label}: {s.retries} retries!")
                    samples.setdefault((label, cls, op), []).append(s)
            for impl in order:
                impl.delete(keys[impl.label] + (skeys[impl.label] if cls == "large" and impl in streamers else []))

    yield from _figures(kind, b, plan, samples, wire)


def _mibps(s: Sample) -> float:
    return s.nbytes / MiB / s.seconds


def _opsps(s: Sample) -> float:
    return s.count / s.seconds


def _figures(
    kind: str, b: Backend, plan: Plan, samples: dict[tuple[str, str, str], list[Sample]], wire: bool
) -> Iterator[Figure]:
    def fig(name: str, value: float, unit: str, who: Impl | None, size: str, op: str | None = None,
            target: str | None = None, met: bool | None = None, **extra: Any) -> Figure:
        params: dict[str, Any] = {"backend": kind, "size": size}
        if op is not None:
            params["op"] = op
        params.update(who.params if who is not None else {})
        params.update(extra)
        return Figure("blobstore", name, value, unit, params, target, met)

    raw = next(i for i in b.impls if i.label == "raw")
    for cls, nbytes in (("small", plan.small_size), ("large", plan.large_size)):
        size = _size_label(nbytes)
        ops = ["put", "get"] + (["put_stream", "open_read"] if cls == "large" else [])
        for op in ops:
            for impl in b.impls:
                ss = samples.get((impl.label, cls, op))
                if not ss:
                    continue
                yield fig(f"{op}_throughput", statistics.median(_mibps(s) for s in ss), "MiB/s", impl, size)
                if cls == "small":
                    yield fig(f"{op}_ops", statistics.median(_opsps(s) for s in ss), "ops/s", impl, size)
            # ratios shardstore/raw (put and get only: what raw does too)
            if op in ("put", "get"):
                base = samples[(raw.label, cls, op)]
                for impl in b.impls:
                    if impl is raw or (impl.label, cls, op) not in samples:
                        continue
                    mine = samples[(impl.label, cls, op)]
                    rounds = [_mibps(m) / _mibps(r) for m, r in zip(mine, base)]
                    ratio = statistics.median(rounds)
                    goal = TARGETS[cls]
                    params = {k: v for k, v in impl.params.items() if k != "impl"}
                    params["rounds"] = "/".join(f"{x:.2f}" for x in rounds)
                    yield fig(f"{op}_ratio", ratio, "ratio", None, size, target=f">= {goal}",
                              met=ratio >= goal, impl="shardstore/raw", **params)
            # requests per op: what shardstore counts, and what went on the wire
            for impl in b.impls:
                ss = samples.get((impl.label, cls, op))
                if not ss:
                    continue
                s = ss[-1]
                if s.requests is not None:
                    per = {k: v / s.count for k, v in s.requests.items() if v}
                    kinds = ",".join(f"{k}:{v:g}" for k, v in per.items())
                    yield fig("requests_per_op", sum(per.values()), "req/op", impl, size, op, kinds=kinds)
                if s.wire is not None:
                    yield fig("http_requests_per_op", s.wire / s.count, "req/op", impl, size, op)


def _backends(ctx: Context) -> list[str]:
    text = getattr(ctx.args, "backends", None) or os.environ.get(ENV_BACKENDS) or ",".join(BACKENDS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad:
        raise ValueError(f"unknown backend(s) {bad}; known: {', '.join(BACKENDS)}")
    return names


def run(ctx: Context) -> Iterator[Figure]:
    """Measure every selected backend; a backend that fails is reported and the rest go on."""
    plan = QUICK if ctx.quick else FULL
    reps = getattr(ctx.args, "reps", None)
    if reps:
        plan = Plan(**{**plan.__dict__, "reps": reps})
    failed: list[str] = []
    for kind in _backends(ctx):
        t0 = time.monotonic()
        try:
            b = _setup(kind, ctx)
        except Exception as exc:
            ctx.progress(f"{kind}: SKIPPED, setup failed: {type(exc).__name__}: {exc}")
            failed.append(kind)
            continue
        try:
            yield from _bench_backend(kind, b, plan, ctx)
        except Exception as exc:
            import traceback

            ctx.progress(f"{kind}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            failed.append(kind)
        finally:
            b.close()
        ctx.progress(f"{kind}: done in {time.monotonic() - t0:.1f}s")
    if failed:
        raise RuntimeError(f"backends failed: {', '.join(failed)}")
