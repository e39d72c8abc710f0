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

A batch of at least :data:`RUN_ROWS` operations is not put in the dict: it is kept as a
*run* (its columns, as given), looked up through a hash index built on the first lookup
that reaches it (:class:`~shardstore.segments.point_read.PointIndex`).  The 336,776-row one
go spent 0.26 s of its ~0.45 s entering tuples in the dict (issue 31), for a map its flush
then drops without a lookup.  A lookup takes the highest seq# among the dict and the runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.point_read import PointIndex


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

#: The column a lookup asked for ``seen`` adds: whether any copy of the id was found (a live segment copy, a
#: buffered index or delete, a refreshed delete).  False: the id is new to the shard, so no older copy of it can
#: be in a segment when this write is refreshed (a primary's refresh skips its lookup: segments/refresh_plan.py).
SEEN = "_seen"


def with_seen(table: pa.Table, found: Any, seen: bool) -> pa.Table:
    """``table`` with the :data:`SEEN` column ``found`` (booleans, one per row) appended when ``seen`` is asked."""
    return table.append_column(SEEN, pa.array(found, pa.bool_())) if seen else table

_ABSENT = (None, None, None)


#: A batch this large is kept as a run, not entered in the dict (module docstring).
RUN_ROWS = 16_384
#: A lookup of n ids goes through the dict's columnar copy (:meth:`VersionMap._small_run`) instead of a dict call
#: per id when n * DICT_COST_PER_ID exceeds what the copy costs: sorting the dict's entries again when batches came
#: since it was built (REBUILD_COST_PER_ENTRY each), plus one hash pass over them (PROBE_COST_PER_ENTRY each).
#: Relative costs measured on this machine (issue 44: a 32,768-id slice of an ingest job spent 0.12 s in the
#: dict calls; a bulk of 1,000 beside a 200,000-entry dict must not pay a 30 ms sort for it)
DICT_COST_PER_ID, REBUILD_COST_PER_ENTRY, PROBE_COST_PER_ENTRY = 16, 4, 1
#: below this many ids a lookup with no runs takes the dict (one call per id beats any Arrow kernel's overhead)
COLUMNAR_MIN_IDS = 64


class _Run:
    """One large batch of buffered operations, kept columnar; its hash index is built on its first lookup."""

    __slots__ = ("entry", "ids", "index", "keys", "latest", "order", "seqs", "terms", "versions")

    def __init__(self, ids: pa.Array | list[str], seqs: np.ndarray, terms: Any, versions: Any, entry: int,
                 order: pa.Array | None = None, keys: SortedKeys | None = None) -> None:
        self.ids, self.seqs, self.terms, self.versions, self.entry = ids, seqs, terms, versions, entry
        self.order = order  # the writer's permutation sorting ``ids`` (a hint, checked before it is used), or None
        # the writer's sorted fingerprints of ``ids``, which it found distinct (so no id twice): a lookup that brings
        # its own finds the run's rows by searchsorted (SortedKeys.find_in); None: the index_in path below
        self.keys = keys if keys is not None and len(keys.fp) == len(seqs) and keys.distinct else None
        self.index: PointIndex | None = None
        self.latest: tuple[pa.Array, np.ndarray] | None = None  # (ids once each, row of each one's highest seq#)

    def match(self, query: pa.Array, keys: SortedKeys | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Columnar: (positions in ``query``, the run's row of the highest-seq# operation) of the ids it holds;
        ``keys``: ``query``'s sorted fingerprints, if the caller has them."""
        if keys is not None and self.keys is not None:
            q, rows = keys.find_in(self.keys)
            if not len(q):
                return q, rows
            ids = pa.array(self.ids, pa.string()) if isinstance(self.ids, list) else one_array(self.ids)
            same = pc.equal(query.take(pa.array(q)), ids.take(pa.array(rows)))  # a fingerprint collision is no match
            keep = np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
            return q[keep], rows[keep]
        if self.latest is None:
            ids = pa.array(self.ids, pa.string()) if isinstance(self.ids, list) else one_array(self.ids)
            if self.order is not None:  # the writer sorted them: unique ids in that order need no sort here
                ordered = ids.take(self.order)
                if strictly_ascending(ordered):
                    self.latest = (ordered, np.asarray(self.order.cast(pa.int64()), dtype=np.int64))
                self.order = None
        if self.latest is None:
            table = pa.table({"id": ids, "seq": pa.array(self.seqs, pa.int64())})
            order = pc.sort_indices(table, sort_keys=[("id", "ascending"), ("seq", "descending")])
            ordered = ids.take(order)
            first = first_of_runs(ordered)
            self.latest = (ordered.filter(first), np.asarray(order.filter(first), dtype=np.int64))
        uniq, rows = self.latest
        at = pc.index_in(query, value_set=uniq)
        hit = np.flatnonzero(np.asarray(pc.is_valid(at), dtype=bool))
        return hit, rows[np.asarray(at.drop_null() if at.null_count else at, dtype=np.int64)]

    def find(self, doc_id: str) -> tuple | None:
        """The fields of the run's highest-seq# operation on ``doc_id``, or None."""
        index = self.index
        if index is None:
            index = self.index = PointIndex(self.ids)
        rows = index.rows(doc_id)
        if not rows:
            return None
        row = max(rows, key=lambda r: self.seqs[r])
        term = self.terms if not isinstance(self.terms, np.ndarray) else int(self.terms[row])
        version = None if self.versions is None else int(self.versions[row])
        return (int(self.seqs[row]), term, version, self.entry, row)


class VersionMap:
    """id -> :class:`BufferedOp` of the highest seq# buffered for it (one per shard buffer)."""

    def __init__(self) -> None:
        self._ops: dict[str, tuple] = {}  # id -> the fields of a BufferedOp (plain tuples: cheaper to build)
        self._runs: list[_Run] = []  # large batches, kept columnar (module docstring)
        #: the dict's batches as given (ids, seq#s, terms and versions; -1 for a delete's): its columnar copy
        self._small: list[tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray]] = []
        self._small_rows = 0
        self._small_built: _Run | None = None  # a _Run over self._small, None once a batch came after it
        #: no operation taken in has a lower seq# (it may have been replaced since: a lower bound)
        self.min_seq_no = 2**63 - 1
        self.max_seq_no = -(2**63)

    def __len__(self) -> int:
        """Entries: ids of the dict plus rows of the runs (an id in two of them counts twice)."""
        return len(self._ops) + sum(len(r.seqs) for r in self._runs)

    def add_docs(self, entry: int, ids: pa.Array, seq_nos: pa.Array, terms: pa.Array, versions: pa.Array,
                 order: pa.Array | None = None, keys: SortedKeys | None = None) -> None:
        """Take in a buffered table of index operations (``entry``: its index in the buffer's docs; ``order``: the
        permutation sorting ``ids``, if the writer had it: a run's first lookup then checks it instead of sorting)."""
        if len(ids) >= RUN_ROWS:
            self._add_run(ids, _numpy(seq_nos), _numpy(terms), _numpy(versions), entry, order, keys)
            return
        self._add(ids, seq_nos, terms.to_pylist(), versions.to_pylist(), entry)
        self._keep_small(ids, _numpy(seq_nos), _numpy(terms), _numpy(versions))

    def _add_run(self, ids: pa.Array | list[str], seqs: np.ndarray, terms: Any, versions: Any, entry: int,
                 order: pa.Array | None = None, keys: SortedKeys | None = None) -> None:
        self._runs.append(_Run(ids, seqs, terms, versions, entry, order, keys))
        self.min_seq_no = min(self.min_seq_no, int(seqs.min()))
        self.max_seq_no = max(self.max_seq_no, int(seqs.max()))

    def add_run(self, entry: int, ids: list[str], first_seq_no: int, primary_term: int, versions: list[int]) -> None:
        """Take in a primary's run of index operations: ``ids`` with the seq#s ``first_seq_no``.. in order, one term
        (the columnar staging of a node's parts, engine/shard/staging.py: no Arrow column read back)."""
        n = len(ids)
        if n >= RUN_ROWS:
            self._add_run(ids, np.arange(first_seq_no, first_seq_no + n, dtype=np.int64), primary_term,
                          np.asarray(versions, dtype=np.int64), entry)
        elif n:
            rows = zip(range(first_seq_no, first_seq_no + n), repeat(primary_term), versions, repeat(entry), range(n))
            self._take(ids, rows, first_seq_no, first_seq_no + n - 1, ascending=True)
            self._keep_small(pa.array(ids, pa.string()), np.arange(first_seq_no, first_seq_no + n, dtype=np.int64),
                             np.full(n, primary_term, dtype=np.int64), np.asarray(versions, dtype=np.int64))

    def add_deletes(self, ids: pa.Array, seq_nos: pa.Array) -> None:
        """Take in buffered delete operations."""
        if len(ids) >= RUN_ROWS:
            self._add_run(ids, _numpy(seq_nos), None, None, -1)
            return
        self._add(ids, seq_nos, repeat(None), repeat(None), -1)
        if len(ids):
            self._keep_small(ids, _numpy(seq_nos), np.full(len(ids), -1, dtype=np.int64),
                             np.full(len(ids), -1, dtype=np.int64))

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

    def _keep_small(self, ids: pa.Array | pa.ChunkedArray, seqs: np.ndarray, terms: np.ndarray,
                    versions: np.ndarray) -> None:
        """Keep a batch the dict took in as columns too (its columnar copy, built when a big lookup asks)."""
        self._small.append((one_array(ids).cast(pa.string()), seqs, terms, versions))
        self._small_rows += len(seqs)
        self._small_built = None

    def _columnar(self, n: int) -> bool:
        """Whether a lookup of ``n`` ids is cheaper through the dict's columnar copy than a dict call per id
        (DICT_COST_PER_ID: the copy is only rebuilt for a lookup big enough to pay for it)."""
        if not self._ops:
            return True
        cost = self._small_rows * (PROBE_COST_PER_ENTRY + (REBUILD_COST_PER_ENTRY if self._small_built is None else 0))
        return n * DICT_COST_PER_ID > cost

    def _small_run(self) -> _Run | None:
        """The dict's operations as one :class:`_Run` (the highest seq# per id wins in it as in the dict)."""
        if not self._small:
            return None
        if self._small_built is None:
            ids = pa.concat_arrays([b[0] for b in self._small])
            self._small_built = _Run(ids, *(np.concatenate([b[k] for b in self._small]) for k in (1, 2, 3)), -2)
        return self._small_built

    def _find(self, doc_id: str) -> tuple | None:
        """The fields of the highest-seq# buffered operation on ``doc_id`` among the dict and the runs."""
        op = self._ops.get(doc_id)
        for run in self._runs:
            found = run.find(doc_id)
            if found is not None and (op is None or found[0] > op[0]):
                op = found
        return op

    def _getter(self) -> Any:
        return self._find if self._runs else self._ops.get

    def get(self, doc_id: str) -> BufferedOp | None:
        """The newest buffered operation on ``doc_id``, or None."""
        op = self._getter()(doc_id)
        return None if op is None else BufferedOp(*op)

    def lookup(self, ids: list | pa.Array, *, seen: bool = False, keys: SortedKeys | None = None) -> pa.Table:
        """Per id (order kept): seq#, term, version of its newest buffered index operation (nulls: none
        buffered, or a delete is newest), as :data:`VERSIONS_SCHEMA`; ``seen``: plus the :data:`SEEN` column
        (True where any operation on the id is buffered, a delete included); ``keys``: the ids' sorted
        fingerprints, if the caller has them (runs that keep theirs are then searched, not hashed)."""
        if not isinstance(ids, list) and (self._runs or len(ids) >= COLUMNAR_MIN_IDS) and self._columnar(len(ids)):
            return self._lookup_columnar(one_array(ids), seen=seen, keys=keys)
        if self._runs and not isinstance(ids, list):
            return self._lookup_columnar(one_array(ids), by_dict=True, seen=seen, keys=keys)
        if not isinstance(ids, list):
            ids = ids.to_pylist()
        get = self._getter()
        ops = [get(i) for i in ids]
        rows = [_live(op) for op in ops]
        cols = list(zip(*rows)) if rows else [(), (), ()]
        table = pa.table([pa.array(c, pa.int64()) for c in cols], schema=VERSIONS_SCHEMA)
        return with_seen(table, [op is not None for op in ops], seen)

    def _newest(self, ids: pa.Array, by_dict: bool = False, keys: SortedKeys | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Columnar over the runs (issue 43: a 200k-row bulk over runs was a Python lookup per id) and over the
        dict's columnar copy (issue 44), or, ``by_dict``, the dict's entries merged in per id (a small lookup
        beside a big dict: :meth:`_columnar`): per id, (found, seq#, term, version; -1 for a delete's)."""
        n = len(ids)
        found = np.zeros(n, dtype=bool)
        seq = np.full(n, -(2**63), dtype=np.int64)
        term = np.full(n, -1, dtype=np.int64)
        version = np.full(n, -1, dtype=np.int64)
        small = None if by_dict else self._small_run()
        for run in self._runs if small is None else [*self._runs, small]:
            q, rows = run.match(ids, keys)
            if not len(q):
                continue
            s = run.seqs[rows]
            newer = s > seq[q]
            q, rows, s = q[newer], rows[newer], s[newer]
            found[q] = True
            seq[q] = s
            term[q] = (run.terms[rows] if isinstance(run.terms, np.ndarray) else
                       np.full(len(q), -1 if run.terms is None else run.terms, dtype=np.int64))
            version[q] = -1 if run.versions is None else run.versions[rows]
        if by_dict and self._ops:
            get = self._ops.get
            for i, op in enumerate(map(get, ids.to_pylist())):
                if op is not None and op[0] > seq[i]:
                    found[i], seq[i] = True, op[0]
                    term[i] = -1 if op[1] is None else op[1]
                    version[i] = -1 if op[2] is None else op[2]
        return found, seq, term, version

    def _lookup_columnar(self, ids: pa.Array, by_dict: bool = False, *, seen: bool = False,
                         keys: SortedKeys | None = None) -> pa.Table:
        found, seq, term, version = self._newest(ids, by_dict, keys)
        null = ~found | (version < 0)  # absent, or a delete is newest
        table = pa.table([pa.array(seq, pa.int64(), mask=null), pa.array(term, pa.int64(), mask=null),
                          pa.array(version, pa.int64(), mask=null)], schema=VERSIONS_SCHEMA)
        return with_seen(table, found, seen)

    def versions(self, ids: list, arr: pa.Array | None = None) -> list[int] | np.ndarray:
        """Per id (order kept): the version of its newest buffered index operation, 0 when there is none or a
        delete is newest (what the next version counts from); ``arr``: the same ids as Arrow (columnar then)."""
        if arr is not None and (self._runs or len(arr) >= COLUMNAR_MIN_IDS):
            found, _seq, _term, version = self._newest(one_array(arr), not self._columnar(len(arr)))
            return np.where(found & (version >= 0), version, 0)
        get = self._getter()
        return [(op[2] or 0) if (op := get(i)) is not None else 0 for i in ids]

    def candidates_table(self, uniq: pa.Array, schema: pa.Schema, keys: SortedKeys | None = None) -> pa.Table:
        """:meth:`candidates` as a table of ``schema`` (q, _seq_no, _primary_term, _version, deleted), columnar
        over the runs (``keys``: ``uniq``'s sorted fingerprints, if the caller has them)."""
        if not self._runs and (len(uniq) < COLUMNAR_MIN_IDS or not self._columnar(len(uniq))):
            q, seq, term, version, deleted = self.candidates(uniq.to_pylist())
            return pa.table([pa.array(q, pa.int64()), pa.array(seq, pa.int64()), pa.array(term, pa.int64()),
                             pa.array(version, pa.int64()), pa.array(deleted, pa.bool_())], schema=schema)
        found, seq, term, version = self._newest(one_array(uniq), not self._columnar(len(uniq)), keys)
        q = np.flatnonzero(found)
        dead = version[q] < 0
        return pa.table([pa.array(q, pa.int64()), pa.array(seq[q], pa.int64()),
                         pa.array(term[q], pa.int64(), mask=term[q] < 0), pa.array(version[q], pa.int64(), mask=dead),
                         pa.array(dead, pa.bool_())], schema=schema)

    def candidates(self, uniq: list) -> tuple[list[int], list[int], list[int | None], list[int | None], list[bool]]:
        """For the columnar merge with segment copies: (query position, seq#, term, version, deleted) per id
        of ``uniq`` that has a buffered operation."""
        q, seq, term, version, deleted = [], [], [], [], []
        get = self._getter()
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


def _numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An int64 column without nulls as numpy (zero copy when it can)."""
    return np.asarray(arr.to_numpy() if isinstance(arr, pa.ChunkedArray) else arr.to_numpy(zero_copy_only=False),
                      dtype=np.int64)


def strictly_ascending(values: pa.Array) -> bool:
    """Whether every value is greater than the one before it: sorted, and no value twice (no nulls)."""
    n = len(values)
    if values.null_count:
        return False
    return n < 2 or bool(pc.all(pc.less(values.slice(0, n - 1), values.slice(1))).as_py())


def first_of_runs(sorted_values: pa.Array) -> pa.BooleanArray:
    """True where a sorted array's value differs from the previous one (first of each run)."""
    n = len(sorted_values)
    if n == 0:
        return pa.array([], pa.bool_())
    differs = pc.not_equal(sorted_values.slice(1), sorted_values.slice(0, n - 1))
    return pa.concat_arrays([pa.array([True]), differs.cast(pa.bool_())])


def _live(op: tuple | None) -> tuple[int | None, int | None, int | None]:
    if op is None or op[2] is None:
        return _ABSENT
    return op[:3]


__all__ = ["RUN_ROWS", "SEEN", "VERSIONS_SCHEMA", "BufferedOp", "VersionMap", "with_seen"]
