"""Seeded fault schedules for the engine simulator (issue 14): pure, no I/O.

A schedule is a list of :class:`Step` drawn from a seed with :class:`random.Random`; the same
seed and length always give the same steps, so any failure replays from ``(seed, step)``.
Each step is frozen data (its kind and arguments, every random choice already made), so a
schedule can be shortened (minimised) and replayed step by step.

Kinds (weights in :data:`WEIGHTS`):

========================  ==================================================================
``bulk``                  index ``ids`` with fresh unique values
``delete``                delete one id
``conditional``           index one id with ``if_seq_no``/``if_primary_term`` of its last ack
``refresh`` / ``flush``   on the index
``kill`` / ``start``      a data node (``wipe``: its disk too)
``kill_manager``/...      a cluster-manager node
``drop``                  the transport loses the next matching request or response
``store_fault``           the blob store fails / loses the reply of / loses the request of
                          the next matching operation (FaultyStore: error, throttle,
                          crash after landing, crash before landing) or delays it
``heal``                  clear transport and store faults
``restore``               close the cluster, restore a new one from the store alone
``corrupt``               behind the cluster's back, flip a byte of, truncate or delete one
                          blob of a chosen kind (``part``), the ``pick``-th in key order; a
                          schedule's first corrupt step is its one data-destroying fault,
                          later ones are skipped (the bar is *any single fault*)
``concurrent``            two client threads write disjoint ids at once
``kill_coordinator``      the coordinator (the ``Cluster`` object) dies while a client's bulk is
                          in flight (``close`` racing it after ``delay`` seconds); then a
                          restore from the store alone
``partition``             isolate a data node from every other node until healed
``delay``                 the transport delays matching requests or responses
``kill_at_send``          the next matching send starts killing its target node, racing the
                          message (a crash anywhere in the handler, not only before it)
``disk_fault``            a data node's next matching local write or fsync (translog or
                          segment files) fails: disk full, EIO, a torn write, or a crash
                          (the node is killed right there, inside the running step)
``ingest``                ``ids`` written as a Spark job commits into a live cluster (issue 43):
                          staged as a Parquet file, a job record, ``Client.ingest`` retried by
                          job id (``spark/live_sink.commit_live``), no Spark started
========================  ==================================================================

``ingest`` steps are not drawn by weight: :func:`draw_schedule` turns :data:`INGEST_SHARE` of the
``bulk`` steps into them with a random stream of their own, so every other step of a seed is
the one it drew before issue 43.

A ``store_fault`` with action ``stale_list`` answers the next matching LIST as it was
``after + 1`` mutations ago (FaultyStore).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DATA_NODES = ("node-0", "node-1", "node-2")
MANAGERS = ("cm-0", "cm-1", "cm-2")
#: the ids a schedule writes (small, so ids are overwritten, deleted and written again)
KEYSPACE = 24
WEIGHTS: dict[str, int] = {
    "bulk": 30, "delete": 6, "conditional": 6, "refresh": 5, "flush": 6,
    "kill": 5, "start": 7, "kill_manager": 2, "start_manager": 3,
    "drop": 5, "store_fault": 8, "heal": 5, "restore": 2, "corrupt": 1, "concurrent": 4,
    "disk_fault": 4, "partition": 2, "delay": 3, "kill_at_send": 2,
    "kill_coordinator": 1,
}
#: blob-store operations and key patterns a store fault may hit
STORE_OPS = ("put", "get", "list", "delete")
#: (the translog patterns take the node-level translog's round index and data blobs too, issue 30: the strings
#: changed in place, so every seed draws the same schedule as before)
STORE_KEYS = ("*translog*/[mi]*", "*translog*/data/*", "*segments/metadata*", "*segments/data*",
              "*primary_terms*", "*cluster-state*", "*")
STORE_ACTIONS = ("fail", "crash_after", "crash_before", "delay", "stale_list")
#: the blob kinds a corrupt step may hit (a fragment of their keys) and what it does to one
CORRUPT_PARTS = ("/segments/data/", "/segments/metadata/", "/translog/data/", "/translog/metadata/",
                 "/primary_terms/", "/cluster-state/manifest/", "/cluster-state/")
CORRUPT_HOW = ("flip", "truncate", "delete")


def corrupt_target(part: str, key: str) -> bool:
    """Whether a corrupt step of ``part`` may hit ``key``: "/translog/data/" and "/translog/metadata/" take a
    node-level translog round's data and index blob too (issue 30)."""
    if part == "/cluster-state/":
        return part in key and "/manifest/" not in key
    if "/node_translog/" in key:
        return (part == "/translog/data/" and "/data/" in key) or (part == "/translog/metadata/" and "/index/" in key)
    return part in key
DISK_ACTIONS = ("enospc", "eio", "torn", "crash")
DISK_PARTS = ("translog", "index")
#: "shard.bulk*": a single write (shard.bulk) and a bulk grouped per node (shard.bulk_many) alike
TRANSPORT_ACTIONS = ("shard.bulk*", "shard.replicate", "*")


@dataclass(frozen=True)
class Step:
    """One action of a schedule, every random choice made."""

    index: int  # its position in the original schedule (kept through minimisation)
    kind: str
    args: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __str__(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.args.items())
        return f"#{self.index} {self.kind}" + (f" {args}" if args else "")


def _doc_id(rng: random.Random) -> str:
    return f"d{rng.randrange(KEYSPACE)}"


def draw_step(rng: random.Random, index: int) -> Step:
    """One step drawn from ``rng`` (see :data:`WEIGHTS`)."""
    kinds = list(WEIGHTS)
    kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
    args: dict[str, Any] = {}
    if kind == "bulk":
        args["ids"] = sorted({_doc_id(rng) for _ in range(rng.randint(1, 8))})
    elif kind == "concurrent":
        ids = rng.sample(range(KEYSPACE), rng.randint(2, 10))
        half = rng.randint(1, len(ids) - 1)
        args["a"] = sorted(f"d{i}" for i in ids[:half])
        args["b"] = sorted(f"d{i}" for i in ids[half:])
    elif kind == "kill_coordinator":
        args["ids"] = sorted({_doc_id(rng) for _ in range(rng.randint(2, 8))})
        args["delay"] = rng.choice((0.0, 0.002, 0.01, 0.03))
    elif kind == "partition":
        args["node"] = rng.choice(DATA_NODES)
    elif kind == "delay":
        args["action"] = rng.choice(TRANSPORT_ACTIONS)
        args["direction"] = rng.choice(("request", "response"))
        args["seconds"] = rng.choice((0.01, 0.05, 0.2))
        args["times"] = rng.randint(1, 5)
    elif kind == "kill_at_send":
        args["action"] = rng.choice(("shard.bulk*", "shard.replicate"))
        args["after"] = rng.randrange(3)
    elif kind == "disk_fault":
        args["node"] = rng.choice(DATA_NODES)
        args["part"] = rng.choice(DISK_PARTS)
        args["op"] = rng.choice(("write", "write", "fsync"))
        args["action"] = rng.choice(DISK_ACTIONS)
        args["after"] = rng.randrange(4)
        args["times"] = rng.choice((1, 1, 2))
    elif kind == "corrupt":
        args["part"] = rng.choice(CORRUPT_PARTS)
        args["pick"] = rng.randrange(1000)
        args["how"] = rng.choice(CORRUPT_HOW)
    elif kind in ("delete", "conditional"):
        args["id"] = _doc_id(rng)
    elif kind in ("kill", "start"):
        args["node"] = rng.choice(DATA_NODES)
        if kind == "kill":
            args["wipe"] = rng.random() < 0.3
    elif kind in ("kill_manager", "start_manager"):
        args["node"] = rng.choice(MANAGERS)
    elif kind == "drop":
        args["action"] = rng.choice(TRANSPORT_ACTIONS)
        args["direction"] = rng.choice(("request", "response"))
        args["after"] = rng.randrange(3)
    elif kind == "store_fault":
        args["op"] = rng.choice(STORE_OPS)
        args["key"] = rng.choice(STORE_KEYS)
        args["action"] = rng.choice(STORE_ACTIONS)
        if args["action"] == "stale_list":
            args["op"] = "list"
        args["after"] = rng.randrange(4)
        args["times"] = rng.choice((1, 1, 2, 3))
    return Step(index, kind, args)


#: the share of ``bulk`` steps written through the Spark sink's commit path instead (module docstring)
INGEST_SHARE = 0.25


def draw_schedule(seed: int, length: int) -> list[Step]:
    """The schedule of ``seed``: ``length`` steps, the same ones every time."""
    rng = random.Random(seed)
    steps = [draw_step(rng, i) for i in range(length)]
    pick = random.Random(f"ingest-{seed}")  # a stream of its own: the other steps stay as drawn before
    return [Step(s.index, "ingest", s.args) if s.kind == "bulk" and pick.random() < INGEST_SHARE else s
            for s in steps]


__all__ = ["INGEST_SHARE", "CORRUPT_HOW", "CORRUPT_PARTS", "corrupt_target", "DATA_NODES", "KEYSPACE", "MANAGERS", "STORE_ACTIONS", "Step", "WEIGHTS", "draw_schedule", "draw_step"]
