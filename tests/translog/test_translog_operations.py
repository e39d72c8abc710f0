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


def _adopted(n: int, term: int) -> dict[str, pa.Array]:
    """The columns of an adopted run of ``n`` rows at seq# 10.. (what a primary logs for an adopted file)."""
    return {"seq_no": pa.array(range(10, 10 + n), pa.int64()), "primary_term": pa.array([term] * n, pa.int64()),
            "op_type": pa.array([OpType.ADOPTED] * n, pa.int8()), "id": pa.array([f"a{i}" for i in range(n)]),
            "version": pa.array([1] * n, pa.int64()), "source": pa.nulls(n, pa.binary()),
            "reason": pa.array(["adopted/1 head"] + [None] * (n - 1), pa.string())}


_ADOPTED_CHANGES = [
    ("version", lambda n, r: pa.array([None if i == r else 1 for i in range(n)], pa.int64())),
    ("source", lambda n, r: pa.array([b"{}" if i == r else None for i in range(n)], pa.binary())),
    ("op_type", lambda n, r: pa.array([OpType.INDEX if i == r else OpType.ADOPTED for i in range(n)], pa.int8())),
    ("op_type", lambda n, r: pa.array([9 if i == r else OpType.ADOPTED for i in range(n)], pa.int8())),
    ("id", lambda n, r: pa.array(["" if i == r else f"a{i}" for i in range(n)])),
    ("id", lambda n, r: pa.array([None if i == r else f"a{i}" for i in range(n)], pa.string())),
    ("id", lambda n, r: pa.array(["x" * (MAX_ID_BYTES + 1) if i == r else f"a{i}" for i in range(n)])),
    ("primary_term", lambda n, r: pa.array([1 if i == r else 2 for i in range(n)], pa.int64())),
    ("seq_no", lambda n, r: pa.array([-1 if i == r else 10 + i for i in range(n)], pa.int64())),
]


@given(st.integers(1, 40), st.integers(0, 39), st.one_of(st.none(), st.integers(0, len(_ADOPTED_CHANGES) - 1)))
def test_an_adopted_run_passes_or_fails_as_the_full_pass_says(n: int, row: int, change: int | None) -> None:
    """An adopted run takes a short path of column ranges (``_looks_adopted``); with any one bad row it must still
    be refused, naming the row the full pass names (no rule of the full pass is skipped)."""
    from shardstore.translog.operations import _name_first_bad_row

    cols = _adopted(n, 2)
    if change is not None:
        name, make = _ADOPTED_CHANGES[change]
        cols[name] = make(n, row % n)
    batch = pa.RecordBatch.from_arrays([cols[c] for c in SCHEMA.names], names=SCHEMA.names)
    try:
        _name_first_bad_row(batch, 2, 100)
        want = None
    except InvalidOperation as exc:
        want = (exc.index, str(exc))
    try:
        validate(batch, current_term=2, max_source_bytes=100)
        got = None
    except InvalidOperation as exc:
        got = (exc.index, str(exc))
    assert got == want
    assert (want is None) == (change is None)
