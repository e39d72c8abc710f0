"""Synthetic ``_source``: documents rebuilt from their typed field columns (issue 16).

An index created with ``source="synthetic"`` (Elasticsearch's ``index.mapping.source.mode:
synthetic``) stores each document once, as its typed field columns: segments hold a null
``_source`` and the translog carries the fields themselves (typed ``FT`` frames, see
:mod:`shardstore.translog.frames`), never a JSON copy.  ``get`` and the readers rebuild the
source from the columns on demand.

What the rebuilt source looks like (as Elasticsearch's synthetic source, documented in
docs/design/segments.md, "Synthetic source"):

* the fields come in the order the index first saw them (``Mapping.order``), not in each
  document's own order;
* a dotted field becomes a nested object (``a.b`` -> ``{"a": {"b": ...}}``);
* an absent or null field is left out; a ``date`` is ISO-8601 UTC with milliseconds
  (``"2013-01-01T05:00:00.000Z"``); a ``double`` that holds a whole number is written ``5.0``.

Two pure functions, no I/O:

* :func:`conform_fields`: typed field columns (from a translog ``fields`` struct) as the
  columns of a mapping, adding fields the mapping lacks (typed from their Arrow type);
* :func:`synthesize_sources`: the JSON sources of rows, built columnar from their fields;
* :func:`index_op_fields`: the field columns of translog index operations, typed or parsed;
* :func:`fill_sources` / :func:`op_sources`: null sources of segment rows / operations rebuilt.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.ops import FIELDS_COLUMN, fields_of
from shardstore.segments.errors import MappingConflict
from shardstore.segments.mapping import FieldType, Mapping, parse_sources, sources_from_table
from shardstore.segments.segment import BASE_SCHEMA

__all__ = ["SOURCE_MODES", "conform_fields", "field_type_of", "fill_sources", "in_source_order", "index_op_fields",
           "op_sources", "row_source", "synthesize_sources"]



#: The values of an index's ``source`` option: ``stored`` keeps the JSON document, ``synthetic`` rebuilds it.
SOURCE_MODES = ("stored", "synthetic")


def field_type_of(t: pa.DataType) -> FieldType | None:
    """The field type a segment column of Arrow type ``t`` has (``string`` reads as ``keyword``), or None."""
    for ftype in (FieldType.KEYWORD, FieldType.LONG, FieldType.INTEGER, FieldType.DOUBLE, FieldType.BOOLEAN,
                  FieldType.DATE):
        if ftype.arrow_type.equals(t):
            return ftype
    return None


def conform_fields(fields: pa.Table, mapping: Mapping, rows: int | None = None) -> tuple[pa.Table, Mapping]:
    """``fields`` as one column per field of the (grown) mapping, in its order; MappingConflict on a type clash.

    ``rows``: how many rows ``fields`` stands for (a table without columns has none of its own).

    A column the mapping lacks adds its field (typed by :func:`field_type_of`); a mapped
    field the rows lack is all null.  Typed operations were parsed against the index
    mapping by the coordinator, so a clash means the translog disagrees with the mapping.
    """
    new: dict[str, FieldType] = {}
    for f in fields.schema:
        ftype = field_type_of(f.type)
        if ftype is None:
            raise MappingConflict(f.name, None, "a field type", str(f.type))
        have = mapping.get(f.name)
        if have is None:
            new[f.name] = ftype
        elif not have.arrow_type.equals(f.type):
            raise MappingConflict(f.name, None, have.value, ftype.value)
    if new:
        mapping = mapping.with_fields(new)
    n = fields.num_rows if rows is None else rows
    names = set(fields.column_names)
    cols = [fields.column(name) if name in names else pa.nulls(n, ftype.arrow_type)
            for name, ftype in mapping.items()]
    return pa.Table.from_arrays(cols, schema=mapping.arrow_schema()), mapping


def in_source_order(names: Sequence[str], order: Sequence[str] | None) -> list[str]:
    """``names`` in ``order`` (a mapping's :attr:`~shardstore.segments.mapping.Mapping.order`); names it lacks
    after them, as given.  The member order of a rebuilt ``_source``."""
    if not order:
        return list(names)
    rank = {name: i for i, name in enumerate(order)}
    last = len(rank)
    return sorted(names, key=lambda name: rank.get(name, last))  # stable: unranked names keep their order


def synthesize_sources(fields: pa.Table, rows: int | None = None, order: Sequence[str] | None = None) -> pa.Array:
    """The JSON ``_source`` of each row rebuilt from its field columns (dotted names nest), as binary.

    ``rows``: how many rows ``fields`` stands for (a table without columns has none of its own).
    ``order``: the member order (the index mapping's :attr:`~shardstore.segments.mapping.Mapping.order`;
    without it, the columns' own order).
    """
    n = fields.num_rows if rows is None else rows
    present = [name for name in in_source_order(fields.column_names, order) if fields.column(name).null_count < n]
    table = pa.Table.from_arrays([pa.nulls(n, pa.string()), *(fields.column(p) for p in present)],
                                 names=["_id", *present])
    return sources_from_table(table, drop_empty=True)[1]  # a row without any o.* field has no "o"


def index_op_fields(idx: pa.Table, mapping: Mapping, *, dynamic: bool = True) -> tuple[pa.Table, Mapping]:
    """The field columns of index operations: their typed ``fields`` where they carry them, else their parsed JSON.

    Returns ``(fields, mapping)`` as :func:`~shardstore.segments.mapping.parse_sources`
    does.  ``dynamic=False`` leaves typed fields the mapping lacks out (as the parse
    ignores unmapped JSON fields then).
    """
    typed = fields_of(idx)
    if typed is None:
        return parse_sources(idx.column("id").combine_chunks(), idx.column("source").combine_chunks(), mapping,
                             dynamic=dynamic)
    if not dynamic:
        typed = typed.select([name for name in typed.column_names if name in mapping])
    has = pc.is_valid(idx.column(FIELDS_COLUMN))
    if isinstance(has, pa.ChunkedArray):
        has = has.combine_chunks()  # the positions below are concatenated as arrays
    if pc.all(has).as_py():
        return conform_fields(typed, mapping, idx.num_rows)
    # mixed (a replay spanning plain and typed operations): each part its own way, then the input order again
    pos = pa.array(np.arange(idx.num_rows), pa.int64())
    t_pos, s_pos = pos.filter(has), pos.filter(pc.invert(has))
    plain = idx.take(s_pos)
    parsed, mapping = parse_sources(plain.column("id").combine_chunks(), plain.column("source").combine_chunks(),
                                    mapping, dynamic=dynamic)
    conformed, mapping = conform_fields(typed.take(t_pos) if typed.num_columns else typed, mapping, len(t_pos))
    parsed, mapping = conform_fields(parsed, mapping, len(s_pos))  # the typed part may have added fields
    both = pa.concat_tables([parsed, conformed])
    return both.take(pc.sort_indices(pa.concat_arrays([s_pos, t_pos]))), mapping


def fill_sources(rows: pa.Table, order: Sequence[str] | None = None) -> pa.Table:
    """Segment rows (base columns + fields) whose null ``_source`` is rebuilt from their fields, members in ``order``.

    A null ``_source``: a synthetic-source index's row, or a stored-source row its fields rebuild
    byte for byte (:mod:`~shardstore.segments.source_keep`).
    """
    src = rows.column("_source")
    if src.null_count == 0:
        return rows
    fields = rows.drop_columns([c for c in rows.column_names if c in BASE_SCHEMA.names])
    rebuilt = pc.coalesce(src, synthesize_sources(fields, rows.num_rows, order))
    return rows.set_column(rows.schema.get_field_index("_source"), "_source", rebuilt)


def row_source(row: dict, order: Sequence[str] | None = None) -> bytes:
    """The JSON ``_source`` of ONE segment row (``to_pylist`` form: base columns + fields), rebuilt in Python.

    A point read's path (``ShardDirectory.get``): the columnar writer costs about a millisecond of
    kernel calls for one row.  The document parses to what :func:`synthesize_sources` writes
    (same members, order and values; a float's digits may be spelled differently, its value not):
    ``tests/segments/test_source_keep.py`` checks both on generated rows.
    """
    doc: dict = {}
    for name, parents, leaf in _source_members(tuple(row), tuple(order) if order else None):
        value = row[name]
        if value is None:
            continue
        if isinstance(value, _dt.datetime):
            value = (f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:"
                     f"{value.second:02d}.{value.microsecond // 1000:03d}Z")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


_BASE_NAMES = frozenset(BASE_SCHEMA.names)


@functools.lru_cache(maxsize=256)
def _source_members(names: tuple[str, ...], order: tuple[str, ...] | None) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """A row's fields in source order, each as (name, parent members, leaf): :func:`row_source`'s plan, made once
    per shape of row and mapping order (the sort and splits cost about a third of a rebuild)."""
    out = []
    for name in in_source_order([n for n in names if n not in _BASE_NAMES], order):
        *parents, leaf = name.split(".")
        out.append((name, tuple(parents), leaf))
    return tuple(out)


def op_sources(ops: pa.Table, order: Sequence[str] | None = None) -> pa.ChunkedArray | pa.Array:
    """The ``source`` of each operation, rebuilt from its typed ``fields`` (members in ``order``) where it has none
    (null for deletes)."""
    src = ops.column("source")
    typed = fields_of(ops)
    if typed is None or src.null_count == 0:
        return src
    rebuilt = synthesize_sources(typed, ops.num_rows, order)
    return pc.if_else(pc.is_valid(ops.column(FIELDS_COLUMN)), pc.coalesce(src, rebuilt), src)
