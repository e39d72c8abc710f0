"""Promotion of a new primary, and what happens when it cannot be done (issue 14, cases 3 and 7d).

:class:`Promotions` is the cluster manager's promotion role: promote the most advanced
in-sync copy (with primary-replica resync), or, when the promotion fails on a store or
transport error, leave the shard red with the cause and retry it on a timer with a newer
term each time; rebuild a shard that lost every in-sync copy from the blob store.  It holds
the red shards' causes and the retry timer; what it needs from the cluster manager (the
index metadata, the nodes' copies, the routing, allocation, the store) is passed to it
explicitly, so this module imports nothing of the cluster.  Every method here runs with the
cluster lock held (docs/design/engine.md, invariants 3, 7b and 7d).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from shardstore.blobstores.base import BlobStore
from shardstore.engine.metadata import IndexMeta, ShardRouting
from shardstore.engine.shard import ShardCopy, ShardSpec
from shardstore.errors import ConflictError
from shardstore.segments.remote_store import next_free_term

log = logging.getLogger("shardstore.engine.cluster")
#: a failed promotion is retried after this many seconds, doubling up to PROMOTION_RETRY_MAX
PROMOTION_RETRY_MIN = 0.1
PROMOTION_RETRY_MAX = 5.0


class CopyHolder(Protocol):
    """What a promotion needs of a node: its disk and its shard copies (:class:`~shardstore.engine.local_node.Node`)."""

    data_dir: str
    copies: dict[tuple[str, int], ShardCopy]

    def discard(self, key: tuple[str, int]) -> ShardCopy | None: ...


class Promotions:
    """The cluster manager's promotions and red shards (held by :class:`~shardstore.engine.cluster.Cluster`).

    Its collaborators, all the cluster manager's: ``lock`` (the cluster lock, taken by the
    retry timer), ``store``, ``indices`` (index name -> metadata, read only: changes go
    through ``set_routing(meta, shard, **changes)``, which also publishes them), ``nodes``
    (node name -> its copies), ``live_nodes()``, ``shard_spec(meta, shard)``,
    ``schedule_allocation()`` (rebuild the missing replicas after the recovery delay) and
    ``acknowledged_max((index UUID, shard))`` (the highest seq# the cluster acknowledged).
    """

    def __init__(self, lock: threading.RLock, store: BlobStore, indices: Mapping[str, IndexMeta],
                 nodes: Mapping[str, CopyHolder], *, live_nodes: Callable[[], list[str]],
                 set_routing: Callable[..., None], shard_spec: Callable[[IndexMeta, int], ShardSpec],
                 schedule_allocation: Callable[[], None], acknowledged_max: Callable[[tuple[str, int]], int]) -> None:
        self._lock = lock
        self._store = store
        self._indices = indices
        self._nodes = nodes
        self._live_nodes = live_nodes
        self._set_routing = set_routing
        self._spec = shard_spec
        self._schedule_allocation = schedule_allocation
        self._acknowledged_max = acknowledged_max
        #: (index, shard) whose promotion failed -> the cause; retried by a timer (_retry_promotions)
        self._unpromoted: dict[tuple[str, int], str] = {}
        self._not_retried: set[tuple[str, int]] = set()  # claimed by another writer: red until a restore
        self._promotion_timer: threading.Timer | None = None
        self._promotion_backoff = PROMOTION_RETRY_MIN
        self._closed = False

    def causes(self) -> dict[tuple[str, int], str]:
        """(index, shard) -> why it has no primary, for every red shard (a copy)."""
        return dict(self._unpromoted)

    def retry_soon(self) -> None:
        """A node started: retry the red shards (a shard may be recoverable now) after the shortest backoff."""
        if set(self._unpromoted) - self._not_retried:
            self._promotion_backoff = PROMOTION_RETRY_MIN
            self._arm_promotion_retry()

    def close(self) -> None:
        """No retry runs after this (cluster lock held)."""
        self._closed = True
        if self._promotion_timer is not None:
            self._promotion_timer.cancel()

    def promote_or_retry_later(self, meta: IndexMeta, sr: ShardRouting, candidates: list[str]) -> bool:
        """Promote, or (a store or transport error) leave the shard red with the cause and retry in the background.

        The failed attempt's term counts as used (its claim may have landed): the routing
        records it, so the next attempt claims a newer one (issue 14, case 3).  Whether it
        promoted.  Called with the cluster lock held.
        """
        key = (meta.name, sr.shard)
        try:
            self._promote(meta, sr, candidates)
        except ConflictError as exc:
            # a newer term claimed the shard: another writer (a Spark job's sink) owns it now. Claiming
            # a term above it would fence that writer and drop its commit from what restore reads,
            # so the engine stops here, red with the cause, and does not retry.
            cause = (f"promotion to term {sr.primary_term + 1} refused ({type(exc).__name__}: {exc}); another "
                     f"writer owns the shard: restore the index from the store once it is done")
            log.error("%s/%d: %s", meta.name, sr.shard, cause)
            self._unpromoted[key] = cause
            self._not_retried.add(key)
            self._set_routing(self._indices[meta.name], sr.shard, primary=None, primary_term=sr.primary_term + 1,
                              copies=candidates, in_sync=candidates)
            return False
        except Exception as exc:  # noqa: BLE001 - any failure: the shard must not stay routed to a dead node
            cause = f"promotion to term {sr.primary_term + 1} failed ({type(exc).__name__}: {exc}); retrying"
            log.error("%s/%d: %s", meta.name, sr.shard, cause)
            # a candidate whose local disk failed is failed for good: retrying it would fail forever (seed 5279),
            # so it leaves the in-sync set and the retry promotes another copy or rebuilds from the store
            candidates = [n for n in candidates if not self._drop_if_disk_failed(meta, sr.shard, n)]
            self._unpromoted[key] = cause
            self._set_routing(self._indices[meta.name], sr.shard, primary=None, primary_term=sr.primary_term + 1,
                              copies=candidates, in_sync=candidates)
            self._arm_promotion_retry()
            return False
        if not candidates:  # nothing to promote: _promote left it red, recovered from the store by the retry
            return False
        self._unpromoted.pop(key, None)
        return True

    def _drop_if_disk_failed(self, meta: IndexMeta, shard: int, node: str) -> bool:
        """Close and forget ``node``'s copy of the shard if a local disk fault failed it; whether it did."""
        holder = self._nodes.get(node)
        copy = holder.copies.get((meta.uuid, shard)) if holder is not None else None
        if copy is None or copy.disk_failure is None:
            return False
        holder.discard((meta.uuid, shard))
        log.error("%s/%d: the copy on %s is failed (%s); it leaves the in-sync set", meta.name, shard, node,
                  copy.disk_failure)
        return True

    def _arm_promotion_retry(self) -> None:
        """Run :meth:`_retry_promotions` after the current backoff (capped exponential); cluster lock held."""
        if self._closed or (self._promotion_timer is not None and self._promotion_timer.is_alive()):
            return
        timer = threading.Timer(self._promotion_backoff, self._retry_promotions)
        timer.daemon = True
        self._promotion_timer = timer
        self._promotion_backoff = min(self._promotion_backoff * 2, PROMOTION_RETRY_MAX)
        timer.start()

    def _retry_promotions(self) -> None:
        """Promote every shard whose promotion failed (timer thread); re-arms itself while any still fails."""
        with self._lock:
            self._promotion_timer = None
            if self._closed:
                return
            for (name, shard) in list(self._unpromoted):
                if (name, shard) in self._not_retried:
                    continue
                meta = self._indices.get(name)
                if meta is None:
                    self._unpromoted.pop((name, shard), None)
                    continue
                sr = meta.routing[shard]
                key = (meta.uuid, shard)
                live = self._live_nodes()
                candidates = [n for n in sr.in_sync if n in live and key in self._nodes[n].copies]
                try:
                    if not candidates:
                        if self._recover_red_shard(meta, sr, live):
                            self._schedule_allocation()
                        continue
                    if self.promote_or_retry_later(meta, sr, candidates):
                        log.info("%s/%d: promotion succeeded on retry", name, shard)
                        self._schedule_allocation()
                except Exception as exc:  # noqa: BLE001 - the timer thread must never die with a shard still red
                    self._unpromoted[(name, shard)] = f"retry failed ({type(exc).__name__}: {exc}); retrying"
                    log.error("%s/%d: %s", name, shard, self._unpromoted[(name, shard)])
                    self._arm_promotion_retry()
            if not set(self._unpromoted) - self._not_retried:
                self._promotion_backoff = PROMOTION_RETRY_MIN

    def _recover_red_shard(self, meta: IndexMeta, sr: ShardRouting, live: list[str]) -> bool:
        """Rebuild a shard that lost every in-sync copy from the blob store alone, as a new primary; whether it did.

        With ``request`` durability the store holds every acknowledged operation (the
        remote translog above the newest commit), so nothing is lost; a recovery that would
        lose some raises RestoreDataLoss and the shard stays red with that cause.  The new
        primary claims a term above every claimed one, which fences any old primary that
        is still running.  Called with the cluster lock held (retry timer).
        """
        key = (meta.name, sr.shard)
        if not live:
            self._unpromoted[key] = "no in-sync copy left and no data node up; start a node to recover it from the store"
            self._arm_promotion_retry()
            return False
        target = min(live, key=lambda n: (len(self._nodes[n].copies), n))
        node = self._nodes[target]
        copy_key = (meta.uuid, sr.shard)
        stale = node.copies.pop(copy_key, None)
        if stale is not None:
            stale.close()
        spec = self._spec(meta, sr.shard)
        shutil.rmtree(os.path.join(node.data_dir, meta.uuid, str(sr.shard)), ignore_errors=True)
        term = sr.primary_term
        try:
            # inside the try: a failed LIST of the term markers used to escape and kill the retry timer's
            # thread, and the shard stayed red for good (fault simulator seed 687, under load)
            term = next_free_term(self._store, spec.address, at_least=sr.primary_term)
            copy = ShardCopy.recover_from_remote(spec, node.data_dir, self._store, primary_term=term,
                                                 known_term=sr.primary_term, index_name=meta.name,
                                                 acknowledged_max=self._acknowledged_max(copy_key),
                                                 node_remote=node.remote)
        except Exception as exc:  # noqa: BLE001 - a store error or a refused (lossy) recovery: stays red, named
            self._unpromoted[key] = (f"no in-sync copy left; recovery from the blob store failed "
                                     f"({type(exc).__name__}: {exc}); retrying")
            log.error("%s/%d: %s", meta.name, sr.shard, self._unpromoted[key])
            self._set_routing(self._indices[meta.name], sr.shard, primary_term=term)
            self._arm_promotion_retry()
            return False
        node.copies[copy_key] = copy
        self._set_routing(self._indices[meta.name], sr.shard, primary=target, primary_term=term, copies=[target],
                          in_sync=[target])
        self._unpromoted.pop(key, None)
        log.warning("%s/%d: every in-sync copy was lost; recovered from the blob store on %s with term %d",
                    meta.name, sr.shard, target, term)
        return True

    def _promote(self, meta: IndexMeta, sr: ShardRouting, candidates: list[str]) -> None:
        key = (meta.uuid, sr.shard)
        if not candidates:
            log.warning("shard %s/%d has no in-sync copy left; recovering it from the blob store", meta.name, sr.shard)
            self._set_routing(meta, sr.shard, primary=None, copies=[], in_sync=[])
            self._unpromoted[(meta.name, sr.shard)] = "no in-sync copy left; recovering it from the blob store"
            self._arm_promotion_retry()
            return
        best = max(candidates, key=lambda n: self._nodes[n].copies[key].local_checkpoint)
        term = sr.primary_term + 1
        primary = self._nodes[best].copies[key]
        primary.promote(term)
        # Primary-replica resync (seed 004): the other in-sync copies get the new primary's
        # operations above their local checkpoint.  Replication is in order per shard, so an
        # in-sync copy holds a prefix of the history the most advanced one holds: nothing to
        # trim, and at most the bulk in flight at the failure to send.  A copy that holds
        # more than the new primary (not expected) is rebuilt by peer recovery instead.
        kept = [best]
        for other in candidates:
            if other == best:
                continue
            copy = self._nodes[other].copies[key]
            try:
                sent = copy.resync_from(primary, term)
                kept.append(other)
                log.info("resynced %s/%d on %s: %d operations", meta.name, sr.shard, other, sent)
            except Exception as exc:  # noqa: BLE001 - rebuilt by peer recovery instead
                log.warning("resync of %s/%d on %s failed (%s: %s); rebuilding it", meta.name, sr.shard, other,
                            type(exc).__name__, exc)
                self._nodes[other].copies.pop(key).close()
        self._set_routing(meta, sr.shard, primary=best, primary_term=term, copies=kept, in_sync=kept)
        log.info("promoted %s to primary of %s/%d with term %d", best, meta.name, sr.shard, term)


__all__ = ["PROMOTION_RETRY_MAX", "PROMOTION_RETRY_MIN", "CopyHolder", "Promotions"]
