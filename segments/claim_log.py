"""The cluster's claim log: one LIST per upload round fences every primary of a node (issue 30).

Rules, key layout and record: :mod:`claim_rule`.  :func:`append_claim` is called by
:meth:`RemoteSegmentStore.claim_term` between the term marker PUT and the marker LIST, so
every primary, a batch job's term included, enters the log before it reads any history.
:class:`ClaimWatch` is one node's view: :meth:`ClaimWatch.refresh` (one LIST, plus one GET
per claim it has not read yet) runs after each translog round landed and before any of its
writes is acknowledged; :meth:`ClaimWatch.verdict` answers per primary from that listing,
with no request.

Cost: a claim is 2 LIST + 1 PUT (+ 1 DELETE when the log is collected); a round is 1 LIST
whatever the number of shards (the log holds at most ``KEEP_CLAIMS`` keys: one page), and
one GET per claim made anywhere in the cluster since the node's last round.
"""

from __future__ import annotations

import logging
import threading

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.errors import ShardstoreError
from shardstore.segments.claim_rule import (
    CLAIMS_DIR,
    KEEP_CLAIMS,
    Claim,
    ClaimListing,
    Verdict,
    accepted,
    claim_name,
    decode_claim,
    encode_claim,
    parse_claim_epoch,
)
from shardstore.segments.errors import CommitConflict

log = logging.getLogger(__name__)

_ATTEMPTS = 64


def claims_prefix(cluster_uuid: str) -> str:
    """``<cluster_uuid>/claims`` (no trailing '/')."""
    return f"{cluster_uuid}/{CLAIMS_DIR}"


def list_epochs(store: BlobStore, cluster_uuid: str) -> list[int]:
    """Every epoch in the log, newest first (one LIST)."""
    found = (parse_claim_epoch(b.key) for b in store.list(claims_prefix(cluster_uuid) + "/"))
    return sorted((e for e in found if e is not None), reverse=True)


def append_claim(store: BlobStore, cluster_uuid: str, index_uuid: str, shard: int, term: int,
                 writer: str) -> int:
    """Enter term ``term`` of the shard in the claim log; returns its epoch (CommitConflict if it never lands)."""
    prefix = claims_prefix(cluster_uuid)
    for _ in range(_ATTEMPTS):
        listed = list_epochs(store, cluster_uuid)
        epoch = (listed[0] if listed else 0) + 1
        key = f"{prefix}/{claim_name(epoch)}"
        try:
            store.put(key, encode_claim(Claim(epoch, index_uuid, shard, term), writer), if_absent=True, token=writer)
        except BlobAlreadyExists:
            continue  # another claimant took this epoch: list again
        after = list_epochs(store, cluster_uuid)
        newest = after[0] if after else epoch
        if not accepted(epoch, newest):  # a slot collection freed long ago: a watcher may be past it
            store.delete([key])
            continue
        old = [e for e in after if e <= newest - KEEP_CLAIMS]
        if old:
            store.delete([f"{prefix}/{claim_name(e)}" for e in old])
        return epoch
    raise CommitConflict(f"{store.location}/{prefix}: could not enter term {term} of shard {index_uuid}/{shard} "
                         f"in the claim log after {_ATTEMPTS} attempts")


class ClaimWatch:
    """One node's latest listing of the claim log, refreshed once per translog round."""

    def __init__(self, store: BlobStore, cluster_uuid: str) -> None:
        self.store = store
        self.cluster_uuid = cluster_uuid
        self._lock = threading.Lock()
        self._listing = ClaimListing.of(())
        self._read: dict[int, Claim] = {}  # epoch -> claim, for the epochs still listed

    def refresh(self) -> None:
        """List the log (one LIST; one GET per claim not read before); later verdicts answer from it."""
        epochs = list_epochs(self.store, self.cluster_uuid)
        with self._lock:
            known = dict(self._read)
        claims = []
        for epoch in epochs:
            claim = known.get(epoch)
            if claim is None:
                claim = self._get(epoch)
                if claim is None:
                    continue  # collected between the LIST and the GET
                if claim.index_uuid is not None:
                    known[epoch] = claim
            claims.append(claim)
        with self._lock:
            self._read = {e: known[e] for e in epochs if e in known}
            self._listing = ClaimListing.of(claims)

    def _get(self, epoch: int) -> Claim | None:
        key = f"{claims_prefix(self.cluster_uuid)}/{claim_name(epoch)}"
        try:
            return decode_claim(self.store.get(key), epoch, key)
        except BlobNotFound:
            return None
        except ShardstoreError as exc:  # unreadable: it may be any shard's, so every primary checks markers
            log.warning("claim log: %s unreadable (%s); primaries check their term markers", key, exc)
            return Claim(epoch, None, -1, -1)

    def verdict(self, index_uuid: str, shard: int, term: int, verified_epoch: int) -> Verdict:
        """What the last listing says about the primary of ``term`` verified up to ``verified_epoch`` (no request)."""
        with self._lock:
            listing = self._listing
        return listing.verdict(index_uuid, shard, term, verified_epoch)


__all__ = ["ClaimWatch", "append_claim", "claims_prefix", "list_epochs"]
