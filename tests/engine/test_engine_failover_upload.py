"""A promotion uploads nothing of the new primary's retained translog (issue 14, case 7).

Before, the promoted replica's whole retained local translog was uploaded under the new
term inside ``kill_node`` (47 MB at 336k docs), so the first failover's time grew with the
shard.  Every operation it holds is already durable under the old term's prefix (at or below
the global checkpoint, or within the old term's uploaded generations: docs/design/engine.md,
invariant 7c), so only the new term's generations are uploaded; restore merges the older
term's log, which is purged only once a commit of the new term covers it.
"""

from __future__ import annotations

from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.engine import Cluster


def _translog_blobs(url: str) -> dict[str, int]:
    """Every translog data blob (per-shard and node-level) and its size."""
    return {b.key: b.size for b in open_store(url).list("")
            if "/translog/data/" in b.key or ("/node_translog/" in b.key and "/data/" in b.key)}


def test_promotion_uploads_only_the_new_terms_log(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=url, data_dir=str(tmp_path / "a"), nodes=3, recovery_delay=5.0)
    n = 20_000
    try:
        cluster.create_index("docs", shards=1, replicas=1)
        for start in range(0, n, 5_000):  # never flushed: the replica retains all of it locally
            assert not cluster.bulk("docs", [{"_id": str(i), "s": "x" * 40} for i in range(start, start + 5_000)]).errors
        before = _translog_blobs(url)
        assert sum(before.values()) > 500_000
        cluster.kill_node(cluster.primary_of("docs", 0))
        new_term_bytes = sum(size for key, size in _translog_blobs(url).items() if key not in before)
        assert new_term_bytes < 20_000, f"the promotion uploaded {new_term_bytes} bytes of translog under term 2"
        assert not cluster.bulk("docs", [{"_id": "after", "s": "y"}]).errors
    finally:
        cluster.close()
    restored = Cluster.restore(store=url, data_dir=str(tmp_path / "b"), nodes=1)
    try:
        restored.refresh("docs")
        assert restored.count("docs") == n + 1
    finally:
        restored.close()
