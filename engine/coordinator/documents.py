"""The document API of the cluster: bulk, index, delete and get, with validation at the door (issue 15).

:class:`Documents` is the write path from a caller's documents to per-item results, one
implementation for the embedded :class:`~shardstore.engine.cluster.Cluster` and for a node
process's coordinator: each is a :class:`DocumentRouter` (where an index's metadata comes
from, how a mapping is committed, how a shard's operations reach its primary).

1. The door (:mod:`~shardstore.engine.coordinator.validation`): each item is checked for the limits;
   a bad one is rejected alone (``DocumentRejected``) and never gets a seq#.
2. One mapping per index (:meth:`Documents._map_items`): the accepted items are parsed
   against the index mapping once; new fields are committed to the cluster state before
   any copy sees an item that needs them (docs/design/engine.md, invariant 15).
3. Routing and the shard writes (:meth:`Documents._write`): per shard, the primary
   stamps, applies (with the coordinator's parsed fields) and replicates.
4. The result: one row per item, in bulk order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.ops import with_fields
from shardstore.engine.coordinator.bulk_parts import PartFailed
from shardstore.engine.coordinator.routing import shard_id, shard_ids, shard_runs
from shardstore.engine.coordinator.validation import (
    MAX_INDEX_FIELDS,
    CheckedDocs,
    check_doc_id,
    check_expectation,
    docs_from_pylist,
    docs_from_table,
)
from shardstore.engine.errors import DocumentRejected, VersionConflict
from shardstore.engine.manager.metadata import IndexMeta
from shardstore.segments.errors import MappingConflict
from shardstore.segments.item_parse import ParsedItems, parse_items
from shardstore.segments.mapping import Mapping
from shardstore.segments.source_keep import kept_sources, table_rebuilds_exactly
from shardstore.segments.table_fields import fields_from_table
from shardstore.translog.operations import OpType, unstamped_batch

__all__ = ["BulkResult", "DocumentRouter", "Documents", "with_shard_fields"]

log = logging.getLogger(__name__)


@dataclass
class BulkResult:
    """Per item: seq_no, primary_term and version, or the error; plus the acknowledged ids."""

    #: one row per item of the bulk, in bulk order: _id, shard, seq_no, primary_term, version,
    #: error (null when acknowledged), item (the item's place in the bulk)
    items: pa.Table
    _acked: list[str] | None = field(default=None, repr=False)

    @property
    def acknowledged(self) -> list[str]:
        """The ids of the acknowledged items, in bulk order (built on first use: a big bulk's caller may not ask)."""
        if self._acked is None:
            self._acked = self.items.filter(pc.is_null(self.items.column("error"))).column("_id").to_pylist()
        return self._acked

    @property
    def errors(self) -> bool:
        """True if any item was not acknowledged."""
        return self.items.column("error").null_count != self.items.num_rows


class DocumentRouter(Protocol):
    """What the document API needs from where it runs: the embedded :class:`Cluster` or a node's coordinator."""

    def index_meta(self, index: str) -> IndexMeta:
        """The index's metadata (IndexNotFound, ClusterClosed)."""

    def mapping_of(self, meta: IndexMeta) -> Mapping:
        """The index mapping of ``meta`` as a :class:`Mapping`."""

    def commit_mapping(self, index: str, base: Mapping, proposed: Mapping) -> Mapping:
        """Commit ``proposed`` (``base`` plus new fields) unless the index mapping moved on from ``base``; the mapping after."""

    def write_shard(self, meta: IndexMeta, shard: int, ops: pa.RecordBatch, expect: tuple | None,
                    mapping: Mapping | None, fields: pa.Table | None, request: str | None = None) -> pa.RecordBatch:
        """Send one shard's operations to its primary; the stamped operations once acknowledged (``request``: the
        write's id; an attempt whose outcome is unknown is sent again with it, engine/shard/request_ledger.py)."""

    def read_doc(self, meta: IndexMeta, shard: int, doc_id: str) -> dict[str, Any] | None:
        """The document from the shard's primary (realtime), raw ``_source`` bytes, or None."""

    def write_shards(self, meta: IndexMeta, parts: list[tuple[int, pa.RecordBatch, pa.Table | None]],
                     mapping: Mapping | None, request: str | None = None) -> list[pa.RecordBatch | BaseException]:
        """One bulk's parts for several shards (no expectation), one request per primary node; per part the
        stamped operations or the error (engine/coordinator/bulk_parts.py)."""

    def run_parallel(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, on worker threads."""


class Documents:
    """The document API (see the module docstring), over a :class:`DocumentRouter`.

    One implementation for both modes: the embedded :class:`~shardstore.engine.cluster.Cluster`
    is its own router; a node process's coordinator routes over the network.
    """

    def __init__(self, router: DocumentRouter) -> None:
        self.router = router

    def bulk(self, index: str, docs: pa.Table | Iterable[MappingABC[str, Any]], *,
             request: str | None = None) -> BulkResult:
        """Index documents (a table with ``_id`` or dicts with ``_id``); per-item results and the acked ids.

        Each item is checked at the door (:mod:`~shardstore.engine.coordinator.validation`) and against the
        index mapping before it gets a seq#: a bad item is reported with ``DocumentRejected``
        and exists on no copy; the others go on.
        """
        synthetic = self.router.index_meta(index).source == "synthetic"
        if isinstance(docs, pa.RecordBatch):
            docs = pa.Table.from_batches([docs])
        # a table's JSON sources are built only if something needs them (source_keep, the parse fallback)
        checked = docs_from_table(docs, sources=False) if isinstance(docs, pa.Table) else docs_from_pylist(docs)
        checked, mapping, fields, direct = self._map_items(index, checked)
        ops = _index_ops(checked, fields, mapping, synthetic=synthetic, direct=direct)
        return self._write(index, ops, mapping=mapping, rejected=checked.rejected, positions=checked.positions,
                           fields=fields, request=request)

    def refusals(self, index: str, table: pa.Table, mapping: Mapping | None = None
                 ) -> tuple[Mapping, list[DocumentRejected]]:
        """What a bulk of ``table`` would refuse, at the door and against ``mapping`` (default: the index's),
        applying and committing nothing; and the mapping it would leave (its new fields added), against which the
        next table of the same ingest job is checked."""
        base = mapping if mapping is not None else self.router.mapping_of(self.router.index_meta(index))
        checked = docs_from_table(table, sources=False)
        parsed, _direct = _parse(checked, base)
        refused = [*checked.rejected, *(DocumentRejected(checked.positions[f.position].as_py(),
                                                         checked.ids[f.position].as_py(), f.field, f.rule)
                                        for f in parsed.failures)]
        return parsed.mapping, refused

    def reserve_fields(self, index: str, proposed: Mapping) -> None:
        """Commit the fields of ``proposed`` the index mapping lacks, before any row needs them (an ingest job's, once
        its files are checked: a client mapping one of them another way afterwards is refused, not the job's rows);
        MappingConflict when the index maps one of them another way already."""
        base = self.router.mapping_of(self.router.index_meta(index))
        while True:
            merged = base.merged(proposed)
            if merged == base:
                return
            after = self.router.commit_mapping(index, base, merged)
            if after.merged(proposed) == after:
                return
            base = after  # another writer added fields meanwhile: merged again against those

    def delete(self, index: str, doc_id: str, *, if_seq_no: int | None = None,
               if_primary_term: int | None = None, request: str | None = None) -> BulkResult:
        """Delete one document (optionally only if its current seq# and term match)."""
        check_doc_id(doc_id)
        check_expectation(if_seq_no, if_primary_term)
        ops = unstamped_batch([int(OpType.DELETE)], [doc_id], [1], [None])
        return self._write(index, ops, _expect(doc_id, if_seq_no, if_primary_term), request=request)

    def delete_ids(self, index: str, ids: pa.Array) -> BulkResult:
        """Delete the documents of ``ids`` (at least one; no expectation), columnar; per-item results."""
        n = len(ids)
        ops = unstamped_batch(pa.repeat(pa.scalar(int(OpType.DELETE), pa.int8()), n), ids.cast(pa.string()),
                              pa.repeat(pa.scalar(1, pa.int64()), n), pa.nulls(n, pa.binary()))
        return self._write(index, ops)

    def index_doc(self, index: str, doc: MappingABC[str, Any], *, if_seq_no: int | None = None,
                  if_primary_term: int | None = None, request: str | None = None) -> BulkResult:
        """Index one document with optimistic concurrency (VersionConflict when seq#/term moved on).

        A document that breaks a rule raises ``DocumentRejected`` (nothing applied).
        """
        check_expectation(if_seq_no, if_primary_term)
        synthetic = self.router.index_meta(index).source == "synthetic"
        checked, mapping, fields, direct = self._map_items(index, docs_from_pylist([doc]))
        if checked.rejected:
            raise checked.rejected[0]
        ops = _index_ops(checked, fields, mapping, synthetic=synthetic, direct=direct)
        return self._write(index, ops, _expect(checked.ids[0].as_py(), if_seq_no, if_primary_term), mapping=mapping,
                           fields=fields, request=request)

    def get(self, index: str, doc_id: str) -> dict[str, Any] | None:
        """The document as Elasticsearch's get API shapes it, or None: ``_index``, ``_id``, ``_version``,
        ``_seq_no``, ``_primary_term`` and ``_source``, the fields as given (rebuilt from the typed columns on a
        synthetic-source index).  Realtime: from the primary, refreshed or not."""
        meta = self.router.index_meta(index)
        check_doc_id(doc_id)
        doc = self.router.read_doc(meta, shard_id(doc_id, meta.shards), doc_id)
        if doc is None:
            return None
        source = doc.get("_source")
        return {"_index": index, "_id": doc["_id"], "_version": doc["_version"], "_seq_no": doc["_seq_no"],
                "_primary_term": doc["_primary_term"], "_source": json.loads(source) if source is not None else {}}

    def _map_items(self, index: str, checked: CheckedDocs) -> tuple[CheckedDocs, Mapping, pa.Table, bool]:
        """Check the accepted items against the index mapping, decided once per index (not per shard).

        New fields are added to the index mapping and committed to the cluster state before
        any copy sees an item that needs them (a copy takes the index mapping in before it
        applies a batch), so no two shards can map one field two ways and a restore knows
        every field's type.  An item that does not fit is rejected; it gets no seq#.
        Returns the accepted items, the index mapping (as committed: its field order is the
        index's), their parsed field columns (the primary applies those instead of parsing the
        sources again) and whether those came straight from the caller's table.
        """
        base = self.router.mapping_of(self.router.index_meta(index))
        parsed, direct = _parse(checked, base)
        mapping = base
        while parsed.mapping != base:
            committed = self.router.commit_mapping(index, base, parsed.mapping)
            mapping = committed
            if committed == parsed.mapping:
                break
            base = committed  # another bulk added fields meanwhile: decide against those (fields only join)
            parsed, direct = _parse(checked, base)
            mapping = base
        if not parsed.failures:
            return checked, mapping, parsed.fields, direct
        rejected = [DocumentRejected(checked.positions[f.position].as_py(), checked.ids[f.position].as_py(),
                                     f.field, f.rule) for f in parsed.failures]
        return checked.without(parsed.keep, rejected), mapping, parsed.fields, direct

    def _write(self, index: str, ops: pa.RecordBatch, expect: tuple | None = None, *,
               mapping: Mapping | None = None, rejected: tuple[DocumentRejected, ...] = (),
               positions: pa.Array | None = None, fields: pa.Table | None = None,
               request: str | None = None) -> BulkResult:
        meta = self.router.index_meta(index)
        if positions is None:
            positions = pa.array(range(ops.num_rows), pa.int64())
        subs = _split_by_shard(shard_ids(ops.column("id"), meta.shards), ops, positions, fields)

        # Shards are written in parallel (the router's workers).
        def write(sub: tuple[int, pa.RecordBatch, pa.Array, pa.Table | None]) -> pa.Table:
            part = self._write_shard(index, meta, sub[0], sub[1], expect=expect, mapping=mapping, fields=sub[3],
                                     request=request)
            return part.append_column("item", sub[2])

        if len(subs) > 1 and expect is None:
            # one request per primary node for all its shards: the node stages them all before its
            # translog upload round, so the bulk costs one round per node, not one per shard (issue 30)
            results = self.router.write_shards(meta, [(sub[0], sub[1], sub[3]) for sub in subs], mapping, request)
            parts = [_parts_items(subs, results)]
        else:
            parts = [write(subs[0])] if len(subs) == 1 else self.router.run_parallel(write, subs)
        if rejected:
            parts.append(_rejected_items(rejected))
        items = pa.concat_tables(parts)
        if len(subs) > 1 or len(parts) > 1:
            items = items.sort_by("item")  # in bulk order, as the caller gave them
        return BulkResult(items)

    def _write_shard(self, index: str, meta: IndexMeta, s: int, sub: pa.RecordBatch,
                     expect: tuple | None = None, mapping: Mapping | None = None,
                     fields: pa.Table | None = None, request: str | None = None) -> pa.Table:
        """One shard's part of a bulk through the router; per-item results (error null = acknowledged)."""
        error, stamped = None, None
        try:
            stamped = self.router.write_shard(meta, s, sub, expect, mapping, fields, request)
        except VersionConflict as exc:
            raise VersionConflict(exc.doc_id, exc.expected_seq_no, exc.expected_primary_term, exc.actual_seq_no,
                                  exc.actual_primary_term, index=index, shard=s) from None
        except Exception as exc:  # noqa: BLE001 - reported per item, never acknowledged
            error = f"{type(exc).__name__}: {exc}"
        return _items(s, sub, stamped, error)


def _split_by_shard(shards: pa.Array, ops: pa.RecordBatch, positions: pa.Array, fields: pa.Table | None
                    ) -> list[tuple[int, pa.RecordBatch, pa.Array, pa.Table | None]]:
    """(shard, its ops, their bulk positions, their parsed fields) per shard the bulk touches, each in bulk order:
    one stable sort by shard and zero-copy slices (``routing.shard_runs``), not a filter per shard of the index."""
    order, runs = shard_runs(shards)
    if order is not None:
        take = pa.array(order)
        ops, positions = ops.take(take), positions.take(take)
        fields = None if fields is None else fields.take(take)
    return [(s, ops.slice(a, b - a), positions.slice(a, b - a), None if fields is None else fields.slice(a, b - a))
            for s, a, b in runs]


def _parts_items(subs: list[tuple[int, pa.RecordBatch, pa.Array, pa.Table | None]],
                 results: list[pa.RecordBatch | BaseException]) -> pa.Table:
    """Per-item results of a bulk's parts (``item``: bulk position), built once when every part was acknowledged."""
    if any(isinstance(res, BaseException) for res in results):
        return pa.concat_tables([
            _items(sub[0], sub[1], None if isinstance(res, BaseException) else res,
                   None if not isinstance(res, BaseException) else str(res) if isinstance(res, PartFailed)
                   else f"{type(res).__name__}: {res}").append_column("item", sub[2])
            for sub, res in zip(subs, results, strict=True)])
    lens = [sub[1].num_rows for sub in subs]
    stamped: list[pa.RecordBatch] = results  # type: ignore[assignment]
    return pa.table({
        "_id": pa.concat_arrays([sub[1].column("id") for sub in subs]),
        "shard": pa.array(np.repeat(np.array([sub[0] for sub in subs], dtype=np.int32), lens)),
        **{name: pa.concat_arrays([st.column(name) for st in stamped]) for name in ("seq_no", "primary_term", "version")},
        "error": pa.nulls(sum(lens), pa.string()),
        "item": pa.concat_arrays([sub[2] for sub in subs]),
    })


def _items(s: int, sub: pa.RecordBatch, stamped: pa.RecordBatch | None, error: str | None) -> pa.Table:
    """Per-item results of one shard's part: its stamped seq#s, or ``error`` on every item."""
    k = sub.num_rows
    ok = stamped is not None
    return pa.table({
        "_id": sub.column("id"),
        "shard": pa.repeat(pa.scalar(s, pa.int32()), k),
        "seq_no": stamped.column("seq_no") if ok else pa.nulls(k, pa.int64()),
        "primary_term": stamped.column("primary_term") if ok else pa.nulls(k, pa.int64()),
        "version": stamped.column("version") if ok else pa.nulls(k, pa.int64()),
        "error": pa.nulls(k, pa.string()) if ok else pa.repeat(pa.scalar(error, pa.string()), k),
    })


def with_shard_fields(meta: IndexMeta, base: Mapping, shard_mappings: list[Mapping]) -> IndexMeta:
    """``meta`` with the fields its restored shards' commits map and the index mapping (``base``) lacks.

    Stores written before mappings were decided per index (issue 15) hold fields in the
    shard commits only; taking them in keeps a later bulk from guessing another type.
    Shards that disagree on a field (the old per-shard bug) keep the first one's type,
    logged: the other shard's items then get a mapping error, never a silent cast.
    """
    merged = base
    for shard_mapping in shard_mappings:
        try:
            merged = merged.merged(shard_mapping)
        except MappingConflict:
            for field_name, ftype in shard_mapping.items():  # field by field, skipping the clashes
                try:
                    merged = merged.merged(Mapping(((field_name, ftype),)))
                except MappingConflict as exc:
                    log.error("index %s: its shards map a field two ways (%s); the index keeps the first "
                              "type", meta.name, exc)
    return meta if merged == base else replace(meta, mappings=merged.to_dict())


def _parse(checked: CheckedDocs, mapping: Mapping) -> tuple[ParsedItems, bool]:
    """The accepted items' field columns against ``mapping``: from a table's own columns when that is exact, else
    parsed; and whether they came from the table's columns."""
    n = len(checked.ids)
    if checked.table is not None and n:
        direct = fields_from_table(checked.table, mapping, max_fields=MAX_INDEX_FIELDS)
        if direct is not None:  # no JSON round trip (issue 16); equal to the parse (tests/segments/test_segments_table_fields.py)
            return ParsedItems(pa.array(np.arange(n, dtype=np.int64)), direct[0], direct[1], ()), True
    return parse_items(checked.ids, checked.json_sources(), mapping, max_fields=MAX_INDEX_FIELDS), False


def _index_ops(checked: CheckedDocs, fields: pa.Table, mapping: Mapping, *, synthetic: bool,
               direct: bool) -> pa.RecordBatch:
    """The unstamped index operations of the accepted items: typed fields, with the JSON source of the rows they
    would not rebuild exactly on a stored-source index (none on a synthetic-source one; segments/source_keep.py)."""
    n = len(checked.ids)
    op_type, version = pa.repeat(pa.scalar(int(OpType.INDEX), pa.int8()), n), pa.repeat(pa.scalar(1, pa.int64()), n)
    if synthetic or (direct and checked.table is not None and table_rebuilds_exactly(checked.table, mapping)):
        sources = pa.nulls(n, pa.binary())
    else:
        sources = kept_sources(checked.json_sources(), fields, mapping)
        if sources.null_count == 0:  # every row keeps its JSON: a plain operation, as before
            return unstamped_batch(op_type, checked.ids, version, sources)
    return with_fields(unstamped_batch(op_type, checked.ids, version, sources), fields)


_ITEMS = pa.schema([("_id", pa.string()), ("shard", pa.int32()), ("seq_no", pa.int64()),
                    ("primary_term", pa.int64()), ("version", pa.int64()), ("error", pa.string()),
                    ("item", pa.int64())])


def _rejected_items(rejected: Iterable[DocumentRejected]) -> pa.Table:
    """Result rows of items refused at the door: no shard, no seq#, the error."""
    rows = list(rejected)
    return pa.table({
        "_id": pa.array([r.doc_id if isinstance(r.doc_id, str) else None for r in rows], pa.string()),
        "shard": pa.nulls(len(rows), pa.int32()), "seq_no": pa.nulls(len(rows), pa.int64()),
        "primary_term": pa.nulls(len(rows), pa.int64()), "version": pa.nulls(len(rows), pa.int64()),
        "error": pa.array([f"{type(r).__name__}: {r}" for r in rows], pa.string()),
        "item": pa.array([r.position for r in rows], pa.int64()),
    }, schema=_ITEMS)


def _expect(doc_id: str, if_seq_no: int | None, if_primary_term: int | None) -> tuple | None:
    """The optimistic-concurrency condition the primary checks, or None when none was given."""
    if if_seq_no is None and if_primary_term is None:
        return None
    return (doc_id, if_seq_no, if_primary_term)

