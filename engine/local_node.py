"""One in-process node of the embedded cluster: its disk, its shard copies and its transport handler.

The data role of :class:`~shardstore.engine.cluster.Cluster` (a node process's is
:mod:`~shardstore.engine.node_service`): ``shard.bulk`` on a primary (apply, then replicate
to every in-sync replica) and ``shard.replicate`` on a replica.  What it asks of the cluster
manager, which in-sync replicas a shard has and to fail a replica or a copy whose local disk
failed, is passed to it as callables: this module imports nothing of the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.engine.bulk_parts import NodeRoles, apply_one, apply_parts, joining_hold, staging_hold
from shardstore.engine.errors import InvalidRequest, OperationTermTooOld, ShardUnavailable
from shardstore.engine.node_remote import NodeRemote
from shardstore.engine.shard import ShardCopy
from shardstore.errors import LocalDiskError
from shardstore.transport import Transport

log = logging.getLogger("shardstore.engine.cluster")
__all__ = ["Node"]


class Node:
    """One in-process node: its disk, its shard copies and its transport handler."""

    def __init__(self, name: str, data_dir: str, store: BlobStore | None, transport: Transport, *,
                 in_sync_replicas: Callable[[tuple[str, int]], list[str]],
                 fail_replica: Callable[[tuple[str, int], str, int, str], None],
                 fail_copy: Callable[[tuple[str, int], str, ShardCopy, str], bool],
                 shard_lock: Callable[[tuple[str, int]], contextlib.AbstractContextManager[Any]]) -> None:
        self.name = name
        self.data_dir = data_dir
        self.store = store
        self.transport = transport
        self.copies: dict[tuple[str, int], ShardCopy] = {}
        #: the node-level translog and claim watch every primary copy here shares (issue 30)
        self.remote = NodeRemote(store, name) if store is not None else None
        self._in_sync_replicas = in_sync_replicas
        self._fail_replica = fail_replica
        self._fail_copy = fail_copy
        #: the cluster's per-shard write lock: bulks of a shard stage and replicate one at a time, and a peer
        #: recovery's hand-off excludes them
        self._shard_lock = shard_lock
        os.makedirs(data_dir, exist_ok=True)

    def handle(self, action: str, req: dict[str, Any]) -> Any:
        """Transport entry point."""
        if action == "shard.bulk_many":
            return self._primary_bulk_many(req)
        key = (req["index_uuid"], req["shard"])
        if action == "shard.bulk":
            return self._primary_bulk(key, req)
        copy = self.copies.get(key)
        if copy is None:
            raise ShardUnavailable(req["index_uuid"], req["shard"], f"no copy on {self.name}")
        if action == "shard.replicate":
            return copy.replica_apply(req["ops"], req["term"], req["global_checkpoint"], req.get("mapping"))
        raise InvalidRequest(f"unknown action {action!r}")

    def _replicate(self, key: tuple[str, int], copy: ShardCopy, stamped: Any, mapping: Any,
                   checkpoints: list[int]) -> None:
        """Send ``stamped`` to every in-sync replica (while the primary's own upload is in flight)."""
        for replica in self._in_sync_replicas(key):
            try:
                checkpoints.append(self.transport.send(
                    self.name, replica, "shard.replicate",
                    {"index_uuid": key[0], "shard": key[1], "ops": stamped, "term": copy.primary_term,
                     "global_checkpoint": copy.global_checkpoint, "mapping": mapping}))
            except OperationTermTooOld:
                raise  # the replica knows a newer term: this primary is stale, its write is not acknowledged
            except Exception as exc:  # noqa: BLE001 - unreachable, or it refused ops the primary applied
                # the cluster manager removes the copy from the in-sync set before we acknowledge: a replica
                # that cannot apply what the primary applied (a mapping it decided otherwise) is rebuilt,
                # never left in sync behind the primary (issue 15 review)
                self._fail_replica(key, replica, copy.primary_term, f"{type(exc).__name__}: {exc}")

    def _primary(self, key: tuple[str, int]) -> ShardCopy:
        copy = self.copies.get(key)
        if copy is None or not copy.primary:
            raise ShardUnavailable(key[0], key[1], f"{self.name} holds no primary")
        return copy

    def _primary_bulk(self, key: tuple[str, int], req: dict[str, Any]) -> dict[str, Any]:
        """``shard.bulk`` on the primary (engine/bulk_parts.py, ``apply_one``)."""
        return {"ops": apply_one(req, key, self._roles(), expect=req.get("expect"))}

    def _settle(self, key: tuple[str, int], copy: ShardCopy, pending: Any) -> None:
        try:
            copy.settle(pending)
        except LocalDiskError as exc:
            self._fail_copy(key, self.name, copy, str(exc))
            raise

    def _primary_bulk_many(self, req: dict[str, Any]) -> dict[str, Any]:
        """``shard.bulk_many``: one bulk's parts for several shards whose primaries are here; per part
        ``{"ops": stamped}`` or ``{"error": "Type: message", "retry": bool}`` (``retry``: nothing was applied).

        Every part is staged first, inside one hold of the node's upload round, so their uploads
        share one data blob (issue 30); then each is replicated; then, the shard locks released,
        each waits for the round.
        """
        return {"results": apply_parts(req["shards"], self._roles())}

    def _roles(self) -> NodeRoles:
        """This node's side of a bulk for engine/bulk_parts.py."""
        return NodeRoles(
            lock=self._shard_lock, primary=lambda part: self._primary((part["index_uuid"], part["shard"])),
            hold=lambda keys: staging_hold(self.remote, self.copies, keys),
            join=lambda key: joining_hold(self.remote, self.copies, key), replicate=self._replicate,
            settle=self._settle, disk_failed=lambda key, copy, exc: self._fail_copy(key, self.name, copy, str(exc)),
            mapping=lambda m: m, reply=lambda stamped: stamped)

    def discard(self, key: tuple[str, int]) -> ShardCopy | None:
        """Take this node's copy of ``key`` out and close it (a failed copy: its close error is only logged)."""
        copy = self.copies.pop(key, None)
        if copy is not None:
            try:
                copy.close()
            except Exception as exc:  # noqa: BLE001 - its disk is failing; what matters is that it stops
                log.warning("closing the failed copy %s on %s: %r", copy.path, self.name, exc)
        return copy

    def close(self, wipe_disk: bool = False) -> None:
        """Stop every copy (abruptly: unrefreshed, uncommitted state is lost; the translog stays on disk).

        Safe against a concurrent close of the same node (``Cluster.close`` racing a ``kill_node``) and
        a copy failed or added meanwhile: each copy is taken out once, atomically, and closed by whoever
        took it (iterating the dict raised "dictionary changed size during iteration", seed 7220).
        """
        while True:
            try:
                _key, copy = self.copies.popitem()
            except KeyError:
                break
            try:
                copy.close()
            except Exception:  # noqa: BLE001 - a dying node does not report
                pass
        if self.remote is not None:  # its stream ends with it; a node started again writes a new one
            self.remote.close()
            self.remote = NodeRemote(self.store, self.name) if self.store is not None else None
        if wipe_disk:
            shutil.rmtree(self.data_dir, ignore_errors=True)
