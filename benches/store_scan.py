"""The cold scan issue 44 names: a remote commit read back from the blob store with no local cache.

``python -m benches peers`` times, beside its ``scan_cold_s`` (the node's own segment files, row cache
bypassed), ``open_commit(store, address).scan()`` into a fresh, empty cache directory on every read: the
commit metadata GET, every segment file downloaded and its CRC32C checked, then decoded
(``scan_store_cold_s``, ``scan_store_cold_ratio`` against deltalake's ``to_pyarrow_table`` of the same
columns, the ``scan_s`` row's reads).  This is what a Spark task or a restore on a new machine pays.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["store_reader"]


def store_reader(cluster: Any, index: str, columns: Sequence[str], base: str) -> Callable[[], Any]:
    """A function reading ``columns`` of every shard's newest remote commit of ``index`` as one Arrow table, each
    call through a new empty cache directory under ``base`` (removed after)."""
    import pyarrow as pa

    from shardstore.core.address import ShardAddress
    from shardstore.segments.reader import open_commit

    meta = cluster.index_meta(index)
    addresses = [ShardAddress(cluster.cluster_uuid, meta.uuid, shard) for shard in range(meta.shards)]

    def read() -> Any:
        cache = tempfile.mkdtemp(prefix="store-scan-", dir=base)
        try:
            batches = [b for a in addresses for b in open_commit(cluster.store, a, cache_dir=cache).scan(columns)]
            return pa.Table.from_batches(batches) if batches else None
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    return read
