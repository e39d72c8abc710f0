"""Pure rules of the cluster's claim log: which claims fence a primary, and when a claim counts (issue 30).

The claim log (:mod:`claim_log`) is one listing a node reads once per translog upload
round instead of one LIST of term markers per shard.  Each claim is one blob::

    <cluster_uuid>/claims/<inv_epoch>

``epoch`` is the log's own counter: a claimant lists the log and creates ``newest + 1``
with ``if_absent`` (the slot is the whole key, so two claimants never both get it), and
epochs are handed out once each and in order.  Only the newest :data:`KEEP_CLAIMS` are
kept.  The blob is a framed record (:func:`~shardstore.core.records.encode_record`, magic
``b"SSCL"``, version 1, CRC32C) with body ``{"index_uuid", "shard", "term", "writer"}``;
a watcher GETs each epoch once (claims are rare), so a round costs one LIST.

The decisions here (docs/design/translog.md, "Fencing without a LIST per shard"):

- :func:`fence_verdict`: a primary of term ``t`` that verified the log up to epoch ``v``
  is fenced by any listed claim of its shard with an epoch above ``v`` and a term above
  ``t``; if the listing no longer reaches back to ``v + 1`` (claims it never saw were
  collected), or a claim above ``v`` could not be read, the caller must LIST the shard's
  term markers instead.
- :func:`accepted`: a claimant whose ``if_absent`` create landed on an epoch far below the
  newest (a slot collection had freed, written by a claimant that listed long ago) must
  delete it and claim again: a node that verified past that epoch would never see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shardstore.core.path_strategy import invert, uninvert
from shardstore.core.records import RecordCorrupted, decode_record, encode_record

CLAIMS_DIR = "claims"
#: claims kept in the log; a node that wrote nothing while more claims than this happened checks markers
KEEP_CLAIMS = 256
#: a new claim counts only if its epoch is at least the newest minus this (half the kept window)
ACCEPT_WINDOW = KEEP_CLAIMS // 2


@dataclass(frozen=True, slots=True, order=True)
class Claim:
    """One claim: ``term`` of shard (``index_uuid``, ``shard``) was claimed at ``epoch`` of the log."""

    epoch: int
    index_uuid: str | None  # None: the claim's blob could not be read (it may be any shard's)
    shard: int
    term: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one listing says about one primary."""

    fenced_by: int | None  # the newer term that claimed the shard, or None
    verified_epoch: int  # the epoch up to which the log was checked for this primary
    check_markers: bool  # claims it never saw were collected: LIST the shard's term markers


MAGIC = b"SSCL"
FORMAT_VERSION = 1


def claim_name(epoch: int) -> str:
    """The key name (no prefix) of the claim at ``epoch``: newer epochs sort first."""
    return invert(epoch)


def parse_claim_epoch(key: str) -> int | None:
    """The epoch a claim key names (with or without its prefix); None for a key that is not a claim."""
    try:
        return uninvert(key.rsplit("/", 1)[-1])
    except Exception:  # noqa: BLE001 - a foreign key in the log is not a claim
        return None


def encode_claim(claim: Claim, writer: str) -> bytes:
    """The framed record of a claim."""
    return encode_record(MAGIC, FORMAT_VERSION, {"index_uuid": claim.index_uuid, "shard": claim.shard,
                                                 "term": claim.term, "writer": writer})


def decode_claim(data: bytes, epoch: int, where: str) -> Claim:
    """The claim a record read from ``where`` holds (RecordCorrupted naming it for any flaw)."""
    _version, body = decode_record(data, magic=MAGIC, supported=FORMAT_VERSION, where=where, what="claim")
    try:
        return Claim(epoch, str(body["index_uuid"]), int(body["shard"]), int(body["term"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordCorrupted(where, f"undecodable claim body: {exc}") from None


@dataclass(frozen=True)
class ClaimListing:
    """One listing of the claim log, indexed by shard: a verdict costs that shard's claims, not the whole log's
    (a node asks once per shard of every round; the log holds a claim per shard that ever got a primary)."""

    newest: int | None
    oldest: int | None
    newest_unreadable: int | None  # the newest epoch whose claim could not be read (it may be any shard's)
    by_shard: Mapping[tuple[str, int], tuple[Claim, ...]]

    @classmethod
    def of(cls, claims: Iterable[Claim]) -> ClaimListing:
        """Index a listing."""
        listed = list(claims)
        by: dict[tuple[str, int], list[Claim]] = {}
        for c in listed:
            if c.index_uuid is not None:
                by.setdefault((c.index_uuid, c.shard), []).append(c)
        return cls(max((c.epoch for c in listed), default=None), min((c.epoch for c in listed), default=None),
                   max((c.epoch for c in listed if c.index_uuid is None), default=None),
                   {k: tuple(v) for k, v in by.items()})

    def verdict(self, index_uuid: str, shard: int, term: int, verified_epoch: int) -> Verdict:
        """Whether this listing fences the primary of ``term`` that verified the log up to ``verified_epoch``."""
        newest = verified_epoch if self.newest is None else self.newest
        oldest = verified_epoch + 1 if self.oldest is None else self.oldest
        fenced = max((c.term for c in self.by_shard.get((index_uuid, shard), ())
                      if c.epoch > verified_epoch and c.term > term), default=None)
        unseen_collected = oldest > verified_epoch + 1
        unreadable = self.newest_unreadable is not None and self.newest_unreadable > verified_epoch
        return Verdict(fenced, max(newest, verified_epoch), (unseen_collected or unreadable) and fenced is None)


def fence_verdict(claims: Iterable[Claim], index_uuid: str, shard: int, term: int, verified_epoch: int) -> Verdict:
    """Whether the listed ``claims`` fence the primary of ``term`` that verified the log up to ``verified_epoch``."""
    return ClaimListing.of(claims).verdict(index_uuid, shard, term, verified_epoch)


def accepted(epoch: int, newest: int) -> bool:
    """Whether a claim created at ``epoch`` counts, given the newest epoch listed right after creating it."""
    return epoch >= newest - ACCEPT_WINDOW


__all__ = ["ACCEPT_WINDOW", "CLAIMS_DIR", "KEEP_CLAIMS", "Claim", "ClaimListing", "Verdict", "accepted", "claim_name",
           "decode_claim", "encode_claim", "fence_verdict", "parse_claim_epoch"]
