"""Seeded fault schedules for nodes as real processes (issue 29): pure, no I/O.

The process-mode counterpart of :mod:`.schedule` (whose draws are left as they are): a list
of :class:`~shardstore.testing.chaos.schedule.Step` drawn from a seed, run by
:mod:`.process_runner` against three ``shardstore node`` processes (``n1``..``n3``, each
data and cluster-manager-eligible) over the local file store, one index of 2 shards and
1 replica.

Kinds (weights in :data:`PROCESS_WEIGHTS`, the partitions' in :data:`PARTITION_WEIGHTS`):

==================  ==========================================================================
``bulk``            index ``ids`` with fresh unique values
``concurrent``      two clients bulk-write disjoint ids (``a``, ``b``) at once
``delete``          delete one id
``index_doc``       index one id (``cas``: with ``if_seq_no``/``if_primary_term`` of its last ack)
``get``             realtime ``get`` of ``ids``: each value must be one the model allows
``refresh``         refresh the index
``flush``           flush the index
``verify``          wait for yellow, read the whole index, check it with the model
``kill``            SIGKILL ``node``
``kill_manager``    SIGKILL the elected cluster manager's node (found when the step runs)
``stop``            SIGTERM ``node`` (a clean shutdown: flush, leave, exit 0)
``pause``           SIGSTOP ``node``; SIGCONT after ``seconds`` (a timer: steps run meanwhile)
``isolate``         cut ``node`` off from both others (issue 41); ``node="primary"``: the node of
                    shard ``shard``'s primary, found when the step runs
``isolate_manager`` cut the elected cluster manager off from both others (found when the step runs)
``bridge``          cut the two nodes other than ``via`` apart; both still reach ``via``
``one_way``         cut one direction of one link: ``src``'s calls to ``dst`` are lost (``dst``'s
                    calls to ``src`` still go through)
``recover``         restart the node a fault took down, on its data directory (or wait for the
                    paused one's SIGCONT), or end the partition (see below)
==================  ==========================================================================

A fault step may carry ``ids`` and ``delay``: a client's bulk of ``ids`` is in flight when
the signal is sent (or the links are cut), ``delay`` seconds after it started.  At most one
fault is active at a time (the guarantee is for any single fault): no fault is drawn while
one is active, and ``recover`` is drawn only then; the runner also waits for green before
each fault.

The partition kinds (:data:`PARTITIONS`, :class:`~shardstore.testing.partitions.LinkedCluster`:
a fault proxy per directed link) carry ``mode`` (``"blackhole"``: bytes dropped, calls time
out; ``"down"``: connections reset, new ones refused) and ``seconds``: the links heal on a
timer after that long while later steps run.  A ``recover`` heals them at once when the
partition step says ``early`` (drawn with the chance :data:`PARTITION_EARLY_HEAL`), else
it waits for the timer, as for a pause: steps take milliseconds while nothing waits on the
cut, so a partition that any ``recover`` healed at once would rarely outlast fault detection
(a node is declared failed after ~4.5 s), which most of :data:`PARTITION_SECONDS` do.

Partition steps come from a second random stream of the seed (:func:`draw_process_schedule`):
at a step with no fault active it decides, with the share :data:`PARTITION_WEIGHTS` would
have among :data:`PROCESS_WEIGHTS`, whether the step is a partition; otherwise the step is
drawn from the first stream exactly as before issue 41.  A seed's schedule is therefore the
one it drew before, up to its first partition step (later steps differ: a fault is active
there, so the first stream draws with ``recover`` weights).
"""

from __future__ import annotations

import random
from typing import Any

from shardstore.testing.chaos.schedule import KEYSPACE, Step

#: the node processes' names (ProcessCluster)
PROCESS_NODES = ("n1", "n2", "n3")
#: the faults that signal a node process (issue 29)
SIGNAL_FAULTS = ("kill", "kill_manager", "stop", "pause")
#: the network partitions between node processes (issue 41)
PARTITIONS = ("isolate", "isolate_manager", "bridge", "one_way")
#: every fault: one active at a time
FAULTS = SIGNAL_FAULTS + PARTITIONS
PROCESS_WEIGHTS: dict[str, int] = {
    "bulk": 30, "concurrent": 6, "delete": 6, "index_doc": 6, "get": 5, "refresh": 4, "flush": 4, "verify": 2,
    "kill": 4, "kill_manager": 3, "stop": 3, "pause": 4,
}
#: the weight of ``recover`` while a fault is active (it replaces the faults' weights)
RECOVER_WEIGHT = 14
#: how long a pause lasts: under, around and over the default fault detection (3 x (0.5 + 1.0) s)
PAUSE_SECONDS = (0.5, 2.0, 5.0, 8.0)
#: how long after a client's bulk started a fault's signal is sent
FAULT_DELAYS = (0.0, 0.02, 0.1, 0.3)
#: the partition kinds' weights, next to PROCESS_WEIGHTS (drawn from their own stream: see the module docstring)
PARTITION_WEIGHTS: dict[str, int] = {"isolate": 3, "isolate_manager": 3, "bridge": 2, "one_way": 2}
#: how a partition cuts its links (shardstore.testing.partitions.CUT_MODES)
CUT_MODES = ("blackhole", "down")
#: how long a partition lasts: under and well over the default fault detection (~4.5 s)
PARTITION_SECONDS = (2.0, 6.0, 12.0)
#: the chance that a partition's ``recover`` heals it at once (``early``) rather than waiting for its timer
PARTITION_EARLY_HEAL = 0.25
#: the chance that a step with no fault active is a partition: their weights' share of all the weights
PARTITION_SHARE = sum(PARTITION_WEIGHTS.values()) / (sum(PROCESS_WEIGHTS.values()) + sum(PARTITION_WEIGHTS.values()))


def _doc_id(rng: random.Random) -> str:
    return f"d{rng.randrange(KEYSPACE)}"


def _ids(rng: random.Random, low: int, high: int) -> list[str]:
    return sorted({_doc_id(rng) for _ in range(rng.randint(low, high))})


def _in_flight(rng: random.Random, args: dict[str, Any]) -> None:
    """Half the faults land while a client's bulk is in flight."""
    if rng.random() < 0.5:
        args["ids"] = _ids(rng, 2, 8)
        args["delay"] = rng.choice(FAULT_DELAYS)


def draw_partition_step(rng: random.Random, index: int) -> Step:
    """One partition step (a kind of :data:`PARTITIONS`) drawn from ``rng``."""
    kinds = list(PARTITION_WEIGHTS)
    kind = rng.choices(kinds, weights=[PARTITION_WEIGHTS[k] for k in kinds])[0]
    args: dict[str, Any] = {}
    if kind == "isolate":
        args["node"] = rng.choice((*PROCESS_NODES, "primary"))
        if args["node"] == "primary":
            args["shard"] = rng.randrange(2)
    elif kind == "bridge":
        args["via"] = rng.choice(PROCESS_NODES)
    elif kind == "one_way":
        args["src"], args["dst"] = rng.sample(PROCESS_NODES, 2)
    args["mode"] = rng.choice(CUT_MODES)
    args["seconds"] = rng.choice(PARTITION_SECONDS)
    args["early"] = rng.random() < PARTITION_EARLY_HEAL
    _in_flight(rng, args)
    return Step(index, kind, args)


def draw_process_step(rng: random.Random, index: int, fault_active: bool,
                      partitions: random.Random | None = None) -> Step:
    """One step drawn from ``rng``; no fault while ``fault_active``, and ``recover`` only then.

    With ``partitions`` (the second stream) and no fault active, the step is a partition with the
    chance :data:`PARTITION_SHARE`, drawn from that stream; ``rng`` is not used then.
    """
    if partitions is not None and not fault_active and partitions.random() < PARTITION_SHARE:
        return draw_partition_step(partitions, index)
    weights = {k: w for k, w in PROCESS_WEIGHTS.items() if not (fault_active and k in FAULTS)}
    if fault_active:
        weights["recover"] = RECOVER_WEIGHT
    kinds = list(weights)
    kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
    args: dict[str, Any] = {}
    if kind == "bulk":
        args["ids"] = _ids(rng, 1, 8)
    elif kind == "concurrent":
        ids = rng.sample(range(KEYSPACE), rng.randint(2, 10))
        half = rng.randint(1, len(ids) - 1)
        args["a"] = sorted(f"d{i}" for i in ids[:half])
        args["b"] = sorted(f"d{i}" for i in ids[half:])
    elif kind == "delete":
        args["id"] = _doc_id(rng)
    elif kind == "index_doc":
        args["id"] = _doc_id(rng)
        args["cas"] = rng.random() < 0.3
    elif kind == "get":
        args["ids"] = _ids(rng, 1, 4)
    elif kind in SIGNAL_FAULTS:
        if kind != "kill_manager":
            args["node"] = rng.choice(PROCESS_NODES)
        if kind == "pause":
            args["seconds"] = rng.choice(PAUSE_SECONDS)
        _in_flight(rng, args)  # a bulk in flight when the signal lands
    return Step(index, kind, args)


def draw_process_schedule(seed: int, length: int) -> list[Step]:
    """The process-mode schedule of ``seed``: ``length`` steps, the same ones every time."""
    rng = random.Random(seed)
    partitions = random.Random(f"{seed}/partitions")  # str seeds are hashed with SHA-512: stable across runs
    out: list[Step] = []
    active = False
    for i in range(length):
        step = draw_process_step(rng, i, active, partitions)
        if step.kind in FAULTS:
            active = True
        elif step.kind == "recover":
            active = False
        out.append(step)
    return out


__all__ = ["CUT_MODES", "FAULTS", "PARTITIONS", "PARTITION_EARLY_HEAL", "PARTITION_SECONDS", "PARTITION_WEIGHTS", "PAUSE_SECONDS",
           "PROCESS_NODES", "PROCESS_WEIGHTS", "SIGNAL_FAULTS", "draw_partition_step", "draw_process_schedule",
           "draw_process_step"]
