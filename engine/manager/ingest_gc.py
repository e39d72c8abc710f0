"""The collection of Spark ingest jobs' leftovers in the store, run beside the dead-stream collection (issue 46).

An ingest job (engine/coordinator/ingest_job.py, docs/design/ingest.md) lives under
``<cluster>/ingest/<index uuid>/<job>/``: staged Parquet files under ``files/``, the job record
``job`` and, once applied, the outcome record ``done``.  The apply path deletes a job's staged
files once ``done`` is written; nothing deleted the rest:

- staged files of a writer that died before it wrote the job record (a Spark driver killed
  mid-job): nobody will ever commit them;
- the records of jobs long done.

The rule (:func:`doomed_keys`, pure, tested over every case):

1. ``done`` exists: the staged files go at once (the outcome answers a replay; the files are
   never read again); the records go once this collector has seen the job done for
   ``done_retention`` (7 days): a replay of the same job id later than that applies it again,
   and Spark replays only its last uncommitted micro-batch, within minutes.
2. a job record without ``done``: everything stays (a commit may still apply it: a retried
   commit of that job id reads its files).
4. an *adopted* job (``adopted/`` markers, or runs in ``done``: its files became segments,
   docs/design/adoption.md): a translog replay of its runs reads the files, so everything stays
   until it is done and ``covered(job)`` holds (engine/coordinator/ingest_adopt.py
   ``runs_covered_in_store``: every run is below the newest remote commits of its shard, which no
   restore replays, and below every copy's newest local commit, which a promoted copy uploads and a
   peer recovery copies); then the files and the markers go, the records as in rule 1.  A done job
   whose staged files are still there is asked too (one GET of ``done``: a lost marker never
   lets rule 1 take an adopted job's files); one with no runs is covered.
3. staged files with neither record: they go once the set of keys under the job has not
   changed for ``orphan_grace`` (6 h) as this collector saw it: a job still staging keeps
   adding files, which restarts the wait.

Ages are this collector's own observations (the store gives no reliable times): a new
manager starts counting afresh, which only delays.  Cost of a pass: one LIST of
``<cluster>/ingest/``, then one batched DELETE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.engine.coordinator.ingest_adopt import ADOPTED_PREFIX, runs_covered_in_store
from shardstore.engine.coordinator.ingest_job import decode_adopted, decode_done

log = logging.getLogger(__name__)

#: seconds the staged files of a job with no record must stay unchanged before they are collected
ORPHAN_GRACE = 6 * 3600.0
#: seconds a done job's records are kept after this collector first saw it done
DONE_RETENTION = 7 * 24 * 3600.0


@dataclass(frozen=True)
class JobView:
    """What one LIST says of one job's prefix."""

    prefix: str  # <cluster>/ingest/<index uuid>/<job>/
    keys: tuple[str, ...]

    @property
    def has_job(self) -> bool:
        """Whether its job record exists."""
        return self.prefix + "job" in self.keys

    @property
    def has_done(self) -> bool:
        """Whether its outcome record exists."""
        return self.prefix + "done" in self.keys

    @property
    def staged(self) -> tuple[str, ...]:
        """Its staged files."""
        return tuple(k for k in self.keys if k.startswith(self.prefix + "files/"))

    @property
    def markers(self) -> tuple[str, ...]:
        """Its adopted markers (one per commit attempt that adopted every file)."""
        return tuple(k for k in self.keys if k.startswith(self.prefix + ADOPTED_PREFIX))

    @property
    def index_uuid(self) -> str:
        """The UUID of the index it was staged for."""
        return self.prefix.rstrip("/").split("/")[-2]


def list_jobs(store: BlobStore, cluster_uuid: str) -> list[JobView]:
    """Every job prefix of the cluster with its keys (one LIST)."""
    root = f"{cluster_uuid}/ingest/"
    found: dict[str, list[str]] = {}
    for info in store.list(root):
        parts = info.key[len(root):].split("/")
        if len(parts) >= 3:  # <index uuid>/<job>/<rest>
            found.setdefault(f"{root}{parts[0]}/{parts[1]}/", []).append(info.key)
    return [JobView(p, tuple(sorted(keys))) for p, keys in sorted(found.items())]


def doomed_keys(jobs: Iterable[JobView], seen: Mapping[str, tuple[float, tuple[str, ...]]], now: float, *,
                orphan_grace: float = ORPHAN_GRACE, done_retention: float = DONE_RETENTION,
                covered: Callable[[JobView], bool] = lambda job: True) -> list[str]:
    """The keys the rule of the module deletes; ``seen``: per job prefix, since when this collector has seen it in its
    present state (done, or with this exact key set) and that key set; ``covered(job)``: rule 4's test (asked only of
    a done job with staged files or markers left)."""
    out: list[str] = []
    for job in jobs:
        since = seen.get(job.prefix, (now, job.keys))[0]
        if job.markers or (job.has_done and job.staged):
            if job.has_done and covered(job):
                out.extend(job.staged + job.markers)
                if now - since >= done_retention:
                    out.extend(k for k in job.keys if k not in job.staged and k not in job.markers)
            continue
        if job.has_done:
            out.extend(job.staged)
            if now - since >= done_retention:
                out.extend(k for k in job.keys if k not in job.staged)
        elif not job.has_job and now - since >= orphan_grace:
            out.extend(job.keys)
    return out


class IngestCollector:
    """Passes of the rule over one store (one thread runs it: the manager's collection worker)."""

    def __init__(self, store: BlobStore, *, orphan_grace: float = ORPHAN_GRACE, done_retention: float = DONE_RETENTION,
                 clock: Callable[[], float] = time.monotonic,
                 shard_address: Callable[[str, int], ShardAddress | None] | None = None,
                 copy_commits: Callable[[str, int], list[int | None]] | None = None) -> None:
        """``shard_address(index uuid, shard)``: where a shard's blobs are (None: the index is gone), and
        ``copy_commits(index uuid, shard)``: each copy's newest local commit checkpoint, for rule 4; without them an
        adopted job's files stay."""
        self.store = store
        self.orphan_grace = orphan_grace
        self.done_retention = done_retention
        self.clock = clock
        self.shard_address = shard_address
        self.copy_commits = copy_commits
        self._seen: dict[str, tuple[float, tuple[str, ...]]] = {}  # prefix -> (since, its keys then)

    def collect(self, cluster_uuid: str) -> int:
        """One pass over ``cluster_uuid``'s ingest jobs; how many keys it deleted."""
        now = self.clock()
        jobs = list_jobs(self.store, cluster_uuid)
        for job in jobs:
            before = self._seen.get(job.prefix)
            changed = before is None or (before[1] != job.keys and not job.has_done) or (
                job.has_done and job.prefix + "done" not in before[1])
            if changed:
                self._seen[job.prefix] = (now, job.keys)
        listed = {j.prefix for j in jobs}
        for prefix in [p for p in self._seen if p.startswith(f"{cluster_uuid}/") and p not in listed]:
            del self._seen[prefix]
        doomed = doomed_keys(jobs, self._seen, now, orphan_grace=self.orphan_grace,
                             done_retention=self.done_retention, covered=self._covered)
        if doomed:
            self.store.delete(doomed)
            log.info("ingest collection: %d keys of %d jobs deleted", len(doomed), len(jobs))
        return len(doomed)


    def _covered(self, job: JobView) -> bool:
        """Rule 4's test (reads the markers, ``done`` and the shards' newest remote commits); False on any doubt."""
        try:
            runs = [r for key in job.markers for r in decode_adopted(self.store.get(key), key).runs]
            runs += list(decode_done(self.store.get(job.prefix + "done"), job.prefix + "done").runs)
            if not runs:  # a job applied by its rows whose clean-up failed: rule 1
                return True
            address, commits = self.shard_address, self.copy_commits
            if address is None or commits is None or address(job.index_uuid, 0) is None:  # not known here: kept
                return False
            return runs_covered_in_store(self.store, runs, lambda shard: address(job.index_uuid, shard),
                                         lambda shard: commits(job.index_uuid, shard))
        except Exception as exc:  # noqa: BLE001 - kept: asked again next pass
            log.warning("ingest collection: %s kept, its records or commits unreadable (%s: %s)", job.prefix,
                        type(exc).__name__, exc)
            return False


__all__ = ["DONE_RETENTION", "ORPHAN_GRACE", "IngestCollector", "JobView", "doomed_keys", "list_jobs"]
