"""The cold scan issue 44 names: a remote commit read back from the blob store with no local cache.

``python -m benches peers`` times, beside its ``scan_cold_s`` (the node's own segment files, row cache
bypassed), ``open_commit(store, address).scan()`` by a new reader on every read: the commit metadata GET,
every segment file downloaded and its CRC32C checked, then decoded.  ``scan_store_cold_s`` (and
``scan_store_cold_ratio`` against deltalake's ``to_pyarrow_table`` of the same columns, the ``scan_s`` row's
reads) is the reader's default: a commit this small is held in memory (segments/reader.py
``reads_in_memory``); ``scan_store_cached_s`` is the same read with ``cache=True``, through a fresh, empty disk
cache directory each time (written, then removed inside the clock).  This is what a Spark task or a restore
on a new machine pays.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["store_reader"]


def store_reader(cluster: Any, index: str, columns: Sequence[str], base: str,
                 cache: bool | None = None) -> Callable[[], Any]:
    """A function reading ``columns`` of every shard's newest remote commit of ``index`` as one Arrow table.

    Each call opens new readers, given ``cache`` and a new empty cache directory under ``base`` (removed after).
    """
    import pyarrow as pa

    from shardstore.core.address import ShardAddress
    from shardstore.segments.reader import open_commit

    meta = cluster.index_meta(index)
    addresses = [ShardAddress(cluster.cluster_uuid, meta.uuid, shard) for shard in range(meta.shards)]

    def read() -> Any:
        tmp = tempfile.mkdtemp(prefix="store-scan-", dir=base)
        try:
            batches = [b for a in addresses for b in open_commit(cluster.store, a, cache_dir=tmp, cache=cache).scan(columns)]
            return pa.Table.from_batches(batches) if batches else None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return read
