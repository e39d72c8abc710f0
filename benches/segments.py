"""Segments: write, incremental upload, scan, get-by-id and refresh, next to raw pyarrow where there is one.

Documents: random ids (19-digit zero-padded random 62-bit integers, so string order is
numeric order) and a JSON ``_source`` of about 190 bytes with five fields the dynamic
mapping types as ``title`` keyword (12 words of a 2,000-word vocabulary), ``status``
keyword (4 values), ``count`` long (uniform in [0, 1e6)), ``score`` double and ``ts``
date.  Sources are built with ``mapping.sources_from_table`` and parsed back with
``mapping.parse_sources`` (or ``ShardDirectory.apply``), all before the clocks except
where parsing is what is measured (refresh).

1. **Write** (``write_mb_per_s``, ``write_ratio``): ``write_segment`` of a segment table
   of WRITE_DOCS documents (base columns + the five typed columns) vs
   ``pyarrow.parquet.write_table(same table, compression="zstd", compression_level=
   ZSTD_LEVEL)`` to the same directory.  Two inputs: ``random`` (ids in random order:
   ``write_segment`` sorts by ``_id``; raw writes the table as is) and ``sorted`` (what
   a refresh hands it: ``refresh`` already sorts by (_id, seq#) to find the winners, so
   ``write_segment`` only checks the order).  Two fsync settings: ``fsync=False`` (no
   fsync on either side) and ``fsync=True`` (``write_segment``'s default: file and
   directory fsynced; the raw side then fsyncs its file and the directory too).
   MB/s = the table's Arrow bytes (``Table.nbytes``, 10^6) per second.  Rounds alternate
   the order (A B, B A, ...); medians; the ratio is the median of per-round ratios
   (write_segment / raw throughput).  Target (issue 4): >= 0.8.
2. **Incremental upload** (``commit_puts``, ``commit_bytes_uploaded``...): a shard of
   UPLOAD_SEGMENTS segments (``ShardDirectory.apply`` + ``refresh`` that many times,
   ``flush(merge=False)``), uploaded once with ``RemoteSegmentStore(store,
   ShardAddress(...), 1).upload``; then one more commit adding one segment of the same
   size (``kind=append_segment``): the store's ``metrics()`` PUT and ``bytes_out`` deltas
   of that upload, against the new files' bytes (``missing_files`` of the commit) and
   the shard's total bytes.  Targets (issue 4): PUTs <= 3 and bytes <= 2x the new
   files' bytes.  Then a commit updating 1% of the shard's documents at random
   (``kind=update_1pct``; no target): the updated documents' old copies sit in almost
   every segment, so each of those segments gets a new live-docs file to upload.
   Backends: ``--segments-remote-backends`` (``file``: a local store in a temp
   directory; ``s3``: moto through ``shardstore.testing.emulators``); default file.
3. **Scan** (``scan_rows_per_s``, ``scan_mb_per_s``, ``scan_ratio``): ``ShardDirectory.scan
   (columns[, filter])`` over the big shard below vs ``pyarrow.dataset.dataset(files)
   .to_batches(columns[, filter])`` over the same Parquet files, batches consumed and
   dropped.  Cases: ``narrow`` (``status``, ``count``), ``wide`` (every column,
   ``_source`` included), ``filter`` (``status``, ``ts`` where ``count < 10,000``: 1% of
   the rows; the filter column is not projected).  Twice: with no deletions, then with
   1% of the documents deleted (after the 1% update of 5. below; the raw side reads the
   deleted rows too, it knows nothing of live docs).  MB/s counts the Arrow bytes each
   side returned.  Files are in the page cache (just written).  Ratio = raw seconds /
   shardstore seconds per round, median.  Target (issue 4): >= 0.8.
4. **get by id** (``get_p50_ms``, ``get_p99_ms``): ``ShardDirectory.get(id,
   realtime=False)`` on the big shard.  ``pass=cold``: the first ``get`` after opening
   the directory (the directory is reopened for each sample; page cache warm, process
   caches empty); ``pass=first``: GET_EXISTING random existing and GET_MISSING missing
   ids in a row on a freshly opened directory; ``pass=warm``: the same ids again;
   ``pass=warmed``: once the row-cache warmer is idle (``warm_wait_s``), as many existing ids
   never asked before (target, issue 16: p99 <= 5 ms).
5. **Refresh of a 1% update** (``refresh_update_seconds``...): a batch updating 1% of
   the big shard's documents (random existing ids, new sources): ``apply`` (parse +
   buffer) then ``refresh`` (winners, id lookups in every segment, live docs marked, the
   new segment written).  ``index=cold`` is the first refresh after opening the
   directory (each segment's id index is built by that refresh: its ``_id`` column
   read and fingerprinted), ``index=warm`` a second 1% update on the same directory.
   ``refresh`` is split by timing the id lookup (``ShardIdIndex.lookup``: the shard-wide id index, its levels
   built from the segments' own indexes on first use) and ``write_segment`` during it; ``flush_seconds`` is the flush after (one live-docs file per touched segment).

The big shard: SHARD_DOCS documents applied and refreshed in bulks of BULK_DOCS through
``ShardDirectory`` (fsync off while building: not measured), flushed without merging,
closed, then reopened (fsync on) for the measurements.  Full: 5,000,000 documents in 50
segments; ``--quick``: 200,000 in 10 segments of 20,000.  ``--segments-docs N`` changes
the size.  Temp files go to ``SHARDSTORE_BENCH_DIR`` (default: the temp directory).
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

#: Targets of issue 4.
WRITE_RATIO_TARGET = 0.8
SCAN_RATIO_TARGET = 0.8
COMMIT_PUTS_TARGET = 3
COMMIT_BYTES_FACTOR = 2.0
REMOTE_BACKENDS = ("file", "s3")
FILTER_COUNT = 10_000  # count < FILTER_COUNT keeps 1% of the rows (count is uniform in [0, 1e6))


@dataclass(frozen=True)
class Plan:
    """Sizes and counts of one run."""

    write_docs: int
    write_rounds: int
    upload_segments: int
    upload_bulk: int
    shard_docs: int
    bulk_docs: int
    scan_rounds: int
    get_existing: int
    get_missing: int
    get_cold: int


FULL = Plan(write_docs=100_000, write_rounds=5, upload_segments=100, upload_bulk=1_000, shard_docs=5_000_000,
            bulk_docs=100_000, scan_rounds=3, get_existing=200, get_missing=50, get_cold=20)
QUICK = Plan(write_docs=20_000, write_rounds=3, upload_segments=100, upload_bulk=1_000, shard_docs=200_000,
             bulk_docs=20_000, scan_rounds=2, get_existing=100, get_missing=25, get_cold=5)


def add_arguments(group: Any) -> None:
    """Options of this bench (the runner adds them to its parser)."""
    group.add_argument("--segments-remote-backends", default=None,
                       help=f"comma-separated subset of {','.join(REMOTE_BACKENDS)} for the incremental upload "
                            "(default file)")
    group.add_argument("--segments-docs", type=int, default=None,
                       help="documents of the big shard (get, scan, refresh; default 5,000,000, quick 200,000)")
    group.add_argument("--segments-reps", type=int, default=None,
                       help="rounds per write and scan measurement (default 5 and 3, quick 3 and 2)")


# -- documents ----------------------------------------------------------------------------------


class _Docs:
    """Random documents: ids, typed field columns, JSON sources, translog batches."""

    def __init__(self, seed: int = 0x5E6) -> None:
        import numpy as np
        import pyarrow as pa

        self.rng = np.random.default_rng(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        words = set()
        while len(words) < 2000:
            k = int(self.rng.integers(3, 10))
            words.add("".join(letters[i] for i in self.rng.integers(0, 26, k)))
        self.vocab = pa.array(sorted(words), pa.string())
        self.seq = 0  # next seq#

    def new_ids(self, n: int) -> Any:
        """``n`` random even id numbers (odd numbers never exist: the missing ids of ``get``)."""
        return self.rng.integers(0, 2**61, n, dtype="int64") * 2

    @staticmethod
    def id_strings(nums: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.utf8_lpad(pa.array(nums.astype(str)), 19, "0")

    def fields(self, n: int) -> Any:
        """The five field columns of ``n`` documents (Arrow table, no ids)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        rng = self.rng
        words = [self.vocab.take(pa.array(rng.integers(0, len(self.vocab), n))) for _ in range(12)]
        return pa.table({
            "title": pc.binary_join_element_wise(*words, " "),
            "status": pa.array(np.array(["active", "idle", "closed", "pending"])[rng.integers(0, 4, n)]),
            "count": pa.array(rng.integers(0, 1_000_000, n)),
            "score": pa.array(rng.random(n)),
            "ts": pa.array(rng.integers(1_600_000_000_000, 1_700_000_000_000, n), pa.timestamp("ms", "UTC")),
        })

    def sources(self, nums: Any) -> tuple[Any, Any]:
        """(ids, JSON sources) of new documents with the given id numbers."""
        from shardstore.segments.mapping import sources_from_table

        f = self.fields(len(nums))
        return sources_from_table(f.add_column(0, "_id", self.id_strings(nums)))

    def batch(self, nums: Any) -> Any:
        """A stamped translog batch indexing new documents with the given id numbers."""
        import numpy as np
        import pyarrow as pa

        from shardstore.translog.operations import stamp, unstamped_batch

        ids, src = self.sources(nums)
        n = len(nums)
        b = unstamped_batch(pa.array(np.zeros(n, np.int8)), ids, pa.array(np.ones(n, np.int64)), src)
        out = stamp(b, self.seq, 1)
        self.seq += n
        return out

    def segment_table(self, nums: Any) -> Any:
        """A segment table (base columns + the typed columns parsed via the mapping)."""
        import numpy as np
        import pyarrow as pa

        from shardstore.segments.mapping import Mapping, parse_sources
        from shardstore.segments.segment import BASE_SCHEMA

        ids, src = self.sources(nums)
        n = len(nums)
        fields, _ = parse_sources(ids, src, Mapping(()))
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        return pa.table([ids, pa.array(seq), pa.array(np.ones(n, np.int64)), pa.array(np.ones(n, np.int64)), src]
                        + list(fields.columns), schema=pa.schema(list(BASE_SCHEMA) + list(fields.schema)))


# -- helpers ------------------------------------------------------------------------------------


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _rounds(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
def _refresh_split() -> Iterator[tuple[_Timer, _Timer]]:
    """Time the directory's id lookups (``ShardIdIndex.lookup``) and its ``write_segment`` (this process only)."""
    import shardstore.segments.directory as directory
    from shardstore.segments.shard_id_index import ShardIdIndex

    lookup, write = _Timer(), _Timer()
    orig_lookup, orig_write = ShardIdIndex.lookup, directory.write_segment
    ShardIdIndex.lookup = lookup.wrap(orig_lookup)  # type: ignore[method-assign]
    directory.write_segment = write.wrap(orig_write)  # type: ignore[assignment]
    try:
        yield lookup, write
    finally:
        ShardIdIndex.lookup = orig_lookup  # type: ignore[method-assign]
        directory.write_segment = orig_write  # type: ignore[assignment]


# -- 1. write -----------------------------------------------------------------------------------


def _write(ctx: Context, base: str, docs: _Docs, plan: Plan, reps: int) -> Iterator[Figure]:
    import pyarrow.parquet as pq

    from shardstore.segments.segment import ZSTD_LEVEL, write_segment

    n = plan.write_docs
    t = docs.segment_table(docs.new_ids(n))
    inputs = {"random": t, "sorted": t.sort_by([("_id", "ascending"), ("_seq_no", "ascending")])}
    mb = t.nbytes / 1e6
    d = tempfile.mkdtemp(prefix="write-", dir=base)
    ctx.progress(f"write: {n} docs, {mb:.1f} MB of Arrow data, {reps} rounds per cell")

    def ours(table: Any, fsync: bool) -> tuple[float, int]:
        path = os.path.join(d, f"seg-{uuid.uuid4().hex}.parquet")
        t0 = time.perf_counter()
        info = write_segment(path, table, name="bench", fsync=fsync)
        dt = time.perf_counter() - t0
        os.unlink(path)
        return dt, info.size

    def raw(table: Any, fsync: bool) -> tuple[float, int]:
        path = os.path.join(d, f"raw-{uuid.uuid4().hex}.parquet")
        t0 = time.perf_counter()
        if fsync:
            with open(path, "wb") as f:
                pq.write_table(table, f, compression="zstd", compression_level=ZSTD_LEVEL)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(d)
        else:
            pq.write_table(table, path, compression="zstd", compression_level=ZSTD_LEVEL)
        dt = time.perf_counter() - t0
        size = os.path.getsize(path)
        os.unlink(path)
        return dt, size

    sides = {"write_segment": ours, "raw": raw}
    ours(inputs["sorted"], False)  # warm-up of both sides
    raw(inputs["sorted"], False)
    for fsync in (False, True):
        for label, table in inputs.items():
            times: dict[str, list[float]] = {"write_segment": [], "raw": []}
            sizes: dict[str, int] = {}
            for rep in range(reps):
                order = ["write_segment", "raw"] if rep % 2 == 0 else ["raw", "write_segment"]
                for side in order:
                    dt, size = sides[side](table, fsync)
                    times[side].append(dt)
                    sizes[side] = size
            common = {"input": label, "fsync": fsync, "docs": n, "table_mb": round(mb, 1)}
            for side in ("write_segment", "raw"):
                yield ctx.figure("write_mb_per_s", mb / _median(times[side]), "MB/s", **common, impl=side,
                                 file_mb=round(sizes[side] / 1e6, 2))
            rounds = [r / w for w, r in zip(times["write_segment"], times["raw"])]
            ratio = _median(rounds)
            yield ctx.figure("write_ratio", ratio, "ratio", target=f">= {WRITE_RATIO_TARGET}",
                             met=ratio >= WRITE_RATIO_TARGET, **common, impl="write_segment/raw",
                             rounds=_rounds(rounds))
            ctx.progress(f"write: input={label} fsync={fsync}: ratio {ratio:.2f} ({_rounds(rounds)})")
    shutil.rmtree(d, ignore_errors=True)


# -- 2. incremental upload ----------------------------------------------------------------------


def _remote_kinds(ctx: Context) -> list[str]:
    text = getattr(ctx.args, "segments_remote_backends", None)
    if text is None:
        return ["file"]
    names = [n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"]
    bad = [n for n in names if n not in REMOTE_BACKENDS]
    if bad:
        raise ValueError(f"unknown remote backend(s) {bad}; known: {', '.join(REMOTE_BACKENDS)}")
    return names


class _Backend:
    """A blob store and the uploader of one shard on it; cleanups run in reverse order."""

    def __init__(self, kind: str, base: str, ctx: Context, cleanups: list[Callable[[], Any]]) -> None:
        from shardstore.blobstores.open import open_store
        from shardstore.core.address import ShardAddress
        from shardstore.segments.remote_store import RemoteSegmentStore

        self.kind = kind
        if kind == "file":
            d = tempfile.mkdtemp(prefix="store-", dir=base)
            cleanups.append(lambda: shutil.rmtree(d, ignore_errors=True))
            self.store = open_store(f"file://{d}/ss")
        else:
            from shardstore.testing.emulators import start_emulator

            ctx.progress(f"upload {kind}: starting emulator")
            t0 = time.monotonic()
            emu = start_emulator(kind)
            cleanups.append(emu.stop)
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            emu.make_bucket(bucket)
            self.store = open_store(emu.store_url(bucket, "ss"), **emu.store_options())
            ctx.progress(f"upload {kind}: emulator up at {emu.endpoint} in {time.monotonic() - t0:.1f}s")
        cleanups.append(self.store.close)
        self.remote = RemoteSegmentStore(self.store, ShardAddress(uuid.uuid4().hex, uuid.uuid4().hex, 0), 1)

    def upload(self, directory: str, commit: Any) -> dict[str, Any]:
        """Upload ``commit``; what it cost."""
        missing = self.remote.missing_files(commit)
        m0 = self.store.metrics()
        t0 = time.perf_counter()
        self.remote.upload(directory, commit)
        dt = time.perf_counter() - t0
        m1 = self.store.metrics()
        return {"seconds": dt, "puts": m1["requests"]["put"] - m0["requests"]["put"],
                "lists": m1["requests"]["list"] - m0["requests"]["list"],
                "gets": m1["requests"]["get"] - m0["requests"]["get"],
                "bytes": m1["bytes_out"] - m0["bytes_out"],
                "new_files": len(missing), "new_bytes": sum(s for s, _ in missing.values())}


def _upload(ctx: Context, base: str, docs: _Docs, plan: Plan, kinds: list[str],
            cleanups: list[Callable[[], Any]]) -> Iterator[Figure]:
    import numpy as np

    from shardstore.segments.directory import ShardDirectory

    if not kinds:
        return
    path = tempfile.mkdtemp(prefix="upload-shard-", dir=base)
    cleanups.append(lambda: shutil.rmtree(path, ignore_errors=True))
    shard = ShardDirectory(path, fsync=False)
    cleanups.append(shard.close)
    t0 = time.monotonic()
    nums = []
    for k in range(plan.upload_segments):
        ids = docs.new_ids(plan.upload_bulk)
        nums.append(ids)
        shard.apply(docs.batch(ids))
        shard.refresh()
    commit = shard.flush(local_checkpoint=shard.max_seq_no, primary_term=1, merge=False)
    ctx.progress(f"upload: shard of {len(commit.segments)} segments x {plan.upload_bulk} docs built in "
                 f"{time.monotonic() - t0:.1f}s")
    backends: list[_Backend] = []
    for kind in kinds:
        b = _Backend(kind, base, ctx, cleanups)
        first = b.upload(path, commit)
        ctx.progress(f"upload {kind}: first upload {first['puts']} PUTs, {first['bytes'] / 1e6:.1f} MB "
                     f"in {first['seconds']:.2f}s")
        yield ctx.figure("initial_upload_puts", first["puts"], "PUT", backend=kind, segments=len(commit.segments),
                         bytes=first["bytes"], seconds=round(first["seconds"], 3))
        backends.append(b)

    # one more commit adding one segment
    ids = docs.new_ids(plan.upload_bulk)
    nums.append(ids)
    shard.apply(docs.batch(ids))
    res = shard.refresh()
    commit = shard.flush(local_checkpoint=shard.max_seq_no, primary_term=1, merge=False)
    new_seg = next(s for s in commit.segments if s.info.name == res.segment)
    shard_bytes = sum(size for size, _ in commit.files().values())
    all_nums = np.concatenate(nums)
    upd = docs.rng.choice(all_nums, max(1, len(all_nums) // 100), replace=False)
    for label, nxt in (("append_segment", None), ("update_1pct", upd)):
        if nxt is not None:
            shard.apply(docs.batch(nxt))
            shard.refresh()
            commit = shard.flush(local_checkpoint=shard.max_seq_no, primary_term=1, merge=False)
            shard_bytes = sum(size for size, _ in commit.files().values())
        for b in backends:
            r = b.upload(path, commit)
            ctx.progress(f"upload {b.kind} {label}: {r['puts']} PUTs, {r['bytes']} bytes "
                         f"({r['new_files']} new files, {r['new_bytes']} bytes) in {r['seconds'] * 1000:.0f} ms")
            params = {"backend": b.kind, "kind": label, "segments": len(commit.segments),
                      "docs_per_segment": plan.upload_bulk}
            budget = COMMIT_BYTES_FACTOR * r["new_bytes"]
            if label == "append_segment":
                yield ctx.figure("commit_puts", r["puts"], "PUT", target=f"<= {COMMIT_PUTS_TARGET}",
                                 met=r["puts"] <= COMMIT_PUTS_TARGET, **params, new_files=r["new_files"],
                                 lists=r["lists"], gets=r["gets"])
                yield ctx.figure("commit_bytes_uploaded", r["bytes"], "bytes",
                                 target=f"<= {COMMIT_BYTES_FACTOR:g}x new files' bytes ({int(budget)})",
                                 met=r["bytes"] <= budget, **params, new_files_bytes=r["new_bytes"],
                                 new_segment_bytes=new_seg.info.size, metadata_bytes=r["bytes"] - r["new_bytes"],
                                 shard_bytes=shard_bytes)
            else:
                yield ctx.figure("commit_puts", r["puts"], "PUT", **params, new_files=r["new_files"],
                                 lists=r["lists"], gets=r["gets"])
                yield ctx.figure("commit_bytes_uploaded", r["bytes"], "bytes", **params,
                                 new_files_bytes=r["new_bytes"], metadata_bytes=r["bytes"] - r["new_bytes"],
                                 shard_bytes=shard_bytes)
            yield ctx.figure("commit_bytes_vs_new", r["bytes"] / max(1, r["new_bytes"]), "ratio", **params)
            yield ctx.figure("commit_bytes_vs_shard", r["bytes"] / shard_bytes, "ratio", **params,
                             shard_bytes=shard_bytes)
            yield ctx.figure("commit_upload_ms", 1000 * r["seconds"], "ms", **params)
    shard.close()


# -- the big shard: build, get, scan, refresh ---------------------------------------------------


class _Shard:
    """The big shard: its directory, the id numbers it holds, and the open ShardDirectory."""

    def __init__(self, ctx: Context, base: str, docs: _Docs, n_docs: int, bulk: int,
                 cleanups: list[Callable[[], Any]]) -> None:
        import numpy as np

        from shardstore.segments.directory import ShardDirectory

        self.path = tempfile.mkdtemp(prefix="shard-", dir=base)
        cleanups.append(lambda: shutil.rmtree(self.path, ignore_errors=True))
        self.dir: Any = None
        cleanups.append(self.close)
        t0 = last = time.monotonic()
        nums = []
        shard = ShardDirectory(self.path, fsync=False)
        try:
            done = 0
            while done < n_docs:
                k = min(bulk, n_docs - done)
                ids = docs.new_ids(k)
                nums.append(ids)
                shard.apply(docs.batch(ids))
                shard.refresh()
                done += k
                now = time.monotonic()
                if now - last >= 3 or done == n_docs:
                    ctx.progress(f"shard: {done:,}/{n_docs:,} docs in {len(nums)} segments, {now - t0:.1f}s")
                    last = now
            self.commit = shard.flush(local_checkpoint=shard.max_seq_no, primary_term=1, merge=False)
        finally:
            shard.close()
        self.nums = np.concatenate(nums)
        self.build_seconds = time.monotonic() - t0
        self.bytes = sum(s.info.size for s in self.commit.segments)
        self.segments = len(self.commit.segments)

    def open(self) -> Any:
        from shardstore.segments.directory import ShardDirectory

        self.close()
        self.dir = ShardDirectory(self.path)
        return self.dir

    def close(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None


def _get(ctx: Context, shard: _Shard, docs: _Docs, plan: Plan) -> Iterator[Figure]:
    import numpy as np

    existing = [f"{x:019d}" for x in docs.rng.choice(shard.nums, plan.get_existing, replace=False)]
    missing = [f"{x:019d}" for x in docs.new_ids(plan.get_missing) + 1]  # odd: never indexed
    common = {"docs": len(shard.nums), "segments": shard.segments, "realtime": False}

    cold, opens = [], []
    for i in range(plan.get_cold):
        t0 = time.perf_counter()
        d = shard.open()
        t1 = time.perf_counter()
        doc = d.get(existing[i], realtime=False)
        t2 = time.perf_counter()
        assert doc is not None and doc["_id"] == existing[i], existing[i]
        opens.append(t1 - t0)
        cold.append(t2 - t1)
    ctx.progress(f"get: cold p50 {1000 * _median(cold):.1f} ms over {len(cold)} reopenings "
                 f"(open {1000 * _median(opens):.1f} ms)")
    yield ctx.figure("open_ms", 1000 * _median(opens), "ms", **common, samples=len(opens))
    yield ctx.figure("get_p50_ms", 1000 * _median(cold), "ms", **common, hit="existing", **{"pass": "cold"},
                     samples=len(cold))
    yield ctx.figure("get_p99_ms", 1000 * _pct(cold, 0.99), "ms", **common, hit="existing", **{"pass": "cold"},
                     samples=len(cold))

    d = shard.open()
    queries = [(x, True) for x in existing] + [(x, False) for x in missing]
    order = np.random.default_rng(7).permutation(len(queries))
    queries = [queries[i] for i in order]
    for label in ("first", "warm"):
        lat: dict[bool, list[float]] = {True: [], False: []}
        for doc_id, present in queries:
            t0 = time.perf_counter()
            doc = d.get(doc_id, realtime=False)
            lat[present].append(time.perf_counter() - t0)
            assert (doc is not None) == present, doc_id
        for present, xs in lat.items():
            hit = "existing" if present else "missing"
            p = {**common, "hit": hit, "pass": label, "samples": len(xs)}
            yield ctx.figure("get_p50_ms", 1000 * _median(xs), "ms", **p)
            yield ctx.figure("get_p99_ms", 1000 * _pct(xs, 0.99), "ms", **p)
        ctx.progress(f"get {label}: existing p50 {1000 * _median(lat[True]):.1f} ms, "
                     f"missing p50 {1000 * _median(lat[False]):.1f} ms")

    # pass=warmed: the row-cache warmer (issue 16) has decoded the opened segments; ids never asked before
    from shardstore.segments import row_cache

    t0 = time.perf_counter()
    idle = row_cache.warmer.wait_idle(600)
    waited = time.perf_counter() - t0
    asked = set(existing)
    fresh = [f"{x:019d}" for x in docs.rng.choice(shard.nums, 2 * plan.get_existing, replace=False)]
    fresh = [x for x in fresh if x not in asked][:plan.get_existing]
    xs = []
    for doc_id in fresh:
        t0 = time.perf_counter()
        doc = d.get(doc_id, realtime=False)
        xs.append(time.perf_counter() - t0)
        assert doc is not None, doc_id
    p = {**common, "hit": "existing", "pass": "warmed", "samples": len(xs), "warm_wait_s": round(waited, 2),
         "warmer_idle": idle, "cache_gib": round(row_cache.row_groups.size_bytes / 2**30, 2)}
    yield ctx.figure("get_p50_ms", 1000 * _median(xs), "ms", **p)
    yield ctx.figure("get_p99_ms", 1000 * _pct(xs, 0.99), "ms", target="<= 5", met=_pct(xs, 0.99) <= 0.005, **p)
    ctx.progress(f"get warmed (waited {waited:.1f} s for the warmer): p50 {1000 * _median(xs):.2f} ms, "
                 f"p99 {1000 * _pct(xs, 0.99):.2f} ms over ids never asked before")


def _scan_cases() -> list[tuple[str, list[str] | None, Any]]:
    import pyarrow.compute as pc

    return [
        ("narrow", ["status", "count"], None),
        ("wide", None, None),
        ("filter", ["status", "ts"], pc.field("count") < FILTER_COUNT),
    ]


def _scan(ctx: Context, shard: _Shard, reps: int, deleted: str) -> Iterator[Figure]:
    import pyarrow.dataset as ds

    d = shard.dir
    segs = d.searchable_segments()
    files = [r.path for r, _ in segs]
    dels = sum(live.deleted_count for _, live in segs)
    docs = sum(r.info.doc_count for r, _ in segs)

    def ours(cols: Any, flt: Any) -> tuple[int, int]:
        rows = nbytes = 0
        for b in d.scan(cols, flt):
            rows += b.num_rows
            nbytes += b.nbytes
        return rows, nbytes

    def raw(cols: Any, flt: Any) -> tuple[int, int]:
        rows = nbytes = 0
        for b in ds.dataset(files, format="parquet").to_batches(columns=cols, filter=flt):
            rows += b.num_rows
            nbytes += b.nbytes
        return rows, nbytes

    sides = {"shardstore": ours, "raw": raw}
    for case, cols, flt in _scan_cases():
        times: dict[str, list[float]] = {"shardstore": [], "raw": []}
        out: dict[str, tuple[int, int]] = {}
        for rep in range(reps):
            order = ["shardstore", "raw"] if rep % 2 == 0 else ["raw", "shardstore"]
            for side in order:
                t0 = time.perf_counter()
                out[side] = sides[side](cols, flt)
                times[side].append(time.perf_counter() - t0)
        common = {"case": case, "deleted": deleted, "columns": "all" if cols is None else ",".join(cols),
                  "filter": "" if flt is None else str(flt), "docs": docs, "deleted_docs": dels,
                  "segments": len(segs)}
        for side in ("shardstore", "raw"):
            rows, nbytes = out[side]
            sec = _median(times[side])
            yield ctx.figure("scan_rows_per_s", rows / sec, "rows/s", **common, impl=side, rows=rows)
            yield ctx.figure("scan_mb_per_s", nbytes / 1e6 / sec, "MB/s", **common, impl=side)
        rounds = [r / s for s, r in zip(times["shardstore"], times["raw"])]
        ratio = _median(rounds)
        yield ctx.figure("scan_ratio", ratio, "ratio", target=f">= {SCAN_RATIO_TARGET}",
                         met=ratio >= SCAN_RATIO_TARGET, **common, impl="shardstore/raw", rounds=_rounds(rounds))
        ctx.progress(f"scan {case} deleted={deleted}: shardstore {_median(times['shardstore']):.2f}s, "
                     f"raw {_median(times['raw']):.2f}s, ratio {ratio:.2f}")


def _refresh(ctx: Context, shard: _Shard, docs: _Docs, label: str) -> Iterator[Figure]:
    d = shard.dir
    n_live = d.count()
    k = max(1, n_live // 100)
    nums = docs.rng.choice(shard.nums, k, replace=False)  # may pick an id updated before: still one live copy
    batch = docs.batch(nums)  # sources built before the clock; parsing is part of apply
    with _refresh_split() as (lookup, write):
        t0 = time.perf_counter()
        d.apply(batch)
        t1 = time.perf_counter()
        res = d.refresh()
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    d.flush(local_checkpoint=d.max_seq_no, primary_term=1, merge=False)
    t4 = time.perf_counter()
    assert res.indexed == k and res.deleted == k, res
    total = t2 - t0
    common = {"index": label, "updated_docs": k, "shard_docs": n_live, "segments": len(d.searchable_segments())}
    ctx.progress(f"refresh 1% ({label} index): apply {t1 - t0:.2f}s, refresh {t2 - t1:.2f}s "
                 f"(lookup {lookup.seconds:.2f}s in {lookup.calls} calls, write {write.seconds:.2f}s), "
                 f"flush {t4 - t3:.2f}s")
    yield ctx.figure("refresh_update_seconds", total, "s", **common)
    yield ctx.figure("refresh_update_docs_per_s", k / total, "docs/s", **common)
    yield ctx.figure("refresh_apply_seconds", t1 - t0, "s", **common, part="apply (parse + buffer)")
    yield ctx.figure("refresh_seconds", t2 - t1, "s", **common, part="refresh")
    yield ctx.figure("refresh_lookup_seconds", lookup.seconds, "s", **common, part="refresh: id lookup (ShardIdIndex.lookup)",
                     calls=lookup.calls)
    yield ctx.figure("refresh_write_seconds", write.seconds, "s", **common, part="refresh: write_segment")
    yield ctx.figure("refresh_other_seconds", (t2 - t1) - lookup.seconds - write.seconds, "s", **common,
                     part="refresh: winners, take, live docs")
    yield ctx.figure("flush_seconds", t4 - t3, "s", **common, part="flush after (live-docs files, commit)")


def run(ctx: Context) -> Iterator[Figure]:
    """Write, incremental upload, then the big shard: get, scan, 1% update refresh, scan with deletions."""
    plan = QUICK if ctx.quick else FULL
    kinds = _remote_kinds(ctx)  # a bad name fails before anything is measured
    n_docs = getattr(ctx.args, "segments_docs", None) or plan.shard_docs
    reps = getattr(ctx.args, "segments_reps", None)
    write_reps, scan_reps = (reps, reps) if reps else (plan.write_rounds, plan.scan_rounds)
    base = tempfile.mkdtemp(prefix="shardstore-bench-segments-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
    cleanups: list[Callable[[], Any]] = [lambda: shutil.rmtree(base, ignore_errors=True)]
    try:
        docs = _Docs()
        ctx.progress(f"files in {base}")
        yield from _write(ctx, base, docs, plan, write_reps)
        yield from _upload(ctx, base, docs, plan, kinds, cleanups)
        shard = _Shard(ctx, base, docs, n_docs, plan.bulk_docs, cleanups)
        yield ctx.figure("shard_build_docs_per_s", len(shard.nums) / shard.build_seconds, "docs/s",
                         docs=len(shard.nums), segments=shard.segments, bulk=plan.bulk_docs,
                         seconds=round(shard.build_seconds, 1), shard_mb=round(shard.bytes / 1e6, 1),
                         how="apply + refresh per bulk, fsync off, flush(merge=False)")
        yield from _get(ctx, shard, docs, plan)
        yield from _scan(ctx, shard, scan_reps, "none")
        yield from _refresh(ctx, shard, docs, "cold")
        yield from _scan(ctx, shard, scan_reps, "1pct")
        yield from _refresh(ctx, shard, docs, "warm")
    finally:
        run_cleanups(cleanups, "[segments] cleanup")
