"""Replica allocation: which copies to build where (pure), cluster health, and the background worker.

The cluster manager never rebuilds a replica inline: :meth:`Cluster.kill_node` promotes
(cheap, constant time) and schedules the rebuilds ``recovery_delay`` seconds later (as
Elasticsearch delays allocation after a node leaves), so a failover neither grows with
the shard's size nor competes with the new primary's first writes for disk and CPU
(docs/design/engine.md, "Failover time").  The worker thread runs the
cluster's allocation round until it has nothing left to do; peer recoveries of
different shards then run one after the other on it while writes go on.

:func:`plan_replicas` is the pure decision: for every shard that has a primary and
fewer copies than ``min(replicas, live nodes - 1)``, the least-loaded live node that
holds no copy (ties by name), at most one recovery per shard at a time.
:func:`cluster_health` is Elasticsearch's traffic light: red when a shard has no
primary, yellow when a wanted replica is missing or still recovering, else green.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shardstore.engine.manager.metadata import IndexMeta

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assignment:
    """Build a replica of ``index``'s ``shard`` on node ``target``."""

    index: str
    shard: int
    target: str


@dataclass(frozen=True)
class ClusterHealth:
    """Elasticsearch-style health: status and shard counts."""

    status: str  # "green" | "yellow" | "red"
    active_primaries: int
    active_shards: int
    initializing_shards: int
    unassigned_shards: int
    red_shards: tuple[str, ...] = ()  # "index/shard" without a primary
    causes: tuple[str, ...] = ()  # "index/shard: why" for shards that are red for a known reason
    data_nodes: int = 0  # data nodes the manager counts as members
    #: every shard has its primary and the in-sync copies the data nodes can hold, none recovering
    settled: bool = False
    #: enough data nodes for every wanted copy (else no recovery can make the cluster green)
    green_possible: bool = True


def wanted_copies(meta: IndexMeta, live: int) -> int:
    """How many copies (primary included) a shard of ``meta`` should have with ``live`` nodes up."""
    return 1 + min(meta.replicas, max(0, live - 1))


def plan_replicas(indices: Mapping[str, IndexMeta], live: Sequence[str], load: Mapping[str, int],
                  busy: frozenset[tuple[str, int]] = frozenset()) -> list[Assignment]:
    """The replica copies to build now (pure; one per shard not in ``busy``), least-loaded node first."""
    load = dict(load)
    out = []
    for name in sorted(indices):
        meta = indices[name]
        for sr in meta.routing:
            if sr.primary is None or (name, sr.shard) in busy:
                continue
            if len(sr.copies) >= wanted_copies(meta, len(live)):
                continue
            free = [n for n in live if n not in sr.copies]
            if not free:
                continue
            target = min(free, key=lambda n: (load.get(n, 0), n))
            load[target] = load.get(target, 0) + 1
            out.append(Assignment(name, sr.shard, target))
    return out


def cluster_health(indices: Mapping[str, IndexMeta], live: Sequence[str],
                   initializing: frozenset[tuple[str, int]] = frozenset(),
                   causes: Mapping[tuple[str, int], str] | None = None) -> ClusterHealth:
    """Health of ``indices`` with ``live`` nodes up and ``initializing`` shards recovering a replica (pure).

    A shard whose routing names a primary that is not live is red (its promotion has not
    happened): health never reports a shard no write can reach as green.
    """
    primaries = shards = unassigned = 0
    red = []
    short = False  # a shard with fewer in-sync copies than the live nodes can hold
    for name in sorted(indices):
        meta = indices[name]
        for sr in meta.routing:
            wanted = 1 + meta.replicas
            if sr.primary is None or sr.primary not in live:
                red.append(f"{name}/{sr.shard}")
                unassigned += wanted
                continue
            primaries += 1
            active = len([n for n in sr.in_sync if n in live])
            shards += active
            short = short or active < wanted_copies(meta, len(live))
            unassigned += max(0, wanted - active)
    init = len(initializing)
    unassigned = max(0, unassigned - init)
    status = "red" if red else ("yellow" if unassigned or init else "green")
    why = tuple(f"{name}/{shard}: {cause}" for (name, shard), cause in sorted((causes or {}).items())
                if f"{name}/{shard}" in red)
    possible = all(meta.replicas + 1 <= len(live) for meta in indices.values())
    return ClusterHealth(status, primaries, shards, init, unassigned, tuple(red), why, len(live),
                         not red and not init and not short, possible)


class AllocationWorker:
    """A daemon thread that calls ``round_()`` until it returns False, each time it is scheduled."""

    def __init__(self, round_: Callable[[], bool], name: str = "allocation") -> None:
        self._round = round_
        self._cond = threading.Condition()
        self._pending = False
        self._busy = False
        self._closed = False
        self._timers: set[threading.Timer] = set()  # delayed schedules not yet due
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def schedule(self, delay: float = 0.0) -> None:
        """Ask for an allocation round (coalesced with one already pending), now or after ``delay`` seconds."""
        with self._cond:
            if self._closed:
                return
            if delay > 0:
                timer = threading.Timer(delay, self._due, args=(None,))
                timer.args = (timer,)
                timer.daemon = True
                self._timers.add(timer)
                timer.start()
                return
            self._pending = True
            self._cond.notify_all()

    def _due(self, timer: threading.Timer) -> None:
        with self._cond:
            self._timers.discard(timer)
            if not self._closed:
                self._pending = True
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no round is pending or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or not (self._pending or self._busy or self._timers),
                                       timeout)

    @property
    def idle(self) -> bool:
        """No round pending, delayed or running."""
        with self._cond:
            return not (self._pending or self._busy or self._timers)

    def close(self, wait: float = 60.0) -> None:
        """Stop after the round in progress (its recovery finishes or fails on closed copies), waiting for it
        up to ``wait`` seconds (the worker is a daemon thread: a process that exits does not wait for it)."""
        with self._cond:
            self._closed = True
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=wait)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    self._cond.notify_all()
                    return
                self._pending, self._busy = False, True
            try:
                while not self._closed and self._round():
                    pass
            except Exception:  # noqa: BLE001 - a failed round is logged; the next schedule retries
                log.exception("allocation round failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
