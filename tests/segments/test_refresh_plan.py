"""The refresh's plan (segments/refresh_plan.py), a pure decision: whichever path finds the winners (every document
when no id repeats, the writers' id sorts merged, or the general sort), they are the general sort's, per id the
newest operation."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.segments import refresh_plan
from shardstore.segments.id_index import SortedKeys, fingerprints
from shardstore.segments.index_buffer import DELETES, IndexBuffer
from shardstore.segments.segment import BASE_SCHEMA

_ENTRY = st.one_of(
    st.tuples(st.just("index"), st.lists(st.integers(0, 30), min_size=1, max_size=12), st.booleans(), st.booleans()),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 30), min_size=1, max_size=3), st.just(False), st.just(False)),
)


def _docs(ids: list[str], first: int) -> pa.Table:
    n = len(ids)
    return pa.table([pa.array(ids, pa.string()), pa.array(range(first, first + n), pa.int64()),
                     pa.array([1] * n, pa.int64()), pa.array([1] * n, pa.int64()), pa.nulls(n, pa.binary())],
                    schema=BASE_SCHEMA)


def _rows(winners: pa.Table) -> list[tuple]:
    return sorted(zip(*(winners.column(c).to_pylist() for c in ("_id", "_seq_no", "_row", "_buffered"))))


@settings(max_examples=300, deadline=None)
@given(st.lists(_ENTRY, min_size=1, max_size=6), st.lists(st.integers(0, 30), max_size=3, unique=True),
       st.booleans())
def test_every_path_finds_the_general_sorts_winners(entries, tombstone_ids, tombstones_first) -> None:
    buffer = IndexBuffer()
    seq = 100 if tombstones_first else 0  # tombstones older or newer than the buffer (a replica's order)
    for kind, nums, keyed, ordered in entries:
        ids = [f"id{n}" for n in nums]
        if kind == "delete":
            buffer.add_deletes(pa.table({"_id": ids, "_seq_no": list(range(seq, seq + len(ids)))}, schema=DELETES))
        else:
            arr = pa.array(ids, pa.string())
            buffer.add_docs(_docs(ids, seq), pc.array_sort_indices(arr) if ordered else None,
                            keys=SortedKeys.of(arr) if keyed else None)
        seq += len(ids)
    tomb_seq = 50 if tombstones_first else 1_000
    tombstones = pa.table({"_id": [f"id{n}" for n in tombstone_ids],
                           "_seq_no": list(range(tomb_seq, tomb_seq + len(tombstone_ids)))}, schema=DELETES)
    plan = refresh_plan.plan_refresh(buffer, tombstones)
    deletes = pa.concat_tables(buffer.deletes) if buffer.deletes else DELETES.empty_table()
    want = refresh_plan._winners(plan.docs, deletes, tombstones)
    assert _rows(plan.winners) == _rows(want)
    assert plan.ids.to_pylist() == plan.winners.column("_id").to_pylist()
    every_keyed = all(k is not None for k in buffer.keys) and plan.docs is not None
    assert (plan.keys is not None) == every_keyed
    if plan.keys is not None:
        fp = fingerprints(plan.docs.column("_id").combine_chunks())
        assert np.array_equal(plan.keys.fp, np.sort(fp)) and np.array_equal(fp[plan.keys.pos], plan.keys.fp)
        if not buffer.deletes and not tombstones.num_rows and len(set(plan.docs.column("_id").to_pylist())) \
                == plan.docs.num_rows:  # every document wins, in buffer order, with no sort
            assert plan.winners.column("_row").to_pylist() == list(range(plan.docs.num_rows))

