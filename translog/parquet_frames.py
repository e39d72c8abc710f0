"""Parquet frames (``FP``, translog format version 7): a bulk part logged as the segment file its primary wrote.

A primary that takes a big part of new documents the written-once way (engine/shard/write_once.py) encodes
its rows once, as a stamped segment file (segments/stamp.py: ``_id`` and the typed fields, no metadata
columns), and logs those same bytes as the part's frame instead of a typed (``FT``) frame of the rows: one
encoding where the row path made two (docs/design/segments.md, "A big part of new documents is written once").

Payload (inside the frame of translog/frames.py, whose header gives the operation count ``n`` and the seq#
range ``lo..hi``; all integers little-endian):

======  =======  ======  =============================================================
offset  size     type    field
======  =======  ======  =============================================================
0       8        i64     primary term of every operation of the frame (>= 1)
8       rest     bytes   a Parquet file of ``n`` rows: ``_id`` (string, no nulls), then
                         one column per typed field, in the ``fields`` struct's order
======  =======  ======  =============================================================

It stands for exactly one batch of index operations: row ``r`` is seq# ``lo + r`` (so ``hi - lo + 1 == n``),
the term above, ``op_type`` index, version 1, no ``source`` and no ``reason``, and its ``fields`` struct holds
the file's columns after ``_id``.  :func:`decode_parquet_payload` rebuilds that batch, the same batch an ``FT``
frame of it decodes to, so every reader of the translog (replay, restore, peer recovery, the changes feed)
sees operations, never the file.  The frame's CRC32C covers the whole payload; the Parquet file's own
structure is checked as it is decoded (a bad file is a corrupt frame, named by its offset).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.core.arrays import one_array
from shardstore.core.ops import FIELDS_COLUMN, OpType
from shardstore.translog.operations import SCHEMA

__all__ = ["PARQUET_MAGIC", "decode_parquet_payload", "parquet_payload_parts"]

#: The frame kind of a Parquet frame (format version 7).
PARQUET_MAGIC = b"FP"
_TERM = struct.Struct("<q")


def parquet_payload_parts(primary_term: int, data: pa.Buffer) -> list[pa.Buffer | bytes]:
    """The payload of a Parquet frame as the parts to write in order: the term, then the file's bytes as they are."""
    if primary_term < 1:
        raise ValueError(f"a Parquet frame needs a primary term >= 1, got {primary_term}")
    return [_TERM.pack(primary_term), data]


def decode_parquet_payload(payload: memoryview | bytes, count: int, min_seq_no: int,
                           max_seq_no: int) -> pa.RecordBatch | str:
    """The operations of a Parquet frame's payload, or the reason it is not the batch its frame header describes."""
    if len(payload) < _TERM.size:
        return f"Parquet frame payload of {len(payload)} bytes (at least {_TERM.size})"
    if count < 1 or max_seq_no - min_seq_no + 1 != count or min_seq_no < 0:
        return f"Parquet frame of {count} operations with seq# range [{min_seq_no}, {max_seq_no}]"
    (term,) = _TERM.unpack_from(payload, 0)
    if term < 1:
        return f"Parquet frame with primary term {term}"
    try:
        table = pq.read_table(pa.BufferReader(pa.py_buffer(payload)[_TERM.size:]), use_threads=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        return f"undecodable Parquet payload: {exc}"
    if table.num_rows != count:
        return f"Parquet payload holds {table.num_rows} rows, frame header says {count}"
    if not table.num_columns or table.schema.names[0] != "_id" or table.schema.field(0).type != pa.string():
        return f"Parquet payload does not start with a string _id column (columns {table.schema.names[:3]})"
    ids = one_array(table.column(0))
    if ids.null_count:
        return f"Parquet payload has {ids.null_count} rows without an _id"
    columns = [one_array(c) for c in table.columns[1:]]
    fields = list(table.schema)[1:]
    struct_ = (pa.StructArray.from_arrays(columns, fields=fields) if fields
               else pa.repeat(pa.scalar({}, pa.struct([])), count))
    n = count
    arrays = [pa.array(np.arange(min_seq_no, max_seq_no + 1, dtype=np.int64)),
              pa.array(np.full(n, term, dtype=np.int64)),
              pa.array(np.full(n, int(OpType.INDEX), dtype=np.int8)),
              ids,
              pa.array(np.ones(n, dtype=np.int64)),
              pa.nulls(n, pa.binary()),
              pa.nulls(n, pa.string()),
              struct_]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA.append(pa.field(FIELDS_COLUMN, struct_.type)))
