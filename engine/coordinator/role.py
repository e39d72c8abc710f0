"""The coordinating role of a node process: the document API over the network (issue 29).

Every node answers ``client.*`` actions.  Its :class:`Coordinator` is the
:class:`~shardstore.engine.coordinator.documents.DocumentRouter` of the one document API
(:class:`~shardstore.engine.coordinator.documents.Documents`, shared with the embedded ``Cluster``):
it reads routing from the cluster state this node applied, sends each shard's operations
to the primary's node (``shard.bulk``) and mapping updates to the cluster manager
(``cm.put_mapping``).

Retries never apply a write twice.  A shard write is retried (after the routing moved
on, up to ``failover_wait`` seconds) only when it is known not to have been applied:
the request never reached the primary's node (``NodeDisconnected.delivered`` False), or
that node answered ``ShardUnavailable`` (it holds no primary of that shard) before
touching anything.  A lost answer (``delivered`` None or True), or a primary that
applied but could not acknowledge (``WriteNotAcknowledged``), is reported per item, not
acknowledged; the caller may retry by id (docs/design/transport.md, "What is retried").
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pyarrow as pa

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.coordination import ClusterManagerNode
from shardstore.core.ops import FIELDS_COLUMN
from shardstore.engine.coordinator.bulk_parts import group_by_node, take_answers, unsent
from shardstore.engine.coordinator.cluster_view import build_view
from shardstore.engine.coordinator.documents import Documents
from shardstore.engine.coordinator.ingest import run_ingest
from shardstore.engine.coordinator.ingest_job import StagedFile, job_prefix
from shardstore.engine.coordinator.view_reads import advance_past_released, read_all_at_once, tag_of
from shardstore.engine.errors import ClusterClosed, IndexNotFound, InvalidRequest, NodeNotReady, ShardUnavailable
from shardstore.engine.manager.metadata import IndexMeta, indices_from_state
from shardstore.engine.node.data_role import call_manager
from shardstore.errors import ShardstoreError
from shardstore.segments.mapping import Mapping
from shardstore.transport import NodeDisconnected

log = logging.getLogger(__name__)
#: a coordinator waits this long for a failover before it reports a shard write as failed
FAILOVER_WAIT = 15.0
#: once the routing moved away from a primary a request is in flight on, how long its answer is still awaited
#: (a primary that failed its own copy reports it, then answers with the cause: LocalDiskError, not "unknown")
MOVED_GRACE = 0.5
#: seconds the cluster view waits for a member's list of copies (one that does not answer is shown as such)
VIEW_TIMEOUT = 2.0


class Coordinator:
    """Routes a node's ``client.*`` requests (see the module docstring)."""

    def __init__(self, name: str, coordination: ClusterManagerNode, send: Callable[..., Any], *,
                 failover_wait: float = FAILOVER_WAIT, address: str | None = None,
                 store: BlobStore | None = None) -> None:
        self.name = name
        self._store = store  # where ingest jobs' staged files are (the cluster's repository)
        self._address = address  # where clients reach this node
        self.coordination = coordination
        self._send = send
        self.failover_wait = failover_wait
        self.documents = Documents(self)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"coord-{name}")
        self._inflight = ThreadPoolExecutor(max_workers=32, thread_name_prefix=f"coord-send-{name}")
        self._cache: tuple[Any, dict[str, IndexMeta]] | None = None
        self._mappings: dict[str, tuple[dict, Mapping]] = {}
        self.closed = False

    # -- routing ----------------------------------------------------------------------------------

    def _indices(self) -> dict[str, IndexMeta]:
        state = self.coordination.applied
        if state is None:
            return {}
        cached = self._cache
        if cached is not None and cached[0] is state:
            return cached[1]
        indices = indices_from_state(state)
        self._cache = (state, indices)
        return indices

    def index_meta(self, index: str) -> IndexMeta:
        """The index's metadata from the applied cluster state (IndexNotFound)."""
        if self.closed:
            raise ClusterClosed(f"index [{index}]")
        meta = self._indices().get(index)
        if meta is None:
            raise IndexNotFound(index)
        return meta

    def mapping_of(self, meta: IndexMeta) -> Mapping:
        """The index mapping of ``meta`` (parsed once per mappings dict)."""
        cached = self._mappings.get(meta.uuid)
        if cached is None or cached[0] is not meta.mappings:
            cached = (meta.mappings, Mapping.from_dict(meta.mappings))
            self._mappings[meta.uuid] = cached
        return cached[1]

    def _ask_translog_collection(self) -> None:
        """After a flush: ask the manager for a pass of the dead-stream collection (engine/manager/translog_gc.py).
        Best effort and bounded: the manager's timer runs one anyway."""
        master = self.coordination.master
        if master is None:
            return
        try:
            self._send(master, "cm.collect_translog", {}, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - see above
            log.debug("%s: no translog collection asked of %s: %r", self.name, master, exc)

    def _manager(self, action: str, request: dict[str, Any], *, idempotent: bool = False) -> Any:
        """Send to the elected cluster manager, waiting out an election (up to ``failover_wait``).

        An ``idempotent`` request (a mapping update is a compare-and-set on the mapping it read, a
        health read changes nothing) is asked again of the next manager as soon as this node
        follows another one: a manager cut off mid-call does not hold the bulk for a whole
        request timeout (issue 41; embedded launcher, a blackholed manager).
        """
        if self.coordination.superseded is not None:  # another cluster took the store over: no retry helps
            raise self.coordination.superseded
        try:
            return call_manager(self._send, lambda: self.coordination.master, self.name, action, request,
                                self.failover_wait, idempotent=idempotent,
                                attempt_timeout=self.failover_wait if idempotent else None,
                                pool=self._inflight if idempotent else None)
        except ShardstoreError:
            if self.coordination.superseded is not None:  # learnt while waiting for a manager
                raise self.coordination.superseded from None
            raise

    def commit_mapping(self, index: str, base: Mapping, proposed: Mapping) -> Mapping:
        """Have the cluster manager commit ``proposed`` unless the mapping moved on; the mapping after."""
        after = self._manager("cm.put_mapping", {"index": index, "base": base.to_dict(),
                                                 "proposed": proposed.to_dict()}, idempotent=True)
        return Mapping.from_dict(after)

    def write_shard(self, meta: IndexMeta, shard: int, ops: pa.RecordBatch, expect: tuple | None,
                    mapping: Mapping | None, fields: pa.Table | None, request_id: str | None = None) -> pa.RecordBatch:
        """Send one shard's operations to its primary; retried on a failover when not applied, or when the write has
        a ``request_id``: whichever primary gets it again answers its first attempt's outcome if it was applied
        (engine/shard/request_ledger.py)."""
        request = {"index_uuid": meta.uuid, "shard": shard, "ops": ops, "fields": _fields_to_send(ops, fields),
                   "expect": None if expect is None else list(expect),
                   "mapping": None if mapping is None else mapping.to_dict(), "request": request_id}
        return self._write_on_primary(meta, shard, "shard.bulk", request, request_id)["ops"]

    def adopt_file(self, meta: IndexMeta, shard: int, file: StagedFile, request_id: str) -> dict[str, Any]:
        """Have the shard's primary adopt a routed staged file (``shard.adopt``), retried on a failover by its request
        id as a write is; the primary's answer (``seq_no_base``, ``rows``, ``primary_term``, ``reapplied``)."""
        request = {"index_uuid": meta.uuid, "shard": shard, "request": request_id,
                   "mapping": self.mapping_of(meta).to_dict(),  # every copy takes the index's fields in first
                   "file": {"key": file.key, "size": file.size, "crc32c": file.crc32c, "rows": file.rows}}
        return self._write_on_primary(meta, shard, "shard.adopt", request, request_id)

    def _write_on_primary(self, meta: IndexMeta, shard: int, action: str, request: dict[str, Any],
                          request_id: str | None) -> Any:
        """Send a write to the shard's primary, waiting out a failover (see :meth:`write_shard`)."""
        deadline = time.monotonic() + self.failover_wait
        seen: tuple[str | None, int] | None = None
        while True:
            sr = self.index_meta(meta.name).routing[shard]
            try:
                if sr.primary is None:
                    raise ShardUnavailable(meta.name, shard, "no primary")
                return self._while_routed(meta.name, shard, sr, action, request)
            except (NodeDisconnected, ShardUnavailable) as exc:
                if isinstance(exc, NodeDisconnected) and exc.delivered is not False and request_id is None:
                    raise  # it may have been applied, and nothing could tell: reported, never sent twice
                if time.monotonic() >= deadline:
                    raise
                seen = (sr.primary, sr.primary_term)
                # the routing moving on, or a quarter second: a copy published as the primary takes writes once
                # its promotion ran (the routing is committed first, issue 41), without another routing change
                self._wait_for_routing(meta.name, shard, seen, min(deadline, time.monotonic() + 0.25))

    def write_shards(self, meta: IndexMeta, parts: list[tuple[int, pa.RecordBatch, pa.Table | None]],
                     mapping: Mapping | None, request_id: str | None = None) -> list[pa.RecordBatch | BaseException]:
        """One bulk's parts, one ``shard.bulk_many`` per primary node (in parallel); per part the stamped
        operations or the error.  A part whose node held no primary, or a request that never reached its
        node, goes through :meth:`write_shard`, which waits out a failover (engine/coordinator/bulk_parts.py)."""
        out: list[pa.RecordBatch | BaseException | None] = [None] * len(parts)
        routing = self.index_meta(meta.name).routing
        groups = group_by_node([p[0] for p in parts], lambda s: routing[s].primary)
        wire_mapping = None if mapping is None else mapping.to_dict()

        def one(i: int) -> pa.RecordBatch | BaseException:
            try:
                return self.write_shard(meta, parts[i][0], parts[i][1], None, mapping, parts[i][2], request_id)
            except Exception as exc:  # noqa: BLE001 - reported for this part
                return exc

        def send(node: str | None, positions: list[int]) -> None:
            if node is None or len(positions) == 1:
                for i in positions:
                    out[i] = one(i)
                return
            request = {"shards": [{"index_uuid": meta.uuid, "shard": parts[i][0], "ops": parts[i][1],
                                   "fields": _fields_to_send(parts[i][1], parts[i][2]), "mapping": wire_mapping,
                                   "request": request_id}
                                  for i in positions]}
            try:
                answer = self._while_routed_many(meta.name, [parts[i][0] for i in positions], node, request)
            except Exception as exc:  # noqa: BLE001 - sent again part by part if it never arrived, or has an id
                again = unsent(exc) or (request_id is not None and isinstance(exc, NodeDisconnected))
                for i in positions:
                    out[i] = one(i) if again else exc
                return
            take_answers(positions, answer, out, one)

        items = list(groups.items())
        if len(items) == 1:
            send(*items[0])
        else:
            list(self._inflight.map(lambda item: send(*item), items))
        return out  # type: ignore[return-value]

    def _while_routed_many(self, index: str, shards: list[int], node: str, request: dict[str, Any]) -> list[Any]:
        """``shard.bulk_many`` to ``node``; given up (outcome unknown) once any of the shards' primary moved."""
        routing = self.index_meta(index).routing
        seen = {s: (routing[s].primary, routing[s].primary_term) for s in shards}
        future = self._inflight.submit(self._send, node, "shard.bulk_many", request)
        while True:
            try:
                return future.result(timeout=0.05)["results"]
            except FutureTimeout:
                now = self.index_meta(index).routing
                moved = [s for s in shards if (now[s].primary, now[s].primary_term) != seen[s]]
                if moved:
                    raise NodeDisconnected(self.name, node, "shard.bulk_many", f"the primary of shard {moved[0]} "
                                           f"moved while the request was in flight", delivered=None) from None

    def _while_routed(self, index: str, shard: int, sr: Any, action: str, request: dict[str, Any]) -> Any:
        """Send to the shard's primary; give up (outcome unknown) once the routing moved away from it.

        A primary that stops answering (paused, cut off) would hold the caller for the whole request
        timeout; once fault detection removed it and the shard's (primary, term) changed, the answer
        cannot be an acknowledgement any more, so the caller hears at once (the request's thread
        finishes in the background).
        """
        future = self._inflight.submit(self._send, sr.primary, action, request)
        while True:
            try:
                return future.result(timeout=0.05)
            except FutureTimeout:
                now = self.index_meta(index).routing[shard]
                if (now.primary, now.primary_term) != (sr.primary, sr.primary_term):
                    with contextlib.suppress(FutureTimeout):  # a primary that failed its copy answers why, soon
                        return future.result(timeout=MOVED_GRACE)
                    raise NodeDisconnected(self.name, sr.primary, action, f"the shard's primary moved to "
                                           f"{now.primary} (term {now.primary_term}) while the request was in "
                                           f"flight", delivered=None) from None

    def _wait_for_routing(self, index: str, shard: int, seen: tuple[str | None, int], deadline: float) -> None:
        """Block until the shard's (primary, term) differs from ``seen`` and has a primary, or the deadline."""
        while time.monotonic() < deadline:
            sr = self.index_meta(index).routing[shard]
            if (sr.primary, sr.primary_term) != seen and sr.primary is not None:
                return
            time.sleep(0.02)

    def read_doc(self, meta: IndexMeta, shard: int, doc_id: str) -> dict[str, Any] | None:
        """The document from the shard's primary (realtime)."""
        return self._on_primary(meta.name, shard, "shard.get", {"id": doc_id})

    def run_parallel(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``[fn(x) for x in items]`` on the coordinator's threads."""
        return list(self._pool.map(fn, items))

    def _on_primary(self, index: str, shard: int, action: str, extra: dict[str, Any]) -> Any:
        """A read on the shard's primary, retried on another routing while a failover runs."""
        deadline = time.monotonic() + self.failover_wait
        while True:
            meta = self.index_meta(index)
            sr = meta.routing[shard]
            try:
                if sr.primary is None:
                    raise ShardUnavailable(index, shard, "no primary")
                return self._send(sr.primary, action, {"index_uuid": meta.uuid, "shard": shard, **extra})
            except (NodeDisconnected, ShardUnavailable):
                if time.monotonic() >= deadline:
                    raise
                # the routing moving on, or a quarter second: a primary outside its read lease for a moment
                # (it just joined, a check was slow) answers again once a check succeeds (issue 41)
                self._wait_for_routing(index, shard, (sr.primary, sr.primary_term),
                                       min(deadline, time.monotonic() + 0.25))

    def _on_copies(self, index: str, action: str, extra: dict[str, Any] | None = None, *,
                   parallel: bool = False) -> None:
        """``action`` (with ``extra``) on every copy of every shard (refresh, flush, a held view), the primary first.

        A copy that fails is asked again (a quarter second later, or once the routing moved on)
        until it succeeds or leaves the routing (failed by the manager, rebuilt), for up to
        ``failover_wait``: skipping it at once is wrong when the routing this node holds is stale
        and the copy it takes for a replica already is the primary a read goes to next (process
        simulator seed 294: a refresh "done", then a scan without the refreshed writes).  Past
        the wait a replica is skipped and a primary's failure raised.  A copy that becomes the
        primary meanwhile runs the action again, as the primary.  ``parallel``: the shards at once (each shard's
        copies still one after the other).
        """
        meta = self.index_meta(index)
        if parallel:
            self.run_parallel(lambda shard: self._on_shard_copies(index, shard, action, extra), list(range(meta.shards)))
        else:
            for shard in range(meta.shards):
                self._on_shard_copies(index, shard, action, extra)

    def _on_shard_copies(self, index: str, shard: int, action: str, extra: dict[str, Any] | None) -> None:
        """:meth:`_on_copies` for one shard."""
        meta = self.index_meta(index)
        deadline = time.monotonic() + self.failover_wait
        done: set[str] = set()
        primary = self.index_meta(index).routing[shard].primary
        while True:
            sr = self.index_meta(index).routing[shard]
            if sr.primary != primary:
                primary = sr.primary
                done.discard(primary)  # again, as the primary
            pending = [n for n in sr.copies if n not in done]
            if not pending:
                break
            node = primary if primary in pending else pending[0]
            try:
                self._send(node, action, {"index_uuid": meta.uuid, "shard": shard, **(extra or {})})
            except (NodeDisconnected, ShardUnavailable):
                if time.monotonic() < deadline:
                    self._wait_for_routing(index, shard, (sr.primary, sr.primary_term),
                                           min(deadline, time.monotonic() + 0.25))
                    continue
                if node == sr.primary:
                    raise
                log.info("%s/%d: %s on %s skipped: the copy failed for %.0fs", index, shard, action, node,
                         self.failover_wait)
            done.add(node)

    # -- client actions -----------------------------------------------------------------------------

    def handle(self, action: str, req: dict[str, Any]) -> Any:
        """Transport entry point for ``client.*`` actions."""
        if action == "client.bulk":
            return self.documents.bulk(req["index"], req["docs"], request=req.get("request")).items
        if action == "client.index_doc":
            return self.documents.index_doc(req["index"], req["doc"], if_seq_no=req.get("if_seq_no"),
                                            if_primary_term=req.get("if_primary_term"),
                                            request=req.get("request")).items
        if action == "client.delete":
            return self.documents.delete(req["index"], req["id"], if_seq_no=req.get("if_seq_no"),
                                         if_primary_term=req.get("if_primary_term"), request=req.get("request")).items
        if action == "client.get":
            return self.documents.get(req["index"], req["id"])
        if action == "client.create_index":
            return self._manager("cm.create_index", req)
        if action == "client.refresh":
            self._on_copies(req["index"], "shard.refresh")
            return True
        if action == "client.flush":
            self._on_copies(req["index"], "shard.flush")
            self._ask_translog_collection()
            return True
        if action == "client.count":
            return sum(int(a["count"]) for a in self._read_views(req["index"], "shard.count", {}))
        if action == "client.scan":
            answers = self._read_views(req["index"], "shard.scan", {"columns": req.get("columns")})
            tables = [a["table"] for a in answers if a["table"] is not None]
            return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        if action == "client.health":
            return self._manager("cm.health", {"index": req.get("index")}, idempotent=True)
        if action == "client.primary_of":
            meta, shard = self.index_meta(req["index"]), req["shard"]
            if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < meta.shards:
                raise InvalidRequest(f"index [{meta.name}] has shards 0..{meta.shards - 1}, not {shard!r}")
            return meta.routing[shard].primary
        if action == "client.routing":
            meta = self.index_meta(req["index"])
            nodes = self.coordination.applied.nodes if self.coordination.applied is not None else {}
            return {"shards": meta.shards,
                    "primaries": [nodes.get(sr.primary) if sr.primary != self.name else self._address
                                  for sr in meta.routing]}
        if action == "client.ingest":
            return self._ingest(req["index"], self._ingest_prefix(req["index"], req["job"]))
        if action == "client.ingest_prefix":
            return self._ingest_prefix(req["index"], req["job"])
        if action == "client.index_uuid":
            return self.index_meta(req["index"]).uuid
        if action == "client.index_mapping":
            meta = self.index_meta(req["index"])
            return {"shards": meta.shards, "mapping": self.mapping_of(meta).to_dict()}
        if action == "client.cluster":
            return self._cluster_view()
        raise InvalidRequest(f"node {self.name}: unknown client action {action!r}")

    def _read_views(self, index: str, action: str, extra: dict[str, Any]) -> list[dict[str, Any]]:
        """``action`` on every shard's primary, tagged, showing each ingest job all at once or nothing of it
        (engine/coordinator/view_reads.py)."""
        return read_all_at_once(self._tagged_read(index, action, extra), tag_of, self._release_on(index),
                                what=f"{action} of [{index}]")

    def _tagged_read(self, index: str, action: str, extra: dict[str, Any]) -> Callable[[], list[dict[str, Any]]]:
        """A read of ``action`` on every shard's primary, each answer tagged with its view (view_reads.py)."""
        shards = [sr.shard for sr in self.index_meta(index).routing]
        key = "count" if action == "shard.count" else "table"

        def read() -> list[dict[str, Any]]:
            answers = [self._on_primary(index, shard, action, {**extra, "tagged": True}) for shard in shards]
            return [a if isinstance(a, dict) else {key: a} for a in answers]  # a node of an older build: untagged

        return read

    def _release_on(self, index: str) -> Callable[[str, int], None]:
        """``release(job, shard)``: ingest job ``job``'s hold ended on every copy of one shard of ``index``."""
        return lambda job, shard: self._on_shard_copies(index, shard, "shard.release_view", {"job": job})

    def _cluster_view(self) -> dict[str, Any]:
        """``client.cluster``: health, nodes and shard copies as an operator reads them (engine/coordinator/cluster_view.py)."""
        state = self.coordination.applied
        if state is None:
            raise NodeNotReady(self.name)
        nodes = dict(state.nodes)
        held: dict[str, Any] = {}

        def ask(node: str) -> None:
            try:
                held[node] = self._send(node, "node.shards", {}, timeout=VIEW_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - shown as the node's error, never waited for
                held[node] = exc
        list(self._inflight.map(ask, nodes))
        health: dict[str, Any]
        if self.coordination.master is None:  # shown at once: an operator looks when something is wrong
            answering = sorted(n for n, a in held.items() if not isinstance(a, BaseException))
            health = {"error": f"no elected cluster manager: red, nothing can be written; {self.name} follows none "
                               f"(the cluster-manager-eligible nodes that answer must be a majority; answering here: "
                               f"{', '.join(answering) or 'none'})"}
        else:
            try:
                health = dict(self._manager("cm.health", {}, idempotent=True))
            except ShardstoreError as exc:
                health = {"error": f"{type(exc).__name__}: {exc}"}
        view = build_view(cluster_uuid=state.cluster_uuid, manager=self.coordination.master,
                          term=state.term, version=state.version, answered_by=self.name, nodes=nodes,
                          indices=self._indices(), held=held, health=health)
        return json.loads(json.dumps(view, default=str))  # plain data on every transport

    def _ingest_prefix(self, index: str, job: str) -> str:
        """Where ingest job ``job`` of ``index`` stages its files and records (engine/coordinator/ingest_job.py)."""
        meta, state = self.index_meta(index), self.coordination.applied
        return job_prefix(state.cluster_uuid, meta.uuid, job)

    def _ingest(self, index: str, prefix: str) -> dict[str, Any]:
        """Apply the ingest job staged under ``prefix`` (engine/coordinator/ingest.py); its outcome."""
        if self._store is None:
            raise InvalidRequest(f"node {self.name} has no repository to read ingest jobs from")

        def scan_ids(name: str) -> pa.Array:
            self._on_copies(name, "shard.refresh")
            tables = [self._on_primary(name, sr.shard, "shard.scan", {"columns": ["_id"]})
                      for sr in self.index_meta(name).routing]
            ids = [t.column("_id") for t in tables if t is not None and t.num_rows]
            return pa.chunked_array([c for i in ids for c in i.chunks], pa.string()).combine_chunks()

        def hold(job: str, seconds: float) -> None:
            self._on_copies(index, "shard.hold_view", {"job": job, "seconds": seconds}, parallel=True)

        def advance(job: str) -> bool:
            # before the first row: no released job is shown by one shard and hidden by another (view_reads.py); a
            # failure (a node of an older build, a copy gone) leaves those views as they are and the job goes on.
            # True when an advance was sent: the caller then holds every copy again before the first row
            sent: list[bool] = []

            def send() -> None:
                sent.append(True)
                self._on_copies(index, "shard.advance_view", {"job": job}, parallel=True)

            try:
                advance_past_released(self._tagged_read(index, "shard.count", {}), tag_of, job, send,
                                      self._release_on(index), what=f"[{index}] ingest job")
            except Exception as exc:  # noqa: BLE001 - visibility of other jobs only; this job's holds stand
                log.warning("[%s] ingest job %s: views not advanced past released jobs (%s: %s)", index, job,
                            type(exc).__name__, exc)
            return bool(sent)

        def release(job: str) -> None:
            # the job's rows are written to segments first, behind the primaries' held views (replicas serve no
            # reads; a promoted one refreshes); the releases then only flip the views, the shards at once.  A
            # refresh that fails here is the release's to redo: every copy is released all the same
            def refresh(shard: int) -> None:
                try:
                    self._on_primary(index, shard, "shard.refresh", {})
                except Exception as exc:  # noqa: BLE001 - the release refreshes again
                    log.info("%s/%d: refresh before the release of ingest job %s failed (%r)", index, shard, job, exc)

            self.run_parallel(refresh, list(range(self.index_meta(index).shards)))
            self._on_copies(index, "shard.release_view", {"job": job}, parallel=True)

        def adopt(shard: int, file: StagedFile, request_id: str) -> dict[str, Any]:
            return self.adopt_file(self.index_meta(index), shard, file, request_id)

        def flush(shards: list[int]) -> None:
            # on a thread of its own: the job is done and released; the flush only lets the collector delete its files
            # sooner (ingest_adopt.py), so the commit's answer does not wait for it
            def run() -> None:
                try:
                    self.run_parallel(lambda shard: self._on_shard_copies(index, shard, "shard.flush", None), shards)
                except Exception as exc:  # noqa: BLE001 - the shards' next flushes cover the runs
                    log.info("[%s] flush after an adopted job failed (%s: %s)", index, type(exc).__name__, exc)

            threading.Thread(target=run, name=f"adopted-flush-{index}", daemon=True).start()

        return run_ingest(self.documents, self._store, index, prefix, scan_ids=scan_ids, hold=hold, advance=advance,
                          release=release, adopt=adopt, flush=flush)

    def close(self) -> None:
        """Stop taking requests."""
        self.closed = True
        self._pool.shutdown(wait=False)
        self._inflight.shutdown(wait=False)


def _fields_to_send(ops: pa.RecordBatch, fields: pa.Table | None) -> pa.Table | None:
    """The parsed fields a shard request carries: none when the operations hold them as their ``fields`` column
    (the primary takes them from there: the same columns were sent twice, 12.8 MB for 65,536 flights rows)."""
    return None if FIELDS_COLUMN in ops.schema.names else fields
