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

from collections.abc import Iterable
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


def fence_verdict(claims: Iterable[Claim], index_uuid: str, shard: int, term: int, verified_epoch: int) -> Verdict:
    """Whether the listed ``claims`` fence the primary of ``term`` that verified the log up to ``verified_epoch``."""
    listed = list(claims)
    newest = max((c.epoch for c in listed), default=verified_epoch)
    oldest = min((c.epoch for c in listed), default=verified_epoch + 1)
    fenced = max((c.term for c in listed
                  if c.epoch > verified_epoch and c.index_uuid == index_uuid and c.shard == shard and c.term > term),
                 default=None)
    unseen_collected = oldest > verified_epoch + 1
    unreadable = any(c.index_uuid is None and c.epoch > verified_epoch for c in listed)
    return Verdict(fenced, max(newest, verified_epoch), (unseen_collected or unreadable) and fenced is None)


def accepted(epoch: int, newest: int) -> bool:
    """Whether a claim created at ``epoch`` counts, given the newest epoch listed right after creating it."""
    return epoch >= newest - ACCEPT_WINDOW


__all__ = ["ACCEPT_WINDOW", "CLAIMS_DIR", "KEEP_CLAIMS", "Claim", "Verdict", "accepted", "claim_name",
           "decode_claim", "encode_claim", "fence_verdict", "parse_claim_epoch"]
