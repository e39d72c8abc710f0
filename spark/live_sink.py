"""The sink into a live cluster: Spark stages files, the cluster applies them once (issue 43).

When a cluster serves the store, ``df.write.format("shardstore")`` never claims a term and never
fences it.  Instead (docs/design/spark.md, "Writing into a live cluster"):

1. **Plan** (driver, :func:`plan_live`): find the live cluster (:func:`find_live`), apply the save
   mode (create the index from the DataFrame's schema when it does not exist), and name the job:
   ``spark-<random>`` (a batch job) or ``<stream>-<batch id>`` (a micro-batch).
2. **Stage** (tasks): each task attempt writes its rows as Parquet files under the job's prefix in
   the store, under names of its own.  Nothing is visible.
3. **Commit** (driver, :func:`commit_live`): the job record naming the files of the attempts Spark
   committed is written put-if-absent, then ``Client.ingest(index, job)``: a coordinator applies the
   rows through the document API (replicated, seq#-stamped, in the translog) and writes the job's
   outcome record.  A lost answer, a killed coordinator or a failover is retried by job id: the
   commit is idempotent (engine/coordinator/ingest.py).
4. **Abort**: the attempts' staged files are deleted; no job record, nothing applied.

Which case (:func:`find_live`): the option ``hosts``; else a cluster this process runs on the store
(the embedded ``Cluster``); else the nodes the store's latest cluster state names, probed.  Nodes that
all refuse the connection are gone: the job bulk-loads straight into the store (:mod:`.writer`,
which claims a term).  A node that does not answer, or answers with an error, is alive: the job
refuses to write rather than fence it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NoClusterState
from shardstore.core.records import crc32c
from shardstore.engine.client import Client, connect, in_process_client
from shardstore.engine.coordinator.ingest import IGNORED_COLUMNS, read_done, read_job, stage_table, write_job
from shardstore.engine.coordinator.ingest_job import IngestJob, StagedFile, check_job_id, files_prefix
from shardstore.engine.errors import IndexAlreadyExists, IndexNotFound, IngestJobNotFound, NodeNotReady
from shardstore.errors import ConflictError, InvalidError, ShardstoreError, UnavailableError
from shardstore.net.security import Security
from shardstore.spark.catalog import open_from_options, sink_index
from shardstore.spark.routed_rows import RoutedFiles, arrow_layout
from shardstore.spark.routed_stage import routed_layout, write_routed

log = logging.getLogger(__name__)
#: how long the probe of the nodes a cluster state names waits for an answer
PROBE_SECONDS = 5.0
#: how long a commit retries an ingest that a failover, a killed coordinator or a lost answer cut short
COMMIT_RETRY_SECONDS = 120.0
#: rows per staged file (a task's partition is split into files of at most this many rows)
FILE_ROWS = 1_000_000
_MODES = {"append": "append", "overwrite": "overwrite", "ignore": "ignore", "errorifexists": "errorifexists",
          "error": "errorifexists", "default": "errorifexists"}


class LiveClusterUnreachable(UnavailableError):
    """A cluster serves the store (its nodes are alive) but did not take this job's connection: nothing written."""


class IndexExists(ConflictError):
    """Save mode ``errorifexists`` (Spark's default) on an index that exists: nothing written."""

    def __init__(self, index: str) -> None:
        super().__init__(f"index [{index}] exists: save mode errorifexists (Spark's default) writes nothing; use "
                         f".mode('append'), 'overwrite' or 'ignore'")
        self.index = index


@dataclass(frozen=True)
class LiveJob:
    """One Spark job (or micro-batch) into a live cluster: where it stages, and how it is applied."""

    options: dict[str, str]
    hosts: tuple[str, ...]  # network addresses of the cluster; () = the cluster this process runs on the store
    index: str
    index_uuid: str
    job: str
    prefix: str
    mode: str  # "append" or "overwrite"
    skip: bool = False  # save mode "ignore" on an existing index: nothing is written
    #: the index's shard count and mapping when the plan was made (``Client.index_mapping``), for the routed layout
    layout: dict[str, Any] | None = None


@dataclass
class LiveCommitMessage(WriterCommitMessage):
    """The files one task attempt staged."""

    files: tuple[StagedFile, ...] = field(default_factory=tuple)


def save_mode(mode: str) -> str:
    """The save mode's canonical name (InvalidError naming the modes there are)."""
    canonical = _MODES.get(str(mode).strip().lower().replace("_", ""))
    if canonical is None:
        raise InvalidError(f"save mode {mode!r}: expected append, overwrite, ignore or errorifexists")
    return canonical


def _option(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    """An option by case-insensitive name."""
    return next((str(v) for k, v in options.items() if str(k).lower() == name.lower()), default)


def find_live(options: dict[str, str], store: BlobStore) -> tuple[str, ...] | None:
    """The live cluster serving ``store``: its addresses, ``()`` for the one this process runs, None when none.

    LiveClusterUnreachable when nodes the cluster state names are alive but did not answer the probe.
    """
    cluster = (_option(options, "cluster", "auto") or "auto").lower()
    if cluster not in ("auto", "none"):
        raise InvalidError(f"option cluster={cluster!r}: expected auto (write through the live cluster if there is "
                           f"one) or none (bulk-load straight into the store, fencing any cluster)")
    hosts = _option(options, "hosts")
    if hosts:
        return tuple(h.strip() for h in hosts.split(",") if h.strip())
    if cluster == "none":
        return None
    if in_process_client(store.location) is not None:
        return ()
    addresses = _state_addresses(store)
    if not addresses:
        return None
    return addresses if _probe(addresses, store.location, sink_security(options)) else None


#: the sink's options for a secured cluster (the cluster secret is never one: Spark shows options in its plans)
TLS_OPTIONS = {"tlsca": "tls_ca", "tlscert": "tls_cert", "tlskey": "tls_key"}


def sink_security(options: dict[str, str]) -> Security | None:
    """TLS and credentials for a secured cluster: options ``tlsCa`` (the nodes' CA), ``tlsCert`` and ``tlsKey``
    (mutual TLS), and the cluster secret from the driver's ``SHARDSTORE_NODE_SECRET``; None when none is given.

    An option named like a secret is refused (InvalidError): the query plan, the UI and the logs show options."""
    for k in options:
        if "secret" in str(k).lower() or "password" in str(k).lower():
            raise InvalidError(f"option {k!r}: a cluster secret is never an option (Spark shows options in its plans "
                               f"and UI); set SHARDSTORE_NODE_SECRET in the driver's environment")
    tls = {field: _option(options, name) for name, field in TLS_OPTIONS.items()}
    secret = os.environ.get("SHARDSTORE_NODE_SECRET")
    if not any(tls.values()) and not secret:
        return None
    return Security(secret=secret, **tls)


def _state_addresses(store: BlobStore) -> tuple[str, ...]:
    """The network addresses (``host:port``) of the nodes the store's latest cluster state names."""
    from shardstore.cluster_state.remote import RemoteClusterStateService
    from shardstore.cluster_state.restore import find_latest

    svc = RemoteClusterStateService(store)
    try:
        head, _chain = find_latest(svc)
    except NoClusterState:
        return ()
    nodes = svc.restore_latest(head).state.nodes
    return tuple(sorted({a for a in nodes.values() if isinstance(a, str) and a.rpartition(":")[2].isdigit()}))


def _probe(addresses: tuple[str, ...], location: str, security: Security | None = None) -> bool:
    """True if a node answers; False if every node refuses the TCP connection (no process listens: gone); else
    LiveClusterUnreachable (a node accepts and does not answer: paused, overloaded, or it refused this job)."""
    errors: list[str] = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
        except ConnectionRefusedError:
            continue  # nothing listens there: that node is gone
        except OSError as exc:
            errors.append(f"{address}: {exc or type(exc).__name__}")
            continue
        client = Client([address], timeout=PROBE_SECONDS, ready_wait=0.0, security=security)
        try:
            client.health()
            return True
        except NodeNotReady:  # an election: alive
            return True
        except ShardstoreError as exc:
            errors.append(f"{address}: {' '.join(str(exc).split())[:200]}")
        finally:
            client.close()
    if errors:
        raise LiveClusterUnreachable(f"{location}: its cluster state names nodes that are alive but did not take this "
                                     f"job ({'; '.join(errors)}); nothing written. Pass option('hosts', ...) to reach "
                                     f"them, or option('cluster', 'none') if that cluster is gone for good")
    log.info("%s: every node of the cluster state refuses connections (%s): bulk-loading into the store", location,
             addresses)
    return False


@contextmanager
def client_for(job: LiveJob | tuple[str, ...], location: str, options: dict[str, str] | None = None) -> Iterator[Client]:
    """A client of the job's cluster (the in-process one, or over the network with the options' TLS and the
    driver's cluster secret: :func:`sink_security`; closed after)."""
    hosts = job.hosts if isinstance(job, LiveJob) else job
    if options is None:
        options = job.options if isinstance(job, LiveJob) else {}
    if not hosts:
        client = in_process_client(location)
        if client is None:
            raise LiveClusterUnreachable(f"{location}: the cluster this process ran on the store is closed; nothing "
                                         f"more of the job is written")
        yield client
        return
    client = connect(",".join(hosts), connect_timeout=None,  # commit_live retries a cluster between nodes itself
                     security=sink_security(options))
    try:
        yield client
    finally:
        client.close()


def stream_id(options: dict[str, str]) -> str:
    """The id of a streaming query's jobs: option ``streamId``, else derived from its checkpoint location (a query
    restarted from its checkpoint names its batches as before: a replayed batch is the same job)."""
    explicit = _option(options, "streamId")
    if explicit:
        return check_job_id(f"stream-{explicit}")
    checkpoint = _option(options, "checkpointLocation")
    if not checkpoint:
        raise InvalidError("the shardstore streaming sink needs .option('checkpointLocation', ...) (or "
                           "option('streamId', ...)): a micro-batch is applied once by its stream and batch id")
    return "stream-" + hashlib.sha256(checkpoint.rstrip("/").encode()).hexdigest()[:20]


def mapping_from_schema(schema: Any) -> dict[str, Any]:
    """The index mapping a new index gets from a DataFrame's schema (flat and struct columns; the rest dynamic)."""
    from pyspark.sql import types as T

    def kind(dt: Any) -> Any:
        if isinstance(dt, T.StringType):
            return {"type": "keyword"}
        if isinstance(dt, T.LongType):
            return {"type": "long"}
        if isinstance(dt, (T.IntegerType, T.ShortType, T.ByteType)):
            return {"type": "integer"}
        if isinstance(dt, (T.DoubleType, T.FloatType)):
            return {"type": "double"}
        if isinstance(dt, T.BooleanType):
            return {"type": "boolean"}
        if isinstance(dt, (T.TimestampType, T.TimestampNTZType, T.DateType)):
            return {"type": "date"}
        if isinstance(dt, T.StructType):
            props = {f.name: k for f in dt.fields if (k := kind(f.dataType)) is not None}
            return {"properties": props} if props else None
        return None  # arrays, maps, binary, decimals: mapped from the values, as a client's bulk would be

    props = {f.name: k for f in schema.fields
             if f.name != "_id" and f.name not in IGNORED_COLUMNS and "." not in f.name
             and (k := kind(f.dataType)) is not None}
    return {"properties": props}


def plan_live(options: dict[str, str], schema: Any, mode: str, *, job: str | None = None) -> LiveJob | None:
    """Plan a write into the live cluster serving the store (step 1), or None when no cluster serves it."""
    mode = save_mode(mode)
    index = sink_index(options, schema)
    store = open_from_options(options)
    hosts = find_live(options, store)
    if hosts is None:
        return None
    with client_for(hosts, store.location, options) as client:
        try:
            index_uuid = client.index_uuid(index)
            exists = True
        except IndexNotFound:
            exists = False
        if exists and mode == "errorifexists":
            raise IndexExists(index)
        if not exists:
            try:
                client.create_index(index, shards=int(_option(options, "shards", "1") or 1),
                                    replicas=int(_option(options, "replicas", "1") or 1),
                                    mappings=mapping_from_schema(schema),
                                    source=_option(options, "source", "stored") or "stored")
            except IndexAlreadyExists:  # created meanwhile by another writer: written into as it is
                pass
            index_uuid = client.index_uuid(index)
        name = job or _option(options, "ingestJob") or f"spark-{uuid.uuid4().hex[:20]}"
        prefix = client.ingest_prefix(index, name)
        try:
            layout = client.index_mapping(index)
        except ShardstoreError as exc:  # a cluster of an older build: the row layout
            log.info("[%s]: no index mapping from the cluster (%s); the job stages rows", index, exc)
            layout = None
    return LiveJob(dict(options), hosts, index, index_uuid, name, prefix, "overwrite" if mode == "overwrite"
                   else "append", skip=exists and mode == "ignore", layout=layout)


def stage_rows(job: LiveJob, batches: Iterator[pa.RecordBatch], where: str) -> LiveCommitMessage:
    """Step 2 (a task attempt): stage its rows as files of at most :data:`FILE_ROWS` rows under names of its own; routed
    files, one per shard, when the job's columns are mapped exactly (spark/routed_rows.py: the cluster adopts them)."""
    store = open_from_options(job.options)
    files: list[StagedFile] = []
    pending: list[pa.RecordBatch] = []
    rows = 0
    routed: RoutedFiles | None = None
    decided = False

    def flush() -> None:
        nonlocal pending, rows
        if rows:
            table = pa.Table.from_batches(pending)
            drop = [c for c in IGNORED_COLUMNS if c in table.column_names]
            files.append(stage_table(store, job.prefix, f"{where}-{len(files)}",
                                     table.drop_columns(drop) if drop else table))
        pending, rows = [], 0

    for batch in batches:
        if not decided:  # once per task, from the batches' schema (the same in every task of the job)
            decided = True
            layout = None
            if job.layout is not None and _option(job.options, "adopt", "auto") != "false":
                layout = arrow_layout(batch.schema, job.layout["mapping"])
            if layout is not None:
                routed = RoutedFiles(store, job.prefix, where, layout, int(job.layout["shards"]), FILE_ROWS)
        if routed is not None:
            routed.add(batch)
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows >= FILE_ROWS:
            flush()
    if routed is not None:
        return LiveCommitMessage(tuple(routed.finish()))
    flush()
    return LiveCommitMessage(tuple(files))


def _attempt_name() -> str:
    """A name no other task attempt uses: partition, attempt and a random part."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    where = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx is not None else "driver"
    return f"{where}-{uuid.uuid4().hex[:12]}"


def commit_live(job: LiveJob, messages: list[Any], *, store: BlobStore | None = None,
                retry_seconds: float = COMMIT_RETRY_SECONDS) -> dict[str, Any]:
    """Step 3: write the job record, then have the cluster apply it, retrying by job id; the job's outcome.

    Once the record is written the job's files stay until a coordinator applied it (an abort then keeps
    them: :func:`abort_live`), so committing the same job id again, a replayed micro-batch included,
    can always apply it.  Each attempt starts at another host (a paused node does not hold every
    retry) and waits at most :func:`_attempt_timeout`; retries go on for ``retry_seconds`` after the
    first failure.  ``store``: the job's store when the caller has it open (else from its options).
    """
    store = store if store is not None else open_from_options(job.options)
    files = tuple(f for m in messages if isinstance(m, LiveCommitMessage) for f in m.files)
    standing = write_job(store, job.prefix, IngestJob(job.job, job.index, job.index_uuid, job.mode, files))
    if standing.files != files:  # a replayed micro-batch: the first attempt's files are applied, ours deleted
        store.delete([f.key for f in files])
    deadline: float | None = None
    started = time.perf_counter()
    hosts = job.hosts
    while True:
        try:
            with client_for(hosts, store.location, job.options) as client:
                out = client.ingest(job.index, job.job, timeout=_attempt_timeout(standing))
            log.info("spark job %s: %d rows into [%s] in %.2fs (%s; the cluster's phases: %s)", job.job,
                     out["applied"], job.index, time.perf_counter() - started,
                     "replayed" if out["replayed"] else f"applied: {out.get('path', 'rows')}",
                     ", ".join(f"{k} {v:.2f}s" for k, v in out.get("seconds", {}).items()))
            return out
        except UnavailableError as exc:  # a failover, a killed or paused coordinator, a lost answer: the same job again
            deadline = deadline or time.monotonic() + retry_seconds
            if time.monotonic() >= deadline:
                raise
            log.warning("spark job %s: ingest cut short (%s); committing it again", job.job, exc)
            hosts = hosts[1:] + hosts[:1]
            time.sleep(0.5)


def _attempt_timeout(job: IngestJob) -> float:
    """How long one ``ingest`` call may take: a minute, plus a second per 2,000 rows (a slow, loaded cluster)."""
    return 60.0 + job.rows / 2_000


def abort_live(job: LiveJob, messages: list[Any]) -> None:
    """Step 4: delete what the attempts staged, except the files a job record names (that job may still be applied:
    a retry, a replayed micro-batch)."""
    store = open_from_options(job.options)
    keys = {f.key for m in messages if isinstance(m, LiveCommitMessage) for f in m.files}
    keys |= {b.key for b in store.list(files_prefix(job.prefix))}
    try:
        keys -= {f.key for f in read_job(store, job.prefix).files}
    except IngestJobNotFound:
        pass
    if keys:
        store.delete(sorted(keys))


def write_frame(spark: Any, df: Any, options: dict[str, str], mode: str) -> bool:
    """The JVM bridge's write (every save mode): True once the job went into a live cluster, False when no cluster
    serves the store (the bulk-load paths write it)."""
    job = plan_live(options, df.schema, mode)
    if job is None:
        return False
    if not job.skip:
        _stage_and_commit(spark, df, job)
    return True


def write_batch(spark: Any, df: Any, options: dict[str, str], batch_id: int) -> None:
    """One micro-batch of ``writeStream.format("shardstore")`` (the JVM's streaming sink): ingest job
    ``<stream>-<batch id>``, applied once; a batch Spark runs again after a restart applies nothing twice."""
    job = plan_live(options, df.schema, "append", job=f"{stream_id(options)}-{batch_id}")
    if job is None:
        raise InvalidError(f"{_option(options, 'store')}: no live cluster serves this store; the streaming sink "
                           f"writes through one (start it, or pass option('hosts', ...))")
    if read_done(open_from_options(options), job.prefix) is not None:
        log.info("spark stream batch %s was applied before: nothing to do", job.job)
        return
    _stage_and_commit(spark, df, job)


def _stage_and_commit(spark: Any, df: Any, job: LiveJob) -> None:
    """Stage ``df`` and commit the job (steps 2-3).

    On a ``local[...]`` master with Spark's own Parquet writer (its commit protocol keeps one attempt's file per
    partition) into a local directory the driver then stages in the store; elsewhere the Python data source's
    tasks stage straight into the store (:class:`LiveArrowWriter`, the same job id).
    """
    if not spark.sparkContext.master.startswith("local"):
        df.write.format("shardstore-arrow").mode(job.mode).options(**{**job.options, "ingestJob": job.job}).save()
        return
    local = tempfile.mkdtemp(prefix="shardstore-stage-")
    try:
        layout = None if job.layout is None or _option(job.options, "adopt", "auto") == "false" else \
            routed_layout(df.schema, job.layout["mapping"])
        store = open_from_options(job.options)
        if layout is not None:  # one file per task and shard, adopted as segments (spark/routed_stage.py)
            written = write_routed(spark, df, layout, int(job.layout["shards"]), local + "/out", job.job)
            files = tuple(_stage_file(store, job, path, shard) for shard, path in written)
        else:
            df.write.mode("overwrite").option("compression", "zstd").parquet("file://" + local + "/out")
            parts = sorted(p for p in os.listdir(local + "/out") if p.endswith(".parquet"))
            files = tuple(_stage_file(store, job, os.path.join(local, "out", p)) for p in parts)
        commit_live(job, [LiveCommitMessage(files)])
    except BaseException:
        abort_live(job, [])
        raise
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _stage_file(store: BlobStore, job: LiveJob, path: str, shard: int | None = None) -> StagedFile:
    """One Parquet file Spark wrote, staged as it is under the job's prefix (``shard``: the one its rows route to)."""
    with open(path, "rb") as f:
        data = f.read()
    rows = pq.read_metadata(pa.BufferReader(data)).num_rows
    name = os.path.basename(path) if shard is None else f"s{shard}-{os.path.basename(path)}"
    key = files_prefix(job.prefix) + name
    store.put(key, data, if_absent=True)
    return StagedFile(key, len(data), crc32c(data), rows, shard)


class LiveArrowWriter(DataSourceArrowWriter):
    """The Python data source's writer into a live cluster (see the module docstring)."""

    def __init__(self, job: LiveJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LiveCommitMessage:
        """Stage this task attempt's rows (nothing visible)."""
        if self.job.skip:
            return LiveCommitMessage()
        return stage_rows(self.job, iterator, _attempt_name())

    def commit(self, messages: list[Any]) -> None:
        """Apply the job once."""
        if not self.job.skip:
            commit_live(self.job, messages)

    def abort(self, messages: list[Any]) -> None:
        """Delete what was staged."""
        abort_live(self.job, messages)


class LiveStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("shardstore")``: each micro-batch is one ingest job ``<stream>-<batch id>``, exactly once."""

    def __init__(self, options: dict[str, str], schema: Any, stream: str) -> None:
        self.options, self.schema, self.stream = dict(options), schema, stream
        self._first = plan_live(self.options, schema, "append", job=f"{stream}-staging")
        if self._first is None:
            raise InvalidError(f"{_option(options, 'store')}: no live cluster serves this store; the streaming sink "
                               f"writes through one (start it, or pass option('hosts', ...))")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LiveCommitMessage:
        """Stage this task attempt's rows under the stream's staging prefix (nothing visible)."""
        assert self._first is not None
        return stage_rows(self._first, iterator, _attempt_name())

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Apply micro-batch ``batchId`` once: a replay of a committed batch applies nothing."""
        assert self._first is not None
        with client_for(self._first, open_from_options(self.options).location) as client:
            job = f"{self.stream}-{batchId}"
            batch = LiveJob(self._first.options, self._first.hosts, self._first.index, self._first.index_uuid, job,
                            client.ingest_prefix(self._first.index, job), "append")
        commit_live(batch, messages)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Delete what this micro-batch's attempts staged (unless its job record names it: a replay applies it)."""
        assert self._first is not None
        with client_for(self._first, open_from_options(self.options).location) as client:
            job = f"{self.stream}-{batchId}"
            prefix = client.ingest_prefix(self._first.index, job)
        abort_live(LiveJob(self._first.options, self._first.hosts, self._first.index, self._first.index_uuid, job,
                           prefix, "append"), messages)


__all__ = ["IndexExists", "LiveArrowWriter", "LiveClusterUnreachable", "LiveCommitMessage", "LiveJob", "LiveStreamWriter",
           "abort_live", "commit_live", "find_live", "mapping_from_schema", "plan_live", "save_mode", "stage_rows",
           "stream_id", "write_batch", "write_frame"]
