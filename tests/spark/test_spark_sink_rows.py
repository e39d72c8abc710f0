"""The sink's pure Arrow helpers against plain-Python references, and its checks of Spark's files (no Spark needed)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstore.errors import CorruptError
from shardstore.spark.segment_files import (
    FINGERPRINTS,
    SparkSegmentMismatch,
    check_unique_seq_nos,
    fingerprints_repeat,
    footer_key_bounds,
    key_bounds,
    read_keys,
)
from shardstore.spark.sink_rows import last_per_id, superseded_copies


@pytest.mark.parametrize("seed", range(10))
def test_last_per_id_keeps_each_ids_last_row_sorted(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 2, 7, 300])
    pool = [f"id{rng.randint(0, max(1, n // rng.choice([1, 2, 5])))}" for _ in range(n)]
    ids = sorted(set(pool)) if seed % 3 == 0 else pool  # some inputs already sorted and unique
    rows = pa.table({"_id": pa.array(ids, pa.string()), "pos": pa.array(range(len(ids)), pa.int64())})
    want: dict[str, int] = {}
    for pos, i in enumerate(ids):
        want[i] = pos  # the last row wins
    got = last_per_id(rows)
    assert got.column("_id").to_pylist() == sorted(want)
    assert got.column("pos").to_pylist() == [want[i] for i in sorted(want)]


@pytest.mark.parametrize("seed", range(12))
def test_superseded_copies_leaves_only_each_ids_highest_seq_no(seed: int) -> None:
    """Within one part (a fast-path task that wrote an id twice) and across parts, against a plain-Python reference."""
    rng = random.Random(seed)
    parts, seq = [], 0
    for _k in range(rng.choice([1, 2, 3])):
        n = rng.choice([0, 1, 5, 200])
        ids = [f"id{rng.randint(0, max(1, n // rng.choice([1, 3])))}" for _ in range(n)]
        if seed % 4 == 0:
            ids = [f"{len(parts)}-{i}" for i in range(n)]  # every id once: nothing superseded
        seqs = list(range(seq, seq + n))
        rng.shuffle(seqs)  # seq#s in any row order (a join may reorder a task's rows)
        seq += n
        parts.append(SimpleNamespace(ids=pa.array(ids, pa.string()), seq_nos=pa.array(seqs, pa.int64())))
    best: dict[str, int] = {}
    for p in parts:
        for i, s in zip(p.ids.to_pylist(), p.seq_nos.to_pylist()):
            best[i] = max(best.get(i, -1), s)
    want = {}
    for k, p in enumerate(parts):
        rows = [r for r, (i, s) in enumerate(zip(p.ids.to_pylist(), p.seq_nos.to_pylist())) if s != best[i]]
        if rows:
            want[k] = rows
    got = {k: sorted(v) for k, v in superseded_copies(parts).items()}
    assert got == want
    if seed % 4 == 0:
        assert got == {}


def test_a_seq_no_on_two_rows_of_a_shard_refuses_the_files(tmp_path) -> None:
    """Each row Spark wrote took its own seq#; one seen twice (a row duplicated after the stamp) is refused."""
    check_unique_seq_nos(0, [pa.array([5, 7], pa.int64()), pa.array([6, 8], pa.int64())])
    check_unique_seq_nos(0, [])
    with pytest.raises(SparkSegmentMismatch, match="shard 3: a seq# appears on more than one row"):
        check_unique_seq_nos(3, [pa.array([5, 7], pa.int64()), pa.array([6, 7], pa.int64())])
    with pytest.raises(CorruptError):  # a kind a caller can act on
        check_unique_seq_nos(1, [pa.array([2, 2], pa.int64())])


def test_read_keys_refuses_seq_nos_outside_the_jobs_range(tmp_path) -> None:
    path = str(tmp_path / "part.parquet")
    pq.write_table(pa.table({"_id": ["a", "b"], "_seq_no": pa.array([10, 12], pa.int64())}), path)
    ids, seqs, versions = read_keys(path, 10, 13, versions=False)
    assert ids.to_pylist() == ["a", "b"] and seqs.to_pylist() == [10, 12] and versions is None
    for first, end in ((11, 13), (10, 12)):
        with pytest.raises(SparkSegmentMismatch, match=r"seq#s 10\.\.12 are outside the job's range"):
            read_keys(path, first, end, versions=False)


def _prints(tmp_path, name: str, values: list[int]) -> str:
    path = str(tmp_path / name)
    np.array(values, dtype="<u8").tofile(path + FINGERPRINTS)
    return path


def test_fingerprints_repeat_within_and_across_files(tmp_path) -> None:
    """The screen finds a fingerprint twice in one file or in two; none in distinct values; refuses a short file."""
    a = _prints(tmp_path, "a", [5, 1, 2**64 - 1, 9])
    b = _prints(tmp_path, "b", [7, 3])
    c = _prints(tmp_path, "c", [4, 2**64 - 1])  # repeats a's last-but-one across files
    d = _prints(tmp_path, "d", [8, 6, 8])  # repeats within itself
    e = _prints(tmp_path, "e", [])
    assert not fingerprints_repeat([a, b, e], [4, 2, 0])
    assert fingerprints_repeat([a, b, c], [4, 2, 2]) and fingerprints_repeat([d], [3])
    assert not fingerprints_repeat([], []) and not fingerprints_repeat([e], [0])
    with pytest.raises(SparkSegmentMismatch, match=r"b\.ids64: 16 bytes of id fingerprints for 3 rows"):
        fingerprints_repeat([a, b], [4, 3])  # a short fingerprint file could hide a repeated id
    with open(b + FINGERPRINTS, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn last record
    with pytest.raises(SparkSegmentMismatch, match=r"b\.ids64: 19 bytes of id fingerprints for 2 rows"):
        fingerprints_repeat([a, b], [4, 2])


@pytest.mark.parametrize("seed", range(6))
def test_footer_key_bounds_equal_the_read_back_bounds(tmp_path, seed: int) -> None:
    """What a screened part takes from the footer equals what reading the ids and seq#s back gives (several row groups)."""
    rng = random.Random(seed)
    n = rng.choice([1, 5, 3000])
    ids = [rng.choice(["", "a", "zz", "é", "日本", "😀"]) + str(rng.randint(0, 10**6)) for _ in range(n)]
    if seed % 2:
        ids.sort()
    seqs = rng.sample(range(10**9), n)
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"_id": pa.array(ids, pa.string()), "_seq_no": pa.array(seqs, pa.int64())}), path,
                   row_group_size=700)
    sorted_ = ids == sorted(ids)
    want = key_bounds(pa.array(ids, pa.string()), pa.array(seqs, pa.int64()))
    assert want.id_sorted == sorted_
    assert footer_key_bounds(path, sorted_) == want
    assert (want.min_id, want.max_id, want.min_seq_no, want.max_seq_no) == (min(ids), max(ids), min(seqs), max(seqs))
