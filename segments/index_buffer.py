"""The indexing buffer of a shard directory: operations applied since the last refresh, columnar.

Index operations are kept as the tables they came in (with the permutation sorting their ids when the
writer had it), deletes as ``(_id, _seq_no)`` tables, and a :class:`~shardstore.segments.version_map.VersionMap`
answers "the newest buffered operation on this id" for the write path's version lookups and realtime gets.
A refresh (segments/directory.py) writes it to a segment and starts a new one; a replica's deferred view
(``ShardDirectory.hold_view(refresh=False)``) splits it at a seq# first (:meth:`IndexBuffer.split_above`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import filled, one_array
from shardstore.core.ops import OpType
from shardstore.segments.errors import SegmentError
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.segment import BASE_SCHEMA
from shardstore.segments.version_map import VersionMap

__all__ = ["DELETES", "IndexBuffer", "buffered_docs", "split_ops"]

#: the schema of buffered deletes and of a directory's tombstones
DELETES = pa.schema([pa.field("_id", pa.string()), pa.field("_seq_no", pa.int64())])


@dataclass
class IndexBuffer:
    """A shard copy's operations applied since its last refresh (see the module docstring)."""

    docs: list[pa.Table] = field(default_factory=list)
    deletes: list[pa.Table] = field(default_factory=list)
    doc_bytes: int = 0  # Arrow bytes of ``docs``
    #: per entry of ``docs``, the permutation sorting its ``_id`` column if the writer had it (a hint the
    #: refresh checks before it trusts it), else None
    orders: list[pa.Array | None] = field(default_factory=list)
    #: per entry of ``docs``, per row whether the writer's version lookup found no copy of its id at all (a
    #: primary's: ``ShardDirectory.apply``'s ``new_ids``), else None: the refresh looks up the others only
    news: list[np.ndarray | None] = field(default_factory=list)
    #: per entry of ``docs``, the sorted fingerprints of its ids if the writer had them and found them distinct
    #: (``SortedKeys``), else None: a refresh builds its segments' id indexes from them (:meth:`sorted_keys`)
    keys: list[SortedKeys | None] = field(default_factory=list)

    #: id -> its newest buffered operation (updated by every apply: the write path's version lookup and a
    #: realtime get are one dict lookup each)
    versions: VersionMap = field(default_factory=VersionMap)

    def __bool__(self) -> bool:
        return bool(self.docs or self.deletes)

    def add_docs(self, docs: pa.Table, order: pa.Array | None = None, new: np.ndarray | None = None,
                 keys: SortedKeys | None = None) -> None:
        """Buffer stamped documents (:func:`buffered_docs` rows); ``order``: the permutation sorting their ids;
        ``new``: per row, whether its id was new to the shard when the writer looked it up (see ``news``);
        ``keys``: the sorted fingerprints of their ids, if the writer has them (the version map's index of them)."""
        keys = keys if keys is not None and len(keys.fp) == docs.num_rows and keys.distinct else None
        self.versions.add_docs(len(self.docs), docs.column("_id"), docs.column("_seq_no"),
                               docs.column("_primary_term"), docs.column("_version"), order, keys)
        self.docs.append(docs)
        self.orders.append(order)
        self.news.append(new)
        self.keys.append(keys)
        self.doc_bytes += docs.nbytes

    def add_run(self, docs: pa.Table, ids: list[str], first_seq_no: int, primary_term: int, versions: list[int],
                nbytes: int) -> None:
        """Buffer a run of index operations at the seq#s ``first_seq_no``.. in order, its ids and versions as lists
        (no order, newness or keys hints); ``nbytes``: its share of the Arrow bytes."""
        self.versions.add_run(len(self.docs), ids, first_seq_no, primary_term, versions)
        self.docs.append(docs)
        self.orders.append(None)
        self.news.append(None)
        self.keys.append(None)
        self.doc_bytes += nbytes

    def sorted_keys(self) -> SortedKeys | None:
        """The sorted fingerprints of every buffered document's id, positions counted over ``docs`` concatenated in
        order; None unless every entry has its own (merged, not computed again: ``SortedKeys.merged``)."""
        if not self.keys or any(k is None for k in self.keys):
            return None
        return SortedKeys.merged(self.keys, [d.num_rows for d in self.docs])  # type: ignore[arg-type]

    def add_deletes(self, deletes: pa.Table) -> None:
        """Buffer stamped deletes (``DELETES`` rows)."""
        self.versions.add_deletes(deletes.column("_id"), deletes.column("_seq_no"))
        self.deletes.append(deletes)

    def split_above(self, seq_no: int) -> tuple[list[pa.Table], list[pa.Table]]:
        """The buffered documents and deletes above ``seq_no`` (each table's rows in order), taken out: this buffer
        keeps the rest.  A table wholly on one side of ``seq_no`` moves as it is (no copy)."""
        kept = IndexBuffer()
        above_docs: list[pa.Table] = []
        above_deletes: list[pa.Table] = []
        for tables, add, above in ((self.docs, kept.add_docs, above_docs),
                                   (self.deletes, kept.add_deletes, above_deletes)):
            for table in tables:
                lo, hi = pc.min_max(table.column("_seq_no")).values()
                if hi.as_py() <= seq_no:
                    add(table)
                elif lo.as_py() > seq_no:
                    above.append(table)
                else:
                    high = pc.greater(table.column("_seq_no"), seq_no)
                    add(table.filter(pc.invert(high)))
                    above.append(table.filter(high))
        self.docs, self.deletes, self.orders, self.news = kept.docs, kept.deletes, kept.orders, kept.news
        self.keys = kept.keys
        self.doc_bytes, self.versions = kept.doc_bytes, kept.versions
        return above_docs, above_deletes

    def latest(self, doc_id: str) -> tuple[int, pa.Table | None, int] | None:
        """The buffered operation on ``doc_id`` with the highest seq#: (seq#, its docs table or None for a
        delete, row), or None when nothing buffered names it."""
        op = self.versions.get(doc_id)
        if op is None:
            return None
        return op.seq_no, (self.docs[op.entry] if op.version is not None else None), op.row


_DOC_SCHEMAS: dict[pa.Schema, pa.Schema] = {}


def _doc_schema(fields: pa.Schema) -> pa.Schema:
    """A buffered documents table's schema for these parsed field columns (built once per field schema)."""
    found = _DOC_SCHEMAS.get(fields)
    if found is None:
        if len(_DOC_SCHEMAS) > 256:
            _DOC_SCHEMAS.clear()
        found = _DOC_SCHEMAS[fields] = pa.schema(list(BASE_SCHEMA) + list(fields))
    return found


def buffered_docs(ops: pa.RecordBatch | pa.Table, fields: pa.Table) -> pa.Table:
    """The buffered documents table of stamped index operations ``ops`` and their parsed ``fields`` (same rows)."""
    return pa.table([one_array(ops.column("id")), ops.column("seq_no"), ops.column("primary_term"),
                     filled(ops.column("version"), 1), ops.column("source")] + list(fields.columns),
                    schema=_doc_schema(fields.schema))


def split_ops(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(index operations, delete operations) of a batch; an all-index batch is returned as it is, not copied."""
    op_type = table.column("op_type")
    is_index = pc.equal(op_type, int(OpType.INDEX))
    if pc.all(is_index, skip_nulls=False).as_py():  # None (not True) when an op_type is null
        return table, table.slice(0, 0)
    if pc.any(pc.equal(op_type, int(OpType.ADOPTED))).as_py():  # never dropped as a no-op would be
        raise SegmentError("adopted operations are adopted with their file (ShardDirectory.adopt; "
                           "engine/shard/adoption_apply.py), not applied as operations")
    return table.filter(is_index), table.filter(pc.equal(op_type, int(OpType.DELETE)))
