"""One round of the partition campaign of issue 41, as a test or a bench runs it.

A round starts three node processes whose links each run through a fault proxy
(:class:`~shardstore.testing.partitions.LinkedCluster`), creates an index, and has two
clients write and delete while one fault lasts ``seconds``:

- ``isolate_primary``: the node holding shard 0's primary is cut off from both others;
- ``isolate_manager``: the elected cluster manager is cut off (the manager first moved off
  ``n1`` when it is there, so shard 0's primary and a replica sit on the majority side);
- ``bridge``: ``n1``-``n3`` cut while both still reach ``n2``.

Clients write through the nodes of the majority side (one per shard, whose ids all route
there, and one across shards), one is pinned to the cut-off node (for a bridge, to ``n1``).  After the heal the round checks, live and after a restore from
the store alone: every acknowledged write present, no acknowledged delete back, the cluster
green and every shard writable within ``heal_wait`` seconds; and it measures, per shard whose
primary stayed on the majority side, the longest gap between acknowledged writes while the
link was cut.  :class:`Writer` is the load either kind of caller uses.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardstore.engine.coordinator.routing import shard_id
from shardstore.engine.launcher import ProcessCluster
from shardstore.testing.partitions import LinkedCluster

__all__ = ["KINDS", "RoundResult", "Writer", "manager_of", "run_round", "wait_until"]

KINDS = ("isolate_primary", "isolate_manager", "bridge")


class Writer:
    """Bulks of 20 new ids, and every 5th bulk a delete of an acknowledged id, on a thread; what was acknowledged.

    With ``shard`` (and the index's ``shards``), every id routes to that one shard: a bulk
    waits for all of its shards, so a per-shard write gap needs a writer per shard.
    """

    def __init__(self, client: Any, index: str, prefix: str, *, shard: int | None = None, shards: int = 1) -> None:
        self.client, self.index, self.prefix = client, index, prefix
        self._shard, self._shards = shard, shards
        self.acked: set[str] = set()
        self.deleted: set[str] = set()
        #: acknowledged ids whose delete's outcome is unknown (its answer lost): present or gone, both allowed
        self.maybe_deleted: set[str] = set()
        #: why items were not acknowledged (the error's first 120 characters) -> how many bulks saw it
        self.errors: Counter[str] = Counter()
        #: (monotonic time, shard) of every acknowledged bulk item's shard, one entry per shard per bulk
        self.acks: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _ids(self) -> Iterator[str]:
        n = 0
        while True:
            doc_id = f"{self.prefix}{n}"
            n += 1
            if self._shard is None or shard_id(doc_id, self._shards) == self._shard:
                yield doc_id

    def _run(self) -> None:
        n = 0
        ids = self._ids()
        while not self._stop.is_set():
            docs = [{"_id": next(ids), "v": n + k} for k in range(20)]
            n += 20
            try:
                result = self.client.bulk(self.index, docs)
            except Exception as exc:  # noqa: BLE001 - not acknowledged: nothing to remember
                self.errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                time.sleep(0.05)
                continue
            now = time.monotonic()
            for error in set(result.items["error"].drop_null().to_pylist()):
                self.errors[error[:120]] += 1
            table = result.items.filter(result.items["error"].is_null())
            self.acks.extend((now, int(s)) for s in set(table["shard"].to_pylist()))
            self.acked.update(result.acknowledged)
            victim = min(self.acked - self.deleted - self.maybe_deleted, default=None) if n % 100 == 0 else None
            if victim is not None:
                try:
                    if self.client.delete(self.index, victim).acknowledged:
                        self.deleted.add(victim)
                    else:
                        self.maybe_deleted.add(victim)
                except Exception:  # noqa: BLE001 - not acknowledged; it may or may not have been applied
                    self.maybe_deleted.add(victim)

    def stop(self) -> None:
        """Stop after the bulk in flight."""
        self._stop.set()
        self._thread.join(60)

    def longest_gap(self, shard: int, start: float, end: float) -> float:
        """The longest time in [start, end] without an acknowledged write on ``shard`` (the window's edges count)."""
        times = [start, *sorted(t for t, s in self.acks if s == shard and start <= t <= end), end]
        return max(b - a for a, b in zip(times, times[1:]))


def wait_until(condition: Any, timeout: float = 30.0, what: str = "a condition") -> None:
    """Poll ``condition()`` every 0.2 s until it is true; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} did not hold within {timeout:g} s")
        time.sleep(0.2)


def manager_of(links: LinkedCluster | ProcessCluster) -> str | None:
    """The cluster manager a live node names, or None."""
    for name in links.names:
        if not links.nodes[name].alive:
            continue
        try:
            master = links.call(name, "discovery.hello", {}, timeout=5)["master"]
        except Exception:  # noqa: BLE001 - not up, or cut off from the caller
            continue
        if master and links.nodes[master].alive:
            return master
    return None


@dataclass
class RoundResult:
    """What one round found (see the module docstring)."""

    kind: str
    mode: str
    seconds: float
    acked: int = 0
    lost: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    lost_after_restore: list[str] = field(default_factory=list)
    resurrected_after_restore: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # what was not green or writable after the heal
    heal_seconds: float = 0.0  # from the heal to green and every shard writable
    gaps: dict[int, float] = field(default_factory=dict)  # shard (primary on the majority side) -> longest gap
    #: per shard of ``gaps``, the errors its writer saw most (why a gap was long)
    gap_errors: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    logs: str = ""

    @property
    def clean(self) -> bool:
        """Nothing lost, nothing back, nothing stuck."""
        return not (self.lost or self.resurrected or self.lost_after_restore or self.resurrected_after_restore
                    or self.stuck)


def _ids(table: pa.Table) -> set[str]:
    return set(table.column("_id").to_pylist()) if table.num_rows else set()


def run_round(root: str | Path, kind: str, mode: str = "blackhole", seconds: float = 12.0, *, shards: int = 3,
              replicas: int = 1, heal_wait: float = 60.0, progress: Any = None, keep: bool = False) -> RoundResult:
    """Run one round in ``root`` (removed afterwards unless ``keep``) and return what it found (module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    say = progress or (lambda _msg: None)
    root = Path(root)
    out = RoundResult(kind, mode, seconds)
    links = LinkedCluster(str(root / "nodes"), f"file://{root / 'store'}?create=true", 3)
    try:
        admin = links.client()
        admin.wait_for_health("green", timeout=60)
        if kind == "isolate_manager" and manager_of(links) == "n1":  # shard 0's primary goes to n1
            links.kill("n1")
            wait_until(lambda: manager_of(links) not in (None, "n1"), what="a manager other than n1")
            links.restart("n1")
            admin.wait_for_health("green", timeout=60)
        admin.create_index("docs", shards=shards, replicas=replicas)
        admin.wait_for_health("green", timeout=60)
        primaries = {s: admin.primary_of("docs", s) for s in range(shards)}
        victim = {"isolate_primary": primaries[0], "isolate_manager": manager_of(links), "bridge": "n1"}[kind]
        assert victim is not None
        majority = [n for n in links.names if n != victim] if kind != "bridge" else list(links.names)
        steady = [Writer(links.client(majority), "docs", f"m{s}-", shard=s, shards=shards) for s in range(shards)]
        writers = [*steady, Writer(links.client(majority), "docs", "m"), Writer(links.client([victim]), "docs", "p")]
        try:
            time.sleep(2.0)
            cut_at = time.monotonic()
            if kind == "bridge":
                links.cut("n1", "n3", mode=mode)
            else:
                links.isolate(victim, mode=mode)
            say(f"{kind} ({mode}): {victim} cut off for {seconds:g} s; primaries {primaries}, manager "
            f"{manager_of(links)}")
            time.sleep(seconds)
            links.heal()
            healed_at = time.monotonic()
            time.sleep(2.0)
        finally:
            for w in writers:
                w.stop()
        out.gaps = {s: steady[s].longest_gap(s, cut_at, healed_at) for s, p in primaries.items()
                    if kind == "bridge" or p != victim}
        out.gap_errors = {s: steady[s].errors.most_common(3) for s in out.gaps}
        acked = set().union(*(w.acked for w in writers))
        deleted = set().union(*(w.deleted for w in writers))
        acked -= set().union(*(w.maybe_deleted for w in writers))  # a delete with no answer: either outcome
        try:
            admin.wait_for_health("green", timeout=heal_wait)
            for i in range(10):  # a write to every shard (bulks of 30 ids reach each of a few shards)
                probe = admin.bulk("docs", [{"_id": f"probe{i}-{k}", "v": k} for k in range(30)])
                acked.update(probe.acknowledged)
                if len(probe.acknowledged) == 30 and set(probe.items["shard"].to_pylist()) == set(range(shards)):
                    break
            else:
                refused = probe.items.filter(probe.items["error"].is_valid()).to_pylist()[:3]
                out.stuck.append(f"a shard refused writes after the heal: {refused}")
        except Exception as exc:  # noqa: BLE001 - a cluster that does not heal is the finding
            out.stuck.append(f"{type(exc).__name__}: {exc}")
        out.heal_seconds = time.monotonic() - healed_at
        out.acked = len(acked)
        try:
            admin.refresh("docs")
            live = _ids(admin.scan("docs", columns=["_id"]))
            out.lost = sorted((acked - deleted) - live)
            out.resurrected = sorted(deleted & live)
            admin.flush("docs")
        except Exception as exc:  # noqa: BLE001
            out.stuck.append(f"live read failed: {type(exc).__name__}: {exc}")
        admin.close()
        out.logs = links.logs()
        links.close()
        from shardstore.engine import Cluster

        restored = Cluster.restore(store=links.store, data_dir=str(root / "restored"), nodes=2)
        try:
            restored.refresh("docs")
            back = _ids(restored.scan("docs", columns=["_id"]))
            out.lost_after_restore = sorted((acked - deleted) - back)
            out.resurrected_after_restore = sorted(deleted & back)
        finally:
            restored.close()
        return out
    finally:
        links.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
