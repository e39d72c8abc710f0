"""Run a seeded process-mode schedule against real node processes and check it with the client model (issue 29).

:func:`run_process_schedule` starts three ``shardstore node`` processes
(:class:`~shardstore.testing.partitions.LinkedCluster`: ``n1``..``n3``, each data and
cluster-manager-eligible, every directed link between two nodes through its own TCP fault
proxy; clients reach the nodes directly) over the local file store, creates one index (2
shards, 1 replica) through a :class:`~shardstore.engine.client.Client`, and executes the
steps of :mod:`~shardstore.testing.chaos.process_schedule` one by one: writes and reads
through the client, faults as signals (SIGKILL, SIGSTOP/SIGCONT, SIGTERM) and restarts on
the node's data directory, and network partitions (issue 41: links cut, healed on a timer
while later steps run; ``recover`` heals them at once when the step says ``early``, else
waits for the timer).

It is checked by the same :class:`~shardstore.testing.chaos.model.ClientModel` as the
in-process runner (:class:`~shardstore.testing.chaos.runner.Simulation`, whose write
bookkeeping it inherits): an acknowledged item pins its value, anything else, a lost
answer included (a bulk's items reported ``NodeDisconnected``, a single-document write
raising it), leaves the id *maybe applied*.  Every exception and per-item error must be a
documented :class:`~shardstore.errors.ShardstoreError`; a ``RemoteError`` (a node's handler
raised something that is not one) is *unclean*.  Each ``get`` value must be one the model
allows.  At the end every link is healed and every node up again; the nodes must follow one
manager and the cluster reach green within ``SETTLE_TIMEOUT``, and every shard take a write
(a probe document per shard acknowledged) within ``WRITABLE_TIMEOUT`` (else *stuck*); the
whole index is read through the client and checked (the probes included); then every
process is SIGKILLed and an embedded ``Cluster.restore`` from the store alone (fresh data
dir, 2 nodes) is checked too.  Node logs stay under ``<workdir>/nodes``, next to
``steps.log`` (each step, signal and restart with the time); a failing or stalled schedule's
logs are copied to ``logs_to`` when given.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardstore.engine.coordinator.routing import shard_id
from shardstore.errors import ShardstoreError
from shardstore.testing.chaos.model import ClientModel, Violation
from shardstore.testing.chaos.process_schedule import PROCESS_NODES, draw_process_schedule
from shardstore.testing.chaos.runner import (
    INDEX,
    SETTLE_TIMEOUT,
    SLOW_STEP,
    Outcome,
    ScheduleEnded,
    Simulation,
    _documented,
)
from shardstore.testing.chaos.schedule import Step

log = logging.getLogger(__name__)

#: fault detection of the node processes (ProcessCluster's defaults): a paused node is removed after ~4.5 s
FD_INTERVAL, FD_TIMEOUT, FD_RETRIES = 0.5, 1.0, 3
#: the collection of dead translog streams (issue 46) at its harshest: no grace, a pass every second
GC_GRACE, GC_EVERY = 0.0, 1.0
#: a partition that lasts longer than this outlasts fault detection (a node is declared failed)
FD_SECONDS = FD_RETRIES * (FD_INTERVAL + FD_TIMEOUT)
#: a client call's timeout: longer than a coordinator's own worst case (failover wait + a node-to-node
#: timeout), so the client hears the coordinator's answer rather than giving up while it still works
CLIENT_TIMEOUT = 60.0
#: how long a kill_manager step looks for the elected manager
FIND_MANAGER_TIMEOUT = 10.0
#: the index's shards (created by ProcessSimulation)
SHARDS = 2
#: the final check: how long after green every shard may take to acknowledge a probe write
WRITABLE_TIMEOUT = 30.0
#: how the schedule's three nodes run: ``shardstore node`` processes behind per-link TCP fault proxies, or the
#: same roles embedded in this process over the in-process transport (issue 42)
LAUNCHERS = ("processes", "embedded")
#: the errors that are not documented although they are ShardstoreErrors: a node's handler raised something else
UNDOCUMENTED = frozenset({"RemoteError"})


@dataclass
class ProcessOutcome(Outcome):
    """An :class:`Outcome` with how long each partition lasted (seconds, cut to heal)."""

    partitions: list[float] = field(default_factory=list)

    @property
    def partitions_over_fd(self) -> int:
        """How many partitions outlasted fault detection (FD_SECONDS)."""
        return sum(1 for s in self.partitions if s > FD_SECONDS)


def _documented_names() -> set[str]:
    import shardstore.net.wire  # noqa: F401 - its errors (RemoteError) are walked too, then taken out
    import shardstore.transport  # noqa: F401

    return _documented() - UNDOCUMENTED


class ProcessSimulation(Simulation):
    """One process-mode schedule's node processes, client, model and outcome (see the module docstring)."""

    def __init__(self, seed: int, workdir: Path, launcher: str = "processes") -> None:  # noqa: D107
        from shardstore.engine.cluster import Cluster
        from shardstore.engine.node.fault_detection import FaultDetectionSettings
        from shardstore.testing.partitions import LinkedCluster

        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")

        self.seed = seed
        self.workdir = Path(workdir)
        self.store_url = f"file://{self.workdir / 'remote'}?fsync=false&create=true"
        self.model = ClientModel()
        self.outcome = ProcessOutcome(seed, 0)
        self.documented = _documented_names()
        self._crashes: list[threading.Thread] = []  # Simulation.apply joins these (none here)
        self._crash_errors: list[BaseException] = []
        self.ended = False
        self.down: str | None = None  # the node a fault took down or paused
        self.down_how: str | None = None  # kill | stop | pause
        self._resume: threading.Timer | None = None
        self.cut: str | None = None  # the active partition, as steps.log tells it
        self._cut_at = 0.0  # when it was cut (monotonic)
        self._heal_timer: threading.Timer | None = None
        self._heal_early = True  # whether recover heals the active partition at once (else it waits for the timer)
        self._waited = 0.0  # seconds the current step waited for a pause's or a partition's timer
        self._links = threading.Lock()  # the heal timer and recover() both heal: one at a time
        self.launcher = launcher
        if launcher == "embedded":  # the same roles, N of them in this process over the in-process transport
            self.procs: Any = Cluster(self.store_url, str(self.workdir / "nodes"), len(PROCESS_NODES),
                                      cluster_managers=0, names=list(PROCESS_NODES), recovery_delay=0.2,
                                      fault_detection=FaultDetectionSettings(FD_INTERVAL, FD_TIMEOUT, FD_RETRIES),
                                      translog_gc_grace=GC_GRACE, translog_gc_every=GC_EVERY)
        else:
            self.procs = self._linked_cluster(LinkedCluster)
        #: pauses and partitions: the embedded launcher's message rules, or the processes' signals and proxies
        self.faults: Any = self.procs.faults if launcher == "embedded" else self.procs
        try:
            self.client = self.procs.client(timeout=CLIENT_TIMEOUT)
            self.cluster: Any = self.client  # Simulation's write steps call self.cluster; the end restores into it
            self.cluster.wait_for_health("green", timeout=SETTLE_TIMEOUT)
            self.cluster.create_index(INDEX, shards=2, replicas=1)
            self.cluster.wait_for_health("green", timeout=SETTLE_TIMEOUT)
        except BaseException:
            self.procs.close()
            raise

    def _linked_cluster(self, linked: Any) -> Any:
        """The schedule's node processes; a start that lost a port picked for a node to another process on this
        host (``free_port`` checks, then the node binds: a CI run beside it can take the port between) starts
        afresh on new ports, up to 3 times: nothing of the schedule has run yet, so this is the harness's fault."""
        from shardstore.engine.launcher import NodeStartFailed

        for attempt in range(1, 4):
            try:
                return linked(str(self.workdir / "nodes"), self.store_url, len(PROCESS_NODES),
                              fd_interval=FD_INTERVAL, fd_timeout=FD_TIMEOUT, fd_retries=FD_RETRIES,
                              env={"SHARDSTORE_NODE_TRANSLOG_GC_GRACE": str(GC_GRACE),
                                   "SHARDSTORE_NODE_TRANSLOG_GC_EVERY": str(GC_EVERY)})
            except NodeStartFailed as exc:
                if "Address already in use" not in str(exc) or attempt == 3:
                    raise
                for name in ("nodes", "remote"):  # a fresh cluster: the half-started one may have bootstrapped
                    path = self.workdir / name
                    if path.exists():
                        path.rename(self.workdir / f"{name}.port-taken-{attempt}")
                (self.workdir / "nodes").mkdir(parents=True)
        raise AssertionError("unreachable")

    # -- judging --------------------------------------------------------------------------

    def apply(self, step: Step) -> None:
        """Execute one step (Simulation.apply), noted with the time in ``nodes/steps.log`` next to the node logs."""
        before = (self.outcome.acked, self.outcome.failed, len(self.outcome.violations), self.outcome.slow_steps)
        self._note(f"{step}")
        self._waited, t0 = 0.0, time.monotonic()
        super().apply(step)
        if self.outcome.slow_steps > before[3] and time.monotonic() - t0 - self._waited <= SLOW_STEP:
            self.outcome.slow_steps -= 1  # slow only while it waited for a timer (a recover), by design: no stall
        self._note(f"  done #{step.index}: +{self.outcome.acked - before[0]} acked, +{self.outcome.failed - before[1]} "
                   f"failed, +{len(self.outcome.violations) - before[2]} violations"
                   + (f" (down: {self.down} {self.down_how})" if self.down else "")
                   + (f" (cut: {self.cut})" if self.cut else ""))

    def _note(self, text: str) -> None:
        now = time.time()
        with open(self.workdir / "nodes" / "steps.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))},{int(now * 1000) % 1000:03d} {text}\n")

    def _error(self, step: Step, exc: BaseException) -> None:
        name = type(exc).__name__
        if isinstance(exc, ShardstoreError) and name in self.documented:
            self.outcome.errors[name] += 1
        else:
            self.outcome.violations.append(Violation("unclean", step.index, f"{name}: {exc}"))

    # -- writes and reads -----------------------------------------------------------------

    def _clients(self, parts: list[dict[str, str | None]], meanwhile: Any = None) -> list[Any]:
        """One client (its own connections) per part, bulk-writing it at once; ``meanwhile`` runs on this thread."""
        results: list[Any] = [None] * len(parts)
        clients = [self.procs.client(timeout=CLIENT_TIMEOUT) for _ in parts]

        def client(n: int) -> None:
            docs = [{"_id": i, "v": v} for i, v in parts[n].items()]
            try:
                results[n] = clients[n].bulk(INDEX, docs)
            except BaseException as exc:  # noqa: BLE001 - judged by the caller
                results[n] = exc

        threads = [threading.Thread(target=client, args=(n,), name=f"chaos-client-{n}") for n in range(len(parts))]
        try:
            for t in threads:
                t.start()
            if meanwhile is not None:
                meanwhile()
        finally:
            for t in threads:
                t.join()
            for c in clients:
                c.close()
        return results

    def _do_index_doc(self, step: Step) -> None:
        doc_id = step.args["id"]
        value = self._value(step, doc_id)
        stamp = self.model.last_stamp.get(doc_id) if step.args.get("cas") else None
        expect: dict[str, Any] = {} if stamp is None else {"if_seq_no": stamp[1], "if_primary_term": stamp[0]}
        self._guarded_write(step, {doc_id: value},
                            lambda: self.cluster.index_doc(INDEX, {"_id": doc_id, "v": value}, **expect))

    def _do_get(self, step: Step) -> None:
        for doc_id in step.args["ids"]:
            doc = self.cluster.get(INDEX, doc_id)
            value = None if doc is None else (doc.get("_source") or {}).get("v")
            v = self.model.check_read(step.index, doc_id, value)
            if v is not None:
                self.outcome.violations.append(v)

    def _do_verify(self, step: Step) -> None:
        """Mid-schedule, with the fault (if any) still active: yellow, then the whole index read and checked."""
        if self._health(step.index, "yellow", "verify"):
            self._check_read(step.index)

    # -- faults ---------------------------------------------------------------------------

    def _green_first(self, step: Step) -> bool:
        """One fault at a time: the node of the last one back (a minimised schedule may have lost its recover
        step), every node following the one manager, and the cluster green before the next; else *stuck*, and
        no fault.  (Green alone is not enough: two nodes hold both copies of both shards.)"""
        self.recover()
        return self._joined(step.index, "before a fault") and self._health(step.index, "green", "before a fault")

    def _masters(self) -> dict[str, str | None]:
        """The manager each node follows (``discovery.hello``; None: none, or no answer)."""
        out: dict[str, str | None] = {}
        for name in PROCESS_NODES:
            try:
                out[name] = self.procs.call(name, "discovery.hello", {}, timeout=2.0).get("master")
            except Exception:  # noqa: BLE001 - down or busy: not following anyone now
                out[name] = None
        return out

    def _joined(self, step: int, when: str) -> bool:
        """Wait until every node follows the same manager (a restarted node has joined); else *stuck*."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        masters = self._masters()
        while time.monotonic() < deadline:
            if None not in masters.values() and len(set(masters.values())) == 1:
                return True
            time.sleep(0.1)
            masters = self._masters()
        self._stuck(step, f"{when}: the nodes never agreed on one manager in {SETTLE_TIMEOUT:.0f}s: {masters}")
        return False

    def _health(self, step: int, status: str, when: str) -> bool:
        """Wait for ``status``; else *stuck* (with the causes the manager gives)."""
        try:
            self.cluster.wait_for_health(status, timeout=SETTLE_TIMEOUT)
            return True
        except ShardstoreError as exc:
            try:
                causes = " ".join(self.cluster.health().causes)
            except Exception as health_exc:  # noqa: BLE001 - no manager answers
                causes = f"health() failed: {health_exc!r}"
            self._stuck(step, f"{when}: {exc}; causes: {causes or 'none'}")
            return False

    def _stuck(self, step: int, text: str) -> None:
        """A *stuck* verdict; the first of a schedule has every live node write its threads' stacks to its log."""
        if not any(v.kind == "stuck" for v in self.outcome.violations):
            dump = getattr(self.procs, "dump_stacks", None)  # node processes only (SIGUSR1)
            if dump is not None:
                self._note(f"  stacks dumped to the logs of {dump()}")
        self.outcome.violations.append(Violation("stuck", step, text))

    def _manager(self) -> str | None:
        """The elected cluster manager, as the live nodes tell it (``discovery.hello``)."""
        deadline = time.monotonic() + FIND_MANAGER_TIMEOUT
        while time.monotonic() < deadline:
            for name in self.procs.live():
                try:
                    master = self.procs.call(name, "discovery.hello", {}, timeout=2.0).get("master")
                except Exception:  # noqa: BLE001 - that node does not answer now; ask another
                    continue
                if master in PROCESS_NODES:
                    return master
            time.sleep(0.1)
        return None

    def _fault(self, step: Step, how: str, node: str) -> None:
        """Signal ``node`` (``how``), with a client's bulk in flight when the step carries ``ids``."""
        def signal() -> None:
            if "ids" in step.args:
                threading.Event().wait(step.args["delay"])
            self._signal(step, how, node)

        self.outcome.faults += 1
        self.down, self.down_how = node, how
        if "ids" in step.args:
            parts: list[dict[str, str | None]] = [{i: self._value(step, i) for i in step.args["ids"]}]
            self._judge(step, parts, self._clients(parts, signal))
        else:
            signal()

    def _signal(self, step: Step, how: str, node: str) -> None:
        log.info("seed %d step %d: %s %s", self.seed, step.index, how, node)
        self._note(f"  signal: {how} {node}")
        if how == "kill":
            self.procs.kill(node)
        elif how == "pause":
            self.faults.pause(node)
            self._resume = threading.Timer(step.args["seconds"], self.faults.resume, [node])
            self._resume.start()
        elif how == "stop":
            try:
                status = self.procs.stop(node)
            except subprocess.TimeoutExpired:
                self.procs.kill(node)
                self.outcome.violations.append(Violation("unclean", step.index,
                                                         f"SIGTERM: {node} did not shut down in time; killed"))
                return
            if status != 0:
                self.outcome.violations.append(Violation("unclean", step.index,
                                                         f"SIGTERM: {node} exited with status {status}"))

    def _do_kill(self, step: Step) -> None:
        if self._green_first(step):
            self._fault(step, "kill", step.args["node"])

    def _do_stop(self, step: Step) -> None:
        if self._green_first(step):
            self._fault(step, "stop", step.args["node"])

    def _do_pause(self, step: Step) -> None:
        if self._green_first(step):
            self._fault(step, "pause", step.args["node"])

    def _manager_or_primary(self) -> str:
        """The elected manager's node; when no node names one, shard 0's primary's node instead."""
        node = self._manager()
        return node if node is not None else self.cluster.primary_of(INDEX, 0)

    def _do_kill_manager(self, step: Step) -> None:
        if not self._green_first(step):
            return
        self._fault(step, "kill", self._manager_or_primary())

    # -- partitions (issue 41) -----------------------------------------------------------

    def _partition(self, step: Step, what: str, cut: Callable[[], None]) -> None:
        """Cut links (``cut()``, described by ``what``) for ``seconds`` with a client's bulk in flight when the step
        carries ``ids``; a timer heals them while later steps run."""
        def apply() -> None:
            if "ids" in step.args:
                threading.Event().wait(step.args["delay"])
            log.info("seed %d step %d: cut %s", self.seed, step.index, what)
            self._note(f"  cut: {what} ({step.args['mode']}, {step.args['seconds']}s)")
            with self._links:
                self.cut, self._cut_at = what, time.monotonic()
                cut()
            self._heal_early = step.args.get("early", True)
            self._heal_timer = threading.Timer(step.args["seconds"], self._heal_links, ["timer"])
            self._heal_timer.daemon = True
            self._heal_timer.start()

        self.outcome.faults += 1
        if "ids" in step.args:
            parts: list[dict[str, str | None]] = [{i: self._value(step, i) for i in step.args["ids"]}]
            self._judge(step, parts, self._clients(parts, apply))
        else:
            apply()

    def _heal_links(self, why: str) -> None:
        """Heal every cut link (the timer, or recover early); nothing if no partition is active."""
        with self._links:
            if self.cut is None:
                return
            self.faults.heal()
            lasted = time.monotonic() - self._cut_at
            self.outcome.partitions.append(lasted)
            self._note(f"  healed: {self.cut} after {lasted:.1f}s ({why})")
            self.cut = None

    def _do_isolate(self, step: Step) -> None:
        if not self._green_first(step):
            return
        node = step.args["node"]
        if node == "primary":
            node = self.cluster.primary_of(INDEX, step.args["shard"])
        mode = step.args["mode"]
        self._partition(step, f"{node} isolated", lambda: self.faults.isolate(node, mode=mode))

    def _do_isolate_manager(self, step: Step) -> None:
        if not self._green_first(step):
            return
        node = self._manager_or_primary()
        mode = step.args["mode"]
        self._partition(step, f"manager {node} isolated", lambda: self.faults.isolate(node, mode=mode))

    def _do_bridge(self, step: Step) -> None:
        if not self._green_first(step):
            return
        a, c = (n for n in PROCESS_NODES if n != step.args["via"])
        mode = step.args["mode"]
        self._partition(step, f"{a}-{c} cut, bridged by {step.args['via']} (manager {self._manager()})",
                        lambda: self.faults.cut(a, c, mode=mode))

    def _do_one_way(self, step: Step) -> None:
        if not self._green_first(step):
            return
        src, dst = step.args["src"], step.args["dst"]
        mode = step.args["mode"]
        self._partition(step, f"{src}->{dst} cut one way (manager {self._manager()})",
                        lambda: self.faults.cut(src, dst, mode=mode, one_way=True))

    def _do_recover(self, step: Step) -> None:
        self.recover()

    def recover(self) -> None:
        """End the active fault: heal the partition (now if its step said ``early``, else when its timer does), or
        bring the node a fault took down back (SIGCONT, the paused one's timer, or a restart on its data dir)."""
        t0 = time.monotonic()
        if self._heal_timer is not None and not self._heal_early:
            self._heal_timer.join()
            self._heal_timer = None
        self.heal("recover")
        if self._resume is not None:
            self._resume.join()
            self._resume = None
        self._waited += time.monotonic() - t0
        node, how = self.down, self.down_how
        self.down = self.down_how = None
        if node is not None and how in ("kill", "stop") and node not in self.procs.live():
            self._note(f"  restart {node}")
            self.procs.restart(node)
        elif node is not None:
            self._note(f"  {node} resumed")

    # -- checks ---------------------------------------------------------------------------

    def heal(self, why: str = "heal") -> None:
        """Heal every cut link now, before its timer (recover also brings nodes back)."""
        if self._heal_timer is not None:
            self._heal_timer.cancel()
            self._heal_timer = None
        self._heal_links(why)

    def settle(self, step: int, status: str = "yellow") -> bool:
        """Every link healed now, every node up and joined, then ``status``, each within SETTLE_TIMEOUT; else
        *stuck*."""
        self.heal()
        self.recover()
        return self._joined(step, "settling") and self._health(step, status, "settling")

    def _writable(self, step: int) -> bool:
        """Every shard acknowledges a probe write within WRITABLE_TIMEOUT (judged by the model); else *stuck*."""
        probes = {s: next(f"probe{n}" for n in range(1000) if shard_id(f"probe{n}", SHARDS) == s)
                  for s in range(SHARDS)}
        deadline = time.monotonic() + WRITABLE_TIMEOUT
        probe = Step(step, "probe")  # judged as any write: acknowledged items pinned, the rest maybe applied
        attempt, errors = 0, []
        while probes:
            attempt += 1
            values: dict[str, str | None] = {i: f"{self.seed}:{step}.{attempt}:{i}" for i in probes.values()}
            try:
                result = self.cluster.bulk(INDEX, [{"_id": i, "v": v} for i, v in values.items()])
            except ShardstoreError as exc:
                self._judge(probe, [values], [exc])
                errors = [f"{type(exc).__name__}: {exc}"]
            else:
                self._write_result(probe, values, result)
                items = result.items.to_pylist()
                errors = [f"{row['_id']}: {row['error']}" for row in items if row["error"] is not None]
                acked = {row["_id"] for row in items if row["error"] is None}
                probes = {s: i for s, i in probes.items() if i not in acked}
            if probes and time.monotonic() >= deadline:
                self._stuck(step, f"after the final heal: shard(s) {sorted(probes)} green but took no write in "
                                  f"{WRITABLE_TIMEOUT:.0f}s ({attempt} attempts); last: {'; '.join(errors)}")
                return False
            if probes:
                time.sleep(0.5)
        self._note(f"  every shard writable ({attempt} attempt(s))")
        return True

    def _restore(self, step: int) -> None:
        """Kill every process, restore an embedded cluster from the store alone on a fresh data dir, check it."""
        from shardstore.engine import Cluster

        self.close_processes()
        self.outcome.restores += 1
        try:
            self.cluster = Cluster.restore(store=self.store_url, data_dir=str(self.workdir / "restored"), nodes=2,
                                           recovery_delay=0.05)
        except ShardstoreError as exc:
            self.outcome.violations.append(Violation("lost", step, f"restore refused: {exc}"))
            raise ScheduleEnded from exc
        try:
            self.cluster.wait_for_health("yellow", timeout=SETTLE_TIMEOUT)
        except ShardstoreError as exc:
            causes = " ".join(self.cluster.health().causes)
            self.outcome.violations.append(Violation("stuck", step, f"restored: {exc}; causes: {causes or 'none'}"))
            return
        self._check_read(step)

    def finish(self, last_step: int) -> None:
        """Final checks: the live cluster (healed, green, writable), then (whatever the live check found) a restore
        from the store alone."""
        for check in (self._final, self._restore):
            self._note(f"final check: {check.__name__}")
            try:
                check(last_step)
            except ScheduleEnded:
                return
            except Exception as exc:  # noqa: BLE001 - every failure of a final check is a violation
                self.outcome.violations.append(Violation("unclean" if not isinstance(exc, ShardstoreError)
                                                         else "stuck", last_step, f"{type(exc).__name__}: {exc}"))
        self._note(f"end: {len(self.outcome.violations)} violations")
        for v in self.outcome.violations:
            self._note(f"  {v}")

    def verify(self, step: int) -> None:
        """Settle, then read the whole index through the client and check it with the model."""
        if self.settle(step):
            self._check_read(step)

    def _final(self, step: int) -> None:
        """After the final heal: green, every shard writable, then the whole index read and checked."""
        if self.settle(step, "green") and self._writable(step):
            self._check_read(step)

    def _check_read(self, step: int) -> None:
        self.cluster.refresh(INDEX)
        rows = self.cluster.scan(INDEX, columns=["_id", "v"]).to_pylist()
        count = self.cluster.count(INDEX)
        gets = {}
        for doc_id in sorted(self.model.possible):
            doc = self.cluster.get(INDEX, doc_id)
            gets[doc_id] = None if doc is None else (doc.get("_source") or {}).get("v")
        self.outcome.violations.extend(self.model.check(step, rows, count, gets))

    def close_processes(self) -> None:
        """Drop the client, cancel a paused node's and a partition's timers, SIGKILL every node process and stop
        the proxies."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._heal_timer is not None:
            self._heal_timer.cancel()
            self._heal_timer = None
        try:
            self.client.close()
        except Exception as exc:  # noqa: BLE001 - closing must not hide the outcome
            log.warning("closing the client: %r", exc)
        self.procs.close()

    def close(self) -> None:
        """Stop everything (the store, data dirs and node logs stay for inspection)."""
        self.close_processes()
        if self.cluster is not self.client:  # the restored embedded cluster
            try:
                self.cluster.close()
            except Exception as exc:  # noqa: BLE001 - closing after a failure must not hide the outcome
                log.warning("closing the restored cluster: %r", exc)


def run_process_schedule(seed: int, steps: Sequence[Step], workdir: Path, keep: bool = False,
                         logs_to: Path | None = None, launcher: str = "processes") -> Outcome:
    """Run ``steps`` (drawn from ``seed``) against fresh node processes under ``workdir``; the outcome.

    A failing schedule's node logs (and a stalled one's: a step over SLOW_STEP seconds) are copied to
    ``logs_to / f"seed-{seed}"`` when given, with ``steps.log``, the steps' timeline.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    embedded_log = None
    if launcher == "embedded":  # the roles log through this process: into nodes/embedded.log, as a node's log
        (workdir / "nodes").mkdir(parents=True, exist_ok=True)
        embedded_log = logging.FileHandler(workdir / "nodes" / "embedded.log")
        embedded_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger("shardstore").addHandler(embedded_log)
        level = logging.getLogger("shardstore").level
        logging.getLogger("shardstore").setLevel(logging.INFO)
    sim = ProcessSimulation(seed, workdir, launcher)
    try:
        for step in steps:
            sim.apply(step)
            if sim.ended:
                break
        else:
            sim.finish(steps[-1].index + 1 if steps else 0)
    finally:
        sim.close()
        if embedded_log is not None:
            logging.getLogger("shardstore").removeHandler(embedded_log)
            logging.getLogger("shardstore").setLevel(level)
            embedded_log.close()
        sim.outcome.seconds = time.monotonic() - t0
        if logs_to is not None and (not sim.outcome.clean or sim.outcome.slow_steps):
            dest = Path(logs_to) / f"seed-{seed}"
            dest.mkdir(parents=True, exist_ok=True)
            for f in (workdir / "nodes").glob("*.log"):
                shutil.copy(f, dest / f.name)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return sim.outcome


def minimise_process(seed: int, steps: list[Step], workdir: Path, budget: int = 20,
                     launcher: str = "processes") -> list[Step]:
    """A shorter schedule that still fails (any violation): chunks removed while it keeps failing, ``budget`` runs.

    Process mode is not deterministic (real processes, real timing): a failure that does not recur keeps the
    chunk, so the result may be longer than needed, never one that did not fail at least once.
    """
    current = list(steps)
    chunk = max(1, len(current) // 2)
    runs = 0
    while chunk >= 1 and runs < budget:
        i, removed = 0, False
        while i < len(current) and runs < budget:
            candidate = current[:i] + current[i + chunk:]
            runs += 1
            if candidate and not run_process_schedule(seed, candidate, Path(workdir) / f"min-{runs}",
                                                                 launcher=launcher).clean:
                current, removed = candidate, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return current


def run_process_seed(seed: int, length: int, workdir: Path, logs_to: Path | None = None,
                     launcher: str = "processes") -> Outcome:
    """Draw ``seed``'s process-mode schedule of ``length`` steps and run it on ``launcher``'s nodes."""
    return run_process_schedule(seed, draw_process_schedule(seed, length), workdir, logs_to=logs_to,
                                launcher=launcher)


__all__ = ["FD_SECONDS", "LAUNCHERS", "ProcessOutcome", "ProcessSimulation", "minimise_process", "run_process_schedule",
           "run_process_seed"]
