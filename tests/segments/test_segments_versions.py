"""Per-id version lookup (the primary's version map) against a plain-Python oracle."""

from __future__ import annotations

import tempfile

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.segments.directory import ShardDirectory
from shardstore.segments.versions import next_versions
from shardstore.translog.operations import OpType, stamp, unstamped_batch

IDS = ["a", "b", "c", "d", "e"]
# one step: ("index"|"delete", ids) or ("refresh",) / ("flush",)
step = st.one_of(
    st.tuples(st.sampled_from(["index", "delete"]), st.lists(st.sampled_from(IDS), min_size=1, max_size=6)),
    st.tuples(st.sampled_from(["refresh", "merge"])),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.lists(st.sampled_from(IDS + ["zz"]), min_size=1, max_size=8))
def test_current_versions_match_an_oracle(steps: list[tuple], queries: list[str]) -> None:
    """Buffered ops, refreshed segments, deletes and merges: the newest live copy's seq#, term and version win."""
    oracle: dict[str, tuple[int, int, int] | None] = {}
    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False) as sd:
        seq = 0
        for s in steps:
            if s[0] == "refresh":
                sd.refresh()
                continue
            if s[0] == "merge":
                sd.refresh()
                sd.force_merge(1)
                continue
            kind, ids = s
            term = 1 + seq // 7
            current = sd.current_versions(pa.array(ids))
            versions = next_versions(pa.array(ids), current.column("_version")).to_pylist()
            # the oracle: version before the batch (0 if absent or deleted) + 1, then +1 per earlier op
            # on the same id in this batch (a batch counts on through its own deletes, like a version map)
            expect, last = [], {i: (oracle[i][2] if oracle.get(i) else 0) for i in ids}
            for i in ids:
                last[i] += 1
                expect.append(last[i])
            assert versions == expect
            op = int(OpType.INDEX if kind == "index" else OpType.DELETE)
            srcs = [b"{}" if kind == "index" else None] * len(ids)
            sd.apply(stamp(unstamped_batch([op] * len(ids), ids, versions, srcs), seq, term))
            for k, (i, v) in enumerate(zip(ids, versions)):
                oracle[i] = (seq + k, term, v) if kind == "index" else None
            seq += len(ids)
        got = sd.current_versions(pa.array(queries)).to_pylist()
        want = [dict(zip(("_seq_no", "_primary_term", "_version"), oracle.get(q) or (None, None, None)))
                for q in queries]
        assert got == want


def test_next_versions_counts_repeats_within_a_batch() -> None:
    got = next_versions(pa.array(["x", "y", "x", "z", "x"]), pa.array([3, None, 3, 7, 3])).to_pylist()
    assert got == [4, 1, 5, 8, 6]
    assert next_versions(pa.array([], pa.string()), pa.array([], pa.int64())).to_pylist() == []
