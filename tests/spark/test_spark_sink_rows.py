"""The sink's pure Arrow helpers against plain-Python references (no Spark needed)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from shardstore.spark.sink_rows import last_per_id


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
