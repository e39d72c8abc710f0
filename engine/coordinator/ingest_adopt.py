"""Applying an ingest job of routed files by adoption: each file becomes a segment of its shard (issue 43).

A job whose record names one shard per file (``SSIJ`` v2, engine/coordinator/ingest_job.py) may be
applied without any row work on the nodes (docs/design/adoption.md): the coordinator checks each
file (:func:`check_routed`), then asks the file's shard's primary to adopt it (``shard.adopt``:
one replicated write of ``n`` seq#s, logged as adopted operations; every replica adopts the same
file).  Holds, ``done`` and release are the row path's (engine/coordinator/ingest.py), so the job
is visible all at once and applied once by its id.

**Checks, before anything is applied** (one GET of each file; only its footer and ``_id`` column
are decoded):

- size and CRC32C, as the row path checks them;
- every column is adoptable against the index mapping as it stands (mapped, the same Arrow type;
  ``segments/adoption.py`` ``check_adoptable``).  A file that is not makes the whole job take the
  row path (it maps new fields and casts values), never half of each;
- the ids: strings, none null, none empty or longer than 512 bytes (IngestRejected names the file);
- no NaN or infinity in a float column (a bulk refuses them: JSON has neither);
- routing: every id must route to the file's shard (IngestRejected naming the first that does
  not); the sink routes every row with the same function (spark/jvm ``Routing``, equal to
  engine/coordinator/routing.py), so this only catches a writer that did not.

**What keeps the files** (invariant 1 of the design): a translog replay of an adopted run reads its
file, so the files stay after ``done`` while any remote translog a restore could replay still holds
a run.  The coordinator writes an *adopted marker* per attempt (``SSIA``: the runs' shard and seq#s)
before ``done`` (which names the runs too); the collector (engine/manager/ingest_gc.py) deletes the
files only once :func:`runs_covered` holds for every run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobNotFound
from shardstore.core.address import ShardAddress
from shardstore.core.records import crc32c
from shardstore.engine.coordinator.ingest_job import (
    AdoptedRuns,
    IngestJob,
    StagedFile,
    encode_adopted,
)
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.engine.errors import IngestRejected
from shardstore.engine.shard.flush_policy import FALLBACK_COMMITS
from shardstore.errors import CorruptError, InvalidError
from shardstore.segments.adoption import check_adoptable
from shardstore.segments.errors import MappingConflict
from shardstore.segments.mapping import DATE_RANGE_MS, Mapping
from shardstore.segments.remote_store import iter_commits, read_metadata
from shardstore.translog.operations import MAX_ID_BYTES

log = logging.getLogger(__name__)
#: where a job's adopted markers go under its prefix (one per commit attempt that adopted every file)
ADOPTED_PREFIX = "adopted/"


@dataclass(frozen=True)
class RoutedCheck:
    """What the check of a routed job found: the files' ids, by key (an ``overwrite`` job's only)."""

    ids: dict[str, pa.Array]


def check_routed(store: BlobStore, job: IngestJob, mapping: Mapping, shards: int,
                 corrupt: Callable[[StagedFile, str], Exception]) -> RoutedCheck | None:
    """Check every file of a routed job for adoption (module docstring); None when a file's columns are not adoptable
    against ``mapping`` (the job takes the row path).  IngestRejected for bad or misrouted ids; ``corrupt(file,
    why)`` is raised for a file gone or not the bytes its record names.  Files are checked CHECK_THREADS at a time
    (the reads, CRCs and Parquet decoding release the GIL); the answer is the one a check of each file in the job's
    order gives: the first file that is bad or not adoptable decides."""
    ids: dict[str, pa.Array] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(CHECK_THREADS, len(job.files))),
                            thread_name_prefix="ingest-check") as pool:
        checks = [pool.submit(_check_file, store, job, f, mapping, shards, corrupt) for f in job.files]
        try:
            for f, check in zip(job.files, checks):
                adoptable, got = check.result()  # raises this file's error
                if not adoptable:
                    return None
                if got is not None:
                    ids[f.key] = got
        finally:
            for check in checks:
                check.cancel()  # the files not started yet are not read for nothing
    return RoutedCheck(ids)


#: how many staged files :func:`check_routed` reads and checks at once
CHECK_THREADS = 4


def _check_file(store: BlobStore, job: IngestJob, f: StagedFile, mapping: Mapping, shards: int,
                corrupt: Callable[[StagedFile, str], Exception]) -> tuple[bool, pa.Array | None]:
    """One file of :func:`check_routed`: whether its columns are adoptable, and its ids when the job overwrites (an
    append keeps none in memory)."""
    assert f.shard is not None
    if not 0 <= f.shard < shards:
        raise IngestRejected(job.job, f.key, f.rows, f"InvalidRequest: the file names shard {f.shard}; the "
                                                     f"index has shards 0..{shards - 1}")
    try:
        data = store.get(f.key)
    except BlobNotFound:
        raise corrupt(f, "gone from the store") from None
    if len(data) != f.size or crc32c(data) != f.crc32c:
        raise corrupt(f, f"{len(data)} bytes, CRC32C {crc32c(data):08x}; the job record says {f.size} bytes, "
                         f"{f.crc32c:08x}")
    pf = pq.ParquetFile(pa.BufferReader(data))
    try:
        check_adoptable(pf.schema_arrow, mapping, f.key)
    except (MappingConflict, ValueError) as exc:
        log.info("ingest job %s: %s is not adoptable as it is (%s); the job takes the row path", job.job, f.key, exc)
        return False, None
    if pf.metadata.num_rows != f.rows:
        raise corrupt(f, f"{pf.metadata.num_rows} rows; the job record says {f.rows}")
    floats = [c.name for c in pf.schema_arrow if pa.types.is_floating(c.type)]
    dates = [c.name for c in pf.schema_arrow if pa.types.is_timestamp(c.type)]
    read = pf.read(columns=["_id", *floats, *dates])
    column = read.column("_id")
    got = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    _check_ids(job.job, f, got)
    _check_finite(job.job, f, read, floats)
    _check_dates(job.job, f, read, dates)
    routed = shard_ids(got, shards).to_numpy(zero_copy_only=False)  # every id: ~0.1 us each (mmh3 in C)
    wrong = np.flatnonzero(routed != f.shard)
    if wrong.size:
        raise IngestRejected(job.job, f.key, int(wrong.size), f"InvalidRequest: row {int(wrong[0])}: id "
                                                              f"{got[int(wrong[0])].as_py()!r} routes to shard "
                                                              f"{int(routed[wrong[0]])}, not the file's shard "
                                                              f"{f.shard}")
    return True, (got if job.mode == "overwrite" else None)


def _check_ids(job: str, f: StagedFile, ids: pa.Array) -> None:
    """IngestRejected naming the first id of ``f`` a document may not have (null, empty, too long)."""
    if ids.null_count:
        raise IngestRejected(job, f.key, ids.null_count, "DocumentRejected: a row has a null _id")
    lengths = pc.binary_length(ids)
    bad = pc.or_(pc.equal(lengths, 0), pc.greater(lengths, MAX_ID_BYTES))
    n = int(pc.sum(bad).as_py() or 0)
    if n:
        first = int(pc.index(bad, True).as_py())
        raise IngestRejected(job, f.key, n, f"DocumentRejected: row {first}: an _id is 1-{MAX_ID_BYTES} bytes, not "
                                            f"{ids[first].as_py()!r}"[:300])


def _check_finite(job: str, f: StagedFile, table: pa.Table, floats: list[str]) -> None:
    """IngestRejected naming the first NaN or infinity of ``f``, as a bulk refuses it (JSON has neither)."""
    for name in floats:
        values = table.column(name)
        _refuse_first(job, f, table, name, pc.or_(pc.is_nan(values), pc.is_inf(values)),
                      "is not a finite number (JSON has no NaN or infinity)")


def _check_dates(job: str, f: StagedFile, table: pa.Table, dates: list[str]) -> None:
    """IngestRejected naming the first date of ``f`` outside years 1 to 9999, as a bulk refuses it (a date field
    keeps what Python's datetime holds; one outside made every later read raise).  The columns are the mapped
    ``timestamp[ms, UTC]`` (``check_adoptable`` ran first)."""
    low, high = DATE_RANGE_MS
    for name in dates:
        ms = table.column(name).cast(pa.int64())
        _refuse_first(job, f, table, name, pc.or_(pc.less(ms, low), pc.greater(ms, high)),
                      "is a date outside years 1 to 9999")


def _refuse_first(job: str, f: StagedFile, table: pa.Table, name: str, bad: pa.ChunkedArray | pa.Array,
                  rule: str) -> None:
    """IngestRejected naming the first row of ``f`` that ``bad`` marks (nulls: not bad) and the field ``name`` broke
    ``rule``, in a bulk's one-line words; nothing when no row is bad."""
    bad = pc.fill_null(bad, False)
    n = int(pc.sum(bad).as_py() or 0)
    if n:
        row = int(pc.index(bad, True).as_py())
        raise IngestRejected(job, f.key, n, f"DocumentRejected: document {row} (id "
                                            f"{table.column('_id')[row].as_py()!r}): field '{name}': {rule}")


def adopted_marker_key(prefix: str) -> str:
    """A new adopted marker's key under the job's ``prefix`` (one per attempt)."""
    return f"{prefix}{ADOPTED_PREFIX}{uuid.uuid4().hex}"


def write_adopted(store: BlobStore, prefix: str, runs: AdoptedRuns) -> str:
    """Write this attempt's adopted marker; its key."""
    key = adopted_marker_key(prefix)
    store.put(key, encode_adopted(runs), if_absent=True)
    return key


def runs_covered(checkpoints_newest_first: Sequence[int | None], last: int,
                 copy_commits: Sequence[int | None] = (None,)) -> bool:
    """Whether a shard's commits cover seq# ``last`` for good (pure): the newest :data:`FALLBACK_COMMITS` remote
    commits (newest first; None for one that could not be read) all hold every operation up to ``last``, so no
    restore, even one falling back past a bad commit, replays it from a remote translog; and so does the newest
    local commit of every copy (None: not known), since a promoted copy uploads its own last commit under its new
    term (a restore may start there) and a peer recovery copies its primary's."""
    newest = list(checkpoints_newest_first[:FALLBACK_COMMITS])
    return (len(newest) == FALLBACK_COMMITS and all(c is not None and c >= last for c in newest)
            and len(copy_commits) > 0 and all(c is not None and c >= last for c in copy_commits))


def shard_checkpoints(store: BlobStore, address: ShardAddress, n: int = FALLBACK_COMMITS) -> list[int | None]:
    """The local checkpoints of the shard's newest ``n`` remote commits, newest first (None: unreadable)."""
    out: list[int | None] = []
    for key in iter_commits(store, address):
        try:
            out.append(read_metadata(store, key).commit.local_checkpoint)
        except (CorruptError, InvalidError, BlobNotFound) as exc:
            log.info("%s: remote commit unreadable for the adopted files' rule (%s)", key, exc)
            out.append(None)
        if len(out) >= n:
            break
    return out


def runs_covered_in_store(store: BlobStore, runs: Sequence[tuple[int, int, int]],
                          address_of: Callable[[int], ShardAddress],
                          copy_commits: Callable[[int], Sequence[int | None]]) -> bool:
    """Whether every run (shard, first seq#, last seq#) is covered (:func:`runs_covered`) by its shard's remote
    commits (per shard one LIST and :data:`FALLBACK_COMMITS` GETs) and its copies' local commits."""
    last = AdoptedRuns("", tuple(runs)).last_by_shard()
    for shard, top in last.items():  # the store first: the copies are asked only once its commits cover
        remote = shard_checkpoints(store, address_of(shard))
        if not runs_covered(remote, top, [top]) or not runs_covered(remote, top, copy_commits(shard)):
            return False
    return True


__all__ = ["ADOPTED_PREFIX", "RoutedCheck", "adopted_marker_key", "check_routed", "runs_covered",
           "runs_covered_in_store", "shard_checkpoints", "write_adopted"]
