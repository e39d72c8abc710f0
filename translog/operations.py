"""Translog operations as Arrow batches: the schema, stamping with seq#s, validation.

An operation is ``index`` (id, source, version), ``delete`` (id, version) or ``no_op``
(reason), stamped with a primary term and a sequence number; operations order by
(seq_no, primary_term).  A bulk of N operations is one RecordBatch of :data:`SCHEMA`;
every check here is a vectorised Arrow compute over the whole batch (no per-operation
Python loop), and the first offending row is reported by index.
"""

from __future__ import annotations

import threading
from enum import IntEnum

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.translog.errors import InvalidOperation

MAX_ID_BYTES = 512
DEFAULT_MAX_SOURCE_BYTES = 100 * 1024 * 1024


class OpType(IntEnum):
    """The kind of an operation (stored as int8)."""

    INDEX = 0
    DELETE = 1
    NO_OP = 2


#: The columns of a stamped operation batch.
SCHEMA = pa.schema(
    [
        pa.field("seq_no", pa.int64(), nullable=False),
        pa.field("primary_term", pa.int64(), nullable=False),
        pa.field("op_type", pa.int8(), nullable=False),
        pa.field("id", pa.string()),  # null for no_op
        pa.field("version", pa.int64()),  # null for no_op
        pa.field("source", pa.binary()),  # the JSON document; index only
        pa.field("reason", pa.string()),  # no_op only
    ]
)

#: The columns a caller supplies before the sequence-number service stamps the batch.
UNSTAMPED = pa.schema([f for f in SCHEMA if f.name not in ("seq_no", "primary_term")])

_ARANGE_LOCK = threading.Lock()
_ARANGE = pa.array([], pa.int64())


def _arange(n: int) -> pa.Array:
    """0..n-1 as int64, sliced from a cached array (grown by doubling)."""
    global _ARANGE
    with _ARANGE_LOCK:
        if len(_ARANGE) < n:
            size = max(n, 2 * len(_ARANGE), 1024)
            _ARANGE = pa.array(range(size), pa.int64())
        return _ARANGE.slice(0, n)


def unstamped_batch(
    op_type: list[int] | pa.Array,
    ids: list[str | None] | pa.Array,
    versions: list[int | None] | pa.Array,
    sources: list[bytes | None] | pa.Array,
    reasons: list[str | None] | pa.Array | None = None,
) -> pa.RecordBatch:
    """Build a batch of :data:`UNSTAMPED` from columns."""
    n = len(op_type)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(op_type, pa.int8()),
            pa.array(ids, pa.string()),
            pa.array(versions, pa.int64()),
            pa.array(sources, pa.binary()),
            pa.array(reasons if reasons is not None else [None] * n, pa.string()),
        ],
        schema=UNSTAMPED,
    )


def index_batch(ids: list[str], sources: list[bytes], versions: list[int] | None = None) -> pa.RecordBatch:
    """An unstamped batch of index operations (version 1 unless given)."""
    n = len(ids)
    return unstamped_batch([OpType.INDEX] * n, ids, versions or [1] * n, sources)


def stamp(batch: pa.RecordBatch, first_seq_no: int, primary_term: int) -> pa.RecordBatch:
    """Give an unstamped batch the contiguous seq#s first_seq_no.. and one primary term."""
    n = batch.num_rows
    seq = pc.add(_arange(n), pa.scalar(first_seq_no, pa.int64()))
    term = pa.array([primary_term], pa.int64()).take(pa.array([0] * n, pa.int32())) if n else pa.array([], pa.int64())
    cols = {name: batch.column(name) for name in UNSTAMPED.names}
    return pa.RecordBatch.from_arrays(
        [seq, term, *(cols[name] for name in UNSTAMPED.names)], schema=SCHEMA
    )


def _first(mask: pa.Array) -> int:
    """Index of the first true value of a boolean mask (nulls count as false), or -1."""
    return pc.index(pc.fill_null(mask, False), True).as_py()


def validate(
    batch: pa.RecordBatch,
    *,
    current_term: int = 0,
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES,
) -> pa.RecordBatch:
    """Check a stamped batch; raise InvalidOperation for its first bad row, else return it."""
    if not batch.schema.equals(SCHEMA):
        missing = [f.name for f in SCHEMA if f.name not in batch.schema.names]
        if missing:
            raise InvalidOperation(None, None, f"the batch lacks the column(s) {missing}")
        try:
            batch = batch.select(SCHEMA.names).cast(SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InvalidOperation(None, None, f"the batch does not match the operation schema: {exc}") from None
    if _looks_valid(batch, current_term, max_source_bytes):
        return batch
    _name_first_bad_row(batch, current_term, max_source_bytes)
    return batch


def _looks_valid(batch: pa.RecordBatch, current_term: int, max_source_bytes: int) -> bool:
    """The common case in a few whole-column reductions; False sends us to the row-naming pass."""
    if batch.num_rows == 0:
        return True
    op = batch.column("op_type")
    op_lo, op_hi = (v.as_py() for v in pc.min_max(op).values())
    if op_lo < OpType.INDEX or op_hi > OpType.NO_OP:
        return False
    seq, term = batch.column("seq_no"), batch.column("primary_term")
    if seq.null_count or term.null_count or pc.min(seq).as_py() < 0 or pc.min(term).as_py() < current_term:
        return False
    ids, source = batch.column("id"), batch.column("source")
    if op_hi == OpType.INDEX:  # all index operations: the usual bulk
        if ids.null_count or source.null_count:
            return False
        id_lo, id_hi = (v.as_py() for v in pc.min_max(pc.binary_length(ids)).values())
        src_hi = pc.max(pc.binary_length(source)).as_py()
        return id_lo >= 1 and id_hi <= MAX_ID_BYTES and src_hi <= max_source_bytes
    return False  # mixed operation types: take the full pass


def _name_first_bad_row(batch: pa.RecordBatch, current_term: int, max_source_bytes: int) -> None:
    """Run every rule as a mask and raise InvalidOperation for the earliest bad row (if any)."""
    op = batch.column("op_type")
    ids = batch.column("id")
    needs_id = pc.not_equal(op, OpType.NO_OP)
    checks = [
        (pc.invert(pc.is_in(op, pa.array([t.value for t in OpType], pa.int8()))), "unknown operation type"),
        (pc.is_null(batch.column("seq_no")), "no sequence number"),
        (pc.less(batch.column("seq_no"), 0), "negative sequence number"),
        (pc.is_null(batch.column("primary_term")), "no primary term"),
        (pc.less(batch.column("primary_term"), current_term),
         f"primary term lower than the log's current term {current_term}"),
        (pc.and_kleene(needs_id, pc.or_kleene(pc.is_null(ids), pc.equal(pc.binary_length(ids), 0))), "missing id"),
        (pc.greater(pc.binary_length(ids), MAX_ID_BYTES), f"id longer than {MAX_ID_BYTES} bytes"),
        (pc.and_kleene(pc.equal(op, OpType.INDEX), pc.is_null(batch.column("source"))), "index operation without source"),
        (pc.greater(pc.binary_length(batch.column("source")), max_source_bytes),
         f"source larger than {max_source_bytes} bytes"),
    ]
    worst: tuple[int, str] | None = None
    for mask, reason in checks:
        i = _first(mask)
        if i >= 0 and (worst is None or i < worst[0]):
            worst = (i, reason)
    if worst is not None:
        i, reason = worst
        raise InvalidOperation(i, ids[i].as_py(), reason)
