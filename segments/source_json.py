"""JSON sources from an Arrow table, built columnar: the stored ``_source`` of a table bulk.

Each field column becomes its JSON text with Arrow string kernels (numbers cast, strings
escaped through their dictionary when few are distinct, timestamps as ISO-8601 UTC with
milliseconds), and one ``binary_join_element_wise`` joins the members of each row
(:func:`_object_json`).  Nothing loops per document in Python.

A table of at least ``2 * PARALLEL_ROWS`` rows is cut into contiguous slices, one per core,
built on a thread each (the kernels release the GIL) and concatenated: the join walks
every member of every row and dominates (the 336,776 flights rows: 0.21 s on one core,
0.13 s on two; issue 16; docs/design/segments.md, "Synthetic source and the one-go
ingest").  The bytes are the same either way.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidDocument

__all__ = ["PARALLEL_ROWS", "sources_from_table"]

#: Rows per slice of a parallel build (a table of fewer than twice this is built on the caller's thread).
PARALLEL_ROWS = 65_536
_DATE_MS = pa.timestamp("ms", tz="UTC")

#: Characters a JSON string literal must escape (backslash, quote, control characters).
_JSON_SPECIAL = '[\\\\"\\x00-\\x1f\\x7f]'
#: Columns at least this long whose first _SAMPLE values hold few distinct strings are escaped
#: through their dictionary: each distinct value once, then one take (about 6x faster on a
#: keyword column such as a carrier code; measured 0.23 -> 0.04 s per 1M values).
_DICT_MIN_ROWS, _SAMPLE = 4096, 1024


def _escape(strings: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray:
    """JSON string literal (with quotes) of each value, columnar."""
    if len(strings) >= _DICT_MIN_ROWS:
        s = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
        if pc.count_distinct(s.slice(0, _SAMPLE)).as_py() * 4 <= _SAMPLE:
            d = s.dictionary_encode()
            out = _escape(d.dictionary).take(d.indices)  # null indices stay null
            return pa.chunked_array([out]) if isinstance(strings, pa.ChunkedArray) else out
    s = strings
    if pc.any(pc.match_substring_regex(s, _JSON_SPECIAL)).as_py():  # one scan for the common case
        if pc.any(pc.match_substring(s, "\\")).as_py():
            s = pc.replace_substring(s, "\\", "\\\\")
        if pc.any(pc.match_substring(s, '"')).as_py():
            s = pc.replace_substring(s, '"', '\\"')
        for c in range(0x20):
            ch = chr(c)
            if pc.any(pc.match_substring(s, ch)).as_py():
                rep = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}.get(ch, f"\\u{c:04x}")
                s = pc.replace_substring(s, ch, rep)
    return pc.binary_join_element_wise('"', s, '"', "")


def _value_json(col: pa.ChunkedArray) -> pa.ChunkedArray:
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if pa.types.is_null(t):  # a column with no value at all: absent from every source
        return pa.chunked_array([pa.nulls(len(col), pa.string())])
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _escape(col.cast(pa.string()))
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return col.cast(pa.string())
    if pa.types.is_floating(t):
        col = col.cast(pa.float64())
        finite = pc.is_finite(col)
        text = col.cast(pa.string())
        # 1.0 is written "1" by the cast: keep it a JSON float, or the field would be mapped long
        text = pc.if_else(pc.match_substring_regex(text, "[.eE]"), text, pc.binary_join_element_wise(text, ".0", ""))
        return pc.if_else(finite, text, pa.scalar(None, pa.string()))
    if pa.types.is_timestamp(t):
        if t.tz is None:
            col = col.cast(pa.timestamp(t.unit, "UTC"))
        # via a naive timestamp: casting a zoned one to text is 20x slower
        naive = col.cast(_DATE_MS).cast(pa.int64()).cast(pa.timestamp("ms"))
        text = pc.replace_substring(naive.cast(pa.string()), " ", "T", max_replacements=1)
        return pc.binary_join_element_wise('"', text, 'Z"', "")
    if pa.types.is_date(t):
        return pc.binary_join_element_wise('"', pc.strftime(col, "%Y-%m-%d"), '"', "")
    raise InvalidDocument(None, None, f"column type {t} cannot be written as a JSON source")


def _object_json(items: list[tuple[str, pa.ChunkedArray | None, dict | None]], n: int, *,
                 empty_is_null: bool = False, drop_empty: bool = False) -> pa.ChunkedArray:
    """JSON objects of the members, one per row, built with a single join of all members.

    A member whose value is null in a row is left out of that row.  ``empty_is_null``: a row
    where no member has a value gets null instead of ``{}``.  ``drop_empty``: the objects of
    dotted names (``a`` of ``a.b``) are built so, and left out of a row holding none of their
    fields (a rebuilt source: the row never had them); without it such a row writes ``"a":{}``,
    as a table bulk's stored JSON always has.  Separators: members
    before the first member present in every row (the anchor) carry a trailing comma,
    members after it a leading one, so no row needs trimming.  A member present in every
    row joins as two pieces (its ``"key":`` literal and its values) without a copy of its
    own; only optional members are joined with their separator first, so that a null
    value drops both.  Without an anchor every member carries a leading comma and the
    first one is trimmed (one more pass).
    """
    values: list[tuple[str, pa.ChunkedArray]] = []
    for key, col, sub in items:
        if sub is not None:
            value = _object_json(list(sub.values()), n, empty_is_null=drop_empty, drop_empty=drop_empty)
        else:
            assert col is not None
            if pa.types.is_struct(col.type):
                value = _object_json(_struct_items(col), n)
                value = pc.if_else(pc.is_valid(col), value, pa.scalar(None, pa.string()))
            else:
                value = _value_json(col)
        values.append((json.dumps(key, ensure_ascii=False) + ":", value))
    if not values:
        return pa.repeat(pa.scalar("{}"), n)
    anchor = next((i for i, (_k, v) in enumerate(values) if v.null_count == 0), None)
    out = _joined(values, anchor)
    if empty_is_null and anchor is None:
        present = values[0][1].is_valid()
        for _key, value in values[1:]:
            present = pc.or_(present, value.is_valid())
        out = pc.if_else(present, out, pa.scalar(None, pa.string()))
    return out


def _joined(values: list[tuple[str, pa.ChunkedArray]], anchor: int | None) -> pa.ChunkedArray:
    """The members' ``"key":value`` pieces joined into one object per row (:func:`_object_json`)."""
    pieces: list[Any] = []
    for i, (key, value) in enumerate(values):
        if i == anchor:
            pieces += [key, value]
        elif anchor is not None and i < anchor:
            pieces.append(pc.binary_join_element_wise(key, value, ",", ""))
        elif value.null_count == 0:
            pieces += ["," + key, value]
        else:
            pieces.append(pc.binary_join_element_wise("," + key, value, ""))
    if anchor is not None:
        # (null_handling="skip" drops rows where every part is null in pyarrow 26: avoid it)
        return pc.binary_join_element_wise("{", *pieces, "}", "", null_handling="replace", null_replacement="")
    body = pc.binary_join_element_wise(*pieces, "", null_handling="replace", null_replacement="")
    return pc.binary_join_element_wise("{", pc.utf8_slice_codeunits(body, 1), "}", "")


def _struct_items(col: pa.ChunkedArray) -> list[tuple[str, pa.ChunkedArray, None]]:
    out = []
    for i in range(col.type.num_fields):
        f = col.type.field(i)
        kid = pa.chunked_array([c.field(i) for c in col.chunks], f.type)
        out.append((f.name, kid, None))
    return out


def sources_from_table(table: pa.Table, *, drop_empty: bool = False) -> tuple[pa.Array, pa.Array]:
    """A table with an ``_id`` column and field columns -> ``(ids, JSON sources)``.

    Columns with dotted names become nested objects (``a.b`` -> ``{"a": {"b": ..}}``; with
    ``drop_empty``, left out of a row where every one of them is null, else ``"a":{}``),
    struct columns nested objects; nulls are left out; NaN/inf are left out (JSON has
    no such numbers); timestamps are written as ISO-8601 UTC with milliseconds.
    Built columnar (Arrow string kernels), not row by row; a large table by slices on a
    thread each (module docstring).
    """
    if "_id" not in table.column_names:
        raise InvalidDocument(None, None, "the table has no _id column")
    ids = table.column("_id").combine_chunks().cast(pa.string())
    n = table.num_rows
    items = _members(table)  # a column naming problem is raised here, before any work
    if n == 0:
        return ids, pa.array([], pa.binary())
    parts = min(os.cpu_count() or 1, n // PARALLEL_ROWS)
    if parts < 2:
        return ids, _binary(_object_json(items, n, drop_empty=drop_empty))
    bounds = [n * i // parts for i in range(parts + 1)]
    slices = [table.slice(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]
    with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="source-json") as pool:
        built = list(pool.map(lambda part: _binary(_object_json(_members(part), part.num_rows, drop_empty=drop_empty)),
                              slices))
    return ids, pa.concat_arrays(built)


def _members(table: pa.Table) -> list[tuple[str, pa.ChunkedArray | None, dict | None]]:
    """The table's field columns as a tree of object members (dotted names nest)."""
    tree: dict[str, Any] = {}
    for name in table.column_names:
        if name == "_id":
            continue
        node = tree
        *parents, leaf = name.split(".")
        for p in parents:
            entry = node.setdefault(p, (p, None, {}))
            if entry[2] is None:
                raise InvalidDocument(None, None, f"column {name!r} sits below the column {p!r}")
            node = entry[2]
        if leaf in node:
            raise InvalidDocument(None, None, f"column {name!r} clashes with another column")
        node[leaf] = (leaf, table.column(name), None)
    return list(tree.values())


def _binary(src: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The built sources as one binary Array."""
    if isinstance(src, pa.ChunkedArray):
        src = src.combine_chunks()
    return src.cast(pa.binary())
