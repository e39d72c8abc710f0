"""Per-id version lookup (the primary's version map) against a plain-Python oracle."""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.segments.directory import ShardDirectory
from shardstore.segments.id_index import SortedKeys, fingerprints
from shardstore.segments.versions import id_order, ids_unique, next_versions
from shardstore.translog.operations import OpType, stamp, unstamped_batch

IDS = ["a", "b", "c", "d", "e"]
# one step: ("index"|"delete", ids) or ("refresh",) / ("flush",)
step = st.one_of(
    st.tuples(st.sampled_from(["index", "delete"]), st.lists(st.sampled_from(IDS), min_size=1, max_size=6)),
    st.tuples(st.sampled_from(["refresh", "merge"])),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.lists(st.sampled_from(IDS + ["zz"]), min_size=1, max_size=8),
       st.sampled_from([1, 10**9]))
def test_current_versions_match_an_oracle(steps: list[tuple], queries: list[str], run_rows: int) -> None:
    """Buffered ops, refreshed segments, deletes and merges: the newest live copy's seq#, term and version win.
    ``run_rows``: every buffered batch kept as a run (found through the sorted fingerprints a primary hands in,
    issue 44) or none."""
    from shardstore.segments import version_map

    saved, version_map.RUN_ROWS = version_map.RUN_ROWS, run_rows
    try:
        _check_current_versions(steps, queries)
    finally:
        version_map.RUN_ROWS = saved


def _check_id_indexes(sd: ShardDirectory) -> None:
    """Every segment's id index (cut from the buffered batches' keys at a refresh when they had them) is the one its
    ids give when fingerprinted afresh: the same fingerprints, each with the row of an id that has it."""
    for seg in sd._segments.values():
        index = seg.reader.id_index()
        ids = index.ids
        assert np.array_equal(index.fp, np.sort(fingerprints(ids)))
        assert np.array_equal(fingerprints(ids.take(pa.array(index.rows))), index.fp)


def _check_current_versions(steps: list[tuple], queries: list[str]) -> None:
    oracle: dict[str, tuple[int, int, int] | None] = {}
    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False) as sd:
        seq = 0
        for s in steps:
            if s[0] == "refresh":
                sd.refresh()
                _check_id_indexes(sd)
                continue
            if s[0] == "merge":
                sd.refresh()
                sd.force_merge(1)
                continue
            kind, ids = s
            term = 1 + seq // 7
            current = sd.current_versions(pa.array(ids))
            versions = next_versions(pa.array(ids), current.column("_version")).to_pylist()
            # a primary's path: the ids' sort says whether they are unique, and both lookups take that answer
            order = id_order(pa.array(ids))
            unique = ids_unique(pa.array(ids), order)
            assert unique == (len(set(ids)) == len(ids))
            keys = SortedKeys.of(pa.array(ids)) if unique else None
            if unique:
                assert sd.current_versions(pa.array(ids), unique=True) == current
                assert sd.current_versions(pa.array(ids), unique=True, keys=keys) == current
            assert next_versions(pa.array(ids), current.column("_version"), order, unique=unique).to_pylist() == versions
            # the oracle: version before the batch (0 if absent or deleted) + 1, then +1 per earlier op
            # on the same id in this batch (a batch counts on through its own deletes, like a version map)
            expect, last = [], {i: (oracle[i][2] if oracle.get(i) else 0) for i in ids}
            for i in ids:
                last[i] += 1
                expect.append(last[i])
            assert versions == expect
            op = int(OpType.INDEX if kind == "index" else OpType.DELETE)
            srcs = [b"{}" if kind == "index" else None] * len(ids)
            sd.apply(stamp(unstamped_batch([op] * len(ids), ids, versions, srcs), seq, term), id_keys=keys)
            for k, (i, v) in enumerate(zip(ids, versions)):
                oracle[i] = (seq + k, term, v) if kind == "index" else None
            seq += len(ids)
        got = sd.current_versions(pa.array(queries)).to_pylist()
        want = [dict(zip(("_seq_no", "_primary_term", "_version"), oracle.get(q) or (None, None, None)))
                for q in queries]
        assert got == want
        once = list(dict.fromkeys(queries))  # the same queries, each once: the unique path agrees
        assert sd.current_versions(pa.array(once), unique=True).to_pylist() == [want[queries.index(q)] for q in once]


def test_next_versions_counts_repeats_within_a_batch() -> None:
    got = next_versions(pa.array(["x", "y", "x", "z", "x"]), pa.array([3, None, 3, 7, 3])).to_pylist()
    assert got == [4, 1, 5, 8, 6]
    assert next_versions(pa.array([], pa.string()), pa.array([], pa.int64())).to_pylist() == []


# one primary history (kind, id) per op; applied to a replica in a shuffled order of batches
history_op = st.tuples(st.sampled_from(["index", "delete"]), st.sampled_from(IDS))


@settings(max_examples=80, deadline=None)
@given(st.lists(history_op, min_size=1, max_size=16), st.randoms(use_true_random=False),
       st.lists(st.booleans(), min_size=16, max_size=16))
def test_current_versions_on_a_replica_applying_out_of_order(history: list[tuple[str, str]], rnd, refresh_after):
    """A replica may apply an older operation after a newer one (and refresh in between): the newest by seq#
    still wins, whether both are buffered or one is in a segment (the version map keeps the highest seq#)."""
    versions: dict[str, int] = {}
    ops = []
    for seq, (kind, doc_id) in enumerate(history):
        versions[doc_id] = versions.get(doc_id, 0) + 1
        ops.append((seq, kind, doc_id, versions[doc_id]))
    newest: dict[str, tuple] = {}
    for op in ops:
        newest[op[2]] = op
    rnd.shuffle(ops)
    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False) as sd:
        for i, (seq, kind, doc_id, version) in enumerate(ops):
            code = int(OpType.INDEX if kind == "index" else OpType.DELETE)
            sd.apply(stamp(unstamped_batch([code], [doc_id], [version], [b"{}" if kind == "index" else None]), seq, 1))
            if refresh_after[i % len(refresh_after)]:
                sd.refresh()
        got = sd.current_versions(pa.array(IDS)).to_pylist()
        want = []
        for doc_id in IDS:
            op = newest.get(doc_id)
            live = op is not None and op[1] == "index"
            want.append({"_seq_no": op[0] if live else None, "_primary_term": 1 if live else None,
                         "_version": op[3] if live else None})
        assert got == want
        for doc_id, w in zip(IDS, want):  # a realtime get agrees with the versions
            doc = sd.get(doc_id)
            assert (doc and doc["_seq_no"]) == (doc and w["_seq_no"]), doc_id
            assert (doc is None) == (w["_seq_no"] is None), doc_id


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(IDS), st.integers(0, 40), st.booleans()), min_size=1, max_size=6),
                min_size=1, max_size=6), st.sampled_from([1, 3, 10**9]), st.sampled_from(["dict", "columnar"]),
       st.sampled_from(["none", "right", "wrong"]), st.sampled_from(["none", "true", "colliding"]))
def test_version_map_keeps_each_ids_highest_seq_no(batches: list[list[tuple[str, int, bool]]], run_rows: int,
                                                   lookups: str, hint: str, keys: str) -> None:
    """Batches in any seq# order (a primary's ascending ones take the dict-update path, others the loop,
    large ones -- ``run_rows`` -- are kept as runs, issue 31): per id the operation with the highest seq# is
    kept, a delete included, and its row is the right one.  ``lookups``: Arrow lookups through a dict call per
    id, or through the dict's columnar copy (issue 44: no Python call per id), whichever the cost rule picks.
    ``hint``: each batch's id sort handed in (a run's first lookup then skips its own sort), none, or a wrong
    one (the identity reversed), which must be ignored.  ``keys``: the sorted fingerprints of each batch of
    distinct ids handed in, and the lookups' own (issue 44: runs found by searchsorted), either the real ones or
    a fingerprint that collides for half the ids (the ids must decide, and a run whose own collide is hashed)."""
    from shardstore.segments import version_map

    saved = version_map.RUN_ROWS, version_map.DICT_COST_PER_ID, version_map.COLUMNAR_MIN_IDS
    version_map.RUN_ROWS = run_rows
    version_map.DICT_COST_PER_ID, version_map.COLUMNAR_MIN_IDS = (0, 10**9) if lookups == "dict" else (10**9, 0)
    try:
        _check_version_map(batches, hint, keys)
    finally:
        version_map.RUN_ROWS, version_map.DICT_COST_PER_ID, version_map.COLUMNAR_MIN_IDS = saved


def _sorted_keys(ids: list[str], kind: str):
    """The SortedKeys of ``ids``: real fingerprints, or one that collides for every two ids of the same parity."""
    import numpy as np

    from shardstore.segments.id_index import SortedKeys

    if kind == "true":
        return SortedKeys.of(pa.array(ids, pa.string()))
    fp = np.array([ord(i[0]) % 2 for i in ids], dtype=np.uint64)
    order = np.argsort(fp, kind="stable")
    return SortedKeys(fp[order], order.astype(np.int64))


def _check_version_map(batches: list[list[tuple[str, int, bool]]], hint: str = "none", keys: str = "none") -> None:
    from shardstore.segments.version_map import VersionMap

    vm, oracle = VersionMap(), {}
    used: set[int] = set()
    for entry, batch in enumerate(batches):
        batch = [(i, s, d) for i, s, d in batch if s not in used and not used.add(s)]  # seq#s are unique
        if not batch:
            continue
        ids, seqs = pa.array([b[0] for b in batch]), pa.array([b[1] for b in batch], pa.int64())
        deleted = batch[0][2]  # one kind per batch, as the directory buffers them
        if deleted:
            vm.add_deletes(ids, seqs)
        else:
            order = {"none": None, "right": pc.sort_indices(ids),
                     "wrong": pa.array(range(len(batch) - 1, -1, -1), pa.uint64())}[hint]
            distinct = len({b[0] for b in batch}) == len(batch)  # a primary hands keys in only then
            vm.add_docs(entry, ids, seqs, pa.array([7] * len(batch), pa.int64()), pa.array([s + 100 for _, s, _ in batch]),
                        order, _sorted_keys([b[0] for b in batch], keys) if keys != "none" and distinct else None)
        for row, (i, s, _) in enumerate(batch):
            if i not in oracle or s > oracle[i][0]:
                oracle[i] = (s, None if deleted else 7, None if deleted else s + 100, -1 if deleted else entry, row)
    for i in IDS:
        got = vm.get(i)
        assert (tuple(got) if got else None) == oracle.get(i)
    want = [dict(zip(("_seq_no", "_primary_term", "_version"), oracle[i][:3] if i in oracle and oracle[i][2]
                     else (None,) * 3)) for i in IDS]
    assert vm.lookup(IDS).to_pylist() == want
    # the columnar lookups (issue 43: over runs, no Python loop per id) agree with the per-id ones
    assert vm.lookup(pa.array(IDS)).to_pylist() == want
    assert vm.versions(IDS) == [(oracle[i][2] or 0) if i in oracle else 0 for i in IDS]
    assert list(vm.versions(IDS, pa.array(IDS))) == vm.versions(IDS)
    q, seq, term, version, deleted = vm.candidates(IDS)
    assert [IDS[p] for p in q] == [i for i in IDS if i in oracle]
    assert seq == [oracle[IDS[p]][0] for p in q] and deleted == [oracle[IDS[p]][2] is None for p in q]
    from shardstore.segments.versions import _CANDIDATE

    assert vm.candidates_table(pa.array(IDS), _CANDIDATE).to_pydict() == {
        "q": q, "_seq_no": seq, "_primary_term": term, "_version": version, "deleted": deleted}
    if keys != "none":  # the lookups that bring their ids' sorted fingerprints agree too
        qk = _sorted_keys(IDS, keys)
        assert vm.lookup(pa.array(IDS), keys=qk).to_pylist() == want
        assert vm.candidates_table(pa.array(IDS), _CANDIDATE, qk).to_pydict() == {
            "q": q, "_seq_no": seq, "_primary_term": term, "_version": version, "deleted": deleted}


def test_a_lookup_of_scattered_ids_decodes_no_row_group_per_bulk(monkeypatch) -> None:
    """Issue 44: a bulk's updates fall anywhere in a segment; once a segment's version columns are read, each lookup
    takes its hits from them (SegmentReader.version_columns) instead of decoding every row group holding one."""
    import pyarrow.parquet as pq

    reads: list[int] = []
    original = pq.ParquetFile.read_row_groups

    def counting(self, row_groups, *args, **kwargs):
        reads.append(len(row_groups))
        return original(self, row_groups, *args, **kwargs)

    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False) as sd:
        n = 20_000
        ids = [f"d{k}" for k in range(n)]
        sd.apply(stamp(unstamped_batch([int(OpType.INDEX)] * n, ids, [1] * n, [b"{}"] * n), 0, 1))
        sd.refresh()
        monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting)
        first = sd.current_versions(pa.array(ids[::997])).column("_version").to_pylist()
        reads.clear()
        for bulk in range(5):  # scattered hits, bulk after bulk
            got = sd.current_versions(pa.array(ids[bulk::1001])).column("_version").to_pylist()
            assert got == [1] * len(got)
        assert first == [1] * len(first) and reads == [], reads


def test_a_refresh_installs_the_version_columns_the_file_holds() -> None:
    """The columns a refresh installs on its new segments (no read back) equal what a fresh reader of the file reads."""
    from shardstore.segments.segment import SegmentReader

    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False) as sd:
        n = 30_000
        ids = [f"d{(k * 7919) % n}" for k in range(n)]  # not in id order: the segment sorts them
        sd.apply(stamp(unstamped_batch([int(OpType.INDEX)] * n, ids, [1 + k % 3 for k in range(n)], [b"{}"] * n), 0, 2))
        sd.refresh()
        readers = [r for r, _live in sd.searchable_segments()]
        assert readers and all("_version_cache" in r.__dict__ for r in readers)
        for r in readers:
            fresh = SegmentReader(r.path, r.info)
            assert [a.to_pylist() for a in r.version_columns()] == [a.to_pylist() for a in fresh.version_columns()]


def test_a_merge_installs_the_id_index_and_version_columns_the_file_holds() -> None:
    """A merge's new segment gets its id index and version columns from memory (no read back on the next lookup,
    an adoption's or a bulk's: issue 43's commit), equal to what a fresh reader of the file builds; lookups answer
    as before the merge."""
    from shardstore.segments.segment import SegmentReader

    with tempfile.TemporaryDirectory() as tmp, ShardDirectory(tmp, fsync=False, warm=False) as sd:
        seq = 0
        for part in range(3):  # three segments, ids interleaved across them, some ids written twice
            ids = [f"d{(k * 7919 + part) % 9000}" for k in range(3000)]
            n = len(ids)
            sd.apply(stamp(unstamped_batch([int(OpType.INDEX)] * n, ids, [1 + part] * n, [b"{}"] * n), seq, 2))
            seq += n
            sd.refresh()
        queries = pa.array([f"d{k}" for k in range(0, 9100, 7)])
        before = sd.current_versions(queries).to_pydict()
        sd.force_merge(1)
        readers = [r for r, _live in sd.searchable_segments()]
        assert len(readers) == 1 and readers[0].index_loaded and "_version_cache" in readers[0].__dict__
        fresh = SegmentReader(readers[0].path, readers[0].info)
        assert [a.to_pylist() for a in readers[0].version_columns()] == [a.to_pylist() for a in fresh.version_columns()]
        mine, theirs = readers[0].id_index(), fresh.id_index()
        assert mine.ids.to_pylist() == theirs.ids.to_pylist() and sorted(mine.fp.tolist()) == theirs.fp.tolist()
        assert sd.current_versions(queries).to_pydict() == before
