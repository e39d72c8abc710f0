"""Blob store throughput: shardstore's stores next to the raw fsspec filesystem they wrap.

For each backend (memory, file, s3, oci, gcs, azure) and two sizes (many 4 KiB blobs,
a few 64 MiB blobs) it times ``store.put``/``store.get`` (through ``open_store``, so with
the retrying wrapper) and the same bytes through the raw filesystem
(``pipe_file``/``cat_file``): fsspec's MemoryFileSystem and LocalFileSystem, and
``emu.raw_fs()`` on the same emulator for the cloud backends.

Method: every implementation is warmed up first (connections, imports, first-call
paths), then ``reps`` rounds are run; in each round the implementations take turns phase
by phase (all small puts of one, then of the next, ...) and the order rotates from round
to round, so neither side always runs first.  Throughputs are the median over rounds; a
ratio is the median of the per-round ratios shardstore/raw (throughput over throughput,
so > 1 means shardstore is faster).

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

from benches.runner import Context, Figure

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


FULL = Plan(small_size=4 * KiB, small_count=200, large_size=64 * MiB, large_count=1, reps=3, warm_small=20)
QUICK = Plan(small_size=4 * KiB, small_count=40, large_size=8 * MiB, large_count=1, reps=3, warm_small=5)


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
    gets: bool = True  # also measure gets (one fsync variant is enough for reads)


def _store_impl(label: str, store: Any, gets: bool = True, **params: Any) -> Impl:
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
        gets=gets,
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
    name: str
    impls: list[Impl]
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for fn in reversed(self.cleanup):
            try:
                fn()
            except Exception as exc:  # cleanup must not hide the figures
                print(f"[blobstore] cleanup of {self.name} failed: {exc}", flush=True, file=__import__("sys").stderr)


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
        b.cleanup.insert(1, store.close)
        b.impls = [_store_impl("shardstore", store), _raw_impl(emu.raw_fs(), f"{bucket}/raw")]
    except BaseException:
        b.close()
        raise
    ctx.progress(f"{kind}: emulator up at {emu.endpoint} in {time.monotonic() - t0:.1f}s")
    return b


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    count: int
    nbytes: int
    requests: dict[str, int] | None  # store.metrics() requests by kind (shardstore only)
    wire: int | None  # HTTP requests sent (cloud only)
    retries: int = 0


def _phase(impl: Impl, op: str, keys: list[str], data: bytes, wire: bool) -> Sample:
    """Time one phase: ``op`` on every key, sequentially."""
    if impl.store is not None:
        impl.store.reset_metrics()
    w0 = _Wire.count
    nbytes = len(data) * len(keys)
    if op == "put":
        fn = impl.put
        t0 = time.perf_counter()
        for k in keys:
            fn(k, data)
        dt = time.perf_counter() - t0
    elif op == "get":
        fn = impl.get
        t0 = time.perf_counter()
        for k in keys:
            got = fn(k)
            if len(got) != len(data):
                raise AssertionError(f"{impl.label} get {k}: {len(got)} bytes, expected {len(data)}")
        dt = time.perf_counter() - t0
    elif op == "put_stream":
        assert impl.put_stream is not None
        t0 = time.perf_counter()
        for k in keys:
            impl.put_stream(k, data)
        dt = time.perf_counter() - t0
    elif op == "open_read":
        assert impl.open_read is not None
        t0 = time.perf_counter()
        for k in keys:
            n = impl.open_read(k)
            if n != len(data):
                raise AssertionError(f"{impl.label} open_read {k}: {n} bytes, expected {len(data)}")
        dt = time.perf_counter() - t0
    else:  # pragma: no cover
        raise ValueError(op)
    wire_n = _Wire.count - w0 if wire else None
    requests = retries = None
    if impl.store is not None:
        m = impl.store.metrics()
        requests, retries = m["requests"], m["retries"]
    return Sample(dt, len(keys), nbytes, requests, wire_n, retries or 0)


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
        if impl.put_stream is not None:
            impl.put_stream(f"warm-{impl.label}-stream", large)
            impl.open_read(f"warm-{impl.label}-stream")  # type: ignore[misc]
            keys.append(f"warm-{impl.label}-stream")
        impl.delete(keys + [f"warm-{impl.label}-large"])
    ctx.progress(f"{kind}: warmed up {', '.join(i.label for i in b.impls)}")

    samples: dict[tuple[str, str, str], list[Sample]] = {}
    n_impl = len(b.impls)
    for rep in range(plan.reps):
        order = b.impls[rep % n_impl :] + b.impls[: rep % n_impl]
        for cls, data, count in sizes:
            keys = {i.label: [f"r{rep}-{cls}-{i.label}-{j:05d}" for j in range(count)] for i in order}
            size = _size_label(len(data))
            ops = ["put", "get"] + (["put_stream", "open_read"] if cls == "large" else [])
            for op in ops:
                for impl in order:
                    if op == "get" and not impl.gets:
                        continue
                    if op in ("put_stream", "open_read") and (impl.put_stream is None or not impl.gets):
                        continue
                    k = keys[impl.label]
                    if op in ("put_stream", "open_read"):
                        k = [f"{x}-stream" for x in k]
                    ctx.progress(f"{kind} {size} {op} {impl.label} x{count} {rep + 1}/{plan.reps}")
                    s = _phase(impl, op, k, data, wire)
                    if s.retries:
                        ctx.progress(f"{kind} {size} {op} {impl.label}: {s.retries} retries!")
                    samples.setdefault((impl.label, cls, op), []).append(s)
            for impl in order:
                dropped = list(keys[impl.label])
                if cls == "large" and impl.put_stream is not None and impl.gets:
                    dropped += [f"{x}-stream" for x in keys[impl.label]]
                impl.delete(dropped)

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
                    ratio = statistics.median(_mibps(m) / _mibps(r) for m, r in zip(mine, base))
                    goal = TARGETS[cls]
                    params = {k: v for k, v in impl.params.items() if k != "impl"}
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
