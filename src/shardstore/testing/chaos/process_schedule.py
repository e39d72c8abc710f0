"""Seeded fault schedules for nodes as real processes (issue 29): pure, no I/O.

The process-mode counterpart of :mod:`.schedule` (whose draws are left as they are): a list
of :class:`~shardstore.testing.chaos.schedule.Step` drawn from a seed, run by
:mod:`.process_runner` against three ``shardstore node`` processes (``n1``..``n3``, each
data and cluster-manager-eligible) over the local file store, one index of 2 shards and
1 replica.

Kinds (weights in :data:`PROCESS_WEIGHTS`):

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
``recover``         restart the node a fault took down, on its data directory (or wait for the
                    paused one's SIGCONT)
==================  ==========================================================================

A fault step may carry ``ids`` and ``delay``: a client's bulk of ``ids`` is in flight when
the signal is sent, ``delay`` seconds after it started.  At most one node is down or paused
at a time (the guarantee is for any single fault): no fault is drawn while one is active,
and ``recover`` is drawn only then; the runner also waits for green before each fault.
"""

from __future__ import annotations

import random
from typing import Any

from shardstore.testing.chaos.schedule import KEYSPACE, Step

#: the node processes' names (ProcessCluster)
PROCESS_NODES = ("n1", "n2", "n3")
#: the faults: one node down or paused at a time
FAULTS = ("kill", "kill_manager", "stop", "pause")
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


def _doc_id(rng: random.Random) -> str:
    return f"d{rng.randrange(KEYSPACE)}"


def _ids(rng: random.Random, low: int, high: int) -> list[str]:
    return sorted({_doc_id(rng) for _ in range(rng.randint(low, high))})


def draw_process_step(rng: random.Random, index: int, fault_active: bool) -> Step:
    """One step drawn from ``rng``; no fault while ``fault_active``, and ``recover`` only then."""
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
    elif kind in FAULTS:
        if kind != "kill_manager":
            args["node"] = rng.choice(PROCESS_NODES)
        if kind == "pause":
            args["seconds"] = rng.choice(PAUSE_SECONDS)
        if rng.random() < 0.5:  # a bulk in flight when the signal lands
            args["ids"] = _ids(rng, 2, 8)
            args["delay"] = rng.choice(FAULT_DELAYS)
    return Step(index, kind, args)


def draw_process_schedule(seed: int, length: int) -> list[Step]:
    """The process-mode schedule of ``seed``: ``length`` steps, the same ones every time."""
    rng = random.Random(seed)
    out: list[Step] = []
    active = False
    for i in range(length):
        step = draw_process_step(rng, i, active)
        if step.kind in FAULTS:
            active = True
        elif step.kind == "recover":
            active = False
        out.append(step)
    return out


__all__ = ["FAULTS", "PAUSE_SECONDS", "PROCESS_NODES", "PROCESS_WEIGHTS", "draw_process_schedule",
           "draw_process_step"]
