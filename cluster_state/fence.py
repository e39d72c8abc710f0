"""Fencing of a superseded cluster UUID: a put-if-absent record, checked once before a publication is acknowledged.

A bootstrap or restore that takes over the latest cluster UUID (the head it restores
from) first writes ``cluster-state-superseded/<old uuid>`` with put-if-absent, and only
then reads the old head's latest committed state.  A cluster manager of the old UUID,
after writing a committed manifest and before acknowledging it, GETs that key once; if
it exists the publication fails with :class:`ClusterStateSuperseded`.  Ordering: if the
manager's GET misses the fence, its committed manifest was written before the fence, so
the restore's later LIST of manifests sees it; otherwise the manager never acknowledges
(docs/design/cluster_state.md, "Fencing a superseded cluster").

The records live outside ``<uuid>/cluster-state/`` on purpose: purge wipes that prefix
(and the UUID marker) of the UUIDs behind the head, and a fence must outlive the cluster
state it fences, or a stale manager writing after the wipe would see no fence.

Record: magic ``CSSU``, format version 1, body ``{"cluster_uuid", "superseded_by",
"node"}``.  Only the key's existence fences; an unreadable record still fences.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.cluster_state.errors import ClusterStateSuperseded
from shardstore.core.records import decode_record, encode_record
from shardstore.errors import CorruptError

log = logging.getLogger(__name__)

#: Prefix of the fence records (one per superseded cluster UUID; never purged).
FENCES = "cluster-state-superseded/"
MAGIC, VERSION = b"CSSU", 1


@dataclass(frozen=True)
class Fence:
    """``cluster_uuid`` was taken over by ``superseded_by`` (bootstrapped by ``node``)."""

    cluster_uuid: str
    superseded_by: str
    node: str | None = None


def fence_key(cluster_uuid: str) -> str:
    """The key of the fence record of ``cluster_uuid``."""
    return FENCES + cluster_uuid


def encode_fence(fence: Fence) -> bytes:
    """The fence record's bytes."""
    body = {"cluster_uuid": fence.cluster_uuid, "superseded_by": fence.superseded_by, "node": fence.node}
    return encode_record(MAGIC, VERSION, body)


def decode_fence(data: bytes, cluster_uuid: str) -> Fence:
    """The fence read back; an unreadable record still fences (``superseded_by`` then says so)."""
    key = fence_key(cluster_uuid)
    try:
        _v, body = decode_record(data, magic=MAGIC, supported=VERSION, where=key, what="cluster-state fence")
        return Fence(str(body["cluster_uuid"]), str(body["superseded_by"]), body.get("node"))
    except (CorruptError, KeyError, TypeError) as exc:  # a damaged or newer record
        log.warning("cluster-state fence %s unreadable (%s); it fences all the same", key, exc)
        return Fence(cluster_uuid, "(unreadable fence record)")


def write_fence(store: BlobStore, fence: Fence) -> Fence:
    """Fence ``fence.cluster_uuid`` (one put-if-absent); returns the fence now in the store (an older one wins)."""
    try:
        store.put(fence_key(fence.cluster_uuid), encode_fence(fence), if_absent=True)
        return fence
    except BlobAlreadyExists:
        existing = read_fence(store, fence.cluster_uuid) or fence
        if existing.superseded_by != fence.superseded_by:
            log.warning("cluster UUID %s was already superseded by %s; %s takes it over again (seed 000 decides "
                        "between the two at the next restore)", fence.cluster_uuid, existing.superseded_by,
                        fence.superseded_by)
        return existing


def read_fence(store: BlobStore, cluster_uuid: str) -> Fence | None:
    """The fence of ``cluster_uuid``, or None (one GET)."""
    try:
        data = store.get(fence_key(cluster_uuid))
    except BlobNotFound:
        return None
    return decode_fence(data, cluster_uuid)


def check_not_superseded(store: BlobStore, cluster_uuid: str) -> None:
    """ClusterStateSuperseded if ``cluster_uuid`` is fenced (one GET)."""
    fence = read_fence(store, cluster_uuid)
    if fence is not None:
        raise ClusterStateSuperseded(cluster_uuid, fence.superseded_by, fence.node)
