"""How every reader of the translog turns frames into operations (local and remote alike).

Filter to a seq# range, drop operations above a generation's trimmed-above seq#, then
keep one operation per seq#: the highest primary term wins.  Columnar throughout (a sort
and a shifted comparison), no loop per operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array
from shardstore.core.ops import FIELDS_COLUMN
from shardstore.translog.checkpoint import UNASSIGNED
from shardstore.translog.errors import InvalidOperation


def filter_batch(batch: pa.RecordBatch, from_seq_no: int, to_seq_no: int, trimmed_above_seq_no: int) -> pa.RecordBatch:
    """Rows with from <= seq# <= to, and <= the generation's trimmed-above seq# if it has one."""
    seq = batch.column("seq_no")
    keep = pc.and_(pc.greater_equal(seq, from_seq_no), pc.less_equal(seq, to_seq_no))
    if trimmed_above_seq_no != UNASSIGNED:
        keep = pc.and_(keep, pc.less_equal(seq, trimmed_above_seq_no))
    return batch.filter(keep)


def resolve(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One operation per seq#, the highest term winning, in seq# order (columnar, no loop per op)."""
    tables = unify_fields([pa.Table.from_batches([b]) for b in batches])
    if not tables:
        return iter(())
    merged = pa.concat_tables(tables).sort_by([("seq_no", "ascending"), ("primary_term", "descending")])
    seq = one_array(merged.column("seq_no"))
    if len(seq) > 1:
        first = pc.not_equal(seq.slice(1), seq.slice(0, len(seq) - 1))
        merged = merged.filter(pa.concat_arrays([pa.array([True]), first]))
    return iter(merged.combine_chunks().to_batches())


def unify_fields(tables: list[pa.Table]) -> list[pa.Table]:
    """The tables with one schema: a ``fields`` struct holding every field any of them has (nulls elsewhere).

    Typed operations (synthetic-source index operations) carry their field values in a
    ``fields`` struct whose members grow with the mapping; plain ones carry none.  A
    field has one type per index, so members of the same name agree (cast otherwise).
    """
    if not any(FIELDS_COLUMN in t.schema.names for t in tables):
        return tables
    members: dict[str, pa.Field] = {}
    for t in tables:
        if FIELDS_COLUMN in t.schema.names:
            for f in t.schema.field(FIELDS_COLUMN).type:
                members.setdefault(f.name, f)
    struct_type = pa.struct(list(members.values()))
    out = []
    for t in tables:
        if FIELDS_COLUMN not in t.schema.names:
            out.append(t.append_column(FIELDS_COLUMN, pa.nulls(t.num_rows, struct_type)))
            continue
        col = one_array(t.column(FIELDS_COLUMN))
        if col.type == struct_type:
            out.append(t)
            continue
        have = {f.name: i for i, f in enumerate(col.type)}
        try:
            kids = [col.field(have[f.name]).cast(f.type) if f.name in have else pa.nulls(len(col), f.type)
                    for f in members.values()]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidOperation(None, None, f"typed operations disagree on a field's type ({exc}); "
                                               f"the index mapping gives each field one type") from None
        mask = col.is_null() if col.null_count else None
        unified = pa.StructArray.from_arrays(kids, fields=list(members.values()), mask=mask)
        out.append(t.set_column(t.schema.get_field_index(FIELDS_COLUMN), FIELDS_COLUMN, unified))
    return out
