"""The shard-wide id index (segments/shard_id_index.py, issue 44): the same answers as searching each segment in
turn (``lookup_segments``, the reference), whatever the segments, the subsets asked for and the order in which
segments join and leave the set; the levels stay few.  Real segment files (``write_segment``), no mock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.segments.segment import SegmentReader, lookup_segments, write_segment
from shardstore.segments.shard_id_index import ShardIdIndex


def _segment(tmp: Path, ids: list[str], name: str, *, sort: bool) -> SegmentReader:
    n = len(ids)
    table = pa.table({
        "_id": pa.array(ids, pa.string()),
        "_seq_no": pa.array(np.arange(n), pa.int64()),
        "_primary_term": pa.array(np.ones(n, dtype=np.int64)),
        "_version": pa.array(np.ones(n, dtype=np.int64)),
        "_source": pa.nulls(n, pa.binary()),
    })
    path = str(tmp / f"{name}.parquet")
    return SegmentReader(path, write_segment(path, table, name=name, sort=sort, fsync=False))


def _same(index: ShardIdIndex, readers: list[SegmentReader], ids: list[str], every: list[SegmentReader]) -> None:
    query = pa.array(ids, pa.string())
    got = [a.to_pylist() for a in index.lookup(readers, query, every)]
    want = [a.to_pylist() for a in lookup_segments(readers, query)]
    assert got == want, (ids, [r.info.name for r in readers])


_IDS = st.lists(st.integers(0, 150).map(lambda i: f"id{i}"), min_size=0, max_size=120)
_STEPS = st.lists(st.tuples(st.sampled_from(["add", "drop", "ask"]), _IDS, st.integers(0, 2**16), st.booleans()),
                  min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_STEPS)
def test_the_levels_answer_as_each_segment_in_turn(tmp_path_factory, steps) -> None:
    """Segments join (an id may be in several, or twice in one), leave, and lookups ask for any subset, with more
    ids than the small-lookup path takes (70 and up): always the reference's answer, in its order."""
    tmp = tmp_path_factory.mktemp("levels")
    index, live, made = ShardIdIndex(), [], 0
    for kind, ids, pick, sort in steps:
        if kind == "add" or not live:
            live.append(_segment(tmp, ids + ids[:3], f"s{made}", sort=sort))
            made += 1
        elif kind == "drop":
            live.pop(pick % len(live))
        subset = [r for k, r in enumerate(live) if (pick >> k) & 1] or live
        queries = (ids * 3 + [f"id{i}" for i in range(150, 221)])[:max(70, len(ids))]
        _same(index, subset, queries, live)
    assert index.levels <= max(1, 2 * len(live).bit_length())


def test_a_fingerprint_collision_finds_no_wrong_row(tmp_path: Path, monkeypatch) -> None:
    """Every id gets the same fingerprint (a forced collision, which no real id pair produces on demand): the ids
    themselves decide, and the answer is still exact."""
    import shardstore.segments.id_index as id_index

    same = lambda ids: np.zeros(len(ids), dtype=np.uint64)  # noqa: E731
    monkeypatch.setattr(id_index, "fingerprints", same)
    import shardstore.segments.segment as segment

    monkeypatch.setattr(segment, "fingerprints", same)
    a = _segment(tmp_path, [f"a{i}" for i in range(80)], "a", sort=True)
    b = _segment(tmp_path, [f"a{i}" for i in range(40, 120)], "b", sort=False)
    index = ShardIdIndex()
    _same(index, [a, b], [f"a{i}" for i in range(0, 160, 2)], [a, b])


def test_many_segments_make_few_levels_and_dead_ones_go(tmp_path: Path) -> None:
    """32 segments of one size make a handful of levels (each at least twice the next), not 32; dropping all but two
    and asking again rebuilds from the two (the dead entries outnumbered the live ones)."""
    readers = [_segment(tmp_path, [f"s{k}-{i}" for i in range(100)], f"s{k}", sort=True) for k in range(32)]
    index = ShardIdIndex()
    ids = [f"s{k}-{i}" for k in range(0, 32, 3) for i in range(0, 100, 7)]
    _same(index, readers, ids, readers)
    assert 1 <= index.levels <= 5
    _same(index, readers[:2], ids, readers[:2])
    assert index.levels == 1 and index._dead == 0
