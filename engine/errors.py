"""Typed errors of the engine (indices, shards, nodes), under the kinds of :mod:`shardstore.errors`.

Each class sits under exactly one kind, so a caller may catch by subsystem
(``EngineError``) or by what to do about it (``ConflictError``: re-read, ``UnavailableError``:
retry later...).  Every message names what was wrong and says whether the operation was
applied: "not applied", "NOT acknowledged", or, for a lost response, "may have been applied".

``NodeDisconnected`` and ``NodeNotFound`` belong to the transport (:mod:`shardstore.transport`,
under ``TransportError``, not ``EngineError``); they are re-exported here because the engine
raises them too.  Catch them by kind (``UnavailableError``, ``NotFoundError``) or by name.
"""

from __future__ import annotations

from shardstore.errors import (
    ConflictError,
    CorruptError,
    InvalidError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)

# the transport's errors, raised by the engine too (re-exported: callers catch them from here)
from shardstore.transport import NodeDisconnected as NodeDisconnected
from shardstore.transport import NodeNotFound as NodeNotFound


class EngineError(ShardstoreError):
    """Base of every engine error."""


class VersionConflict(EngineError, ConflictError):
    """An ``if_seq_no`` / ``if_primary_term`` condition did not hold; the write was not applied.

    ``actual_seq_no`` / ``actual_primary_term`` are None when the document does not exist.
    """

    def __init__(
        self,
        doc_id: str,
        expected_seq_no: int,
        expected_primary_term: int,
        actual_seq_no: int | None,
        actual_primary_term: int | None,
        *,
        index: str | None = None,
        shard: int | None = None,
    ) -> None:
        where = "".join(f"[{p}]" for p in (index, shard) if p is not None)
        where = f"{where} " if where else ""
        if actual_seq_no is None:
            current = "the document does not exist"
        else:
            current = f"the current document has seq_no [{actual_seq_no}] and primary term [{actual_primary_term}]"
        super().__init__(
            f"{where}document {doc_id!r}: version conflict, required seq_no [{expected_seq_no}] and "
            f"primary term [{expected_primary_term}] but {current}; the write was not applied"
        )
        self.doc_id = doc_id
        self.expected_seq_no = expected_seq_no
        self.expected_primary_term = expected_primary_term
        self.actual_seq_no = actual_seq_no
        self.actual_primary_term = actual_primary_term
        self.index = index
        self.shard = shard


class StalePrimary(EngineError, ConflictError):
    """A copy acted as primary but its term was superseded (or it is no primary at all).

    The message always says the operation was NOT acknowledged: a client must not count
    such a write as durable (it may exist on the stale copy, never in the acked history).
    """

    def __init__(self, message: str, *, term: int | None = None, current_term: int | None = None) -> None:
        if "acknowledged" not in message.lower():
            message = f"{message}; the operation was NOT acknowledged"
        super().__init__(message)
        self.term = term
        self.current_term = current_term


class OperationTermTooOld(EngineError, ConflictError):
    """A replica refused operations of a primary term below the one it knows; they were not applied."""

    def __init__(self, message: str, *, op_term: int | None = None, known_term: int | None = None) -> None:
        super().__init__(message)
        self.op_term = op_term
        self.known_term = known_term


class IndexNotFound(EngineError, NotFoundError):
    """The index named does not exist; nothing was applied."""

    def __init__(self, index: str) -> None:
        super().__init__(f"no such index [{index}]; nothing was applied")
        self.index = index


class IndexAlreadyExists(EngineError, ConflictError):
    """An index of that name exists already; it was not created again (nor changed)."""

    def __init__(self, index: str) -> None:
        super().__init__(f"index [{index}] already exists; it was not created again")
        self.index = index


class ShardUnavailable(EngineError, UnavailableError):
    """A shard has no active primary (or its node is down); the operation was not applied, retry later."""

    def __init__(self, index: str, shard: int, reason: str) -> None:
        super().__init__(f"[{index}][{shard}] unavailable: {reason}; the operation was not applied, retry later")
        self.index = index
        self.shard = shard
        self.reason = reason


class WriteNotAcknowledged(EngineError, UnavailableError):
    """A primary applied a write but could not acknowledge it (a replica failed and the cluster manager could not
    be told): it may be in the shard's history.  Not retried by a coordinator; the caller may retry (by id)."""

    def __init__(self, index: str, shard: int, reason: str) -> None:
        super().__init__(f"[{index}][{shard}] write NOT acknowledged: {reason}; it may have been applied")
        self.index = index
        self.shard = shard
        self.reason = reason


class NodeNotReady(EngineError, UnavailableError):
    """The node asked has not joined an elected cluster manager yet (it just started, or lost its manager);
    nothing was applied.  Another node, or the same one a moment later, can serve the call."""

    def __init__(self, node: str) -> None:
        super().__init__(f"node {node!r} has not joined a cluster manager yet; nothing was applied; retry on "
                         f"another node")
        self.node = node


class NoNodeReachable(EngineError, UnavailableError):
    """``connect()``: no address answered in time; names every address tried and why (a wrong port, a node not
    started yet, TLS or credentials refused).  Retry once a node is up."""

    def __init__(self, tried: dict[str, str], seconds: float) -> None:
        causes = "; ".join(f"{a}: {why}" for a, why in tried.items())
        super().__init__(f"no node answered: {causes} (each address tried at once, waited for at most {seconds:g}s)")
        self.tried = tried


class IndexNotCreated(EngineError, UnavailableError):
    """An index could not be created (its metadata was not committed, or no data node is up); it takes no writes."""

    def __init__(self, index: str, reason: str) -> None:
        super().__init__(f"[{index}] not created: {reason}; no shard of it was allocated, retry later")
        self.index = index
        self.reason = reason


class ClusterClosed(EngineError, UnavailableError):
    """The cluster was closed (its process stopping, the coordinator gone); a call in flight may or may not have
    applied.  The same call against a restarted (restored) cluster may succeed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: the cluster is closed; a write in flight may or may not have been applied; "
                         f"retry it against a restarted cluster (Cluster.restore)")


class InvalidRequest(EngineError, InvalidError):
    """A request is malformed (bad shard count, missing id...); nothing was applied."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid request: {reason}; nothing was applied")
        self.reason = reason


class InvalidIndexName(InvalidRequest):
    """An index name breaks the naming rules (Elasticsearch's); nothing was created."""

    def __init__(self, name: object, rule: str) -> None:
        super().__init__(f"invalid index name {name!r}: {rule}")
        self.name = name
        self.rule = rule


class DocumentRejected(EngineError, InvalidError):
    """One bulk item breaks a document rule (a limit, a value JSON cannot hold, a mapping conflict).

    The item got no seq# and exists on no copy; the other items of its bulk are unaffected.
    ``position`` is the item's place in the bulk, ``field`` the dotted field at fault (None
    for the document as a whole), ``rule`` the rule it broke.
    """

    def __init__(self, position: int, doc_id: object, field: str | None, rule: str) -> None:
        who = f"document {position}" + (f" (id {doc_id!r})" if doc_id is not None else "")
        where = f" field {field!r}:" if field is not None else ""
        super().__init__(f"{who}:{where} {rule}; this item was not applied")
        self.position = position
        self.doc_id = doc_id
        self.field = field
        self.rule = rule


class MappingNotCommitted(EngineError, UnavailableError):
    """A bulk needed new fields in the index mapping, and the cluster state did not commit them; nothing was applied."""

    def __init__(self, index: str, fields: list[str], cause: BaseException) -> None:
        super().__init__(f"index [{index}]: mapping update for {fields} not committed to the cluster state "
                         f"({type(cause).__name__}: {cause}); nothing of this bulk was applied, retry it")
        self.index = index
        self.fields = fields


class DataDirInUse(EngineError, ConflictError):
    """Another cluster holds the data directory; nothing was written to the store."""

    def __init__(self, data_dir: str, holder: str) -> None:
        super().__init__(f"data directory {data_dir!r} is in use by another cluster ({holder}); stop that cluster "
                         f"or give this one its own data_dir; nothing was written to the store")
        self.data_dir = data_dir


class HealthTimeout(EngineError, UnavailableError):
    """The cluster did not reach the health asked for in time (replicas still recovering or no node to hold them)."""


class ResyncRefused(EngineError, ConflictError):
    """A replica holds operations above the new primary's history; it is rebuilt by peer recovery instead."""


class RestoreDataLoss(EngineError, CorruptError):
    """A restore would bring back fewer operations than the store says were acknowledged; nothing was restored.

    ``losses`` lists, per shard, the missing seq# ranges and the blobs at fault.  Pass
    ``accept_data_loss=True`` to ``Cluster.restore`` to restore the rest anyway; the cluster's
    ``restore_losses`` then says exactly what was dropped.
    """

    def __init__(self, losses: list) -> None:
        parts = "; ".join(str(loss) for loss in losses)
        super().__init__(f"restore refused, acknowledged operations are missing: {parts}; pass "
                         f"accept_data_loss=True to restore without them")
        self.losses = list(losses)


class RecoverySourceClosed(EngineError, UnavailableError):
    """A peer recovery stopped because its source copy closed (node killed, shard failed over); retry later."""

    def __init__(self, source: str, cause: BaseException) -> None:
        super().__init__(f"peer recovery stopped: its source {source} closed meanwhile "
                         f"({type(cause).__name__}: {cause}); it is retried against the shard's current primary")
        self.source = source


class InvariantViolated(EngineError, InvalidError):
    """A routing change broke an invariant of docs/design/engine.md (a bug); it was not published, nothing changed.

    Not retryable: the same decision would break it again.  ``broken`` names each invariant and its reason.
    """

    def __init__(self, what: str, broken: list[str]) -> None:
        super().__init__(f"{what}: not published, it breaks {'; '.join(broken)}")
        self.what = what
        self.broken = list(broken)


class IngestIncomplete(EngineError, UnavailableError):
    """An ingest job's rows were not all acknowledged (a shard unavailable, a failover): the job is not recorded as
    done, the rows acknowledged so far stay; committing the same job again applies it whole (by ``_id``)."""

    def __init__(self, job: str, where: str, failed: int, first: str) -> None:
        super().__init__(f"ingest job {job}: {failed} row(s) of {where} not acknowledged (first: {first}); the job is "
                         f"not done: commit it again (same job id) to apply it whole")
        self.job = job
        self.where = where
        self.failed = failed


class IngestRejected(EngineError, InvalidError):
    """An ingest job holds rows the index refuses (a mapping conflict, a bad ``_id``): the job stops there, not done;
    fix the rows and run a new job (the rows acknowledged before it stay)."""

    def __init__(self, job: str, where: str, failed: int, first: str) -> None:
        super().__init__(f"ingest job {job}: {failed} row(s) of {where} rejected (first: {first}); the job stopped, "
                         f"not done")
        self.job = job
        self.where = where
        self.failed = failed


class IngestJobNotFound(EngineError, NotFoundError):
    """No job record at the key a commit named (never written, or the store lost it); nothing was applied."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no ingest job record at {key!r}; nothing was applied")
        self.key = key
