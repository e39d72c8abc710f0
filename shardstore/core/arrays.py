"""Small Arrow helpers shared by the hot paths."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["one_array"]


def one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The values as one Array: a ChunkedArray's only chunk as it is, else its chunks concatenated.

    ``ChunkedArray.combine_chunks()`` copies even a single chunk (2.5 ms for the columns of
    the 336,776 flights rows, per call); the chunk itself may be a slice (a non-zero offset),
    which every caller here handles.
    """
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values
