"""Parse a bulk's sources against an index mapping item by item: the items that fit, and why each other one does not.

:func:`~shardstore.segments.mapping.parse_sources` decides a whole batch at once and
refuses it on its first bad document.  A bulk wants per-item answers, decided once per
index (issue 15, item 5): :func:`parse_items` parses the whole batch in one columnar
pass and, only when that fails, splits the batch in halves, parsing the left half first
and the right half against the mapping the left half produced, down to the single items
that fail.  ``k`` bad items in ``n`` cost about ``k * log2(n)`` extra parses of shrinking
ranges; a clean bulk costs exactly one parse.  Because halves are decided left to right,
the first item to bring a new field decides its type, as if items were applied in order.

A range whose new mapping would exceed ``max_fields`` fails like a conflict, so the item
that adds the field over the limit is the one rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from shardstore.segments.errors import InvalidDocument, MappingConflict
from shardstore.segments.mapping import Mapping, parse_sources

__all__ = ["ItemFailure", "ParsedItems", "parse_items"]


@dataclass(frozen=True)
class ItemFailure:
    """Why one item (its place in the batch) was refused: the field at fault (or None) and the rule."""

    position: int
    field: str | None
    rule: str


@dataclass(frozen=True)
class ParsedItems:
    """The items that fit (``keep``: their places, ascending), their field columns, the mapping and the failures."""

    keep: pa.Array  # int64
    fields: pa.Table  # one row per kept item, ``mapping.arrow_schema()``
    mapping: Mapping
    failures: tuple[ItemFailure, ...]


class _TooManyFields(Exception):
    pass


def _failure(position: int, exc: Exception, max_fields: int | None) -> ItemFailure:
    if isinstance(exc, MappingConflict):
        return ItemFailure(position, exc.field, f"a value of type {exc.found} conflicts with the mapped type "
                                                f"{exc.mapped}")
    if isinstance(exc, InvalidDocument):
        return ItemFailure(position, None, exc.reason)
    return ItemFailure(position, None, f"the index mapping would exceed {max_fields} fields")


def parse_items(ids: pa.Array, sources: pa.Array, mapping: Mapping, *, dynamic: bool = True,
                max_fields: int | None = None) -> ParsedItems:
    """Parse every item that fits ``mapping`` (extended in item order); the rest become :class:`ItemFailure`."""
    pieces: list[tuple[int, int, pa.Table]] = []
    failures: list[ItemFailure] = []

    def attempt(lo: int, hi: int, m: Mapping) -> Mapping:
        try:
            table, out = parse_sources(ids.slice(lo, hi - lo), sources.slice(lo, hi - lo), m, dynamic=dynamic)
            if max_fields is not None and len(out) > max(max_fields, len(m)):
                raise _TooManyFields()
        except (MappingConflict, InvalidDocument, _TooManyFields) as exc:
            if hi - lo == 1:
                failures.append(_failure(lo, exc, max_fields))
                return m
            mid = (lo + hi) // 2
            return attempt(mid, hi, attempt(lo, mid, m))
        pieces.append((lo, hi, table))
        return out

    n = len(ids)
    final = attempt(0, n, mapping) if n else mapping
    schema = final.arrow_schema()
    tables = []
    keep: list[pa.Array] = []
    for lo, hi, table in pieces:
        cols = [table.column(f.name) if f.name in table.column_names else pa.nulls(hi - lo, f.type) for f in schema]
        tables.append(pa.Table.from_arrays(cols, schema=schema))
        keep.append(pa.array(range(lo, hi), pa.int64()))
    fields = pa.concat_tables(tables) if tables else schema.empty_table()
    kept = pa.concat_arrays(keep) if keep else pa.array([], pa.int64())
    return ParsedItems(kept, fields, final, tuple(failures))
