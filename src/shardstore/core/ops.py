"""Operation types and the "no operations" seq#, shared by the translog, the segments and the engine."""

from __future__ import annotations

from enum import IntEnum

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array

__all__ = ["FIELDS_COLUMN", "NO_OPS", "OP_NAMES", "OpType", "fields_of", "index_fields", "with_fields"]

#: The seq# (and checkpoint) of a shard that holds no operation yet.
NO_OPS = -1


class OpType(IntEnum):
    """The kind of an operation (stored as int8 in translog frames and operation batches)."""

    INDEX = 0
    DELETE = 1
    NO_OP = 2
    #: one row of a file a primary adopted as a segment (docs/design/adoption.md, "Step 2"): its fields are in the file
    ADOPTED = 3


#: The name of each operation type, as the changes feed reports it.
OP_NAMES: dict[OpType, str] = {OpType.INDEX: "index", OpType.DELETE: "delete", OpType.NO_OP: "noop",
                               OpType.ADOPTED: "index"}  # an adopted row is an index operation to a reader


#: The optional last column of an operation batch: a struct of the typed field values of each
#: index operation (null for deletes and no-ops).  Index operations of a synthetic-source
#: index carry these instead of a JSON ``source`` (issue 16; docs/design/translog.md, "Typed
#: operations"); the translog writes a batch with it as a typed (``FT``) frame.
FIELDS_COLUMN = "fields"


def with_fields(batch: pa.RecordBatch, fields: pa.Table) -> pa.RecordBatch:
    """``batch`` with the typed field columns of its rows as the ``fields`` struct column (same row order)."""
    if fields.num_columns == 0:  # documents without a field: an empty (valid) struct per row
        struct = pa.repeat(pa.scalar({}, pa.struct([])), batch.num_rows)
    elif fields.num_rows != batch.num_rows:
        raise ValueError(f"{fields.num_rows} rows of fields for {batch.num_rows} operations")
    else:
        arrays = [one_array(c) for c in fields.columns]
        struct = pa.StructArray.from_arrays(arrays, fields=list(fields.schema))
    if FIELDS_COLUMN in batch.schema.names:
        return batch.set_column(batch.schema.get_field_index(FIELDS_COLUMN), FIELDS_COLUMN, struct)
    return batch.append_column(FIELDS_COLUMN, struct)


def fields_of(batch: pa.RecordBatch | pa.Table) -> pa.Table | None:
    """The typed field columns of a batch's rows (a table, one column per field), or None without ``fields``."""
    if FIELDS_COLUMN not in batch.schema.names:
        return None
    col = batch.column(FIELDS_COLUMN)
    struct = one_array(col)
    if struct.type.num_fields == 0:  # documents without a field: keep the row count (a table of no columns)
        return pa.Table.from_struct_array(struct)
    if struct.offset or struct.null_count:  # flatten() applies the parent's offset and validity to each child
        return pa.Table.from_arrays(struct.flatten(), schema=pa.schema(list(struct.type)))
    return pa.Table.from_arrays([struct.field(i) for i in range(struct.type.num_fields)],
                                schema=pa.schema(list(struct.type)))


def index_fields(batch: pa.RecordBatch | pa.Table) -> pa.Table | None:
    """The typed fields of a batch of index operations that all carry them (a coordinator's parse, sent once as the
    ``fields`` column), else None (the copy parses the sources)."""
    if FIELDS_COLUMN not in batch.schema.names or batch.column(FIELDS_COLUMN).null_count:
        return None
    if not pc.all(pc.equal(batch.column("op_type"), int(OpType.INDEX))).as_py():
        return None
    return fields_of(batch)
