"""Operation batches: schema, contiguous stamping, and vectorised validation."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardstore.errors import InvalidError
from shardstore.translog.errors import InvalidOperation
from shardstore.translog.operations import (
    MAX_ID_BYTES,
    SCHEMA,
    OpType,
    index_batch,
    stamp,
    unstamped_batch,
    validate,
)


@given(st.integers(0, 3000), st.integers(0, 2**40), st.integers(1, 2**31))
def test_stamp_gives_contiguous_seq_nos_and_one_term(n: int, first: int, term: int) -> None:
    b = stamp(index_batch([f"id{i}" for i in range(n)], [b"{}"] * n), first, term)
    assert b.schema == SCHEMA
    assert b.column("seq_no").to_pylist() == list(range(first, first + n))
    assert set(b.column("primary_term").to_pylist()) <= {term}
    assert validate(b, current_term=term).num_rows == n


def _mixed() -> pa.RecordBatch:
    return stamp(
        unstamped_batch(
            [OpType.INDEX, OpType.DELETE, OpType.NO_OP],
            ["a", "b", None],
            [1, 2, None],
            [b'{"x":1}', None, None],
            [None, None, "fill gap"],
        ),
        5,
        2,
    )


def test_a_valid_mixed_batch_passes() -> None:
    assert validate(_mixed(), current_term=2).num_rows == 3


@pytest.mark.parametrize(
    ("change", "row", "reason"),
    [
        (lambda c: c.update(op_type=pa.array([0, 1, 9], pa.int8())), 2, "unknown operation type"),
        (lambda c: c.update(id=pa.array(["a", None, None])), 1, "missing id"),
        (lambda c: c.update(id=pa.array(["a", "", None])), 1, "missing id"),
        (lambda c: c.update(id=pa.array(["a", "b" * (MAX_ID_BYTES + 1), None])), 1, "id longer than"),
        (lambda c: c.update(source=pa.array([None, None, None], pa.binary())), 0, "without source"),
        (lambda c: c.update(source=pa.array([b"x" * 101, None, None], pa.binary())), 0, "source larger than 100"),
        (lambda c: c.update(primary_term=pa.array([2, 1, 2], pa.int64())), 1, "primary term lower"),
        (lambda c: c.update(seq_no=pa.array([5, -1, 7], pa.int64())), 1, "negative sequence number"),
    ],
)
def test_bad_rows_are_named_by_index(change, row: int, reason: str) -> None:  # type: ignore[no-untyped-def]
    cols = {name: _mixed().column(name) for name in SCHEMA.names}
    change(cols)
    batch = pa.RecordBatch.from_arrays([cols[n] for n in SCHEMA.names], names=SCHEMA.names)
    with pytest.raises(InvalidOperation, match=reason) as info:
        validate(batch, current_term=2, max_source_bytes=100)
    assert info.value.index == row
    assert isinstance(info.value, InvalidError) and "nothing of this batch was written" in str(info.value)


def test_the_first_bad_row_wins_across_rules() -> None:
    cols = {name: _mixed().column(name) for name in SCHEMA.names}
    cols["id"] = pa.array(["a", None, None])  # row 1: missing id
    cols["op_type"] = pa.array([7, 1, 2], pa.int8())  # row 0: unknown type
    batch = pa.RecordBatch.from_arrays([cols[n] for n in SCHEMA.names], names=SCHEMA.names)
    with pytest.raises(InvalidOperation) as info:
        validate(batch)
    assert info.value.index == 0


def test_schema_problems_are_batch_level() -> None:
    with pytest.raises(InvalidOperation, match="lacks the column"):
        validate(pa.RecordBatch.from_pydict({"seq_no": [1]}))
    cols = {name: _mixed().column(name) for name in SCHEMA.names}
    cols["seq_no"] = pa.array(["x", "y", "z"])
    with pytest.raises(InvalidOperation, match="does not match the operation schema"):
        validate(pa.RecordBatch.from_arrays([cols[n] for n in SCHEMA.names], names=SCHEMA.names))
