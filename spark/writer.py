"""The ``shardstore`` sink: ``df.write.format("shardstore")...mode("append").save()`` (issue 7).

Protocol (docs/design/spark.md, "Writing and the changes feed"), per shard:

1. **Claim** (driver, :func:`make_writer`): term ``T' = max(newest marker, cluster-state
   term) + 2`` (one term left free for a live engine's failover), term marker written
   ``if_absent`` (taken: :class:`ConcurrentShardWriter`).  It fences the engine's live
   primaries: their next acknowledgement, flush or promotion fails.
2. **Base** (driver, after the claim): the newest remote commit and the remote translog
   above it (everything the engine acknowledged was uploaded before our claim); a
   translog tail is folded into a commit ``C0`` of ``T'`` first.
3. **Tasks** (:meth:`ShardstoreArrowWriter.write`): rows routed by murmur3 of ``_id``;
   per shard: last row per id, JSON ``_source``, fields typed against the mapping, ids
   looked up in the base (versions, old copies), a seq# range reserved in the job's
   ledger (``<segments prefix of T'>/spark/seq/<n>``, ``if_absent`` entries), ONE
   segment uploaded under a fresh key.  Nothing is visible: only committed files are read.
4. **Commit** (driver): newest marker still ``T'`` and nobody else under ``T'`` (else
   :class:`ConcurrentShardWriter`); ONE commit metadata per touched shard, ``if_absent``:
   base segments with old copies deleted + task segments (an id two tasks wrote keeps its
   highest seq#), ``max_seq_no = local_checkpoint =`` the ledger's end.  Then the job is
   marked closed and unreferenced uploads and the ledger are deleted.
5. **Abort**: the job is marked closed (a late task attempt deletes its own uploads),
   then every upload under ``T'`` no commit names, and the ledger, are deleted.

Seq#s of a failed task attempt are a gap no operation fills.  Commits are atomic per
shard, not across shards.  ``overwrite`` is not supported.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists
from shardstore.core.address import ShardAddress
from shardstore.core.records import crc32c
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.errors import ConflictError, CorruptError, InvalidError
from shardstore.segments.commit import CommitPoint, CommittedSegment
from shardstore.segments.errors import CommitConflict, CommitNotFound, TermAlreadyClaimed
from shardstore.segments.livedocs import LiveDocs, livedocs_file_name
from shardstore.segments.mapping import Mapping, sources_from_table
from shardstore.segments.read_plan import read_livedocs
from shardstore.segments.reader import ShardCommitReader
from shardstore.segments.remote_metadata import RemoteCommitMetadata, RemoteFile, data_key
from shardstore.segments.remote_store import (
    RemoteSegmentStore,
    latest_commit,
    latest_term,
    list_commit_keys,
    list_terms,
    read_metadata,
)
from shardstore.segments.segment import SegmentInfo, lookup_segments, segment_file_name, write_segment
from shardstore.spark.catalog import open_from_options, resolve_index, sink_index
from shardstore.spark.segment_files import in_parallel
from shardstore.spark.sink_rows import last_per_id, superseded_copies, typed_fields
from shardstore.translog.operations import MAX_ID_BYTES
from shardstore.translog.remote import RemoteTranslog

log = logging.getLogger(__name__)
#: Columns of a DataFrame the sink ignores (what the reader adds to every row).
IGNORED_COLUMNS = ("_seq_no", "_primary_term", "_version", "_source")
LEDGER = "spark/seq/"
#: Terms left free below the job's: a live engine promoting a replica during the job takes
#: cluster-state term + 1, which must stay below the job's term so that the job fences it.
TERM_GAP = 1
#: Written by the driver's commit (after the metadata) and abort (before the cleanup): a task
#: attempt still running then deletes what it uploaded instead of leaving it behind.
CLOSED = "spark/closed"


class ConcurrentShardWriter(ConflictError):
    """Another writer (an engine primary or another job) claimed or committed to a shard this job writes."""


@dataclass(frozen=True)
class ShardPlan:
    """What the driver claimed for one shard: the job's term and the base every task builds on."""

    shard: int
    address: ShardAddress
    term: int
    base_seq_no: int  # highest seq# of the shard's history before the job (-1: none)
    base: RemoteCommitMetadata | None  # the commit the job's commit replaces
    mapping: dict

    @property
    def prefix(self) -> str:
        """The segments prefix of the job's term."""
        return self.address.segments_prefix(self.term).rstrip("/")


@dataclass
class ShardPart:
    """One task's segment for one shard."""

    shard: int
    info: dict
    remote: RemoteFile
    # the segment's ids and seq#s in row order (the fast path's: any order, an id possibly twice); None when the
    # fast path's fingerprint screen found no id twice in the shard (segment_files.fingerprints_repeat)
    ids: pa.Array | None
    seq_nos: pa.Array | None
    deletes: dict[str, list[int]]  # base segment name -> rows of old copies
    mapping: dict


@dataclass
class ShardstoreCommitMessage(WriterCommitMessage):
    """What a task attempt wrote: one part per shard it touched."""

    parts: list[ShardPart] = field(default_factory=list)


def _superseded(parts: list[ShardPart]) -> dict[int, list[int]]:
    """superseded_copies of a shard's parts; none when the fast path's screen found every id unique (ids None)."""
    screened = [p.ids is None for p in parts]
    if all(screened):
        return {}
    if any(screened):
        raise CorruptError("a shard's parts mix screened and read-back ids (a bug of the sink's fast path); "
                           "nothing was committed")
    return superseded_copies(parts)


def make_writer(options: dict[str, str], schema: Any, overwrite: bool) -> ShardstoreArrowWriter:
    """Claim every shard of the index for this job and return the Arrow writer (see the module docstring)."""
    if overwrite:
        raise InvalidError("the shardstore sink only appends: use .mode('append') (overwrite is not supported; "
                           "delete the index through the engine first)")
    index = sink_index(options, schema)
    store = open_from_options(options)
    loc = resolve_index(store, index)
    job = f"spark{uuid.uuid4().hex[:20]}"
    with ThreadPoolExecutor(max_workers=min(8, loc.shards)) as pool:
        plans = list(pool.map(lambda s: claim_shard(store, loc.address(s), loc.primary_terms[s], job, loc.mappings),
                              range(loc.shards)))
    return ShardstoreArrowWriter(options, job, plans, source=loc.source)


def claim_shard(store: BlobStore, address: ShardAddress, state_term: int, job: str, mapping: dict) -> ShardPlan:
    """Claim term newest + 1 of one shard (``if_absent``), then read its base (folding a translog tail into C0)."""
    terms = list_terms(store, address)
    term = max([state_term] + terms[:1]) + 1 + TERM_GAP
    try:  # the segments' own claim: path strategy recorded, term marker if_absent, fencing checked
        RemoteSegmentStore(store, address, term, writer=job).claim_term(exclusive=True)
    except TermAlreadyClaimed as exc:  # (another CommitConflict, e.g. a different path strategy, goes up as it is)
        raise ConcurrentShardWriter(f"{exc}; this job claimed shard {address.index_uuid}/{address.shard} term {term} "
                                    f"at the same time: retry the job once that writer is done") from None
    try:
        base: RemoteCommitMetadata | None = latest_commit(store, address)
    except CommitNotFound:
        base = None
    above = base.commit.local_checkpoint if base else -1
    prefixes = [address.translog_prefix(t) for t in list_terms(store, address)]
    tail = [b for b in RemoteTranslog.read_operations(store, prefixes, above + 1) if b.num_rows]
    base_seq = base.commit.max_seq_no if base else -1
    if tail:
        base = fold_tail(store, address, term, job, base, tail, mapping)
        base_seq = max(base_seq, base.commit.max_seq_no)
    merged = Mapping.from_dict(mapping)
    if base is not None:
        merged = Mapping.from_dict(base.commit.mapping).with_fields({n: merged[n] for n in merged.order})
    return ShardPlan(address.shard, address, term, base_seq, base, merged.to_dict())


def fold_tail(store: BlobStore, address: ShardAddress, term: int, job: str, base: RemoteCommitMetadata | None,
              tail: list[pa.RecordBatch], mapping: dict) -> RemoteCommitMetadata:
    """Commit ``base`` + the translog operations above it as commit C0 of ``term`` (the engine is fenced by now)."""
    from shardstore.engine.shard.adoption_apply import as_index_operations
    from shardstore.segments.directory import ShardDirectory
    from shardstore.segments.remote_store import restore

    tmp = tempfile.mkdtemp(prefix="shardstore-c0-")
    try:
        if base is not None:
            restore(store, address, tmp)
        # adopted runs (docs/design/adoption.md) as the index operations they stand for: their files' rows
        ops = as_index_operations(pa.Table.from_batches(tail), store, f"shard {address.index_uuid}/{address.shard}")
        top = max(pc.max(ops.column("seq_no")).as_py(), base.commit.max_seq_no if base else -1)
        with ShardDirectory(tmp, mapping=mapping, fsync=False, warm=False) as directory:
            directory.apply(ops)
            commit = directory.flush(
                local_checkpoint=top, primary_term=term, merge=False,
                translog_uuid=base.commit.translog_uuid if base else "",
                translog_generation=base.commit.translog_generation if base else 0,
                user_data={"writer": "spark", "job": job, "global_checkpoint": str(top)})
            remote = RemoteSegmentStore(store, address, term, writer=job)
            return remote.upload(tmp, commit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def reserve_seq_nos(store: BlobStore, plan: ShardPlan, count: int, token: str) -> tuple[int, str]:
    """Reserve ``count`` consecutive seq#s in the job's ledger (``if_absent`` entries); (the first, the entry's key)."""
    prefix = f"{plan.prefix}/{LEDGER}"
    while True:
        keys = sorted(b.key for b in store.list(prefix))
        if keys:
            last = json.loads(store.get(keys[-1]))
            k, start = int(keys[-1].rsplit("/", 1)[-1]) + 1, last["start"] + last["count"]
        else:
            k, start = 0, plan.base_seq_no + 1
        body = json.dumps({"start": start, "count": count, "attempt": token}).encode()
        try:
            store.put(f"{prefix}{k:010d}", body, if_absent=True, token=token)
            return start, f"{prefix}{k:010d}"
        except BlobAlreadyExists:
            continue  # another task took entry k: read it and take the next


def ledger_end(store: BlobStore, plan: ShardPlan) -> int:
    """The highest seq# the job's ledger handed out (the base's when none)."""
    keys = sorted(b.key for b in store.list(f"{plan.prefix}/{LEDGER}"))
    if not keys:
        return plan.base_seq_no
    last = json.loads(store.get(keys[-1]))
    return int(last["start"] + last["count"] - 1)


class ShardstoreArrowWriter(DataSourceArrowWriter):
    """Writes Arrow batches as per-shard segments (tasks) and commits them once per shard (driver)."""

    def __init__(self, options: dict[str, str], job: str, plans: list[ShardPlan], source: str = "stored") -> None:
        """Hold the options (the store is reopened in each task), the job id, the shards' plans and the source mode."""
        self.options = dict(options)
        self.job = job
        self.plans = plans
        #: the index's source option: "synthetic" segments keep no JSON _source (the JSON only feeds the typing)
        self.source = source

    # -- tasks ------------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ShardstoreCommitMessage:
        """Route the task's rows, write and upload one segment per touched shard; nothing is visible yet."""
        batches = [b for b in iterator if b.num_rows]
        if not batches:
            return ShardstoreCommitMessage([])
        table = pa.Table.from_batches(batches)
        table = table.drop_columns([c for c in IGNORED_COLUMNS if c in table.column_names])
        ids = table.column("_id").combine_chunks()
        if ids.null_count:
            raise InvalidError(f"{ids.null_count} row(s) have a null _id; every row needs an id")
        if not pa.types.is_string(ids.type):
            ids = ids.cast(pa.string())
            table = table.set_column(table.schema.get_field_index("_id"), "_id", ids)
        longest = pc.max(pc.binary_length(ids)).as_py() if len(ids) else 0
        if longest > MAX_ID_BYTES:  # as the engine refuses it (and an id index cannot take ids of 32 KiB)
            raise InvalidError(f"an _id of {longest} bytes is longer than the {MAX_ID_BYTES} bytes an id may have")
        shards = shard_ids(ids, len(self.plans))
        store = open_from_options(self.options)
        attempt = f"{self.job}-{uuid.uuid4().hex[:12]}"
        uploaded: list[str] = []
        tmp = tempfile.mkdtemp(prefix="shardstore-sink-")
        try:
            parts = []
            for s in pc.unique(shards).to_pylist():
                rows = pc.indices_nonzero(pc.equal(shards, s))
                parts.append(self._write_shard(store, self.plans[s], table.take(rows), tmp, attempt, uploaded))
            for p in parts:  # after the uploads: an abort that listed before them marked the job closed first
                self._check_open(store, self.plans[p.shard])
            return ShardstoreCommitMessage(parts)
        except BaseException:
            if uploaded:  # nothing names them: they would never be read, but do not leave them behind
                store.delete(uploaded)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _check_open(self, store: BlobStore, plan: ShardPlan) -> None:
        """ConcurrentShardWriter if the job was already committed or aborted (a late or speculative attempt)."""
        if store.exists(f"{plan.prefix}/{CLOSED}"):
            raise ConcurrentShardWriter(f"spark job {self.job} was already committed or aborted (shard {plan.shard}); "
                                        f"this late task attempt's uploads are deleted")

    def _write_shard(self, store: BlobStore, plan: ShardPlan, rows: pa.Table, tmp: str, attempt: str,
                     uploaded: list[str]) -> ShardPart:
        """One shard's rows of this task as one uploaded segment (the part the commit names)."""
        rows = last_per_id(rows)  # sorted by _id, one row per id
        ids, sources = sources_from_table(rows)
        fields, mapping = typed_fields(rows, ids, sources, Mapping.from_dict(plan.mapping))
        versions, deletes = _versions_and_old_copies(store, plan, ids)
        n = len(ids)
        self._check_open(store, plan)  # an aborted job's late task uploads nothing
        start, entry = reserve_seq_nos(store, plan, n, attempt)  # (the ledger is deleted whole by commit/abort)
        try:  # closed meanwhile (the driver writes "closed" before it lists the ledger to delete it)
            self._check_open(store, plan)
        except ConcurrentShardWriter:
            store.delete([entry])  # our entry may have come after that listing: ours to delete
            raise
        if getattr(self, "source", "stored") == "synthetic":
            sources = pa.nulls(n, pa.binary())  # as the engine and the fast path write a synthetic index
        doc = pa.table([ids, pa.array(np.arange(start, start + n, dtype=np.int64)),
                        pa.array(np.full(n, plan.term, dtype=np.int64)), versions, sources] + list(fields.columns),
                       names=["_id", "_seq_no", "_primary_term", "_version", "_source"] + fields.column_names)
        name = f"seg_{uuid.uuid4().hex[:16]}"
        path = os.path.join(tmp, segment_file_name(name))
        info = write_segment(path, doc, name=name, fsync=False)
        key = f"{plan.prefix}/{data_key(info.file_name, uuid.uuid4().hex)}"
        uploaded.append(key)
        with open(path, "rb") as f:
            store.put_stream(key, f, if_absent=True, token=attempt)
        os.unlink(path)
        return ShardPart(plan.shard, info.to_dict(), RemoteFile(key, info.size, info.checksum),
                         doc.column("_id").combine_chunks(), doc.column("_seq_no").combine_chunks(), deletes,
                         mapping.to_dict())

    # -- driver -----------------------------------------------------------------------------

    def commit(self, messages: list[ShardstoreCommitMessage | None]) -> None:
        """Write ONE commit per touched shard (``if_absent``), after checking no other writer claimed it."""
        store = open_from_options(self.options)
        by_shard: dict[int, list[ShardPart]] = defaultdict(list)
        for m in messages:
            for p in (m.parts if m is not None else []):
                by_shard[p.shard].append(p)
        for s in sorted(by_shard):  # every check before any commit: a conflict leaves no shard half-written
            self._check_owner(store, self.plans[s])
        shards = sorted(by_shard)  # each shard's duplicate check (a hash pass over its ids) on a thread of its own
        dups = dict(zip(shards, in_parallel(lambda s: _superseded(by_shard[s]), shards)))
        for s in shards:
            self._commit_shard(store, self.plans[s], by_shard[s], dups[s])
        self._close(store)
        self._cleanup(store)

    def abort(self, messages: list[ShardstoreCommitMessage | None]) -> None:
        """Delete what the job uploaded that no commit names (task segments, live docs, the seq# ledger)."""
        store = open_from_options(self.options)
        self._close(store)  # first: a task attempt still uploading sees it and deletes its own files
        self._cleanup(store)

    def _close(self, store: BlobStore) -> None:
        """Mark the job closed under every shard's term (tasks check it after uploading)."""
        for plan in self.plans:
            try:
                store.put(f"{plan.prefix}/{CLOSED}", self.job.encode(), if_absent=True, token=self.job)
            except BlobAlreadyExists:
                pass

    def _check_owner(self, store: BlobStore, plan: ShardPlan) -> None:
        """ConcurrentShardWriter unless the job still owns the shard (newest term, nobody else under it)."""
        newest = latest_term(store, plan.address)
        if newest != plan.term:
            raise ConcurrentShardWriter(
                f"{store.location}: shard {plan.address.index_uuid}/{plan.shard} was claimed by term {newest} after "
                f"this job claimed term {plan.term} (an engine restore/promotion or another job); nothing of this "
                f"job was committed, rerun it")
        for key in list_commit_keys(store, plan.address, plan.term):
            if not key.endswith(f"__{self.job}"):
                raise ConcurrentShardWriter(f"{store.location}/{key}: another writer committed under this job's "
                                            f"term {plan.term} of shard {plan.shard}; nothing of this job was committed")
        foreign = next(iter(store.list(plan.address.translog_prefix(plan.term).rstrip("/") + "/")), None)
        if foreign is not None:
            raise ConcurrentShardWriter(f"{store.location}/{foreign.key}: an engine primary logged operations under "
                                        f"this job's term {plan.term} of shard {plan.shard}; nothing of this job was "
                                        f"committed")

    def _commit_shard(self, store: BlobStore, plan: ShardPlan, parts: list[ShardPart],
                      dup: dict[int, list[int]]) -> RemoteCommitMetadata:
        """Merge the task segments into the base commit and PUT the one new commit metadata (``if_absent``).

        ``dup``: :func:`_superseded` of ``parts`` (the rows a higher-seq# copy of their id supersedes).
        """
        base = plan.base
        files: dict[str, RemoteFile] = dict(base.files) if base else {}
        mapping = Mapping.from_dict(plan.mapping)
        for p in parts:
            task_mapping = Mapping.from_dict(p.mapping)
            theirs = {n: task_mapping[n] for n in task_mapping.order}  # in the order the task saw them
            clash = {f: (t, theirs[f]) for f, t in mapping.items() if f in theirs and theirs[f] != t}
            if clash:
                raise InvalidError(f"shard {plan.shard}: tasks mapped new fields differently {clash}; map the "
                                   f"fields in the index (create_index(mappings=...)) or cast the columns")
            mapping = mapping.with_fields(theirs)
        # old copies in the base commit, as the tasks found them
        doomed: dict[str, list[Any]] = defaultdict(list)
        for p in parts:
            for seg, rows in p.deletes.items():
                doomed[seg].append(rows)
        # an id written more than once (two tasks, or twice in one fast-path task): the highest seq# wins (dup)
        segments: list[CommittedSegment] = []
        for cs in (base.commit.segments if base else ()):
            rows = [r for rs in doomed.get(cs.info.name, []) for r in rs]
            segments.append(self._with_deletes(store, plan, base, cs, rows, files) if rows else cs)
        for k, p in enumerate(parts):
            info = SegmentInfo.from_dict(p.info, "spark task")
            files[info.file_name] = p.remote
            cs = CommittedSegment(info)
            rows = dup.get(k)
            segments.append(self._with_deletes(store, plan, None, cs, rows, files) if rows is not None else cs)
        top = ledger_end(store, plan)
        commit = CommitPoint(
            generation=(base.commit.generation + 1) if base else 1, primary_term=plan.term, segments=tuple(segments),
            max_seq_no=top, local_checkpoint=top,
            translog_uuid=base.commit.translog_uuid if base else "",
            translog_generation=base.commit.translog_generation if base else 0,
            history_uuid=base.commit.history_uuid if base else uuid.uuid4().hex, mapping=mapping.to_dict(),
            user_data={"writer": "spark", "job": self.job, "global_checkpoint": str(top)})
        self._check_owner(store, plan)
        try:  # the segments' own publication: fenced, if_absent, written last
            md = RemoteSegmentStore(store, plan.address, plan.term, writer=self.job).publish(
                commit, {n: files[n] for n in commit.files()})
        except CommitConflict as exc:
            raise ConcurrentShardWriter(f"{exc}; another attempt of this job's commit raced it, or a newer term "
                                        f"claimed the shard: nothing more of this job was committed") from None
        log.info("spark job %s committed shard %d: generation %d, %d segments, seq# up to %d", self.job, plan.shard,
                 commit.generation, len(segments), top)
        return md

    def _with_deletes(self, store: BlobStore, plan: ShardPlan, base: RemoteCommitMetadata | None,
                      cs: CommittedSegment, rows: list[int], files: dict[str, RemoteFile]) -> CommittedSegment:
        """``cs`` with ``rows`` also deleted: a new live-docs file uploaded under the job's term."""
        live = LiveDocs.all_live(cs.info.doc_count)
        if cs.livedocs_file is not None and base is not None:
            live = read_livedocs(store, base.files[cs.livedocs_file])  # verified against the commit's CRC32C
        live = live.delete(pa.array(sorted(set(rows)), pa.int64()))
        gen = cs.livedocs_generation + 1
        name = livedocs_file_name(cs.info.name, gen)
        data = live.encode()
        key = f"{plan.prefix}/{data_key(name, uuid.uuid4().hex)}"
        store.put(key, data, if_absent=True, token=self.job)
        remote = RemoteFile(key, len(data), crc32c(data))
        files[name] = remote
        return CommittedSegment(cs.info, gen, name, remote.size, remote.checksum, live.deleted_count)

    def _cleanup(self, store: BlobStore) -> None:
        """Delete the job's ledgers and every data blob under its terms that no commit of those terms names."""
        for plan in self.plans:
            keep: set[str] = set()
            for key in list_commit_keys(store, plan.address, plan.term):
                try:
                    keep |= {f.key for f in read_metadata(store, key).files.values()}
                except Exception:  # noqa: BLE001 - an unreadable commit: keep everything rather than guess
                    log.warning("spark job %s: cannot read %s; leaving shard %d's uploads", self.job, key, plan.shard)
                    keep = {"*"}
                    break
            doomed = [b.key for b in store.list(f"{plan.prefix}/{LEDGER}")]
            if "*" not in keep:
                doomed += [b.key for b in store.list(f"{plan.prefix}/data/") if b.key not in keep]
            if doomed:
                store.delete(doomed)


def _versions_and_old_copies(store: BlobStore, plan: ShardPlan, ids: pa.Array) -> tuple[pa.Array, dict[str, list[int]]]:
    """Per id its next version (live copy's + 1, else 1) and, per base segment, the rows of its old copies."""
    base = plan.base
    n = len(ids)
    if base is None or not base.commit.segments:
        return pa.array(np.ones(n, dtype=np.int64)), {}
    lo, hi = pc.min_max(ids).values()
    cands = [s for s in base.commit.segments if s.live_count and s.info.min_id is not None
             and s.info.min_id <= hi.as_py() and s.info.max_id >= lo.as_py()]
    if not cands:
        return pa.array(np.ones(n, dtype=np.int64)), {}
    reader = ShardCommitReader(store, base, cache=True)  # the shared disk cache: every task of the job reads these
    segs = reader.segments(cands)
    qpos, segidx, rows = lookup_segments([r for r, _ in segs], ids)
    versions = np.ones(n, dtype=np.int64)
    deletes: dict[str, list[int]] = {}
    if len(qpos):
        q_np, s_np, r_np = qpos.to_numpy(), segidx.to_numpy(), rows.to_numpy()
        for k in np.unique(s_np):
            sel = s_np == k
            seg_reader, live = segs[int(k)]
            alive = np.asarray(live.mask().take(pa.array(r_np[sel])).to_numpy(zero_copy_only=False), dtype=bool)
            if not alive.any():
                continue
            r, q = r_np[sel][alive], q_np[sel][alive]
            got = seg_reader.take(r, columns=["_version"]).column("_version").to_numpy()
            versions[q] = np.maximum(versions[q], got + 1)
            deletes[seg_reader.info.name] = r.tolist()
    return pa.array(versions), deletes


__all__ = ["ConcurrentShardWriter", "ShardstoreArrowWriter", "ShardstoreCommitMessage", "make_writer"]
