"""The writes a shard copy applied, by request id: a retried write gets its first attempt's outcome (issue 45).

A client names every write ``writer:sequence`` (its own id and a counter, as Kafka's idempotent
producer).  When the answer of a write is lost (its coordinator or its primary died, a link was
cut) the client and the coordinator send it again with the same id; whichever primary receives
it, the old one or a replica promoted since, looks the id up here before it stamps anything:

- found: the operations were applied once already; the copy answers with their seq#s, terms and
  versions (once they are durable here and on every in-sync copy: see
  ``engine/coordinator/bulk_parts.py``, :func:`~shardstore.engine.coordinator.bulk_parts.apply_one`),
  and applies nothing;
- not found: the first attempt never reached this copy's history (a promoted replica that did
  not receive it lost it with the old primary's history, where resync rolled it away), so
  applying it now applies it once.

The primary records an id when it stages the batch; each replica when it applies the batch the
primary sent with the id.  What the ledger keeps and for how long:

- the last :data:`CAPACITY` request ids per copy (memory only: about 100 bytes each plus the
  answer's three int64 columns), oldest dropped first;
- across a failover of the primary to an in-sync replica that received the write, and across a
  lost answer to a live primary: yes;
- across a restart of the node, a peer recovery (the new replica starts with an empty ledger)
  or a restore from the store: no.  A retry that arrives after one of those may be applied a
  second time (docs/design/engine.md, "Writes retried exactly once").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.engine.shard.adopted_ops import has_adopted, run_summary

#: request ids a copy remembers (the oldest is forgotten first)
CAPACITY = 20_000


@dataclass(frozen=True)
class Applied:
    """A request's first attempt on this copy: its answer (seq#, term, version per item), its highest seq#, and the
    pending upload of the primary that staged it (None on a replica: applied only once durable)."""

    reply: Any  # the (seq#, term, version) columns; an adopted run's summary dict
    max_seq_no: int
    pending: Any = None


class RequestLedger:
    """Request id -> :class:`Applied`, bounded to ``capacity`` entries (thread-safe)."""

    def __init__(self, capacity: int = CAPACITY) -> None:  # noqa: D107
        if capacity < 1:
            raise ValueError(f"a request ledger holds at least one request, not {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, Applied] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, request: str | None) -> Applied | None:
        """The first attempt of ``request`` on this copy, or None (never applied here, forgotten, or no id)."""
        if not request:
            return None
        with self._lock:
            return self._entries.get(request)

    def record(self, request: str | None, stamped: pa.RecordBatch, pending: Any = None) -> None:
        """Remember that ``request`` applied ``stamped`` (its seq#, term and version columns are kept; of an adopted
        run, its summary: engine/shard/adopted_ops.py ``run_summary``)."""
        if not request or stamped.num_rows == 0:
            return
        max_seq_no = int(pc.max(stamped.column("seq_no")).as_py())
        reply: Any = run_summary(stamped) if has_adopted(stamped) else stamped.select(["seq_no", "primary_term",
                                                                                          "version"])
        with self._lock:
            self._entries[request] = Applied(reply, max_seq_no, pending)
            self._entries.move_to_end(request)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
