"""Small Arrow helpers shared by the hot paths."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["dense", "dense_schema", "may_hold_byte", "one_array", "take_rows", "validate_full"]

_Taken = TypeVar("_Taken", pa.Table, pa.Array, pa.ChunkedArray)


def one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The values as one Array: a ChunkedArray's only chunk as it is, else its chunks concatenated.

    ``ChunkedArray.combine_chunks()`` copies even a single chunk (2.5 ms for the columns of
    the 336,776 flights rows, per call); the chunk itself may be a slice (a non-zero offset),
    which every caller here handles.
    """
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def take_rows(values: _Taken, rows: pa.Array) -> _Taken:
    """``values.take(rows)``; a run of consecutive ascending rows (a refresh in buffer order) is a zero-copy slice."""
    n = len(rows)
    if n:
        first, last = rows[0].as_py(), rows[n - 1].as_py()
        if last - first == n - 1 and (n < 2 or bool(pc.all(pc.greater(rows.slice(1), rows.slice(0, n - 1))).as_py())):
            return values.slice(first, n)
    return values.take(rows)


def filled(values: pa.Array | pa.ChunkedArray, value: object) -> pa.Array | pa.ChunkedArray:
    """``values`` with nulls replaced by ``value``; ``values`` itself when it has none (the common case:
    ``fill_null`` costs a compute call even then, which shows on a bulk's many small per-shard parts)."""
    return values if values.null_count == 0 else values.fill_null(value)


def validate_full(values: pa.Table | pa.RecordBatch | pa.ChunkedArray | pa.Array) -> None:
    """Arrow's full validation of ``values`` (``ArrowInvalid`` if broken), an ASCII string column checked at once.

    ``validate(full=True)`` checks a string column's UTF-8 one value at a time: 1.1 ms for each
    string column of the 336,776 flights rows, 5.5 ms of a one-go bulk (issue 16).  The
    bytes of a string array with monotonic, in-bounds offsets that are all ASCII are valid
    UTF-8 whatever the value bounds, and that is one pass over the bytes; any other
    string array (and every other type) gets Arrow's own full validation, and its message.
    """
    if isinstance(values, (pa.Table, pa.RecordBatch)):
        values.validate()  # the columns' lengths agree with the table's
        for col in values.columns:
            validate_full(col)
        return
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        if not _ascii_strings(chunk):
            chunk.validate(full=True)


def may_hold_byte(values: pa.ChunkedArray | pa.Array, byte: int) -> bool:
    """False only if no value of a string/binary column holds ``byte``: one pass over the value bytes.

    The bytes under null slots are looked at too, so True may be a false alarm (a caller then
    runs its exact per-value check); other types always say True.  ``pc.match_substring`` over
    the four string columns of the 336,776 flights rows took 5.5 ms, this 0.3 ms (issue 16).
    """
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for arr in chunks:
        t = arr.type
        if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                or pa.types.is_large_binary(t)):
            return True
        if len(arr) == 0:
            continue
        offsets, data_buf = _offsets(arr)
        lo, hi = int(offsets[0]), int(offsets[-1])
        if hi > lo and bool((np.frombuffer(data_buf, np.uint8, hi - lo, lo) == byte).any()):
            return True
    return False


def _offsets(arr: pa.Array) -> tuple[np.ndarray, pa.Buffer | None]:
    """A non-empty (large) string or binary array's offsets (its slice's n + 1 of them) and its data buffer."""
    t = arr.type
    width = np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32
    _validity, off_buf, data_buf = arr.buffers()
    return np.frombuffer(off_buf, width, len(arr) + 1, arr.offset * np.dtype(width).itemsize), data_buf


def _ascii_strings(arr: pa.Array) -> bool:
    """Whether ``arr`` is a string array with sound offsets whose bytes are all ASCII (so valid UTF-8)."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return False
    arr.validate()  # buffer sizes agree with the length (what the reads below rely on)
    n = len(arr)
    if n == 0:
        return True
    offsets, data_buf = _offsets(arr)
    if offsets[0] < 0 or offsets[-1] > (data_buf.size if data_buf is not None else 0):
        return False
    if n > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        return False
    if offsets[-1] == offsets[0]:
        return True
    data = np.frombuffer(data_buf, np.uint8, int(offsets[-1] - offsets[0]), int(offsets[0]))
    return int(data.max()) < 0x80


def _plain(field: pa.Field) -> pa.Field:
    return field.with_type(field.type.value_type) if pa.types.is_dictionary(field.type) else field


def dense_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every dictionary field back to its value type (a file opened with ``read_dictionary``)."""
    if not any(pa.types.is_dictionary(f.type) for f in schema):
        return schema
    return pa.schema([_plain(f) for f in schema], metadata=schema.metadata)


def dense(table: pa.Table) -> pa.Table:
    """``table`` with every dictionary column cast back to its value type (the table itself when none is).

    A segment's own schema never declares a dictionary column (mappings give plain types), so every dictionary
    column a segment read meets is one ``segments/dictionary_read.open_segment_file`` chose."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, _plain(f), table.column(i).cast(f.type.value_type))
    return table
