"""What the blob store says a shard acknowledged, read for a restore (issue 14, case 1).

:func:`audit` reads, for every term of the shard, the translog metadata and the commit
metadata, and returns the highest seq# any of them names (:class:`Evidence`), the
translog generations to replay, and the blobs found damaged on the way.  The decisions
(which seq#s are missing, how trims cap an older term) are in :mod:`restore_check`.

- The newest *readable* translog metadata of each term is used; a newer one that cannot be
  read is a fault (named), and the one before it is used instead.
- Node-level translog (issue 30): the sections of the shard in every node stream of the
  cluster are read too (not only the streams its newest metadata names), so a lost or
  damaged per-shard metadata hides nothing; a round whose index blob is lost is read from
  its data blob's trailer, and a round whose data blob is lost keeps its sections, whose
  read then fails naming the blob (and so the seq# range it held).
- A data blob under a term's ``data/`` of a generation newer than every generation that
  metadata names is an *orphan*: its metadata blob was lost (or its metadata PUT failed, in
  which case its operations were never acknowledged and may come back, as any
  unacknowledged write may).  Its frames are read and checked (CRC per frame) and it is
  replayed like a named generation, so one lost metadata blob loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.engine.shard.restore_check import capped
from shardstore.errors import ShardstoreError
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import iter_commits, read_metadata
from shardstore.translog.frames import HEADER_SIZE, GenerationHeader, iter_frames
from shardstore.translog.node_read import StreamCatalog
from shardstore.translog.remote import UNASSIGNED
from shardstore.translog.remote_metadata import (
    DATA_DIR,
    METADATA_DIR,
    RemoteGeneration,
    decode_metadata,
    generation_checksum,
)

log = logging.getLogger(__name__)


@dataclass
class Evidence:
    """The store's account of one shard: the generations to replay, the highest acknowledged seq#, the faults."""

    entries: list[RemoteGeneration] = field(default_factory=list)
    trims: list[tuple[int, int]] = field(default_factory=list)  # (seq_no, term) of every readable metadata
    expected_max: int = -1
    #: (global checkpoint, term) of each term's newest readable translog metadata: every seq# up to it was processed
    #: on every in-sync copy after its upload (acknowledged history), even when a purge left no operation to name it
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    commits: list[tuple[str, RemoteCommitMetadata]] = field(default_factory=list)  # readable ones, any order

    @property
    def global_checkpoint(self) -> int:
        """The highest recorded global checkpoint, each capped by newer primaries' trims.

        A primary never trims below a global checkpoint it knows, except one that accepted a loss
        (``accept_data_loss``): it trims at what it restored and re-issues the dropped seq#s, so the
        old history's checkpoint no longer names operations of this one.
        """
        return max((capped(cp, term, self.trims) for cp, term in self.checkpoints), default=-1)

    def restore_order(self) -> list[str]:
        """Commit keys to try, best first: the highest local checkpoint a newer primary's trim does not cut.

        A newer term's commit is not always the furthest: a new primary's background re-upload
        can be an old local commit while an older term's commit covers more (found by the
        fault simulator, seed 687).  A commit above a newer primary's trim may hold operations
        that primary dropped, so it comes last.
        """
        def rank(item: tuple[str, RemoteCommitMetadata]) -> tuple[bool, int, int, int]:
            _key, md = item
            cp = md.commit.local_checkpoint
            safe = capped(cp, md.primary_term, self.trims) == cp
            return (safe, cp, md.primary_term, md.generation)

        return [key for key, _md in sorted(self.commits, key=rank, reverse=True)]


def _join(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}"


def _orphan(store: BlobStore, key: str, term: int) -> RemoteGeneration:
    """A data blob no readable metadata names, described from its own checked bytes."""
    data = store.get(key)
    header = GenerationHeader.decode(data, key)
    lo, hi, n = None, None, 0
    for frame in iter_frames(data, HEADER_SIZE, None, key):
        lo = frame.min_seq_no if lo is None else min(lo, frame.min_seq_no)
        hi = frame.max_seq_no if hi is None else max(hi, frame.max_seq_no)
        n += frame.count
    return RemoteGeneration(header.generation, header.primary_term or term, key, len(data),
                            generation_checksum(data), -1 if lo is None else lo, -1 if hi is None else hi, n,
                            UNASSIGNED)


def _translog(store: BlobStore, address: ShardAddress, term: int, ev: Evidence) -> None:
    """Add ``term``'s translog: its newest readable metadata's generations, then its orphan data blobs."""
    prefix = address.translog_prefix(term)
    named: dict[str, RemoteGeneration] = {}
    for info in store.list(_join(prefix, METADATA_DIR)):
        try:
            md = decode_metadata(store.get(info.key), info.key)
        except ShardstoreError as exc:
            ev.faults.append(f"{info.key}: {exc}")
            continue
        named = {e.blob_key: e for e in md.entries}
        ev.checkpoints.append((md.global_checkpoint, md.primary_term))
        if md.trim is not None:
            ev.trims.append(md.trim)
        break
    top_generation = max((e.generation for e in named.values()), default=-1)
    ev.entries.extend(named.values())
    for info in store.list(_join(prefix, DATA_DIR)):
        if info.key in named:
            continue
        try:
            generation = int(info.key.rsplit("/", 1)[-1].split("__", 1)[0])
        except ValueError:
            continue
        if generation <= top_generation:
            continue  # superseded: a retried upload, or purged by a commit
        try:
            orphan = _orphan(store, info.key, term)
        except ShardstoreError as exc:
            ev.faults.append(f"{info.key}: {exc}")
            continue
        log.warning("restore: translog data blob %s (seq# %d-%d) is named by no readable metadata; replaying it",
                    info.key, orphan.min_seq_no, orphan.max_seq_no)
        ev.entries.append(orphan)


def _streams(store: BlobStore, address: ShardAddress, ev: Evidence, catalog: StreamCatalog | None) -> None:
    """Add the shard's sections in every node-level translog stream of the cluster (each named once): from one
    listing of every stream (``catalog``, shared by the shards of one restore; else one LIST here)."""
    seen = {(e.blob_key, e.offset) for e in ev.entries}
    if catalog is None or catalog.store.location != store.location:
        catalog = StreamCatalog(store, address.cluster_uuid)
    for e in catalog.entries(address.index_uuid, address.shard, ev.faults):
        if (e.blob_key, e.offset) not in seen:
            seen.add((e.blob_key, e.offset))
            ev.entries.append(e)


def audit(store: BlobStore, address: ShardAddress, terms: list[int], *, streams: StreamCatalog | None = None) -> Evidence:
    """Read every term's translog and commit metadata of the shard: what it must restore (see the module).

    ``streams``: the cluster's node-translog streams listed once for several shards (else listed here: one LIST
    however many streams, dead ones included)."""
    ev = Evidence()
    for term in terms:
        _translog(store, address, term, ev)
    _streams(store, address, ev, streams)
    for e in ev.entries:
        if e.num_ops:
            top = e.max_seq_no if e.trimmed_above_seq_no == UNASSIGNED else min(e.max_seq_no, e.trimmed_above_seq_no)
            ev.expected_max = max(ev.expected_max, capped(top, e.primary_term, ev.trims))
    ev.expected_max = max(ev.expected_max, ev.global_checkpoint)
    for key in iter_commits(store, address, terms):
        try:
            md = read_metadata(store, key)
        except ShardstoreError as exc:
            ev.faults.append(f"{key}: {exc}")
            continue
        ev.commits.append((key, md))
        ev.expected_max = max(ev.expected_max, capped(md.commit.local_checkpoint, md.primary_term, ev.trims))
    _purged_without_commit(address, terms, ev)
    return ev


def _purged_without_commit(address: ShardAddress, terms: list[int], ev: Evidence) -> None:
    """Name the lost commit when none is readable yet the translog starts above seq# 0, or holds no operation at all
    while its metadata's global checkpoint says seq#s were acknowledged.

    Only a remote commit lets the translog be purged (a new shard's first commit covers all of
    it: engine/shard/flush_policy.py, ``remote_purge_gate``), so the operations below were in that
    commit, whose metadata blob is gone without a trace to read: the fault is its place.  With no
    write after that flush, the purge left no operation behind, only the global checkpoint of the
    translog metadata it wrote (fault simulator, seed 9614: an empty shard restored silently).
    """
    if ev.commits or any("/segments/" in f for f in ev.faults):
        return
    firsts = [e.min_seq_no for e in ev.entries if e.num_ops]
    first = min(firsts) if firsts else ev.global_checkpoint + 1
    if first > 0:
        where = ", ".join(_join(address.segments_prefix(t), "metadata/") for t in sorted(terms) or [1])
        what = (f"the translog starts at seq# {first}" if firsts else
                f"the translog holds no operation while its metadata's global checkpoint is seq# {first - 1}")
        ev.faults.append(f"{where}: no segment commit is there, yet {what}; only a commit lets it be purged, so that "
                         f"commit's metadata blob was lost")
        if ev.expected_max < first - 1:
            ev.expected_max = first - 1


__all__ = ["Evidence", "audit"]
