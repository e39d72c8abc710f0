"""The store-side collection of dead node-translog streams, run by the cluster manager (issue 46).

A node process deletes the rounds of its own translog stream by reference counts it keeps
in memory; a process that died leaves its stream behind.  :class:`StreamCollector` finds
such streams from one LIST of the cluster's ``node_translog/``, reads what the store says
about each shard their rounds hold (its commits, the sections its translog metadata
names), and deletes the rounds the pure rule of :mod:`shardstore.translog.stream_gc`
allows.  The rule, its safety argument and the request cost: docs/design/translog.md,
"Collecting dead streams".

Which streams are dead is the manager's knowledge: a stream names its writer's process id
(:func:`~shardstore.translog.node_format.stream_owner`), and a stream whose writer is no
member's process, for :data:`GRACE_SECONDS` as this collector saw it, is dead.
:class:`CollectionWorker` runs passes on its own thread (never under the manager's lock):
on the manager's timer and when a flush asks for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.engine.manager.ingest_gc import IngestCollector
from shardstore.engine.shard.flush_policy import FALLBACK_COMMITS
from shardstore.engine.shard.restore_audit import Evidence
from shardstore.errors import ShardstoreError
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import iter_commits, list_terms, read_metadata
from shardstore.translog.node_format import stream_owner
from shardstore.translog.node_read import StreamCatalog, forget_cached, read_round
from shardstore.translog.remote import latest_metadata
from shardstore.translog.stream_gc import (
    RoundView,
    SectionView,
    ShardKey,
    ShardRetention,
    dead_streams,
    doomed_rounds,
    shards_of,
)

log = logging.getLogger(__name__)

#: seconds a stream's writer must have been no member's process before its stream counts as dead
GRACE_SECONDS = 30.0
#: seconds between two passes of the manager's timer
COLLECT_EVERY = 30.0


def list_streams(store: BlobStore, cluster_uuid: str) -> StreamCatalog:
    """Every stream of the cluster with its rounds' keys and bytes (one LIST, however many streams)."""
    return StreamCatalog(store, cluster_uuid)


@dataclass(frozen=True)
class CollectionReport:
    """What one pass found and did."""

    streams: int  # streams listed
    dead: int  # of which dead
    rounds_deleted: int
    blobs_deleted: int
    bytes_deleted: int
    bytes_left: int  # every stream's bytes after the pass
    streams_left: int


class StreamCollector:
    """Passes of the store-side collection over one store (see the module); not thread-safe: one worker runs it."""

    def __init__(self, store: BlobStore, *, grace: float = GRACE_SECONDS, fallback: int = FALLBACK_COMMITS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.grace = grace
        self.fallback = fallback
        self.clock = clock
        self._absent_since: dict[str, float] = {}  # stream -> when this collector first saw it without a live owner
        self._commits: dict[str, RemoteCommitMetadata] = {}  # commit metadata key -> decoded (written once)

    def collect(self, cluster_uuid: str, live_owners: Iterable[str],
                address_of: Callable[[str, int], ShardAddress | None],
                still_managing: Callable[[], bool] = lambda: True) -> CollectionReport:
        """One pass over ``cluster_uuid``'s streams; ``live_owners``: the members' process ids;
        ``address_of(index_uuid, shard)``: where a shard's blobs live (None: an index this cluster does not know);
        ``still_managing()``: asked right before the delete (a manager deposed during the pass deletes nothing)."""
        listing = list_streams(self.store, cluster_uuid)
        live = frozenset(live_owners)
        now = self.clock()
        owners = {s: stream_owner(s) for s in listing.rounds}
        for s in listing.rounds:
            if owners[s] is None or owners[s] not in live:
                self._absent_since.setdefault(s, now)
            else:
                self._absent_since.pop(s, None)
        for s in list(self._absent_since):
            if s.startswith(f"{cluster_uuid}/") and s not in listing.rounds:
                del self._absent_since[s]  # gone from the store
        dead = dead_streams(listing.rounds, owners, live, self._absent_since, now, self.grace)
        rounds = [self._round_view(listing, s, r) for s in sorted(dead) for r in sorted(listing.rounds[s])]
        retention: dict[ShardKey, ShardRetention] = {}
        for key in sorted(shards_of(rounds, dead)):
            address = address_of(*key)
            if address is None:
                continue
            try:
                retention[key] = self._retention(address)
            except ShardstoreError as exc:  # unreadable: its sections are kept, the restore audit names the fault
                log.warning("translog collection: shard %s/%d kept: %s", key[0], key[1], exc)
        doomed = doomed_rounds(rounds, dead, retention, fallback=self.fallback)
        keys = [k for r in doomed for k in r.keys]
        deleted_bytes = sum(listing.sizes.get(k, 0) for k in keys)
        if keys and not still_managing():
            doomed, keys, deleted_bytes = [], [], 0  # its member list may be stale now: the next manager decides
        if keys:
            self.store.delete(keys)  # one request per service batch: data blobs and index blobs alike
            forget_cached(self.store, keys)
            log.info("translog collection: %d rounds (%d blobs, %d bytes) of %d dead streams deleted",
                     len(doomed), len(keys), deleted_bytes, len(dead))
        left = {s: set(rs) for s, rs in listing.rounds.items()}
        for r in doomed:
            left[r.stream].discard(r.round)
        streams_left = sum(1 for rs in left.values() if rs)
        return CollectionReport(streams=len(listing.rounds), dead=len(dead), rounds_deleted=len(doomed),
                                blobs_deleted=len(keys), bytes_deleted=deleted_bytes,
                                bytes_left=listing.total_bytes - deleted_bytes, streams_left=streams_left)

    def _round_view(self, listing: StreamCatalog, stream: str, round_no: int) -> RoundView:
        """A round of a dead stream as the decision sees it (its index read once: cached per key)."""
        keys = tuple(listing.rounds[stream][round_no])
        index = read_round(self.store, stream, round_no, listing.have(stream, round_no))
        data = next((k for k in keys if "/data/" in k), f"{stream}/data/")
        if index is None:
            return RoundView(stream, round_no, keys, data, None)
        sections = tuple(SectionView(s.index_uuid, s.shard, s.primary_term, s.max_seq_no, s.num_ops, s.offset)
                         for s in index.sections)
        return RoundView(stream, round_no, keys, index.data_key, sections)

    def _retention(self, address: ShardAddress) -> ShardRetention:
        """The shard's best readable commits (restore order) and the sections its translog metadata names."""
        terms = list_terms(self.store, address)
        named: set[tuple[str, int]] = set()
        ev = Evidence()
        for term in terms:
            found = latest_metadata(self.store, address.translog_prefix(term))
            if found is not None:
                _key, md = found
                named.update((e.blob_key, e.offset) for e in md.entries)
                if md.trim is not None:
                    ev.trims.append(md.trim)
        if len(self._commits) > 50_000:  # decoded commits of shards long collected: bounded
            self._commits.clear()
        for key in iter_commits(self.store, address, terms):
            md = self._commits.get(key)
            if md is None:
                try:
                    md = read_metadata(self.store, key)
                except ShardstoreError:
                    continue  # unreadable: not a commit a restore can use
                self._commits[key] = md
            ev.commits.append((key, md))
        by_key = dict(ev.commits)
        best = tuple((by_key[k].commit.local_checkpoint, by_key[k].primary_term) for k in ev.restore_order())
        return ShardRetention(commits=best, named=frozenset(named))

    def forget(self) -> None:
        """Drop what this collector saw (a manager that stopped managing: when it manages again, every stream's
        grace counts afresh, as the design says) and the decoded commits (bounded by what one term reads)."""
        self._absent_since.clear()
        self._commits.clear()


class CollectionWorker:
    """Runs :class:`StreamCollector` passes on its own thread: every ``every`` seconds and when asked.

    ``snapshot()`` gives what a pass needs, read under the caller's lock: ``None`` (not the
    manager now, or a member's process id is not known yet: no pass) or the members' process
    ids and, per data cluster UUID, where each shard's blobs live.
    """

    def __init__(self, collector: StreamCollector,
                 snapshot: Callable[[], tuple[frozenset[str], dict[str, dict[tuple[str, int], ShardAddress]]] | None],
                 *, every: float = COLLECT_EVERY, name: str = "translog-gc",
                 ingest: IngestCollector | None = None, ingest_cluster: Callable[[], str | None] | None = None) -> None:
        """``ingest``: also collect Spark ingest jobs' leftovers under the cluster ``ingest_cluster()`` names
        (engine/manager/ingest_gc.py), in the same passes."""
        self.collector = collector
        self.snapshot = snapshot
        self.ingest = ingest
        self.ingest_cluster = ingest_cluster
        self.every = every
        self.last: CollectionReport | None = None
        self.passes = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Ask for a pass soon (after a flush); returns at once."""
        self._wake.set()

    def run_once(self) -> list[CollectionReport]:
        """One pass over every data cluster UUID now (the worker's own step; tests call it too)."""
        view = self.snapshot()
        if view is None:
            self.collector.forget()  # not managing: when this node manages again, graces count afresh
            return []
        owners, clusters = view
        reports = []
        for cluster_uuid, addresses in sorted(clusters.items()):
            reports.append(self.collector.collect(cluster_uuid, owners,
                                                  lambda index_uuid, shard, a=addresses: a.get((index_uuid, shard)),
                                                  still_managing=lambda: self.snapshot() is not None))
        if self.ingest is not None and self.ingest_cluster is not None and (uuid := self.ingest_cluster()):
            self.ingest.collect(uuid)
        self.passes += 1
        if reports:
            self.last = reports[-1]
        return reports

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.every)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - a store fault: the next pass tries again
                log.warning("translog collection pass failed: %r", exc)

    def close(self) -> None:
        """Stop the thread (a pass in progress finishes)."""
        self._stop.set()
        self._wake.set()
__all__ = ["COLLECT_EVERY", "GRACE_SECONDS", "CollectionReport", "CollectionWorker", "StreamCollector", "list_streams"]
