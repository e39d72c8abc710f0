"""Promotion: a shard without a primary gets one, or is rebuilt from the blob store (the cluster manager's).

When a primary's node leaves, the in-sync copy with the highest local checkpoint becomes
primary of term + 1 (``shard.promote``: it claims the term in the store, which fences the old
primary, and resyncs the other copies).  A shard with no in-sync copy left is rebuilt from
the blob store on the least loaded data node, and refuses to come back with less than the
cluster acknowledged (``acknowledged_max``).  A failed promotion leaves the shard red with its
cause and is retried with a backoff; a term another writer claimed is never claimed over
(docs/design/engine.md, invariants 3 and 7; issue 41 and 42).

Every decision is published (committed on a majority) before it is acted on, through the
:class:`Board` the promotions are given: the cluster manager role
(:class:`~shardstore.engine.manager.role.ManagerRole`), whose lock every method here runs under.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from shardstore.blobstores.base import BlobStore
from shardstore.engine.coordinator.documents import with_shard_fields
from shardstore.engine.errors import ShardUnavailable
from shardstore.engine.manager.metadata import IndexMeta, ShardRouting, sync_index
from shardstore.engine.node.data_role import spec_to_wire
from shardstore.engine.shard.shard_copy import ShardSpec
from shardstore.errors import ConflictError
from shardstore.segments.mapping import Mapping
from shardstore.segments.remote_store import next_free_term

log = logging.getLogger("shardstore.engine.manager.role")  # the manager's decisions, in one logger
#: a failed promotion is retried after RETRY_FIRST seconds, doubling up to RETRY_MAX
RETRY_FIRST, RETRY_MAX = 0.1, 5.0


class Board(Protocol):
    """What promotions need of the cluster manager: its routing, members, publication and transport."""

    lock: threading.RLock
    active: bool
    indices: dict[str, IndexMeta]
    members: dict[str, str]
    store: BlobStore
    accept_data_loss: bool
    check_timeout: float

    def data_nodes(self) -> list[str]:
        """The members with the data role, sorted."""
    def set_routing(self, meta: IndexMeta, shard: int, **changes: Any) -> IndexMeta:
        """Publish one shard's new routing (checked, committed on a majority) and keep it."""
    def spec(self, meta: IndexMeta, shard: int) -> ShardSpec:
        """The shard's spec as its copies open it."""
    def send(self, target: str, action: str, request: Any, timeout: float | None = None) -> Any:
        """One action to one node (this one included)."""
    def notify(self, node: str, action: str, request: dict[str, Any]) -> None:
        """Send in the background, never waiting on a node that may be gone."""
    def submit(self, task: Any) -> None:
        """Publish a cluster-state change; step down if a majority did not commit it."""


class Promotions:
    """The shards without a primary, why, and their promotion or rebuild (see the module docstring)."""

    def __init__(self, board: Board) -> None:  # noqa: D107
        self.board = board
        #: (index, shard) -> why it has no primary (health's causes); retried by :meth:`retry_red`
        self.causes: dict[tuple[str, int], str] = {}
        #: red shards another writer claimed: never promoted again (a restore brings them back)
        self.not_retried: set[tuple[str, int]] = set()
        #: (index, shard) -> the backoff of its failed promotions, and when the next one may run
        self._retry_delay: dict[tuple[str, int], float] = {}
        self.retry_at: dict[tuple[str, int], float] = {}
        #: (index, shard) -> why its last rebuild from the store failed (a RestoreDataLoss names the lost ranges)
        self.store_failures: dict[tuple[str, int], Exception] = {}
        #: (index, shard) -> when its promotion may run: the old primary's read lease is over by then (a later
        #: grant goes only to a node that applied the routing without it, so it no longer serves the shard)
        self.lease_waits: dict[tuple[str, int], float] = {}
        #: (index UUID, shard) -> the highest global checkpoint its primary reported (node.stats): every
        #: operation up to it was acknowledged and is in the store, so a rebuild from the store that comes
        #: back with less refuses (RestoreDataLoss), as the embedded cluster's ``acknowledged_max`` (issue 42)
        self.acknowledged: dict[tuple[str, int], int] = {}


    def promote(self, meta: IndexMeta, sr: ShardRouting, candidates: list[str]) -> bool:
        """Promote the most advanced candidate (lock held); red with the cause on failure; whether it did.

        The decision is published first (issue 41): the new primary and its term are committed
        on a majority before the copy claims the term in the store and takes writes.  A manager
        that cannot commit raises (NoQuorum) having sent nothing, and steps down.
        """
        key = (meta.name, sr.shard)
        if not candidates:
            self.board.set_routing(meta, sr.shard, primary=None, copies=[], in_sync=[])
            self.causes[key] = "no in-sync copy left; recovering it from the blob store"
            return self.recover_from_store(self.board.indices[meta.name], sr.shard)
        term = sr.primary_term + 1
        stats: dict[str, dict] = {}
        unreachable = []
        for n in candidates:
            try:
                s = self.board.send(n, "shard.stats", {"index_uuid": meta.uuid, "shard": sr.shard},
                               timeout=self.board.check_timeout)
            except Exception:  # noqa: BLE001 - it may come back: the promotion is retried
                unreachable.append(n)
                continue
            if s is not None and s["disk_failure"] is None:
                stats[n] = s
        if not stats and not unreachable:  # every in-sync copy is gone (restarted nodes, a restore)
            return self.promote(meta, sr, [])
        if not stats:
            return self._failed(meta, sr, term, candidates,
                                          ShardUnavailable(meta.name, sr.shard, f"no in-sync copy answered ({unreachable})"))
        best = max(stats, key=lambda n: stats[n]["local_checkpoint"])
        group = [best, *(n for n in stats if n != best)]
        self.board.set_routing(meta, sr.shard, primary=best, primary_term=term, copies=group, in_sync=group)
        try:
            answer = self.board.send(best, "shard.promote", {"index_uuid": meta.uuid, "shard": sr.shard, "term": term,
                                                        "replicas": group[1:]})
        except ConflictError as exc:
            # a newer term claimed the shard: another writer (a Spark job's sink) owns it now.  Claiming a
            # term above it would fence that writer and drop its commit from what restore reads, so the
            # shard stays red with the cause and is not retried (issue 42)
            cause = (f"promotion to term {term} refused ({type(exc).__name__}: {exc}); another writer owns the "
                     f"shard: restore the index from the store once it is done")
            log.error("%s/%d: %s", meta.name, sr.shard, cause)
            self.causes[key] = cause
            self.not_retried.add(key)
            self.board.set_routing(meta, sr.shard, primary=None, primary_term=term, copies=group, in_sync=group)
            return False
        except Exception as exc:  # noqa: BLE001 - red with the cause, retried with a newer term
            return self._failed(meta, sr, term, group, exc)
        kept = [best, *answer["kept"]]
        if kept != group:
            self.board.set_routing(meta, sr.shard, copies=kept, in_sync=kept)
        for n in candidates:
            if n not in kept:
                self.board.notify(n, "shard.discard", {"index_uuid": meta.uuid, "shard": sr.shard})
        self.causes.pop(key, None)
        self._retry_delay.pop(key, None)
        self.retry_at.pop(key, None)
        log.info("promoted %s to primary of %s/%d with term %d", best, meta.name, sr.shard, term)
        return True

    def _failed(self, meta: IndexMeta, sr: ShardRouting, term: int, candidates: list[str],
                          exc: Exception) -> bool:
        """Leave the shard red with the cause; ``term`` counts as used (its claim may have landed)."""
        cause = f"promotion to term {term} failed ({type(exc).__name__}: {exc}); retrying"
        log.error("%s/%d: %s", meta.name, sr.shard, cause)
        key = (meta.name, sr.shard)
        self.causes[key] = cause
        # retried after 0.1 s, doubling to 5 s: a store that keeps refusing does not burn a term per tick
        delay = min(RETRY_MAX, 2 * self._retry_delay.get(key, RETRY_FIRST / 2))
        self._retry_delay[key] = delay
        self.retry_at[key] = time.monotonic() + delay
        self.board.set_routing(meta, sr.shard, primary=None, primary_term=term, copies=candidates, in_sync=candidates)
        return False

    def recover_from_store(self, meta: IndexMeta, shard: int) -> bool:
        """Rebuild a shard with no in-sync copy from the blob store on the least loaded member (lock held).

        As a promotion, the target and its term are committed before it claims the term (issue 41).
        """
        key = (meta.name, shard)
        if not self.board.data_nodes():
            self.causes[key] = "no in-sync copy left and no data node up"
            return False
        load = {n: 0 for n in self.board.data_nodes()}
        for m in self.board.indices.values():
            for r in m.routing:
                for c in r.copies:
                    if c in load:
                        load[c] += 1
        target = min(load, key=lambda n: (load[n], n))
        sr = meta.routing[shard]
        spec = self.board.spec(meta, shard)
        try:
            term = next_free_term(self.board.store, spec.address, at_least=sr.primary_term)
        except Exception as exc:  # noqa: BLE001 - a store error: red, named, retried
            self.causes[key] = f"no in-sync copy left; listing its terms failed ({type(exc).__name__}: {exc})"
            return False
        self.board.set_routing(meta, shard, primary=target, primary_term=term, copies=[target], in_sync=[target])
        try:
            answer = self.board.send(target, "shard.recover_from_store", {
                "spec": spec_to_wire(spec), "term": term, "known_term": sr.primary_term, "index_name": meta.name,
                "acknowledged_max": self.acknowledged.get((meta.uuid, shard), -1),
                "accept_data_loss": self.board.accept_data_loss})
        except Exception as exc:  # noqa: BLE001 - a store error or a refused (lossy) recovery: red, named
            self.store_failures[key] = exc
            self.causes[key] = (f"no in-sync copy left; recovery from the blob store failed "
                                     f"({type(exc).__name__}: {exc}); retrying")
            log.error("%s/%d: %s", meta.name, shard, self.causes[key])
            self.board.set_routing(meta, shard, primary=None, copies=[], in_sync=[])
            return False
        self.causes.pop(key, None)
        self.store_failures.pop(key, None)
        self._retry_delay.pop(key, None)
        self.retry_at.pop(key, None)
        self._take_shard_fields(meta.name, Mapping.from_dict(answer["mapping"]))
        log.warning("%s/%d: recovered from the blob store on %s with term %d", meta.name, shard, target, term)
        return True

    def _take_shard_fields(self, name: str, shard_mapping: Mapping) -> None:
        """Publish the fields a rebuilt shard's commit maps and the index mapping lacks (a store written before
        mappings were per index, issue 15), so a later bulk does not guess another type (lock held)."""
        meta = self.board.indices.get(name)
        if meta is None:
            return
        merged = with_shard_fields(meta, Mapping.from_dict(meta.mappings), [shard_mapping])
        if merged is not meta:
            try:
                self.board.submit(sync_index(merged))
                self.board.indices[name] = merged
            except Exception as exc:  # noqa: BLE001 - the next rebuild or mapping update publishes them
                log.error("%s: the restored shards' fields were not published (%s: %s)", name,
                          type(exc).__name__, exc)

    def retry_red(self) -> None:
        """Promote or rebuild every shard left without a primary (a failed promotion, a restore)."""
        with self.board.lock:
            if not self.board.active:
                return
            for (name, shard) in list(self.causes):
                if (name, shard) in self.not_retried:
                    continue
                meta = self.board.indices.get(name)
                if meta is None:
                    self.causes.pop((name, shard), None)
                    continue
                sr = meta.routing[shard]
                if sr.primary is not None and sr.primary in self.board.members:
                    self.causes.pop((name, shard), None)
                    continue
                if time.monotonic() < self.lease_waits.get((name, shard), 0.0):
                    continue  # the old primary may still answer reads
                if time.monotonic() < self.retry_at.get((name, shard), 0.0):
                    continue  # its last promotion failed: retried once its backoff is over
                self.lease_waits.pop((name, shard), None)
                self.promote(meta, sr, [n for n in sr.in_sync if n in self.board.members])
