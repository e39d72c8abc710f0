"""Translog operations as Arrow batches: the schema, stamping with seq#s, validation.

An operation is ``index`` (id, source, version), ``delete`` (id, version), ``no_op``
(reason) or ``adopted`` (id, version; no source: one row of a file a primary adopted as a
segment, engine/shard/adopted_ops.py), stamped with a primary term and a sequence number;
operations order by (seq_no, primary_term).  A bulk of N operations is one RecordBatch of :data:`SCHEMA`;
every check here is a vectorised Arrow compute over the whole batch (no per-operation
Python loop), and the first offending row is reported by index.

The append path calls :func:`summarize` once (column ranges: what the checks, the
frame header and the primary-term roll all need) and then :func:`check`.  A one-row
batch is read from its buffers directly: an Arrow aggregate costs ~10 µs of dispatch,
which dominated appends of a single operation.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.ops import FIELDS_COLUMN, OpType
from shardstore.translog.errors import InvalidOperation

MAX_ID_BYTES = 512
DEFAULT_MAX_SOURCE_BYTES = 100 * 1024 * 1024




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
            _ARANGE = pa.array(np.arange(size, dtype=np.int64))
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
            pa.array(reasons, pa.string()) if reasons is not None else pa.nulls(n, pa.string()),
        ],
        schema=UNSTAMPED,
    )


def index_batch(ids: list[str], sources: list[bytes], versions: list[int] | None = None) -> pa.RecordBatch:
    """An unstamped batch of index operations (version 1 unless given)."""
    n = len(ids)
    return unstamped_batch([OpType.INDEX] * n, ids, versions or [1] * n, sources)


_UNSTAMPED_NAMES = list(UNSTAMPED.names)


def stamp(batch: pa.RecordBatch, first_seq_no: int, primary_term: int) -> pa.RecordBatch:
    """Give an unstamped batch the contiguous seq#s first_seq_no.. and one primary term (its ``fields`` kept)."""
    n = batch.num_rows
    seq = pa.array(np.arange(first_seq_no, first_seq_no + n, dtype=np.int64))
    term = pa.array(np.full(n, primary_term, dtype=np.int64))
    names = batch.schema.names
    if names[:len(_UNSTAMPED_NAMES)] == _UNSTAMPED_NAMES:  # the usual layout: by position (a lookup by name
        rest = [batch.column(i) for i in range(len(_UNSTAMPED_NAMES))]  # costs more than the stamping)
    else:
        rest = [batch.column(name) for name in _UNSTAMPED_NAMES]
    stamped = pa.RecordBatch.from_arrays([seq, term, *rest], schema=SCHEMA)
    if FIELDS_COLUMN in names:
        stamped = stamped.append_column(FIELDS_COLUMN, batch.column(FIELDS_COLUMN))
    return stamped


def _first(mask: pa.Array) -> int:
    """Index of the first true value of a boolean mask (nulls count as false), or -1."""
    return pc.index(pc.fill_null(mask, False), True).as_py()


@dataclass(frozen=True)
class Summary:
    """A batch cast to :data:`SCHEMA` and the column ranges the checks and the frame header need.

    A range is None when the batch is empty or the column has nulls.  ``id_bytes`` is
    (shortest, longest) id length; ``source_bytes_max`` an upper bound of the longest
    source (the total of the column when that is already within the limit).
    """

    batch: pa.RecordBatch
    all_index: bool  # every operation is an ``index`` (and op_type has no nulls)
    seq_no: tuple[int, int] | None
    primary_term: tuple[int, int] | None
    id_bytes: tuple[int, int] | None
    source_bytes_max: int | None
    typed: bool = False  # the batch has a ``fields`` column
    fields_complete: bool = False  # ... and every row of it is valid
    #: the seq#s are ``seq_no[0]``, +1, +2, ... in row order (known to a primary that stamped them; summarize
    #: leaves it False and the log reads the column)
    contiguous: bool = False


_I32 = struct.Struct("<i")
_COL = {name: i for i, name in enumerate(SCHEMA.names)}


def _int_range(arr: pa.Array) -> tuple[int, int] | None:
    """(min, max) of a null-free integer column; a single row is read from its buffer (no aggregate)."""
    if arr.null_count or len(arr) == 0:
        return None
    if len(arr) == 1:
        width = arr.type.bit_width // 8
        raw = arr.buffers()[1]
        v = int.from_bytes(memoryview(raw)[arr.offset * width : (arr.offset + 1) * width], "little", signed=True)
        return v, v
    mm = pc.min_max(arr)
    return mm["min"].as_py(), mm["max"].as_py()


def _all_zero(arr: pa.Array) -> bool:
    """Whether a null-free int8 column holds only zeros (``OpType.INDEX``): one byte count, no aggregate."""
    if arr.null_count:
        return False
    values = memoryview(arr.buffers()[1])[arr.offset : arr.offset + len(arr)]
    return values.tobytes().count(0) == len(arr)


def _binary_total(arr: pa.Array) -> int:
    """Total bytes of the values of a string/binary column (from its offsets buffer)."""
    offsets = arr.buffers()[1]
    lo = _I32.unpack_from(offsets, 4 * arr.offset)[0]
    hi = _I32.unpack_from(offsets, 4 * (arr.offset + len(arr)))[0]
    return hi - lo


def summarize(batch: pa.RecordBatch) -> Summary:
    """Cast ``batch`` to :data:`SCHEMA` (InvalidOperation if it cannot be) and take the ranges of its columns.

    A trailing ``fields`` struct column (typed operations) is kept as it is.
    """
    fields = None
    if FIELDS_COLUMN in batch.schema.names:
        fields = batch.column(FIELDS_COLUMN)
        if not pa.types.is_struct(fields.type):
            raise InvalidOperation(None, None, f"the {FIELDS_COLUMN} column is a {fields.type}, not a struct")
        batch = batch.drop_columns([FIELDS_COLUMN])
    if not batch.schema.equals(SCHEMA):
        missing = [f.name for f in SCHEMA if f.name not in batch.schema.names]
        if missing:
            raise InvalidOperation(None, None, f"the batch lacks the column(s) {missing}")
        try:
            batch = batch.select(SCHEMA.names).cast(SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InvalidOperation(None, None, f"the batch does not match the operation schema: {exc}") from None
    if fields is not None:
        batch = batch.append_column(FIELDS_COLUMN, fields)
    if batch.num_rows == 0:
        return Summary(batch, True, None, None, None, None, fields is not None, fields is not None)
    ids, source = batch.column(_COL["id"]), batch.column(_COL["source"])
    id_bytes: tuple[int, int] | None = None
    if not ids.null_count:
        if len(ids) == 1:
            id_bytes = (_binary_total(ids),) * 2  # type: ignore[assignment]
        else:
            mm = pc.min_max(pc.binary_length(ids))
            id_bytes = (mm["min"].as_py(), mm["max"].as_py())
    return Summary(
        batch,
        _all_zero(batch.column(_COL["op_type"])),
        _int_range(batch.column(_COL["seq_no"])),
        _int_range(batch.column(_COL["primary_term"])),
        id_bytes,
        None if source.null_count and fields is None else _binary_total(source),  # an upper bound with nulls
        fields is not None,
        fields is not None and fields.null_count == 0,
    )


def check(summary: Summary, *, current_term: int = 0, max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES) -> pa.RecordBatch:
    """Raise InvalidOperation for the first bad row of a summarised batch, else return the batch."""
    if not _looks_valid(summary, current_term, max_source_bytes):
        _name_first_bad_row(summary.batch, current_term, max_source_bytes)
    return summary.batch


def validate(
    batch: pa.RecordBatch,
    *,
    current_term: int = 0,
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES,
) -> pa.RecordBatch:
    """Check a stamped batch; raise InvalidOperation for its first bad row, else return it."""
    return check(summarize(batch), current_term=current_term, max_source_bytes=max_source_bytes)


def _looks_valid(s: Summary, current_term: int, max_source_bytes: int) -> bool:
    """The common case (all index operations) from the summary; False sends us to the row-naming pass."""
    if s.batch.num_rows == 0:
        return True
    if not s.all_index:
        return _looks_adopted(s, current_term)  # else mixed (or unknown) operation types, or nulls: the full pass
    if s.seq_no is None or s.primary_term is None:
        return False  # nulls: the full pass names the row
    if s.seq_no[0] < 0 or s.primary_term[0] < current_term:
        return False
    if s.id_bytes is None or s.source_bytes_max is None:
        return False
    if s.typed and not s.fields_complete and s.batch.column(_COL["source"]).null_count:
        return False  # an index operation may lack both: the full pass names it
    if s.id_bytes[0] < 1 or s.id_bytes[1] > MAX_ID_BYTES:
        return False
    if s.typed and not _typed_within(s.batch, max_source_bytes):
        return False
    if s.source_bytes_max <= max_source_bytes:
        return True
    return pc.max(pc.binary_length(s.batch.column(_COL["source"]))).as_py() <= max_source_bytes


def _looks_adopted(s: Summary, current_term: int) -> bool:
    """An adopted run (every operation ``ADOPTED``, each with a version and no source, no typed fields) passes every
    rule of :func:`_name_first_bad_row` from a few column ranges (an adopted file's rows, issue 43); False otherwise."""
    b = s.batch
    op, version, source = b.column(_COL["op_type"]), b.column("version"), b.column(_COL["source"])
    if s.typed or op.null_count or version.null_count or source.null_count != b.num_rows:
        return False
    if s.seq_no is None or s.primary_term is None or s.seq_no[0] < 0 or s.primary_term[0] < current_term:
        return False
    if s.id_bytes is None or s.id_bytes[0] < 1 or s.id_bytes[1] > MAX_ID_BYTES:
        return False
    mm = pc.min_max(op)
    return mm["min"].as_py() == mm["max"].as_py() == OpType.ADOPTED


def _text_members(batch: pa.RecordBatch) -> list[pa.Array]:
    """The string and binary members of a typed batch's ``fields`` (the values that can make a document big)."""
    struct = batch.column(FIELDS_COLUMN)
    return [struct.field(i) for i, f in enumerate(struct.type)
            if pa.types.is_string(f.type) or pa.types.is_binary(f.type)]


def _typed_text_bytes(batch: pa.RecordBatch) -> pa.Array:
    """Per operation, the bytes of its typed document's string values (what stands for its source size)."""
    total = pa.repeat(pa.scalar(0, pa.int64()), batch.num_rows)
    for member in _text_members(batch):
        total = pc.add(total, pc.fill_null(pc.binary_length(member).cast(pa.int64()), 0))
    return total


def _typed_within(batch: pa.RecordBatch, max_source_bytes: int) -> bool:
    """Whether every typed document's string values fit in ``max_source_bytes`` (an O(columns) bound first)."""
    members = _text_members(batch)
    if sum(_binary_total(m) for m in members) <= max_source_bytes:
        return True
    return pc.max(_typed_text_bytes(batch)).as_py() <= max_source_bytes


def _name_first_bad_row(batch: pa.RecordBatch, current_term: int, max_source_bytes: int) -> None:
    """Run every rule as a mask and raise InvalidOperation for the earliest bad row (if any)."""
    op = batch.column("op_type")
    ids = batch.column("id")
    needs_id = pc.not_equal(op, OpType.NO_OP)
    typed = FIELDS_COLUMN in batch.schema.names
    no_fields = pc.is_null(batch.column(FIELDS_COLUMN)) if typed else pa.repeat(pa.scalar(True), batch.num_rows)
    typed_bytes = _typed_text_bytes(batch) if typed else pa.repeat(pa.scalar(0, pa.int64()), batch.num_rows)
    checks = [
        (pc.invert(pc.is_in(op, pa.array([t.value for t in OpType], pa.int8()))), "unknown operation type"),
        (pc.is_null(batch.column("seq_no")), "no sequence number"),
        (pc.less(batch.column("seq_no"), 0), "negative sequence number"),
        (pc.is_null(batch.column("primary_term")), "no primary term"),
        (pc.less(batch.column("primary_term"), current_term),
         f"primary term lower than the log's current term {current_term}"),
        (pc.and_kleene(needs_id, pc.or_kleene(pc.is_null(ids), pc.equal(pc.binary_length(ids), 0))), "missing id"),
        (pc.greater(pc.binary_length(ids), MAX_ID_BYTES), f"id longer than {MAX_ID_BYTES} bytes"),
        (pc.and_kleene(pc.equal(op, OpType.INDEX), pc.and_kleene(pc.is_null(batch.column("source")), no_fields)),
         "index operation without source or fields"),
        (pc.and_kleene(pc.equal(op, OpType.ADOPTED), pc.is_null(batch.column("version"))),
         "adopted operation without a version"),
        (pc.and_kleene(pc.equal(op, OpType.ADOPTED), pc.is_valid(batch.column("source"))),
         "adopted operation with a source (its fields are in its file)"),
        (pc.greater(pc.binary_length(batch.column("source")), max_source_bytes),
         f"source larger than {max_source_bytes} bytes"),
        (pc.greater(typed_bytes, max_source_bytes), f"typed fields larger than {max_source_bytes} bytes"),
    ]
    worst: tuple[int, str] | None = None
    for mask, reason in checks:
        i = _first(mask)
        if i >= 0 and (worst is None or i < worst[0]):
            worst = (i, reason)
    if worst is not None:
        i, reason = worst
        raise InvalidOperation(i, ids[i].as_py(), reason)
