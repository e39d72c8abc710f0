"""Applying an ingest job: a coordinator adopts a writer's staged files through the document API (issue 43).

The job record (:mod:`.ingest_job`) names Parquet files a writer (a Spark job) staged in the
store.  :func:`run_ingest` applies them as bulks of :data:`SLICE_ROWS` rows through the one
write path every client write takes (door, one mapping per index, routing, per-shard seq#s,
replication, the translog), so replicas, peer recovery, failover and ``restore`` see the rows
as any other acknowledged write.  Nothing about the cluster is claimed or fenced.

Idempotent by the job id (docs/design/ingest.md): the outcome record ``done`` is written
put-if-absent only once every row is acknowledged; a commit that finds it answers it again
and applies nothing.  A job cut short (a coordinator killed, a shard unavailable past the
failover wait) has no ``done``: committing it again applies every row again, which leaves
every document as the job wrote it (rows are keyed by ``_id``; versions move on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.core.records import crc32c
from shardstore.engine.coordinator.documents import BulkResult, Documents
from shardstore.engine.coordinator.ingest_adopt import check_routed, write_adopted
from shardstore.engine.coordinator.ingest_job import (
    AdoptedRuns,
    IngestDone,
    IngestJob,
    StagedFile,
    decode_done,
    decode_job,
    done_as_dict,
    done_key,
    encode_done,
    encode_job,
    files_prefix,
    job_key,
)
from shardstore.engine.errors import IngestIncomplete, IngestJobNotFound, IngestRejected, InvalidRequest
from shardstore.errors import CorruptError
from shardstore.segments.errors import MappingConflict
from shardstore.segments.mapping import Mapping

log = logging.getLogger(__name__)
#: rows per bulk while a job is applied (bounds the coordinator's memory; one per-item result table each)
SLICE_ROWS = 65_536
#: staged files applied at once: a job's files are Spark partitions, whose rows have no order between them, so
#: one file's routing and parsing run while another's slice is on the primaries and replicas (each file's own
#: slices stay in order: a later row of an id wins); the coordinator holds this many files decoded
FILES_AT_ONCE = 2
#: a job whose staged files hold at most this many bytes keeps them decoded from the check to the apply (one GET
#: and decode per file); a bigger one is read twice (checked, then applied) to bound the coordinator's memory
KEEP_CHECKED_BYTES = 64 << 20
#: seconds a copy holds its view for a job past the coordinator's last word: the coordinator renews the hold every
#: third of this on a thread of its own while it applies (_Renewal), and the sink commits a job cut short again
#: within a second, so a job that fails for good, or whose coordinator died, shows what it applied this long after
HOLD_LEASE = 30.0
#: columns a staged file may carry that are not the document's (what a reader adds to every row)
IGNORED_COLUMNS = ("_seq_no", "_primary_term", "_version", "_source")
#: error names of items the index refuses for good (anything else is a shard or node being unavailable)
_REJECTIONS = ("DocumentRejected", "MappingConflict", "InvalidRequest")


class StagedFileCorrupt(CorruptError):
    """A staged file's size or CRC32C is not what its job record says, or it is gone: the job applies nothing more."""


def stage_table(store: BlobStore, prefix: str, name: str, table: pa.Table) -> StagedFile:
    """Write ``table`` as one staged Parquet file of the job under ``prefix`` (zstd; a fresh ``name`` per attempt)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data = sink.getvalue().to_pybytes()
    key = files_prefix(prefix) + name + ".parquet"
    store.put(key, data, if_absent=True)
    return StagedFile(key, len(data), crc32c(data), table.num_rows)


def write_job(store: BlobStore, prefix: str, job: IngestJob) -> IngestJob:
    """Write the job record put-if-absent; the record that stands (an earlier attempt's, for a job id written before:
    a replayed stream batch applies the files its first attempt staged, never two sets)."""
    try:
        store.put(job_key(prefix), encode_job(job), if_absent=True)
        return job
    except BlobAlreadyExists:
        return read_job(store, prefix)


def read_staged(store: BlobStore, f: StagedFile) -> pa.Table:
    """A staged file's rows, its size and CRC32C checked against the job record (StagedFileCorrupt names the key)."""
    try:
        data = store.get(f.key)
    except BlobNotFound:
        raise StagedFileCorrupt(f"staged file {f.key} ({f.rows} rows) is gone from the store; the job record names it; "
                                f"nothing more of the job is applied: run the job again") from None
    if len(data) != f.size or crc32c(data) != f.crc32c:
        raise StagedFileCorrupt(f"staged file {f.key}: {len(data)} bytes, CRC32C {crc32c(data):08x}; the job record "
                                f"says {f.size} bytes, {f.crc32c:08x}; nothing more of the job is applied")
    table = pq.read_table(pa.BufferReader(data))
    drop = [c for c in IGNORED_COLUMNS if c in table.column_names]
    return table.drop_columns(drop) if drop else table


def read_done(store: BlobStore, prefix: str) -> IngestDone | None:
    """The job's outcome record, or None while it is not done."""
    key = done_key(prefix)
    try:
        return decode_done(store.get(key), key)
    except BlobNotFound:
        return None


def read_job(store: BlobStore, prefix: str) -> IngestJob:
    """The job record (IngestJobNotFound)."""
    key = job_key(prefix)
    try:
        return decode_job(store.get(key), key)
    except BlobNotFound:
        raise IngestJobNotFound(key) from None


def _check(result: BulkResult, job: str, where: str) -> int:
    """Acknowledged items of one slice; IngestRejected / IngestIncomplete when any item was not."""
    errors = result.items.column("error")
    failed = len(errors) - errors.null_count
    if failed:
        first = str(pc.drop_null(errors)[0])
        kind = IngestRejected if first.startswith(_REJECTIONS) else IngestIncomplete
        raise kind(job, where, failed, first)
    return len(errors)


#: ``adopt(shard, file, request id)``: have the shard's primary adopt a routed file (``shard.adopt``); its answer
Adopt = Callable[[int, StagedFile, str], dict[str, Any]]


def run_ingest(documents: Documents, store: BlobStore, index: str, prefix: str, *,
               scan_ids: Callable[[str], pa.Array], hold: Callable[[str, float], None] | None = None,
               advance: Callable[[str], bool] | None = None,
               release: Callable[[str], None] | None = None, adopt: Adopt | None = None,
               flush: Callable[[list[int]], None] | None = None) -> dict[str, Any]:
    """Apply the job under ``prefix`` to ``index`` once (see the module docstring); its outcome as a dict.

    ``adopt``: a job of routed files is adopted file by file (engine/coordinator/ingest_adopt.py) when every file's
    columns are adoptable as they are; else, and without ``adopt``, its rows are applied.  ``flush(shards)``: once an
    adopted job is released, those shards are flushed (their commits then cover the adopted runs sooner).

    The outcome's ``seconds``: where this call's time went (``check``, ``hold``, ``apply``, ``release`` and
    ``total``; only ``total`` for a job applied before), for the sink's log line and ``benches/ingest.py``.

    The outcome's ``path`` (a call that applied the job): ``adopt`` (its files became segments) or ``rows``.

    ``scan_ids(index)``: the ``_id`` of every live document searches see (for ``overwrite``).  ``hold(job,
    seconds)`` / ``release(job)``: every copy of the index holds what searches see while the job applies, and
    shows all of it at once when released (docs/design/ingest.md, "Atomic visibility"); ``advance(job)`` runs once
    after the first hold, before the first row (the held views show the jobs released meanwhile: view_reads.py
    ``advance_past_released``); when it sent an advance (True), every copy is held again before the first row, so
    an advance still on its way to a copy (a timed-out request) finds a renewed hold and changes nothing;
    ``release`` runs once ``done`` is written, never after a failure (a retry of the job holds again and keeps the
    view pinned first).
    """
    clock = _Phases()
    done = read_done(store, prefix)
    if done is not None:
        return clock.outcome(done_as_dict(done, replayed=True))
    job = read_job(store, prefix)
    if job.index != index:
        raise InvalidRequest(f"ingest job {job.job} was staged for index [{job.index}], not [{index}]")
    meta = documents.router.index_meta(index)
    if meta.uuid != job.index_uuid:
        raise InvalidRequest(f"index [{index}] is not the one ingest job {job.job} was staged for (uuid "
                             f"{meta.uuid}, the job's {job.index_uuid}: deleted and created again since)")
    routed = None
    if adopt is not None and job.routed:
        try:
            routed = check_routed(store, job, documents.router.mapping_of(meta), meta.shards,
                                  lambda f, why: StagedFileCorrupt(f"staged file {f.key}: {why}; nothing more of the "
                                                                   f"job is applied"))
        except StagedFileCorrupt as exc:
            return clock.outcome(done_as_dict(_finished_first(store, prefix, exc), replayed=True))
    if routed is not None:
        checked, mapping = {}, documents.router.mapping_of(meta)
    else:
        checked = _check_files(documents, store, index, prefix, job)
        if isinstance(checked, IngestDone):  # a second commit of the job running at once finished first
            return clock.outcome(done_as_dict(checked, replayed=True))
        checked, mapping = checked
    try:  # the job's new fields, before its first row: a client mapping one another way meanwhile is refused
        documents.reserve_fields(index, mapping)
    except MappingConflict as exc:  # one was mapped another way since the check: nothing is applied
        raise IngestRejected(job.job, "the index mapping", job.rows, f"MappingConflict: {exc}") from None
    clock.mark("check")
    stop = threading.Event()  # a file failed: the others apply no further slice
    progress = {"files": 0, "rows": 0}
    lock = threading.Lock()
    runs: list[tuple[int, int, int]] = []  # adopted: (shard, first seq#, last seq#) per file
    number = {f.key: i for i, f in enumerate(job.files)}

    def adopt_file(f: StagedFile) -> tuple[int, pa.ChunkedArray | None]:
        assert adopt is not None and routed is not None and f.shard is not None
        if stop.is_set():
            raise _Stopped
        if read_done(store, prefix) is not None:  # a second commit of the job finished first (its files may be going)
            raise StagedFileCorrupt(f"ingest job {job.job} was done by another commit meanwhile")
        # the request id names the file's bytes too: a job id used again later never gets an old file's answer
        answer = adopt(f.shard, f, f"ingest:{job.job}:{number[f.key]}:{f.crc32c:08x}:{f.size}")
        with lock:
            runs.append((f.shard, int(answer["seq_no_base"]), int(answer["seq_no_base"]) + int(answer["rows"]) - 1))
        if int(answer["rows"]) != f.rows:
            raise IngestIncomplete(job.job, f.key, f.rows, f"shard {f.shard} adopted {answer['rows']} rows of it")
        return int(answer["rows"]), pa.chunked_array([routed.ids[f.key]]) if job.mode == "overwrite" else None

    def apply_file(f: StagedFile) -> tuple[int, pa.ChunkedArray | None]:
        try:
            if routed is not None:
                rows, written = adopt_file(f)
            else:
                table = checked.pop(f.key) if f.key in checked else read_staged(store, f)
                rows = 0
                for off in range(0, table.num_rows, SLICE_ROWS):
                    if stop.is_set():
                        raise _Stopped
                    rows += _check(documents.bulk(index, table.slice(off, SLICE_ROWS)), job.job, f.key)
                written = table.column("_id").cast(pa.string()) if job.mode == "overwrite" else None
        except BaseException:
            stop.set()
            raise
        with lock:
            progress["files"] += 1
            progress["rows"] += rows
            log.info("ingest job %s: %d of %d files %s (%d of %d rows)", job.job, progress["files"],
                     len(job.files), "adopted" if routed is not None else "applied", progress["rows"], job.rows)
        return rows, written

    try:
        with _Renewal(hold, job.job):
            if advance is not None and advance(job.job) and hold is not None:
                hold(job.job, HOLD_LEASE)  # a renewal: a late advance_view refuses a renewed hold
            clock.mark("hold")
            try:
                outcomes = _each_file(apply_file, job.files) if routed is None else _each_shard(apply_file, job.files)
            finally:  # before done, and whatever stopped this commit: the files stay while any run it took is in a
                if runs:  # translog (ingest_adopt.py; a commit that finds done meanwhile took runs all the same)
                    write_adopted(store, prefix, AdoptedRuns(job.job, tuple(sorted(runs))))
            written = [ids for _, ids in outcomes if ids is not None]
            deleted = _replace(documents, index, job, written, scan_ids) if job.mode == "overwrite" else 0
    except StagedFileCorrupt as exc:
        return clock.outcome(done_as_dict(_finished_first(store, prefix, exc), replayed=True))
    clock.mark("apply")
    applied = sum(rows for rows, _ in outcomes)
    done = IngestDone(job.job, job.rows, applied, deleted, tuple(sorted(runs)))
    replayed = False
    try:
        store.put(done_key(prefix), encode_done(done), if_absent=True)
    except BlobAlreadyExists:  # a second commit of the job finished first: its record stands
        done, replayed = read_done(store, prefix) or done, True
    if release is not None:
        try:
            release(job.job)
        except Exception as exc:  # noqa: BLE001 - the job is done; a copy not released shows it when its hold lapses
            log.warning("ingest job %s: a copy's view not released (%s: %s); it shows the job when its hold "
                        "lapses", job.job, type(exc).__name__, exc)
    clock.mark("release")
    if routed is not None:
        _flush_adopted(flush, job, sorted({shard for shard, _a, _b in runs}))
        _clean(store, prefix, job, keep_job_files=True)
    else:
        _clean(store, prefix, job)
    out = {**clock.outcome(done_as_dict(done, replayed=replayed)), "path": "adopt" if routed is not None else "rows"}
    log.info("ingest job %s: %d rows into [%s] (%s)", job.job, applied, index,
             ", ".join(f"{k} {v:.2f}s" for k, v in out["seconds"].items()))
    return out


def _check_files(documents: Documents, store: BlobStore, index: str, prefix: str, job: IngestJob
                 ) -> tuple[dict[str, pa.Table], Mapping] | IngestDone:
    """Every file of the job read and checked at the door and against the mapping before any row is applied, so
    a job the index refuses applies nothing (IngestRejected names the file and the first refused row).  The
    decoded files, when together they are at most :data:`KEEP_CHECKED_BYTES` staged, for the apply (else it reads
    them again), and the mapping the job's rows leave (the index's plus their new fields); or the outcome of a
    second commit of the job that finished first (it deleted the files)."""
    keep = sum(f.size for f in job.files) <= KEEP_CHECKED_BYTES
    tables: dict[str, pa.Table] = {}
    mapping = None
    for f in job.files:
        try:
            table = read_staged(store, f)
        except StagedFileCorrupt as exc:
            return _finished_first(store, prefix, exc)
        mapping, refused = documents.refusals(index, table, mapping)
        if refused:
            raise IngestRejected(job.job, f.key, len(refused), f"{type(refused[0]).__name__}: {refused[0]}")
        if keep:
            tables[f.key] = table
    if mapping is None:  # a job of no files
        mapping = documents.router.mapping_of(documents.router.index_meta(index))
    return tables, mapping


def _finished_first(store: BlobStore, prefix: str, missing: StagedFileCorrupt) -> IngestDone:
    """On a staged file gone or damaged: the outcome of a second commit of the job that ran at once, finished first
    and deleted the files (its outcome stands), else ``missing`` raised."""
    finished = read_done(store, prefix)
    if finished is None:
        raise missing
    return finished


class _Phases:
    """Seconds per phase of one ``run_ingest`` call (the outcome's ``seconds``)."""

    def __init__(self) -> None:  # noqa: D107
        self._start = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """``phase`` ended now."""
        now = time.perf_counter()
        self.seconds[phase], self._last = round(now - self._last, 4), now

    def outcome(self, out: dict[str, Any]) -> dict[str, Any]:
        """``out`` with ``seconds``: the phases so far and ``total``."""
        return {**out, "seconds": {**self.seconds, "total": round(time.perf_counter() - self._start, 4)}}


class _Renewal:
    """The coordinator's hold on every copy's view for one job: taken before the first row (a failure raises: nothing
    is applied), then renewed every third of :data:`HOLD_LEASE` on a thread of its own while the job applies, so a
    slice waiting out a failover does not outlast it; a renewal that fails is logged (the next one tries again)."""

    def __init__(self, hold: Callable[[str, float], None] | None, job: str) -> None:  # noqa: D107
        self._hold, self._job = hold, job
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Renewal:
        if self._hold is not None:
            self._hold(self._job, HOLD_LEASE)
            self._thread = threading.Thread(target=self._run, name=f"ingest-hold-{self._job}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        assert self._hold is not None
        while not self._stop.wait(HOLD_LEASE / 3):
            try:
                self._hold(self._job, HOLD_LEASE)
            except Exception as exc:  # noqa: BLE001 - a copy not renewed now may be by the next renewal
                log.warning("ingest job %s: views not held again (%s: %s)", self._job, type(exc).__name__, exc)


class _Stopped(Exception):
    """A file stopped between slices because another file of the job failed (that failure is the one raised)."""


def _each_file(apply_file: Callable[[StagedFile], Any], files: tuple[StagedFile, ...]) -> list[Any]:
    """``apply_file`` over the job's files, :data:`FILES_AT_ONCE` at a time (each file's slices in order); the
    first real failure is raised once every file stopped."""
    if len(files) <= 1 or FILES_AT_ONCE <= 1:
        return [apply_file(f) for f in files]
    with ThreadPoolExecutor(min(FILES_AT_ONCE, len(files)), thread_name_prefix="ingest-file") as pool:
        futures = [pool.submit(apply_file, f) for f in files]
    errors = [e for e in (fu.exception() for fu in futures) if e is not None]
    first = next((e for e in errors if not isinstance(e, _Stopped)), errors[0] if errors else None)
    if first is not None:
        raise first
    return [fu.result() for fu in futures]


#: shards whose files an adopted job sends at once (each shard's files in order: they queue on its write lock)
SHARDS_AT_ONCE = 8


def _each_shard(apply_file: Callable[[StagedFile], Any], files: tuple[StagedFile, ...]) -> list[Any]:
    """``apply_file`` over a routed job's files: up to :data:`SHARDS_AT_ONCE` shards at once, each shard's files one
    after the other in the job's order; results in the job's order, the first real failure raised once every
    shard stopped."""
    by_shard: dict[int, list[int]] = {}
    for i, f in enumerate(files):
        by_shard.setdefault(int(f.shard or 0), []).append(i)
    out: list[Any] = [None] * len(files)

    def run(positions: list[int]) -> None:
        for i in positions:
            out[i] = apply_file(files[i])

    if len(by_shard) <= 1:
        run([i for group in by_shard.values() for i in group])
        return out
    with ThreadPoolExecutor(min(SHARDS_AT_ONCE, len(by_shard)), thread_name_prefix="ingest-shard") as pool:
        futures = [pool.submit(run, group) for group in by_shard.values()]
    errors = [e for e in (fu.exception() for fu in futures) if e is not None]
    first = next((e for e in errors if not isinstance(e, _Stopped)), errors[0] if errors else None)
    if first is not None:
        raise first
    return out


def _replace(documents: Documents, index: str, job: IngestJob, written: list[pa.ChunkedArray],
             scan_ids: Callable[[str], pa.Array]) -> int:
    """Delete every document of ``index`` the job did not write (``overwrite``); how many."""
    present = scan_ids(index)
    keep = pa.chunked_array([c for w in written for c in w.chunks], pa.string())
    gone = present.filter(pc.invert(pc.is_in(present, value_set=keep.combine_chunks())))
    for off in range(0, len(gone), SLICE_ROWS):
        _check(documents.delete_ids(index, gone.slice(off, SLICE_ROWS)), job.job, "the overwrite's deletes")
    return len(gone)


def _flush_adopted(flush: Callable[[list[int]], None] | None, job: IngestJob, shards: list[int]) -> None:
    """Flush the shards an adopted job wrote into (their commits then cover its runs sooner); a failure is logged."""
    if flush is None or not shards:
        return
    try:
        flush(shards)
    except Exception as exc:  # noqa: BLE001 - the job is done; the files only stay longer (ingest_gc.py)
        log.info("ingest job %s: the adopted shards were not flushed (%s: %s); their next flushes cover the runs",
                 job.job, type(exc).__name__, exc)


def _clean(store: BlobStore, prefix: str, job: IngestJob, *, keep_job_files: bool = False) -> None:
    """Delete the job's staged files (and any other attempt's left under its prefix); the records stay.
    ``keep_job_files``: an adopted job's own files stay (the collector deletes them once their runs are covered:
    engine/coordinator/ingest_adopt.py); only other attempts' leftovers go."""
    try:
        keys = {b.key for b in store.list(files_prefix(prefix))}
        keys = keys - {f.key for f in job.files} if keep_job_files else keys | {f.key for f in job.files}
        if keys:
            store.delete(sorted(keys))
    except Exception as exc:  # noqa: BLE001 - the job is done; leftovers are only space
        log.warning("ingest job %s: staged files not deleted (%s)", job.job, exc)
