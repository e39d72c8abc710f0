"""shardstore.core.arrays: one Array out of a column without copying a single chunk."""

from __future__ import annotations

import pyarrow as pa

from shardstore.core.arrays import one_array


def test_a_single_chunk_is_taken_as_it_is_and_several_are_joined() -> None:
    base = pa.array(["a", "b", "c", "d"])
    sliced = pa.chunked_array([base.slice(1, 2)])
    got = one_array(sliced)
    assert got.to_pylist() == ["b", "c"] and got.offset == 1
    assert got.buffers()[2].address == base.buffers()[2].address  # no copy
    assert one_array(pa.chunked_array([base, base.slice(2)])).to_pylist() == ["a", "b", "c", "d", "c", "d"]
    assert one_array(pa.chunked_array([], pa.int64())).to_pylist() == []
    assert one_array(base) is base
