"""The adopted-operation record (engine/shard/adopted_ops.py, pure): the head reason's codec, and cutting a batch into
its plain pieces and adopted runs, against a plain Python oracle; and the replica's re-apply decision
(segments/adoption.py ``reapply_plan`` with the primary's versions)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.core.ops import OpType
from shardstore.engine.shard.adopted_ops import (
    REASON_VERSION,
    AdoptedFile,
    AdoptedRun,
    adopted_batch,
    decode_reason,
    encode_reason,
    has_adopted,
    split_runs,
)
from shardstore.errors import UnsupportedFormatVersion
from shardstore.segments.adoption import reapply_plan, row_versions
from shardstore.translog.errors import InvalidOperation
from shardstore.translog.operations import SCHEMA, index_batch, stamp


def test_the_head_reason_round_trips_and_names_what_is_wrong() -> None:
    f = AdoptedFile("cluster/ingest/job 1/files/part 0.parquet", 1234, 0xDEADBEEF, 77)  # a key with spaces
    reason = encode_reason(f, 500)
    assert reason == f"adopted/{REASON_VERSION} 500 77 1234 deadbeef {f.key}"
    assert decode_reason(reason, "here") == (f, 500)
    with pytest.raises(UnsupportedFormatVersion, match="adopted operation reason at here"):
        decode_reason(reason.replace("adopted/1", "adopted/2"), "here")
    for bad in (None, "", "filling gaps", "adopted/x 1", "adopted/1 1 2 3", "adopted/1 a 2 3 00000000 k",
                "adopted/0 1 2 3 00000000 k", "adopted/1 1 2 3 zz k"):
        with pytest.raises(InvalidOperation, match="here"):
            decode_reason(bad, "here")
    with pytest.raises(ValueError):
        AdoptedFile("k", 1, 1 << 32, 1)


def _plain(first: int, n: int) -> pa.RecordBatch:
    return stamp(index_batch([f"p{first + i}" for i in range(n)], [b"{}"] * n), first, 1)


# a history: ("p", n) plain operations, ("a", n) an adopted run of n rows
_steps = st.lists(st.tuples(st.sampled_from("pa"), st.integers(1, 5)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(steps=_steps)
def test_split_runs_gives_back_each_piece_in_order(steps) -> None:
    batches, want, seq = [], [], 0
    for k, (kind, n) in enumerate(steps):
        if kind == "p":
            b = _plain(seq, n)
            want.append(("p", seq, n))
        else:
            f = AdoptedFile(f"f{k}", 10 * n, k, n)
            b = adopted_batch(f, seq, 1, pa.array([f"x{k}-{i}" for i in range(n)]), np.arange(1, n + 1))
            want.append(("a", seq, n, f))
        batches.append(b)
        seq += n
    if not batches:
        return
    whole = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    assert has_adopted(whole) == any(k == "a" for k, _ in steps)
    got = []
    for piece in split_runs(whole, "t"):
        if isinstance(piece, AdoptedRun):
            assert piece.ops.column("version").to_pylist() == list(range(1, piece.file.rows + 1))
            got.append(("a", piece.seq_no_base, piece.file.rows, piece.file))
        else:
            got.append(("p", piece.column("seq_no")[0].as_py(), piece.num_rows))
    merged = []  # consecutive plain steps come back as one piece
    for w in want:
        if w[0] == "p" and merged and merged[-1][0] == "p":
            merged[-1] = ("p", merged[-1][1], merged[-1][2] + w[2])
        else:
            merged.append(w)
    assert got == merged


def _run(n: int = 4, base: int = 10) -> pa.RecordBatch:
    return adopted_batch(AdoptedFile("k", 1, 2, n), base, 3, pa.array([f"i{j}" for j in range(n)]), np.ones(n))


@pytest.mark.parametrize("damage, message", [
    (lambda b: b.slice(1), "without its run's head"),
    (lambda b: b.slice(0, 3), "not 4 whole rows"),
    (lambda b: b.set_column(0, SCHEMA.field(0), pa.array([10, 11, 13, 14])), "gap or two terms"),
    (lambda b: b.set_column(1, SCHEMA.field(1), pa.array([3, 3, 4, 3])), "gap or two terms"),
    (lambda b: b.set_column(5, SCHEMA.field(5), pa.array([None, b"{}", None, None], pa.binary())), "carries a source"),
    (lambda b: b.set_column(4, SCHEMA.field(4), pa.array([1, None, 1, 1], pa.int64())), "lacks a version"),
    (lambda b: b.set_column(0, SCHEMA.field(0), pa.array([11, 12, 13, 14])), "not 4 whole rows"),
    (lambda b: pa.Table.from_batches([b, _run(4, 14)]).combine_chunks().to_batches()[0].slice(0, 6),
     "not 4 whole rows"),
])
def test_a_damaged_run_is_refused(damage, message) -> None:
    with pytest.raises(InvalidOperation, match=message):
        split_runs(damage(_run()), "t")


def test_a_plain_batch_is_one_piece_and_an_empty_one_has_no_run() -> None:
    b = _plain(0, 3)
    assert split_runs(b, "t") == [b]
    assert not has_adopted(b.slice(0, 0))
    nulls = b.set_column(2, pa.field("op_type", pa.int8()), pa.array([0, None, int(OpType.ADOPTED)], pa.int8()))
    assert has_adopted(nulls)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.sampled_from("abcdef"), max_size=25), seen=st.sets(st.sampled_from("abcdef")),
       data=st.data())
def test_a_replica_re_applies_what_the_primary_did_with_its_versions(ids, seen, data) -> None:
    given_versions = data.draw(st.lists(st.integers(1, 6), min_size=len(ids), max_size=len(ids)))
    counts = Counter(ids)
    want_rows = [r for r, i in enumerate(ids) if i in seen or counts[i] > 1 or given_versions[r] != 1]
    got = reapply_plan(pa.array(ids, pa.string()), np.array([i in seen for i in ids], dtype=bool),
                       pa.nulls(len(ids), pa.int64()), np.array(given_versions, dtype=np.int64))
    assert got.rows.tolist() == want_rows
    assert got.versions.tolist() == [given_versions[r] for r in want_rows]
    assert row_versions(len(ids), got).tolist() == given_versions


def test_reapply_plan_refuses_given_versions_of_another_length() -> None:
    with pytest.raises(ValueError, match="1 given versions"):
        reapply_plan(pa.array(["a", "b"]), np.array([True, False]), pa.array([1, None]), np.array([1]))
