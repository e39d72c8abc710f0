"""Run a seeded schedule against a real in-process cluster and check it with the client model (issue 14).

:func:`run_schedule` builds a 3-node cluster (3 cluster managers) over a real blob store
(``file`` or ``memory``) wrapped in :class:`~shardstore.testing.faulty.FaultyStore`,
creates one index (2 shards, 1 replica), and executes the steps of
:mod:`~shardstore.testing.chaos.schedule` one by one.  Every exception must be one of the
project's documented errors (a :class:`~shardstore.errors.ShardstoreError`); per-item bulk
errors are checked by their type name.  After each ``restore`` step and at the end (all
faults healed, every node started) it waits for the cluster to be at least yellow (else:
*stuck*), then reads the whole index and checks it with the model; the end also restores
a fresh cluster from the store alone and checks that.  :func:`minimise` shortens a failing
schedule while it still fails.

Faults: transport drops, store faults (error, throttle, delay, lost reply, lost request,
stale listing), local-disk faults (disk full, failed fsync, torn write, and a crash that
kills the node at that write, inside the running step), node and manager kills with and
without disk wipe, one destroyed blob per schedule, concurrent clients on disjoint ids.
What it cannot inject yet (see the issue's notes): a restarted node that reopens its own
disk (a restarted node's copies are rebuilt from a peer or the store), and the death of
the coordinator (the client is the in-process Cluster).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardstore.blobstores import open_store
from shardstore.blobstores.errors import Throttled, TransientError
from shardstore.engine.shard.write_once import ENV_MIN_ROWS
from shardstore.errors import ShardstoreError
from shardstore.segments.directory import INDEX_BUFFER_BYTES
from shardstore.testing.chaos.model import ClientModel, Violation
from shardstore.testing.chaos.schedule import DATA_NODES, MANAGERS, Step, corrupt_target, draw_schedule
from shardstore.testing.disk import DiskFaults
from shardstore.testing.faulty import FaultyStore

log = logging.getLogger(__name__)
INDEX = "docs"
#: the simulated index's shards
SHARDS = 2
#: how long a check waits for the cluster to be usable again before calling it stuck
SETTLE_TIMEOUT = 60.0
#: a step slower than this is counted as a stall (a timeout waited out somewhere)
SLOW_STEP = 10.0
#: how long the simulated cluster waits out an election (client) and a failover (coordinator) before refusing
SIM_READY_WAIT = 2.0
SIM_FAILOVER_WAIT = 3.0
#: the lease of a view held for an ingest job in the simulated cluster (engine/coordinator/ingest.py HOLD_LEASE, 30 s
#: in a deployment): a copy an ingest step's release did not reach keeps its view this long, which a check waits out
SIM_HOLD_LEASE = 2.0
#: The indexing buffer of half the schedules: bulks of a few documents fill it (see Simulation).
SMALL_INDEX_BUFFER = 1024


def _documented() -> set[str]:
    """Names of every ShardstoreError subclass (the errors the project documents)."""
    import shardstore.blobstores.errors  # noqa: F401 - load every error module before walking the classes
    import shardstore.cluster_state.errors  # noqa: F401
    import shardstore.engine.errors  # noqa: F401
    import shardstore.segments.errors  # noqa: F401
    import shardstore.translog.errors  # noqa: F401

    out, todo = set(), [ShardstoreError]
    while todo:
        cls = todo.pop()
        out.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return out


@dataclass
class Outcome:
    """What one schedule did and what it broke."""

    seed: int
    steps: int
    violations: list[Violation] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)  # documented error type -> how many
    acked: int = 0
    failed: int = 0
    restores: int = 0
    refused: int = 0  # restores refused naming the blob a corrupt step destroyed (correct)
    faults: int = 0  # injected faults that fired
    slow_steps: int = 0  # steps that took over SLOW_STEP seconds (a stall: reported, not a violation)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """No violation."""
        return not self.violations

    def count(self, *kinds: str) -> int:
        """How many violations of these kinds."""
        return sum(1 for v in self.violations if v.kind in kinds)


class ScheduleEnded(Exception):
    """The schedule cannot go on: its one corrupt blob made a restore refuse (correctly); nothing more to check."""


class Simulation:
    """One schedule's cluster, store, model and outcome (see the module docstring)."""

    def __init__(self, seed: int, workdir: Path, store_kind: str = "file", source: str = "stored") -> None:
        self.seed = seed
        self.source = source  # the index's source option: "synthetic" logs typed fields, no JSON
        # half the seeds (a bit of its own, not the store's nor the source's) shrink the indexing buffer so
        # that bulks refresh while their translog upload is in flight (engine/shard/shard_copy.py _log_remote): the
        # overlap meets the store and disk faults too, on both stores and both source options
        self.index_buffer_bytes = SMALL_INDEX_BUFFER if (seed // 4) % 2 else INDEX_BUFFER_BYTES
        # and another bit: every part of new ids is written once (engine/shard/write_once.py), which a bulk of a few
        # documents takes on a synthetic-source index (no JSON source): placed segments and Parquet frames then
        # meet every fault (the copies read the setting when they open; restored at close)
        self.write_once = bool((seed // 8) % 2)
        self._write_once_env = os.environ.get(ENV_MIN_ROWS)
        os.environ[ENV_MIN_ROWS] = "1" if self.write_once else "0"
        self.workdir = Path(workdir)
        self._views_held_until = 0.0  # until when a failed ingest step's views may stay held (monotonic)
        if store_kind == "file":
            url = f"file://{self.workdir / 'remote'}?fsync=false"
        elif store_kind == "memory":
            url = f"memory://chaos-{seed}-{uuid.uuid4().hex[:8]}"
        else:
            raise ValueError(f"store_kind must be 'file' or 'memory', not {store_kind!r}")
        self.store = FaultyStore(open_store(url), seed=seed)
        self.disk = DiskFaults(on_crash=self._crash_at)
        self._crashes: list[threading.Thread] = []
        self.disk.__enter__()
        try:
            self._start()
        except BaseException:
            self.disk.__exit__(None, None, None)
            raise

    def _start(self) -> None:
        self.model = ClientModel()
        self.outcome = Outcome(self.seed, 0)
        self.documented = _documented()
        self._generation = 0
        self.corrupted: tuple[str, str] | None = None  # (key, how) of the schedule's one destroyed blob
        self._crash_errors: list[BaseException] = []
        self.ended = False
        self.cluster = self._new_cluster(restore=False)
        self.cluster.create_index(INDEX, shards=SHARDS, replicas=1, source=self.source)

    # -- plumbing -------------------------------------------------------------------------

    def _data_dir(self) -> str:
        self._generation += 1
        return str(self.workdir / f"nodes-{self._generation}")

    def _new_cluster(self, restore: bool) -> Any:
        from shardstore.engine import Cluster

        # a leaderless or red stretch is refused after a few seconds (NodeNotReady, ShardUnavailable: documented)
        # rather than the 10 s and 15 s a deployment waits: the schedule moves on to its next fault
        options = dict(store=self.store, data_dir=self._data_dir(), nodes=len(DATA_NODES), recovery_delay=0.05,
                       index_buffer_bytes=self.index_buffer_bytes, ready_wait=SIM_READY_WAIT,
                       retry_wait=SIM_READY_WAIT + SIM_FAILOVER_WAIT,
                       failover_wait=SIM_FAILOVER_WAIT,
                       # the collection of dead translog streams (issue 46) at its harshest: no grace, a pass a second
                       translog_gc_grace=0.0, translog_gc_every=1.0)
        return Cluster.restore(**options) if restore else Cluster(**options)

    def _error(self, step: Step, exc: BaseException) -> None:
        name = type(exc).__name__
        if isinstance(exc, ShardstoreError):
            self.outcome.errors[name] += 1
        else:
            self.outcome.violations.append(Violation("unclean", step.index, f"{name}: {exc}"))

    def _item_error(self, step: Step, text: str) -> None:
        name = text.split(":", 1)[0].strip()
        if name in self.documented:
            self.outcome.errors[name] += 1
        else:
            self.outcome.violations.append(Violation("unclean", step.index, f"bulk item error {text}"))

    def _value(self, step: Step, doc_id: str) -> str:
        return f"{self.seed}:{step.index}:{doc_id}"

    # -- steps ----------------------------------------------------------------------------

    def apply(self, step: Step) -> None:
        """Execute one step; documented errors are counted, others are violations."""
        handler: Callable[[Step], None] = getattr(self, f"_do_{step.kind}")
        t0 = time.monotonic()
        try:
            handler(step)
        except ScheduleEnded:
            self.ended = True
        except ShardstoreError as exc:
            self._error(step, exc)
        except Exception as exc:  # noqa: BLE001 - an undocumented error is what the simulator looks for
            self._error(step, exc)
        self._join_crashes(step)
        if time.monotonic() - t0 > SLOW_STEP:
            self.outcome.slow_steps += 1
            log.warning("seed %d: step %s took %.1fs", self.seed, step, time.monotonic() - t0)
        self.outcome.steps += 1

    def _join_crashes(self, step: Step) -> None:
        """Wait for the node kills that disk-fault crashes started during the step; their errors are judged."""
        while self._crashes:
            self._crashes.pop().join()
        while self._crash_errors:
            self._error(step, self._crash_errors.pop())

    def _write_result(self, step: Step, values: dict[str, str | None], result: Any) -> None:
        items = result.items.to_pylist()
        for row in items:
            doc_id = row["_id"]
            if row["error"] is None:
                self.outcome.acked += 1
                self.model.acknowledged(doc_id, values[doc_id])
                v = self.model.stamp(doc_id, row["primary_term"], row["seq_no"], row["version"], step.index)
                if v is not None:
                    self.outcome.violations.append(v)
            else:
                self.outcome.failed += 1
                self.model.uncertain(doc_id, values[doc_id])
                self._item_error(step, row["error"])

    def _uncertain(self, values: dict[str, str | None]) -> None:
        """A write whose outcome is unknown (it raised): each of its values may or may not be current."""
        for doc_id, value in values.items():
            self.model.uncertain(doc_id, value)
            self.outcome.failed += 1

    def _guarded_write(self, step: Step, values: dict[str, str | None], call: Callable[[], Any]) -> None:
        try:
            result = call()
        except BaseException:
            self._uncertain(values)
            raise
        self._write_result(step, values, result)

    def _do_bulk(self, step: Step) -> None:
        values: dict[str, str | None] = {i: self._value(step, i) for i in step.args["ids"]}
        docs = [{"_id": i, "v": v} for i, v in values.items()]
        self._guarded_write(step, values, lambda: self.cluster.bulk(INDEX, docs))

    def _do_ingest(self, step: Step) -> None:
        """The Spark sink's commit into a live cluster, without Spark (issue 43): the rows staged as the sink stages a
        frame of mapped columns, one Parquet file per shard (docs/design/adoption.md: the cluster adopts them as
        segments; before the index maps ``v`` the coordinator applies their rows), then ``commit_live`` (job record,
        ``Client.ingest`` retried by job id).  Every row is acknowledged when the commit returns; a commit that raised
        leaves each row uncertain."""
        from dataclasses import replace

        import pyarrow as pa

        from shardstore.engine.coordinator.ingest import stage_table
        from shardstore.engine.coordinator.routing import split_by_shard
        from shardstore.spark.live_sink import LiveCommitMessage, LiveJob, commit_live

        values: dict[str, str | None] = {i: self._value(step, i) for i in step.args["ids"]}

        def commit() -> dict[str, Any]:
            name = f"sim-{self.seed}-{step.index}-{self._generation}"
            prefix = self.cluster.ingest_prefix(INDEX, name)
            job = LiveJob({}, (), INDEX, self.cluster.index_uuid(INDEX), name, prefix, "append")
            rows = pa.table({"_id": pa.array(list(values), pa.string()), "v": pa.array(list(values.values()),
                                                                                     pa.string())})
            staged = tuple(replace(stage_table(self.store, prefix, f"p0-a0-s{shard}", part), shard=shard)
                           for shard, part in sorted(split_by_shard(rows, SHARDS)
                                                     .items()))
            return commit_live(job, [LiveCommitMessage(staged)], store=self.store, retry_seconds=SIM_FAILOVER_WAIT)

        from shardstore.engine.coordinator import ingest

        ingest.HOLD_LEASE = SIM_HOLD_LEASE  # this process is the simulated cluster's (its coordinators read it)
        try:
            out = commit()
        except BaseException:
            self._uncertain(values)
            raise
        finally:
            # a job cut short, or a copy its release did not reach (a fault), keeps its view until the hold lapses
            # (docs/design/ingest.md, "Atomic visibility"): searches miss writes acknowledged meanwhile, as
            # documented; the next check reads once every hold of this step lapsed
            self._views_held_until = time.monotonic() + SIM_HOLD_LEASE + 0.5
        if out["applied"] != len(values):
            self.outcome.violations.append(Violation("unclean", step.index, f"ingest applied {out}, not "
                                                                             f"{len(values)} rows"))
        for doc_id, value in values.items():
            self.outcome.acked += 1
            self.model.acknowledged(doc_id, value)

    def _clients(self, parts: list[dict[str, str | None]], meanwhile: Callable[[], None] | None = None) -> list[Any]:
        """One client thread per part bulk-writing it at once (``meanwhile`` runs on this thread); their results."""
        results: list[Any] = [None] * len(parts)

        def client(n: int) -> None:
            docs = [{"_id": i, "v": v} for i, v in parts[n].items()]
            try:
                results[n] = self.cluster.bulk(INDEX, docs)
            except BaseException as exc:  # noqa: BLE001 - judged by the caller, on the client's thread of control
                results[n] = exc

        threads = [threading.Thread(target=client, args=(n,), name=f"chaos-client-{n}") for n in range(len(parts))]
        for t in threads:
            t.start()
        if meanwhile is not None:
            meanwhile()
        for t in threads:
            t.join()
        return results

    def _judge(self, step: Step, parts: list[dict[str, str | None]], results: list[Any]) -> None:
        """Each client's outcome into the model: acknowledged items pinned, the rest uncertain."""
        for values, result in zip(parts, results):
            if isinstance(result, BaseException):
                self._uncertain(values)
                self._error(step, result)
            else:
                self._write_result(step, values, result)

    def _do_concurrent(self, step: Step) -> None:
        """Two clients at once, on disjoint ids: each bulk is checked as if it ran alone."""
        parts: list[dict[str, str | None]] = [{i: self._value(step, i) for i in step.args[k]} for k in ("a", "b")]
        self._judge(step, parts, self._clients(parts))

    def _do_kill_coordinator(self, step: Step) -> None:
        """The coordinator dies with a bulk in flight: its answer (results or a typed error) is judged, then the
        cluster is restored from the store alone and checked."""
        parts: list[dict[str, str | None]] = [{i: self._value(step, i) for i in step.args["ids"]}]

        def kill() -> None:
            threading.Event().wait(step.args["delay"])
            self.cluster.close()

        self._judge(step, parts, self._clients(parts, kill))
        self._restore(step.index)

    def _do_delete(self, step: Step) -> None:
        doc_id = step.args["id"]
        self._guarded_write(step, {doc_id: None}, lambda: self.cluster.delete(INDEX, doc_id))

    def _do_conditional(self, step: Step) -> None:
        from shardstore.engine.errors import VersionConflict

        doc_id = step.args["id"]
        stamp = self.model.last_stamp.get(doc_id)
        if stamp is None:
            return
        term, seq_no, _version = stamp
        value = self._value(step, doc_id)
        try:
            self._guarded_write(step, {doc_id: value}, lambda: self.cluster.index_doc(
                INDEX, {"_id": doc_id, "v": value}, if_seq_no=seq_no, if_primary_term=term))
        except VersionConflict:
            self.outcome.errors["VersionConflict"] += 1  # refused: nothing applied, still "uncertain" above

    def _do_refresh(self, step: Step) -> None:
        self.cluster.refresh(INDEX)

    def _do_flush(self, step: Step) -> None:
        self.cluster.flush(INDEX)

    def _do_kill(self, step: Step) -> None:
        if step.args["node"] in self.cluster.live_nodes():
            self.cluster.kill_node(step.args["node"], wipe_disk=step.args.get("wipe", False))

    def _do_start(self, step: Step) -> None:
        self.cluster.start_node(step.args["node"])

    def _do_kill_manager(self, step: Step) -> None:
        self.cluster.kill_node(step.args["node"])

    def _do_start_manager(self, step: Step) -> None:
        self.cluster.start_node(step.args["node"])

    def _do_drop(self, step: Step) -> None:
        a = step.args
        self.cluster.transport.drop(a["action"], times=1, after=a["after"], direction=a["direction"])

    def _do_store_fault(self, step: Step) -> None:
        a = step.args
        action = a["action"]
        rule: dict[str, Any] = {"op": a["op"], "key": a["key"], "times": a["times"], "after": a["after"]}
        if action == "delay":
            rule.update(action="delay", delay=0.05)
        elif action == "fail":
            rule.update(action="fail", error=Throttled if a["after"] % 2 else TransientError)
        elif action == "stale_list":
            rule.update(action="stale_list", op="list", lag=a["after"] + 1, after=0)
        else:
            rule.update(action=action)
        self.store.inject(**rule)

    def _do_heal(self, step: Step) -> None:
        self.heal()

    def _do_partition(self, step: Step) -> None:
        self.cluster.transport.isolate(step.args["node"])

    def _do_delay(self, step: Step) -> None:
        a = step.args
        self.cluster.transport.delay(a["seconds"], a["action"], times=a["times"], direction=a["direction"])

    def _do_kill_at_send(self, step: Step) -> None:
        a = step.args
        self.cluster.transport.on(a["action"], lambda _s, target, _a, _r: self._kill_async(target), times=1,
                                  after=a["after"])

    def _do_disk_fault(self, step: Step) -> None:
        a = step.args
        self.disk.inject(op=a["op"], path=f"*/{a['node']}/*/{a['part']}/*", action=a["action"], after=a["after"],
                         times=a["times"])

    def _crash_at(self, path: str) -> None:
        """A disk-fault crash: the node owning ``path`` is killed now, while its write fails (joined after the step)."""
        node = next((n for n in DATA_NODES if f"/{n}/" in path), None)
        if node is not None:
            self._kill_async(node)

    def _kill_async(self, node: str) -> None:
        """Kill ``node`` on another thread, racing whatever the step is doing (joined after the step)."""
        cluster = self.cluster

        def kill() -> None:
            try:
                if node in cluster.live_nodes():
                    cluster.kill_node(node)
            except Exception as exc:  # noqa: BLE001 - judged like any error of a step
                self._crash_errors.append(exc)

        t = threading.Thread(target=kill, name=f"chaos-crash-{node}")
        t.start()
        self._crashes.append(t)  # started first: the step's thread joins whatever is in the list

    def _do_corrupt(self, step: Step) -> None:
        """Destroy one blob behind the cluster's back (only the schedule's first corrupt step does)."""
        if self.corrupted is not None:
            return
        inner = self.store.inner
        part = step.args["part"]
        keys = sorted(i.key for i in inner.list("") if corrupt_target(part, i.key))
        if not keys:
            return
        key = keys[step.args["pick"] % len(keys)]
        how = step.args["how"]
        if how == "delete":
            inner.delete([key])
        else:
            data = bytearray(inner.get(key))
            if how == "flip" and data:
                data[len(data) // 2] ^= 0x40
            else:
                data = data[: len(data) // 2]
            inner.put(key, bytes(data))
        self.corrupted = (key, how)
        log.info("seed %d step %d: %s %s", self.seed, step.index, how, key)

    def _refusal_is_right(self, step: int, exc: BaseException) -> bool:
        """After the one corrupt blob: a RestoreDataLoss naming a seq# range (and the blob, if it is still there)."""
        from shardstore.engine.errors import RestoreDataLoss

        if self.corrupted is None or not isinstance(exc, RestoreDataLoss):
            return False
        key, how = self.corrupted
        text = str(exc)
        names_range = "seq#" in text or "seq_no" in text
        names_blob = how == "delete" or key in text or key.rsplit("/", 1)[-1] in text
        if names_range and names_blob:
            self.outcome.refused += 1
            return True
        return False

    def _restore(self, step: int) -> None:
        """Close the cluster and restore a new one from the store alone; a wrong refusal is a *lost* violation."""
        self.heal()
        self.cluster.close()
        self.outcome.restores += 1
        try:
            self.cluster = self._new_cluster(restore=True)
        except ShardstoreError as exc:
            if self._refusal_is_right(step, exc):
                raise ScheduleEnded from exc
            self.outcome.violations.append(Violation("lost", step, f"restore refused: {exc}"))
            raise ScheduleEnded from exc
        self.verify(step)

    def _do_restore(self, step: Step) -> None:
        self._restore(step.index)

    # -- checks ---------------------------------------------------------------------------

    def heal(self) -> None:
        """Clear every transport and store fault."""
        self.cluster.clear_faults()
        self.store.clear()
        self.disk.clear()

    def settle(self, step: int, status: str = "yellow") -> bool:
        """Heal, start every node, wait for ``status``; a *stuck* violation (False) if it never comes."""
        self.heal()
        for name in (*MANAGERS, *DATA_NODES):
            self.cluster.start_node(name)
        try:
            self.cluster.wait_for_health(status, timeout=SETTLE_TIMEOUT)
            return True
        except ShardstoreError as exc:
            causes = " ".join(self.cluster.health().causes)
            if self.corrupted is not None and "RestoreDataLoss" in causes and self.corrupted[0] in causes:
                self.outcome.refused += 1  # red, naming the destroyed blob: the right answer, not stuck
                raise ScheduleEnded from exc
            self.outcome.violations.append(Violation("stuck", step, f"{exc}; causes: {causes or 'none'}"))
            return False

    def verify(self, step: int) -> None:
        """Settle, then read the whole index and check it with the model (once a failed ingest step's views lapsed)."""
        if not self.settle(step):
            return
        time.sleep(max(0.0, self._views_held_until - time.monotonic()))
        self.cluster.refresh(INDEX)
        rows = self.cluster.scan(INDEX, columns=["_id", "v"]).to_pylist()
        count = self.cluster.count(INDEX)
        gets = {}
        for doc_id in sorted(self.model.possible):
            doc = self.cluster.get(INDEX, doc_id)
            gets[doc_id] = None if doc is None else (doc.get("_source") or {}).get("v")
        self.outcome.violations.extend(self.model.check(step, rows, count, gets))

    def finish(self, last_step: int) -> None:
        """Final checks: the live cluster, then a restore from the store alone onto fresh nodes."""
        for check in (self.verify, self._restore):
            try:
                check(last_step)
            except ScheduleEnded:
                return
            except Exception as exc:  # noqa: BLE001 - every failure of a final check is a violation
                self.outcome.violations.append(Violation("unclean" if not isinstance(exc, ShardstoreError)
                                                         else "stuck", last_step, f"{type(exc).__name__}: {exc}"))
                return

    def close(self) -> None:
        """Stop the cluster (the store and data directories stay for inspection)."""
        if self._write_once_env is None:
            os.environ.pop(ENV_MIN_ROWS, None)
        else:
            os.environ[ENV_MIN_ROWS] = self._write_once_env
        self.disk.__exit__(None, None, None)
        while self._crashes:
            self._crashes.pop().join()
        try:
            self.cluster.close()
        except Exception as exc:  # noqa: BLE001 - closing after a failure must not hide the outcome
            log.warning("closing the simulated cluster: %r", exc)


def run_schedule(seed: int, steps: Sequence[Step], workdir: Path, store_kind: str = "file",
                 keep: bool = False, source: str = "stored") -> Outcome:
    """Run ``steps`` (drawn from ``seed``) in a fresh cluster under ``workdir``; the outcome with every violation.

    ``source``: the index's source option (``stored`` or ``synthetic``, issue 16).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    sim = Simulation(seed, workdir, store_kind, source)
    try:
        for step in steps:
            sim.apply(step)
            if sim.ended:
                break
        else:
            sim.finish(steps[-1].index + 1 if steps else 0)
    finally:
        sim.close()
        sim.outcome.faults = sim.store.fired_total + sim.disk.fired_total
        sim.outcome.seconds = time.monotonic() - t0
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return sim.outcome


def run_seed(seed: int, length: int, workdir: Path, store_kind: str = "file", source: str = "stored") -> Outcome:
    """Draw ``seed``'s schedule of ``length`` steps and run it."""
    return run_schedule(seed, draw_schedule(seed, length), workdir, store_kind, source=source)


def minimise(seed: int, steps: list[Step], workdir: Path, store_kind: str = "file",
             budget: int = 40, source: str = "stored") -> list[Step]:
    """A shorter schedule that still fails (any violation): chunks removed while it keeps failing, ``budget`` runs."""
    current = list(steps)
    chunk = max(1, len(current) // 2)
    runs = 0
    while chunk >= 1 and runs < budget:
        i, removed = 0, False
        while i < len(current) and runs < budget:
            candidate = current[:i] + current[i + chunk:]
            runs += 1
            if candidate and not run_schedule(seed, candidate, Path(workdir) / f"min-{runs}", store_kind,
                                              source=source).clean:
                current, removed = candidate, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return current


__all__ = ["Outcome", "Simulation", "minimise", "run_schedule", "run_seed"]
