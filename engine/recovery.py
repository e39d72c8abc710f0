"""Peer recovery: a new replica built from its primary while writes go on.

Elasticsearch's two phases, made small:

1. *Without blocking writes*: the primary's last commit is locked and its files copied;
   the replica opens on them and replays the primary's local translog above the
   commit's checkpoint.  A translog hold on the primary (:meth:`ShardCopy.hold_translog`)
   keeps those generations from being purged by a concurrent flush.
2. *Under the shard's write lock* (no write of this shard is in flight, none starts):
   the replica replays what was logged during phase 1, learns the global checkpoint, and
   ``finalize`` (the cluster manager) adds it to the in-sync set, or refuses it because
   the primary or its term changed meanwhile.  From then on it receives every write.

Phase 1 is what grows with the shard; it no longer holds up anything, so a failover
costs the promotion alone (docs/design/engine.md, "Failover time").
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

from shardstore.blobstores.base import BlobStore
from shardstore.engine.errors import RecoverySourceClosed
from shardstore.engine.node_remote import NodeRemote
from shardstore.engine.shard import ShardCopy, ShardSpec
from shardstore.translog.tracker import NO_OPS_PERFORMED


def peer_recover(primary: ShardCopy, spec: ShardSpec, data_dir: str, store: BlobStore | None, *,
                 node_remote: NodeRemote | None = None, shard_lock: contextlib.AbstractContextManager,
                 finalize: Callable[[ShardCopy], bool]) -> ShardCopy | None:
    """Build a replica of ``primary`` under ``data_dir``; returns it once ``finalize`` accepted it, else None.

    RecoverySourceClosed (retryable) when ``primary`` closes meanwhile (issue 14, case 6b).
    """
    try:
        return _recover(primary, spec, data_dir, store, node_remote, shard_lock=shard_lock, finalize=finalize)
    except (OSError, ValueError) as exc:
        if primary.closed:
            raise RecoverySourceClosed(primary.path, exc) from exc
        raise


def _recover(primary: ShardCopy, spec: ShardSpec, data_dir: str, store: BlobStore | None,
             node_remote: NodeRemote | None, *,
             shard_lock: contextlib.AbstractContextManager,
             finalize: Callable[[ShardCopy], bool]) -> ShardCopy | None:
    dest = os.path.join(data_dir, spec.index_uuid, str(spec.shard))
    shutil.rmtree(dest, ignore_errors=True)
    commit = primary.directory.last_commit
    start = commit.local_checkpoint if commit is not None else NO_OPS_PERFORMED
    with primary.hold_translog(start + 1) as advance:
        if commit is not None:
            primary.directory.lock_commit(commit.generation)
            try:
                os.makedirs(os.path.join(dest, "index"))
                for name in [*commit.files(), commit.file_name]:
                    shutil.copy2(os.path.join(primary.directory.path, name), os.path.join(dest, "index", name))
            finally:
                primary.directory.release_commit(commit.generation)
        replica = ShardCopy(spec, data_dir, store, primary_term=1, primary=False, node_remote=node_remote)
        try:
            # phase 1: concurrent with writes
            replica.replay(primary.translog.read_operations(replica.local_checkpoint + 1))
            advance(replica.local_checkpoint + 1)
            with shard_lock:  # phase 2: the shard's writes wait for the tail only
                replica.replay(primary.translog.read_operations(replica.local_checkpoint + 1))
                replica.update_global_checkpoint(primary.global_checkpoint)
                if finalize(replica):
                    return replica
            replica.close()
            return None
        except BaseException:
            replica.close()
            raise
