"""The records of an ingest job: a writer's staged files adopted by a live cluster (issue 43).

A writer that is not a client of the cluster row by row (a Spark job) stages its rows as
files in the cluster's blob store, then hands the cluster ONE job record naming them.  A
coordinator applies the job through the document API and records its outcome; the
outcome record makes the job's commit idempotent by its id (docs/design/ingest.md).

Keys, under the cluster's UUID (``<c>``) and the index's UUID (``<i>``)::

    <c>/ingest/<i>/<job>/files/<name>.parquet   staged rows (Parquet: ``_id`` + the document's columns)
    <c>/ingest/<i>/<job>/job                    IngestJob, written by the writer, put-if-absent, last
    <c>/ingest/<i>/<job>/done                   IngestDone, written by the coordinator, put-if-absent
    <c>/ingest/<i>/<job>/adopted/<attempt>      the seq#s an adopted job took (v2 jobs), kept with the files

Records share :mod:`shardstore.core.records`' framing (magic, format version, length, JSON body,
CRC32C):

* ``SSIJ`` v1, the job: ``{"job", "index", "index_uuid", "mode", "files": [{"key", "size",
  "crc32c", "rows"}]}``; ``mode`` is ``append`` or ``overwrite`` (every document the job does not
  write is deleted once the job's rows are applied).
* ``SSIJ`` v2, a job of *routed* files: each file also has ``"shard"``, the one shard all its rows
  route to, and the cluster may adopt it as a segment of that shard instead of applying its rows
  (docs/design/adoption.md).  Written only when every file is routed; a v1 reader refuses it
  (UnsupportedFormatVersion) rather than apply it some other way.
* ``SSIA`` v1, the adopted marker: ``{"job", "runs": [[shard, first seq#, last seq#], ...]}``, written
  by the coordinator once every file is adopted, before ``done``; it keeps the staged files in the
  store (engine/manager/ingest_gc.py) until every adopted shard's remote commit covers its runs
  (until then a replay of the translog reads the files), and goes with the files.
* ``SSID`` v1, the outcome: ``{"job", "rows", "applied", "deleted"}`` (rows staged, rows
  acknowledged, documents the overwrite deleted), and for an adopted job ``"runs"`` as in the marker
  (a reader that does not know the key ignores it).

An unknown version raises :class:`~shardstore.errors.UnsupportedFormatVersion`; a flipped bit,
:class:`~shardstore.core.records.RecordCorrupted` naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shardstore.core.records import decode_record, encode_record
from shardstore.errors import InvalidError

JOB_MAGIC, DONE_MAGIC, VERSION = b"SSIJ", b"SSID", 1
ADOPTED_MAGIC = b"SSIA"
#: the job record's version when every file names its shard (routed files)
ROUTED_VERSION = 2
MODES = ("append", "overwrite")
#: a job id: what a writer names its job (Spark: a random id per batch job, ``<stream>-<batch id>`` per micro-batch)
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_job_id(job: str) -> str:
    """``job`` if it is a valid job id (letters, digits, ``_.-``, at most 128), else InvalidError."""
    if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
        raise InvalidError(f"an ingest job id is 1-128 letters, digits, '_', '.' or '-' (starting with a letter or "
                           f"digit), got {job!r}")
    return job


def job_prefix(cluster_uuid: str, index_uuid: str, job: str) -> str:
    """The prefix of a job's keys (files, job record, outcome)."""
    return f"{cluster_uuid}/ingest/{index_uuid}/{check_job_id(job)}/"


def job_key(prefix: str) -> str:
    """The key of the job record under ``prefix``."""
    return prefix + "job"


def done_key(prefix: str) -> str:
    """The key of the outcome record under ``prefix``."""
    return prefix + "done"


def adopted_key(prefix: str) -> str:
    """The key of the adopted marker under ``prefix``."""
    return prefix + "adopted"


def files_prefix(prefix: str) -> str:
    """Where the job's staged files go under ``prefix``."""
    return prefix + "files/"


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file: its key, size, CRC32C and row count; ``shard``: the shard every row routes to, or None
    (rows of any shard)."""

    key: str
    size: int
    crc32c: int
    rows: int
    shard: int | None = None


@dataclass(frozen=True)
class IngestJob:
    """A job: the staged files to apply to ``index`` (of UUID ``index_uuid``) and how."""

    job: str
    index: str
    index_uuid: str
    mode: str
    files: tuple[StagedFile, ...]

    @property
    def rows(self) -> int:
        """Rows staged over every file."""
        return sum(f.rows for f in self.files)

    @property
    def routed(self) -> bool:
        """Whether every file names its shard (and there is one): the job may be adopted."""
        return bool(self.files) and all(f.shard is not None for f in self.files)


@dataclass(frozen=True)
class AdoptedRuns:
    """The adopted marker: per adopted file, its shard and the seq#s its run took."""

    job: str
    runs: tuple[tuple[int, int, int], ...]  # (shard, first seq#, last seq#)

    def last_by_shard(self) -> dict[int, int]:
        """Per shard, the highest seq# the job's runs took there."""
        out: dict[int, int] = {}
        for shard, _first, last in self.runs:
            out[shard] = max(out.get(shard, -1), last)
        return out


@dataclass(frozen=True)
class IngestDone:
    """A job's outcome: rows staged, rows acknowledged, documents an overwrite deleted; an adopted job's runs (shard,
    first seq#, last seq#), which keep its files as its adopted markers do (engine/manager/ingest_gc.py rule 4)."""

    job: str
    rows: int
    applied: int
    deleted: int
    runs: tuple[tuple[int, int, int], ...] = ()


def encode_job(job: IngestJob) -> bytes:
    """The job record's bytes (``SSIJ`` v1)."""
    if job.mode not in MODES:
        raise InvalidError(f"an ingest job's mode is one of {MODES}, got {job.mode!r}")
    routed = job.routed
    if not routed and any(f.shard is not None for f in job.files):
        raise InvalidError(f"ingest job {job.job}: some files name a shard and some do not")
    files = [{"key": f.key, "size": f.size, "crc32c": f.crc32c, "rows": f.rows,
              **({"shard": f.shard} if routed else {})} for f in job.files]
    body = {"job": check_job_id(job.job), "index": job.index, "index_uuid": job.index_uuid, "mode": job.mode,
            "files": files}
    return encode_record(JOB_MAGIC, ROUTED_VERSION if routed else VERSION, body)


def decode_job(data: bytes, where: str) -> IngestJob:
    """The job record read from ``where`` (RecordCorrupted, UnsupportedFormatVersion)."""
    version, body = decode_record(data, magic=JOB_MAGIC, supported=ROUTED_VERSION, where=where, what="ingest job")
    files = tuple(StagedFile(str(f["key"]), int(f["size"]), int(f["crc32c"]), int(f["rows"]),
                             int(f["shard"]) if version >= ROUTED_VERSION else None) for f in body["files"])
    return IngestJob(str(body["job"]), str(body["index"]), str(body["index_uuid"]), str(body["mode"]), files)


def encode_adopted(runs: AdoptedRuns) -> bytes:
    """The adopted marker's bytes (``SSIA`` v1)."""
    return encode_record(ADOPTED_MAGIC, VERSION, {"job": runs.job, "runs": [list(r) for r in runs.runs]})


def decode_adopted(data: bytes, where: str) -> AdoptedRuns:
    """The adopted marker read from ``where`` (RecordCorrupted, UnsupportedFormatVersion)."""
    _v, body = decode_record(data, magic=ADOPTED_MAGIC, supported=VERSION, where=where, what="ingest adopted marker")
    return AdoptedRuns(str(body["job"]), tuple((int(s), int(a), int(b)) for s, a, b in body["runs"]))


def encode_done(done: IngestDone) -> bytes:
    """The outcome record's bytes (``SSID`` v1)."""
    body: dict[str, Any] = {"job": done.job, "rows": done.rows, "applied": done.applied, "deleted": done.deleted}
    if done.runs:
        body["runs"] = [list(r) for r in done.runs]
    return encode_record(DONE_MAGIC, VERSION, body)


def decode_done(data: bytes, where: str) -> IngestDone:
    """The outcome record read from ``where`` (RecordCorrupted, UnsupportedFormatVersion)."""
    _v, body = decode_record(data, magic=DONE_MAGIC, supported=VERSION, where=where, what="ingest outcome")
    return IngestDone(str(body["job"]), int(body["rows"]), int(body["applied"]), int(body["deleted"]),
                      tuple((int(a), int(b), int(c)) for a, b, c in body.get("runs", ())))


def done_as_dict(done: IngestDone, *, replayed: bool) -> dict[str, Any]:
    """The outcome as the ``client.ingest`` answer (``replayed``: the job had been applied before)."""
    return {"job": done.job, "rows": done.rows, "applied": done.applied, "deleted": done.deleted,
            "replayed": replayed}
