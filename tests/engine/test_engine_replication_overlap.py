"""A primary replicates while its own translog upload is in flight (docs/design/engine.md, invariant 1).

The primary counts its batch processed (so its local checkpoint, and the global one,
move) only once the upload landed; a replica may therefore hold a write the store never
got (the primary's upload failed or its process died first).  Such a write was never
acknowledged, but it is live on the replica: a promotion uploads it again under the new
term, so a restore from the store alone finds what the live shard serves, with no gap.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shardstore.blobstores import open_store
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.testing.faulty import FaultyStore
from shardstore.translog.errors import TranslogUnavailable
from shardstore.translog.operations import index_batch


def _bulk(ids: list[str], tag: str) -> pa.RecordBatch:
    return index_batch(ids, [json.dumps({"tag": tag}).encode() for _ in ids])


def _top(batch: pa.RecordBatch) -> int:
    return int(pc.max(batch.column("seq_no")).as_py())


def test_replication_runs_before_the_upload_is_counted_and_the_ack_waits_for_both(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'remote'}?create=true")
    spec = ShardSpec("cluster-o", "index-o", 0, buffer_interval=0.0)
    primary = ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "r"), store, primary_term=1, primary=False)
    seen: dict[str, int] = {}

    def replicate(stamped: pa.RecordBatch) -> None:
        seen["primary_lc_during_replication"] = primary.local_checkpoint
        seen["replica_lc"] = replica.replica_apply(stamped, primary.primary_term, primary.global_checkpoint)

    try:
        stamped = primary.primary_apply(_bulk([f"d{i}" for i in range(50)], "one"), replicate=replicate)
        assert seen["primary_lc_during_replication"] < _top(stamped)  # not counted before the upload landed
        assert seen["replica_lc"] == _top(stamped)
        assert primary.local_checkpoint == _top(stamped)  # counted once it did, before primary_apply returned
        assert primary.remote_translog is not None and primary.remote_translog.uploaded_generations
        # an empty batch (every item of the shard rejected at the door) neither logs nor waits for an upload
        empty = primary.primary_apply(_bulk([], "none"), replicate=lambda s: seen.setdefault("empty", s.num_rows))
        assert empty.num_rows == 0 and seen["empty"] == 0
    finally:
        primary.close()
        replica.close()


def test_a_replicas_write_the_store_never_got_is_uploaded_by_its_promotion(tmp_path: Path) -> None:
    """The primary's translog upload fails (a fault no emulator produces on demand: FaultyStore) after its
    replica applied the batch: not acknowledged, yet live on the replica; once promoted, the store holds it."""
    url = f"file://{tmp_path / 'remote'}?create=true"
    spec = ShardSpec("cluster-o", "index-o", 0, buffer_interval=0.0, upload_timeout=1.0)
    faulty = FaultyStore(open_store(url))
    primary = ShardCopy(spec, str(tmp_path / "p"), faulty, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "r"), open_store(url), primary_term=1, primary=False)

    def replicate(stamped: pa.RecordBatch) -> None:
        lc = replica.replica_apply(stamped, primary.primary_term, primary.global_checkpoint)
        primary.update_global_checkpoint(min(lc, primary.local_checkpoint))

    try:
        primary.primary_apply(_bulk([f"a{i}" for i in range(20)], "acked"), replicate=replicate)
        faulty.inject(op=("put", "put_stream"), key="*translog*", action="fail", times=None)
        with pytest.raises(TranslogUnavailable):
            primary.primary_apply(_bulk([f"b{i}" for i in range(30)], "never-acked"), replicate=replicate)
        assert replica.max_seq_no == 49  # the replica holds the write the store never got
    finally:
        primary.close()
    replica.promote(2)
    replica.directory.refresh()
    live = {r["_id"] for b in replica.directory.scan(columns=["_id"]) for r in b.to_pylist()}
    replica.close()
    restored = ShardCopy.recover_from_remote(spec, str(tmp_path / "restored"), open_store(url), primary_term=3)
    try:
        restored.directory.refresh()
        got = {r["_id"] for b in restored.directory.scan(columns=["_id"]) for r in b.to_pylist()}
        assert got == live and len(got) == 50  # no gap: the restore serves what the live shard served
    finally:
        restored.close()
    assert os.path.isdir(tmp_path / "restored")
