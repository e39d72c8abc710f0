"""The sink's pure Arrow helpers against plain-Python references (no Spark needed)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pyarrow as pa
import pytest

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
