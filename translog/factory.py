"""Which remote translog a primary copy writes, chosen in one place (issue 42; OpenSearch's ``TranslogFactory``).

A primary copy (:class:`~shardstore.engine.shard.shard_copy.ShardCopy`) logs every operation locally and
uploads it before it is acknowledged.  Two writers keep that contract:

- :class:`~shardstore.translog.node_translog.NodeShardTranslog`: the node's one upload stream
  (issue 30), every copy of the node in the same rounds.  What every node of a cluster runs;
- :class:`~shardstore.translog.remote.RemoteTranslog`: one upload stream per copy, with no node
  around it (a copy built on its own, in tests and benches of the translog itself).

The copy never asks which one it holds: it asks its :class:`TranslogFactory` for a
:class:`ShardRemoteTranslog` when it becomes a primary, and uses only the methods below.

The contract (every implementation):

- ``append(batch, history=, summary=)`` logs locally and starts an upload without waiting; it
  returns the local position, and ``wait_uploaded(position)`` returns once everything logged
  before it is in the store (``TranslogUnavailable`` after the upload timeout).  An operation
  is acknowledged only after that;
- ``add`` is ``append`` then ``wait_uploaded``;
- ``trim_operations_above(seq_no, term)`` records, under the new term, that operations above
  ``seq_no`` of older terms are not part of history (a promotion);
- ``purge``/``purge_older_term`` delete only what a remote segment commit covers
  (``translog/purge.py``), ``min_unuploaded_generation`` bounds the local log's deletion;
- ``close`` stops the uploads; what was not uploaded stays in the local log.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from shardstore.blobstores.base import BlobStore
from shardstore.translog.frames import Part
from shardstore.translog.local import LocalTranslog
from shardstore.translog.node_translog import NodeTranslog
from shardstore.translog.operations import Summary
from shardstore.translog.remote import RemoteTranslog
from shardstore.translog.remote_metadata import RemoteTranslogMetadata


class ShardRemoteTranslog(Protocol):
    """What a primary copy uses of its remote translog (see the module docstring for the contract)."""

    def append(self, batch: pa.RecordBatch, *, history: bool = False, summary: Summary | None = None,
               frame: tuple[bytes, list[Part]] | None = None) -> tuple[int, int]: ...

    def add(self, batch: pa.RecordBatch, *, history: bool = False) -> tuple[int, int]: ...

    def wait_uploaded(self, position: tuple[int, int] | int, timeout: float | None = None) -> None: ...

    def trim_operations_above(self, seq_no: int, term: int) -> RemoteTranslogMetadata: ...

    def purge(self, remote_commit_local_checkpoint: int, remote_commit_primary_term: int) -> set[int]: ...

    def purge_older_term(self, prefix: str, remote_commit_local_checkpoint: int,
                         remote_commit_primary_term: int) -> list[str]: ...

    @property
    def min_unuploaded_generation(self) -> int: ...

    def close(self) -> None: ...


class TranslogFactory(Protocol):
    """Opens the remote translog of a primary copy (see the module docstring)."""

    #: whether every upload rolls (fsyncs and seals) what it uploads before anything is acknowledged, so the
    #: local log need not fsync each append too
    rolls_before_acknowledging: bool

    def open(self, local: LocalTranslog, cluster_uuid: str, prefix: str, index_uuid: str, shard: int, *,
             upload_timeout: float, buffer_interval: float, covered_through: int) -> ShardRemoteTranslog:
        """The remote translog of the copy whose local log is ``local``, uploading under ``prefix``."""
        ...


class NodeTranslogs:
    """Every copy of a node in the node's upload rounds (issue 30)."""

    rolls_before_acknowledging = True

    def __init__(self, node_translog: NodeTranslogSource) -> None:
        self._node = node_translog

    def open(self, local: LocalTranslog, cluster_uuid: str, prefix: str, index_uuid: str, shard: int, *,
             upload_timeout: float, buffer_interval: float, covered_through: int) -> ShardRemoteTranslog:
        """The copy's handle in its node's stream of cluster ``cluster_uuid``."""
        return self._node.translog(cluster_uuid).open_shard(local, prefix, index_uuid, shard,
                                                            upload_timeout=upload_timeout,
                                                            covered_through=covered_through)


class PerShardTranslogs:
    """One upload stream per copy, straight to ``store`` (a copy with no node around it)."""

    rolls_before_acknowledging = False

    def __init__(self, store: BlobStore) -> None:
        self._store = store

    def open(self, local: LocalTranslog, cluster_uuid: str, prefix: str, index_uuid: str, shard: int, *,
             upload_timeout: float, buffer_interval: float, covered_through: int) -> ShardRemoteTranslog:
        """The copy's own remote translog under ``prefix``."""
        return RemoteTranslog(local, self._store, prefix, buffer_interval=buffer_interval,
                              upload_timeout=upload_timeout, covered_through=covered_through)


class NodeTranslogSource(Protocol):
    """What holds a node's translog streams, one per cluster UUID (``engine/node_remote.NodeRemote``)."""

    def translog(self, cluster_uuid: str) -> NodeTranslog:
        """The node's stream for ``cluster_uuid``."""
        ...
