"""The promoted copy's re-upload decision (translog/unconfirmed.py): every term/seq# combination against a model."""

from __future__ import annotations

import itertools

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.translog.unconfirmed import not_uploaded


def _ops(rows: list[tuple[int, int]]) -> pa.Table:
    return pa.table({"seq_no": pa.array([s for s, _ in rows], pa.int64()),
                     "primary_term": pa.array([t for _, t in rows], pa.int64())})


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 4)), max_size=20, unique_by=lambda r: r[0]),
       tops=st.dictionaries(st.integers(1, 4), st.integers(-1, 12), max_size=4))
def test_only_rows_no_uploaded_prefix_of_their_term_holds_are_kept(rows, tops) -> None:
    got = not_uploaded(_ops(rows), tops)
    want = [(s, t) for s, t in rows if not (t in tops and s <= tops[t])]
    assert list(zip(got.column("seq_no").to_pylist(), got.column("primary_term").to_pylist())) == want


def test_every_small_case_exhaustively() -> None:
    """Each of 3 ops (terms 1-2) against each top (none, -1..3) of each term: a row goes only when its own
    term's uploaded prefix reaches it (an uploaded prefix of another term never covers it)."""
    rows = [(1, 1), (2, 2), (3, 1)]
    for top1, top2 in itertools.product([None, -1, 0, 1, 2, 3], repeat=2):
        tops = {t: v for t, v in ((1, top1), (2, top2)) if v is not None}
        got = not_uploaded(_ops(rows), tops).column("seq_no").to_pylist()
        assert got == [s for s, t in rows if not (t in tops and s <= tops[t])], tops
    assert not_uploaded(_ops([]), {1: 5}).num_rows == 0
