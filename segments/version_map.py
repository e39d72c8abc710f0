"""The version map of a shard's buffered (unrefreshed) operations: one dict lookup per id.

Elasticsearch keeps a *LiveVersionMap* beside its indexing buffer so that a write finds an
id's current version without searching; this is ours.  Per id, the buffered operation with
the highest seq# (index or delete, in any order of arrival: a replica may apply an older
operation after a newer one) is kept as one entry.  A refresh starts a new, empty map (the
buffer's operations are then in segments, found through their fingerprint index).

Why a dict and not a columnar match: the map is updated once per applied batch (one
``to_pylist`` per column and a loop in C-level dict calls), while a lookup over the buffered
Arrow tables concatenated them on every write, a cost growing with every bulk since the last
refresh (issue 30: 0.33 ms of the ~1 ms a primary spent per shard of a 100-shard bulk).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import NamedTuple

import numpy as np
import pyarrow as pa


class BufferedOp(NamedTuple):
    """An id's newest buffered operation: its seq#, term, version (None for a delete) and where its row is."""

    seq_no: int
    primary_term: int | None
    version: int | None  # None: the newest buffered operation deletes the id
    entry: int  # index of its table in the buffer's docs (-1 for a delete)
    row: int


#: What a lookup returns per id (nulls: absent or deleted).
VERSIONS_SCHEMA = pa.schema([pa.field("_seq_no", pa.int64()), pa.field("_primary_term", pa.int64()),
                             pa.field("_version", pa.int64())])

_ABSENT = (None, None, None)


class VersionMap:
    """id -> :class:`BufferedOp` of the highest seq# buffered for it (one per shard buffer)."""

    def __init__(self) -> None:
        self._ops: dict[str, tuple] = {}  # id -> the fields of a BufferedOp (plain tuples: cheaper to build)
        #: no operation taken in has a lower seq# (it may have been replaced since: a lower bound)
        self.min_seq_no = 2**63 - 1
        self.max_seq_no = -(2**63)

    def __len__(self) -> int:
        return len(self._ops)

    def add_docs(self, entry: int, ids: pa.Array, seq_nos: pa.Array, terms: pa.Array, versions: pa.Array) -> None:
        """Take in a buffered table of index operations (``entry``: its index in the buffer's docs)."""
        self._add(ids, seq_nos, terms.to_pylist(), versions.to_pylist(), entry)

    def add_run(self, entry: int, ids: list[str], first_seq_no: int, primary_term: int, versions: list[int]) -> None:
        """Take in a primary's run of index operations: ``ids`` with the seq#s ``first_seq_no``.. in order, one term
        (the columnar staging of a node's parts, engine/staging.py: no Arrow column read back)."""
        n = len(ids)
        if n:
            rows = zip(range(first_seq_no, first_seq_no + n), repeat(primary_term), versions, repeat(entry), range(n))
            self._take(ids, rows, first_seq_no, first_seq_no + n - 1, ascending=True)

    def add_deletes(self, ids: pa.Array, seq_nos: pa.Array) -> None:
        """Take in buffered delete operations."""
        self._add(ids, seq_nos, repeat(None), repeat(None), -1)

    def _add(self, ids: pa.Array, seq_nos: pa.Array, terms: Iterable, versions: Iterable, entry: int) -> None:
        n = len(ids)
        if not n:
            return
        seq_np = np.asarray(seq_nos.to_numpy() if isinstance(seq_nos, pa.ChunkedArray)
                            else seq_nos.to_numpy(zero_copy_only=False), dtype=np.int64)
        keys, seqs = ids.to_pylist(), seq_np.tolist()
        low, high = int(seq_np.min()), int(seq_np.max())
        rows = zip(seqs, terms, versions, repeat(entry), range(n))
        self._take(keys, rows, low, high, ascending=n == 1 or bool((seq_np[1:] > seq_np[:-1]).all()))

    def _take(self, keys: Iterable[str], rows: Iterable[tuple], low: int, high: int, *, ascending: bool) -> None:
        """Enter ``rows`` (seq# first) for ``keys``; their seq#s span ``low``..``high``."""
        if ascending and low > self.max_seq_no:
            # a primary's batch: newer than every entry, and a later row newer than an earlier one
            self._ops.update(zip(keys, rows))
        else:  # a replica or a replay may apply out of order: the highest seq# wins
            ops, get = self._ops, self._ops.get
            for doc_id, op in zip(keys, rows):
                old = get(doc_id)
                if old is None or op[0] > old[0]:
                    ops[doc_id] = op
        self.min_seq_no = min(self.min_seq_no, low)
        self.max_seq_no = max(self.max_seq_no, high)

    def get(self, doc_id: str) -> BufferedOp | None:
        """The newest buffered operation on ``doc_id``, or None."""
        op = self._ops.get(doc_id)
        return None if op is None else BufferedOp(*op)

    def lookup(self, ids: list) -> pa.Table:
        """Per id (order kept): seq#, term, version of its newest buffered index operation (nulls: none
        buffered, or a delete is newest), as :data:`VERSIONS_SCHEMA`."""
        get = self._ops.get
        rows = [_live(get(i)) for i in ids]
        cols = list(zip(*rows)) if rows else [(), (), ()]
        return pa.table([pa.array(c, pa.int64()) for c in cols], schema=VERSIONS_SCHEMA)

    def versions(self, ids: list) -> list[int]:
        """Per id (order kept): the version of its newest buffered index operation, 0 when there is none or a
        delete is newest (what the next version counts from)."""
        get = self._ops.get
        return [(op[2] or 0) if (op := get(i)) is not None else 0 for i in ids]

    def candidates(self, uniq: list) -> tuple[list[int], list[int], list[int | None], list[int | None], list[bool]]:
        """For the columnar merge with segment copies: (query position, seq#, term, version, deleted) per id
        of ``uniq`` that has a buffered operation."""
        q, seq, term, version, deleted = [], [], [], [], []
        get = self._ops.get
        for pos, doc_id in enumerate(uniq):
            op = get(doc_id)
            if op is None:
                continue
            q.append(pos)
            seq.append(op[0])
            term.append(op[1])
            version.append(op[2])
            deleted.append(op[2] is None)
        return q, seq, term, version, deleted


def _live(op: tuple | None) -> tuple[int | None, int | None, int | None]:
    if op is None or op[2] is None:
        return _ABSENT
    return op[:3]


__all__ = ["VERSIONS_SCHEMA", "BufferedOp", "VersionMap"]
