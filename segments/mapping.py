"""Index mappings and the columnar parser of JSON sources.

A :class:`Mapping` maps dotted field names to a :class:`FieldType`.  Objects are not
fields of their own: ``{"o": {"a": 1}}`` maps ``o.a``, and ``o`` is an *object path*.
A name is never both a field and an object path.

:func:`parse_sources` turns a batch of JSON sources into one typed Arrow column per
mapped field (nulls where a document has no value), extending the mapping with the
new fields when ``dynamic`` is true.  The fast path is one ``pyarrow.json.read_json``
over the newline-joined sources, with the known fields as explicit schema; Python
parses documents one by one only on the error path (to name the offending document)
and for the rare values pyarrow's reader refuses although they are valid (then the
batch is parsed by the Python reference path, with the same rules).

Decisions (dynamic mapping, close to OpenSearch's defaults):

* integer numbers -> ``long``; numbers with a fraction or an exponent -> ``double``; a
  new field seeing both in one batch -> ``double``.  Integers outside int64 are refused.
* ``true``/``false`` -> ``boolean``.
* strings -> ``keyword`` (exact value, filterable, with Parquet min/max; no analysed
  ``text`` + ``keyword`` pair: full-text search is not what the segment columns are
  for).  A new string field whose every value in the batch is an ISO-8601 date
  (``yyyy-MM-dd``, optionally ``THH:mm[:ss[.fraction]]`` and ``Z``/``±hh:mm``) -> ``date``.
  ``text`` exists for explicit mappings and is stored exactly as ``keyword``.
* ``date`` is ``timestamp[ms, UTC]``; values are ISO-8601 strings (naive -> UTC).
  Numbers (epoch millis) are refused for dates.
* objects are flattened to dotted names; keys holding dots (``{"a.b": 1}``) are the
  same field as ``{"a": {"b": 1}}``; ``null`` means absent and a field only ever seen
  as ``null`` is not mapped.
* coercion is strict: a value must have the mapped JSON kind (``"12"`` does not fit
  ``long``, ``12`` does not fit ``keyword``); the one widening is an integer into a
  ``double`` field.
* **arrays are refused**: a value that is a JSON array (of scalars or not, empty or
  not) raises :class:`MappingConflict` with found type ``array``.  Segment columns
  stay scalar so Parquet min/max statistics and Spark/DuckDB filter pushdown work on
  them; a multi-valued field type may come later as a type of its own.
* field names starting with ``_`` that are metadata columns (``_id``, ``_source``...)
  and empty names are refused (:class:`InvalidDocument`).
* with ``dynamic=False`` unmapped fields are ignored (kept in ``_source`` only, not
  checked, no column).
"""

from __future__ import annotations

import datetime as _dt
import enum
import functools
import json
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from shardstore.core.arrays import one_array
from shardstore.segments.source_json import sources_from_table

from .errors import InvalidDocument, MappingConflict

__all__ = [
    "DATE_RANGE_MS",
    "FieldType",
    "INTEGER_RANGE",
    "LONG_RANGE",
    "Mapping",
    "json_default",
    "METADATA_FIELDS",
    "parse_sources",
    "sources_from_pylist",
    "sources_from_table",
]

#: Column names reserved by the segment format; a source may not hold them.
METADATA_FIELDS = frozenset({"_id", "_seq_no", "_primary_term", "_version", "_source",
                             "__shardstore_live__"})  # the last one: the live-docs column of filtered scans
#: The key of :meth:`Mapping.to_dict` that lists the fields in the order the index first saw them.
ORDER_KEY = "_order"

_DATE_ARROW = pa.timestamp("ms", tz="UTC")
_DATE_RE = r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
_DATE_PY_RE = re.compile(_DATE_RE)


class FieldType(str, enum.Enum):
    """The type of a mapped field; its value is the OpenSearch type name."""

    KEYWORD = "keyword"
    TEXT = "text"
    LONG = "long"
    INTEGER = "integer"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    DATE = "date"

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type a column of this field type has in a segment."""
        return _ARROW_TYPES[self]

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


_ARROW_TYPES = {
    FieldType.KEYWORD: pa.string(),
    FieldType.TEXT: pa.string(),
    FieldType.LONG: pa.int64(),
    FieldType.INTEGER: pa.int32(),
    FieldType.DOUBLE: pa.float64(),
    FieldType.BOOLEAN: pa.bool_(),
    FieldType.DATE: _DATE_ARROW,
}


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
        raise InvalidDocument(None, None, f"invalid field name {name!r}")
    if name.split(".", 1)[0] in METADATA_FIELDS:
        raise InvalidDocument(None, None, f"field name {name!r} is a metadata field")


@dataclass(frozen=True)
class Mapping:
    """Immutable field name (dotted) -> :class:`FieldType`; fields kept sorted by name.

    ``order``: the field names in the order the index first saw them (the order given, by
    default), which is the member order of a document's ``_source`` rebuilt from its fields
    (docs/design/segments.md, "Stored source without a second copy").  It only grows at the
    end: :meth:`with_fields` and :meth:`merged` append.  It does not take part in equality.
    """

    fields: tuple[tuple[str, FieldType], ...] = ()
    order: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        given = tuple(str(n) for n, _ in self.fields)
        fields = tuple(sorted((str(n), FieldType(t)) for n, t in self.fields))
        object.__setattr__(self, "fields", fields)
        names = [n for n, _ in fields]
        if len(set(names)) != len(names):
            raise ValueError("a field is mapped twice")
        order = tuple(self.order) or given
        if len(order) != len(names) or set(order) != set(names):
            raise ValueError(f"the mapping's field order {list(order)} does not list its fields {names} once each")
        object.__setattr__(self, "order", order)
        leaves = set(names)
        for n in names:
            _check_name(n)
            parts = n.split(".")
            for i in range(1, len(parts)):
                if ".".join(parts[:i]) in leaves:
                    raise MappingConflict(".".join(parts[:i]), None, _ARROW_NAME[FieldType(dict(fields)[".".join(parts[:i])])], "object")

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mapping:
        """OpenSearch style ``{"properties": {...}}`` (nested objects with their own
        ``properties``) or flat ``{"a.b": "long"}`` / ``{"a.b": {"type": "long"}}``."""
        out: dict[str, FieldType] = {}

        def walk(prefix: str, props: dict[str, Any]) -> None:
            for key, spec in props.items():
                name = f"{prefix}{key}"
                if isinstance(spec, str):
                    out[name] = FieldType(spec)
                elif isinstance(spec, dict) and "properties" in spec:
                    if spec.get("type", "object") != "object":
                        raise ValueError(f"field {name!r}: properties given for type {spec['type']!r}")
                    walk(name + ".", spec["properties"])
                elif isinstance(spec, dict) and spec.get("type") == "object":
                    continue  # an object without fields maps nothing
                elif isinstance(spec, dict) and "type" in spec:
                    out[name] = FieldType(spec["type"])
                else:
                    raise ValueError(f"field {name!r}: cannot read mapping {spec!r}")

        order = data.get(ORDER_KEY) if isinstance(data, dict) else None
        if order is not None:
            data = {k: v for k, v in data.items() if k != ORDER_KEY}
            if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
                raise ValueError(f"mapping {ORDER_KEY}: expected a list of field names, got {order!r}")
        if set(data) == {"properties"} and isinstance(data["properties"], dict):
            walk("", data["properties"])
        else:
            walk("", data)
        return cls(tuple(out.items()), order=tuple(order or ()))

    def to_dict(self) -> dict[str, Any]:
        """OpenSearch style nested ``{"properties": ...}``; :meth:`from_dict` reads it back."""
        root: dict[str, Any] = {}
        for name, ftype in self.fields:
            node = root
            *parents, leaf = name.split(".")
            for p in parents:
                node = node.setdefault(p, {"properties": {}})["properties"]
            node[leaf] = {"type": ftype.value}
        out: dict[str, Any] = {"properties": root}
        if list(self.order) != [n for n, _ in self.fields]:  # sorted order needs no word (and older readers)
            out[ORDER_KEY] = list(self.order)
        return out

    # -- access ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.fields)

    def __iter__(self) -> Iterator[str]:
        return (n for n, _ in self.fields)

    def __contains__(self, name: object) -> bool:
        return name in self._dict

    def __getitem__(self, name: str) -> FieldType:
        return self._dict[name]

    def get(self, name: str, default: FieldType | None = None) -> FieldType | None:
        """The type of field ``name`` (``default`` when unmapped)."""
        return self._dict.get(name, default)

    def items(self) -> tuple[tuple[str, FieldType], ...]:
        """``(name, type)`` pairs, in mapping order."""
        return self.fields

    @property
    def _dict(self) -> dict[str, FieldType]:
        d = self.__dict__.get("_cache_dict")
        if d is None:
            d = dict(self.fields)
            object.__setattr__(self, "_cache_dict", d)
        return d

    @property
    def object_paths(self) -> frozenset[str]:
        """Every proper prefix of a dotted field name (``o`` for ``o.a``)."""
        d = self.__dict__.get("_cache_objects")
        if d is None:
            d = frozenset(".".join(n.split(".")[:i]) for n in self for i in range(1, n.count(".") + 1))
            object.__setattr__(self, "_cache_objects", d)
        return d

    def with_fields(self, new: dict[str, FieldType]) -> Mapping:
        """This mapping with ``new`` fields added (or retyped)."""
        mine = self._dict
        if not new or all(mine.get(n) is t for n, t in new.items()):  # nothing new: no rebuild, no re-validation
            return self
        return Mapping(tuple({**mine, **new}.items()), order=self.order + tuple(n for n in new if n not in mine))

    def merged(self, other: Mapping) -> Mapping:
        """This mapping plus the fields of ``other``; MappingConflict if one field has two types."""
        mine = self._dict
        for name, ftype in other.fields:
            have = mine.get(name)
            if have is not None and have is not ftype:
                raise MappingConflict(name, None, have.value, ftype.value)
        theirs = other._dict
        return self.with_fields({n: theirs[n] for n in other.order if n not in mine})

    def arrow_schema(self) -> pa.Schema:
        """Flat schema of the field columns (dotted names), as stored in a segment."""
        return pa.schema([pa.field(n, t.arrow_type) for n, t in self.fields])

    def json_schema(self) -> pa.Schema:
        """Nested (struct) schema of the fields, as a JSON reader sees the sources."""
        tree: dict[str, Any] = {}
        for name, ftype in self.fields:
            node = tree
            *parents, leaf = name.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = ftype.arrow_type

        def build(node: dict[str, Any]) -> list[pa.Field]:
            return [pa.field(k, pa.struct(build(v)) if isinstance(v, dict) else v) for k, v in node.items()]

        return pa.schema(build(tree))

    def __hash__(self) -> int:
        return hash(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self.fields == other.fields

    def __getstate__(self) -> dict[str, Any]:
        return {"fields": self.fields}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "fields", state["fields"])


_ARROW_NAME = {t: t.value for t in FieldType}


# ---------------------------------------------------------------------------------------
# The parser.
# ---------------------------------------------------------------------------------------

class _SlowPath(Exception):
    """The fast path cannot decide; parse document by document."""


def _check_ids(ids: pa.Array, sources: pa.Array) -> tuple[pa.Array, pa.Array]:
    if isinstance(ids, pa.ChunkedArray):
        ids = one_array(ids)
    if isinstance(sources, pa.ChunkedArray):
        sources = one_array(sources)
    if len(ids) != len(sources):
        raise InvalidDocument(None, None, f"{len(ids)} ids for {len(sources)} sources")
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        ids = ids.cast(pa.string())
    bad = pc.or_kleene(pc.is_null(ids), pc.equal(pc.binary_length(ids), 0))
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        raise InvalidDocument(i, ids[i].as_py(), "missing or empty _id")
    if not (pa.types.is_binary(sources.type) or pa.types.is_large_binary(sources.type)):
        sources = sources.cast(pa.binary()) if pa.types.is_string(sources.type) or pa.types.is_large_string(sources.type) else sources
    if sources.null_count:
        i = pc.index(pc.is_null(sources), True).as_py()
        raise InvalidDocument(i, ids[i].as_py(), "no source")
    return ids, sources


def _joined(sources: pa.Array) -> tuple[pa.Buffer, int]:
    """Sources with raw CR/LF turned to spaces (only whitespace may hold them in valid
    JSON), one per line, as one buffer; also the longest line."""
    if pc.any(pc.match_substring(sources, "\n")).as_py():
        sources = pc.replace_substring(sources, "\n", " ")
    if pc.any(pc.match_substring(sources, "\r")).as_py():
        sources = pc.replace_substring(sources, "\r", " ")
    lines = pc.binary_join_element_wise(sources, pa.scalar(b"", pa.binary()), b"\n")
    width = 8 if pa.types.is_large_binary(lines.type) else 4
    fmt = "<q" if width == 8 else "<i"
    offsets = lines.buffers()[1]
    start = struct.unpack_from(fmt, offsets, lines.offset * width)[0]
    end = struct.unpack_from(fmt, offsets, (lines.offset + len(lines)) * width)[0]
    longest = pc.max(pc.binary_length(lines)).as_py() or 0
    return lines.buffers()[2][start:end], longest


def _flatten(prefix: str, arr: pa.Array | pa.ChunkedArray, out: list[tuple[str, pa.ChunkedArray]]) -> None:
    """Struct columns to dotted leaf columns (a null struct makes its children null)."""
    if pa.types.is_struct(arr.type):
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        flat = [c.flatten() for c in chunks]  # children with the parent's nulls applied
        for i in range(arr.type.num_fields):
            f = arr.type.field(i)
            _flatten(f"{prefix}{f.name}.", pa.chunked_array([k[i] for k in flat], f.type), out)
    else:
        if not isinstance(arr, pa.ChunkedArray):
            arr = pa.chunked_array([arr], arr.type)
        out.append((prefix[:-1], arr))


def json_kind_of(t: pa.DataType) -> str:
    """The JSON kind an Arrow column type's values write as (``long``, ``double``, ``keyword``...), or the type's name."""
    if pa.types.is_integer(t):
        return "long"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        return "date"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "keyword"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "array"
    if pa.types.is_struct(t):
        return "object"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def _first_valid(col: pa.ChunkedArray) -> int:
    return pc.index(pc.is_valid(col), True).as_py()


def parse_sources(
    ids: pa.Array,
    sources: pa.Array,
    mapping: Mapping,
    *,
    dynamic: bool = True,
) -> tuple[pa.Table, Mapping]:
    """Parse JSON object sources into one typed column per mapped field.

    Returns ``(table, mapping)``: ``table`` has one column per field of the returned
    mapping (dotted names, :meth:`Mapping.arrow_schema` order, nulls where absent) and
    ``mapping`` is ``mapping`` plus the fields this batch added (``dynamic``).

    Raises :class:`MappingConflict` (field, document id, mapped and found types) or
    :class:`InvalidDocument` (document index and id); nothing is returned then, so
    nothing of the batch can be applied.
    """
    ids, sources = _check_ids(ids, sources)
    n = len(ids)
    if n == 0:
        return mapping.arrow_schema().empty_table(), mapping
    try:
        return _parse_fast(ids, sources, mapping, dynamic)
    except _SlowPath:
        return _parse_python(ids, sources, mapping, dynamic)


def _read(buf: pa.Buffer, longest: int, schema: pa.Schema, dynamic: bool) -> pa.Table:
    block = max(1 << 20, longest + 1)
    po = pajson.ParseOptions(
        explicit_schema=schema if len(schema) else None,
        unexpected_field_behavior="infer" if dynamic else "ignore",
    )
    try:
        return pajson.read_json(pa.BufferReader(buf), read_options=pajson.ReadOptions(block_size=block), parse_options=po)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _SlowPath(str(exc)) from exc


def _parse_fast(ids: pa.Array, sources: pa.Array, mapping: Mapping, dynamic: bool) -> tuple[pa.Table, Mapping]:
    n = len(ids)
    buf, longest = _joined(sources)
    table = _read(buf, longest, mapping.json_schema(), dynamic)
    if table.num_rows != n:
        raise _SlowPath("row count")
    flat: list[tuple[str, pa.ChunkedArray]] = []
    for name, col in zip(table.column_names, table.columns):
        _flatten(name + ".", col, flat)

    columns: dict[str, pa.ChunkedArray] = {}
    new: dict[str, FieldType] = {}
    reread = False
    for name, col in flat:
        if not name or any(not p for p in name.split(".")) or name.split(".", 1)[0] in METADATA_FIELDS:
            if col.null_count == len(col) and name:
                continue
            i = _first_valid(col) if col.null_count < len(col) else 0
            raise InvalidDocument(i, ids[i].as_py(), f"field name {name!r} is empty or a metadata field")
        kind = json_kind_of(col.type)
        mapped = mapping.get(name)
        if kind == "null":
            continue
        if mapped is None and dynamic and col.null_count == len(col):
            continue
        if kind == "array":
            i = _first_valid(col)
            raise MappingConflict(name, ids[i].as_py(), mapped.value if mapped else "(unmapped)", "array")
        if mapped is None:
            if not dynamic:
                continue
            if name in mapping.object_paths:
                i = _first_valid(col)
                raise MappingConflict(name, ids[i].as_py(), "object", kind)
            if kind == "keyword":
                valid = pc.drop_null(col)
                if len(valid) and pc.all(pc.match_substring_regex(valid, _DATE_RE)).as_py():
                    kind = "date"
                    reread = True
            elif kind == "date":
                reread = True  # inferred as naive timestamp[s]: re-read as ms UTC
            ftype = FieldType(kind)
            if name in new and new[name] != ftype:
                raise _SlowPath("two spellings of one field")
            new[name] = ftype
        else:
            ftype = mapped
        if name in columns:
            # ``{"a.b": 1}`` next to ``{"a": {"b": 2}}``: one field.
            if columns[name].type != col.type:
                raise _SlowPath("two spellings of one field")
            columns[name] = pc.coalesce(columns[name], col)
        else:
            columns[name] = col

    if new:
        # A new field may sit below a new (or mapped) leaf: {"a": 1} and {"a": {"b": 1}}.
        try:
            extended = mapping.with_fields(new)
        except MappingConflict:
            raise _SlowPath("object and scalar") from None
    else:
        extended = mapping
    redone: dict[str, pa.ChunkedArray] = {}  # re-read columns (their dates are range-checked on the way)
    if reread:
        table2 = _read(buf, longest, extended.json_schema(), dynamic)
        if table2.num_rows != n:
            raise _SlowPath("row count")
        flat = []
        for name, col in zip(table2.column_names, table2.columns):
            _flatten(name + ".", col, flat)
        for name, col in flat:
            if name in new and new[name] is FieldType.DATE:
                if col.type != _DATE_ARROW or not _dates_in_range(col):
                    raise _SlowPath(f"{name}: {col.type} on re-read, or a date outside years 1-9999")
                redone[name] = pc.coalesce(redone[name], col) if name in redone else col
        columns.update(redone)

    out = []
    for name, ftype in extended.fields:
        col = columns.get(name)
        want = ftype.arrow_type
        if (ftype is FieldType.DATE and col is not None and col.type == _DATE_ARROW and name not in redone
                and not _dates_in_range(col)):  # (a re-read date column was checked above)
            raise _SlowPath(f"{name}: a date outside years 1-9999")  # the Python path names the document
        if col is None:
            out.append(pa.chunked_array([pa.nulls(n, want)], want))
            continue
        if col.type != want:
            found = json_kind_of(col.type)
            ok = (found == "long" and ftype in (FieldType.LONG, FieldType.INTEGER, FieldType.DOUBLE)) or (
                found == "double" and ftype is FieldType.DOUBLE) or (
                found == "keyword" and ftype in (FieldType.KEYWORD, FieldType.TEXT)) or (found == "date" and ftype is FieldType.DATE)
            if not ok:
                raise _SlowPath(f"{name}: {col.type} for {ftype.value}")
            try:
                col = col.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise _SlowPath(f"{name}: cast") from None
        out.append(col)
    return pa.Table.from_arrays(out, schema=extended.arrow_schema()), extended


# ---------------------------------------------------------------------------------------
# The Python reference path: error messages, and values the Arrow reader refuses.
# ---------------------------------------------------------------------------------------

#: The values a ``long`` and an ``integer`` field hold.
LONG_RANGE = _INT64 = (-(1 << 63), (1 << 63) - 1)
INTEGER_RANGE = _INT32 = (-(1 << 31), (1 << 31) - 1)


#: Dates Python's ``datetime`` can hold (years 1 to 9999), in ms since the epoch: the range a date field keeps.
DATE_RANGE_MS = _DATE_MIN_MS, _DATE_MAX_MS = -62135596800000, 253402300799999
_DATE_READ = pajson.ParseOptions(explicit_schema=pa.schema([("d", _DATE_ARROW)]))


@functools.lru_cache(maxsize=8192)
def _date_ms(value: str) -> int | None:
    """``value`` read as a date by the very reader of the fast path (ms since the epoch), or None.

    One grammar for both paths (issue 15 review): the Python path asks the Arrow JSON
    reader, so a value is a date, or not, whichever path a batch takes; and only dates
    of years 1 to 9999 are kept (a year 0 date made every later read raise).
    """
    try:
        t = pajson.read_json(pa.BufferReader(json.dumps({"d": value}).encode("utf-8")), parse_options=_DATE_READ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    ms = t.column(0).cast(pa.int64())[0].as_py()
    return ms if ms is not None and _DATE_MIN_MS <= ms <= _DATE_MAX_MS else None


def _dates_in_range(col: pa.ChunkedArray) -> bool:
    """True when every date of ``col`` (timestamp[ms, UTC]) lies in years 1 to 9999."""
    mm = pc.min_max(col.cast(pa.int64()))
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return lo is None or (_DATE_MIN_MS <= lo and hi <= _DATE_MAX_MS)


def _py_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if _INT64[0] <= value <= _INT64[1] else "big integer"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "date" if _DATE_PY_RE.match(value) and _date_ms(value) is not None else "keyword"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _fits(ftype: FieldType, value: Any) -> bool:
    if ftype is FieldType.DATE:  # a mapped date takes what the reader takes (not only what inference calls a date)
        return isinstance(value, str) and _date_ms(value) is not None
    kind = _py_kind(value)
    if ftype in (FieldType.KEYWORD, FieldType.TEXT):
        return kind in ("keyword", "date")
    if ftype is FieldType.LONG:
        return kind == "long"
    if ftype is FieldType.INTEGER:
        return kind == "long" and _INT32[0] <= value <= _INT32[1]
    if ftype is FieldType.DOUBLE:
        return kind in ("long", "double") or (kind == "big integer")
    if ftype is FieldType.BOOLEAN:
        return kind == "boolean"
    if ftype is FieldType.DATE:
        return kind == "date"
    return False


def _py_flatten(prefix: str, obj: dict[str, Any], out: dict[str, Any], objects: set[str]) -> bool:
    """Dotted leaves of ``obj`` into ``out``, object paths into ``objects``; True if ``obj`` holds a value.

    An object holding no value (``{}``, ``{"x": null}``) is absent, as ``null`` is: it leaves
    no object path, so a later mapping of that name as a scalar never makes an acknowledged
    document unreplayable (the Arrow reader of the fast path sees no field in it either).
    """
    any_value = False
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            if not _py_flatten(name + ".", value, out, objects):
                continue
            objects.add(name)
        elif value is None:
            continue
        else:
            out[name] = value
        any_value = True
        # a dotted key implies its parents are objects
        parts = name.split(".")
        for i in range(1, len(parts)):
            objects.add(".".join(parts[:i]))
    return any_value


def _parse_python(ids: pa.Array, sources: pa.Array, mapping: Mapping, dynamic: bool) -> tuple[pa.Table, Mapping]:
    id_list = ids.to_pylist()
    docs: list[dict[str, Any]] = []
    doc_objects: dict[str, int] = {}  # object path -> first document holding it
    for i, (doc_id, raw) in enumerate(zip(id_list, sources.to_pylist())):
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidDocument(i, doc_id, f"invalid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise InvalidDocument(i, doc_id, f"source is a JSON {type(obj).__name__}, not an object")
        flat: dict[str, Any] = {}
        objects: set[str] = set()
        _py_flatten("", obj, flat, objects)
        for name in list(flat) + sorted(objects):
            if any(not p for p in name.split(".")) or name.split(".", 1)[0] in METADATA_FIELDS:
                raise InvalidDocument(i, doc_id, f"field name {name!r} is empty or a metadata field")
        docs.append(flat)
        for name in objects:
            doc_objects.setdefault(name, i)
        # objects where a scalar is mapped
        for name in objects:
            mapped = mapping.get(name)
            if mapped is not None:
                raise MappingConflict(name, doc_id, mapped.value, "object")

    # pass 1: mapped fields, and kinds of new fields
    new_kinds: dict[str, tuple[str, int]] = {}  # name -> (kind, first doc)
    new_values: dict[str, list[tuple[int, Any]]] = {}
    for i, flat in enumerate(docs):
        for name, value in flat.items():
            mapped = mapping.get(name)
            if mapped is not None:
                if not _fits(mapped, value):
                    raise MappingConflict(name, id_list[i], mapped.value, _py_kind(value))
                continue
            if name in mapping.object_paths:
                raise MappingConflict(name, id_list[i], "object", _py_kind(value))
            if not dynamic:
                continue
            kind = _py_kind(value)
            if kind in ("array", "big integer") or kind not in {t.value for t in FieldType}:
                raise MappingConflict(name, id_list[i], "(unmapped)", kind)
            new_values.setdefault(name, []).append((i, value))
            if name not in new_kinds:
                new_kinds[name] = (kind, i)
                continue
            prev = new_kinds[name][0]
            if prev == kind:
                continue
            merged = {frozenset({"long", "double"}): "double", frozenset({"date", "keyword"}): "keyword"}.get(frozenset({prev, kind}))
            if merged is None:
                raise MappingConflict(name, id_list[i], prev, kind)
            new_kinds[name] = (merged, new_kinds[name][1])
    # new fields against each other (a scalar here, an object there)
    new = {name: FieldType(k) for name, (k, _) in new_kinds.items()}
    all_objects: dict[str, int] = dict(doc_objects) if dynamic else {}
    for name, (_, first) in new_kinds.items():
        parts = name.split(".")
        for j in range(1, len(parts)):
            all_objects.setdefault(".".join(parts[:j]), first)
    for name in new:
        if name in all_objects:
            i = max(all_objects[name], new_kinds[name][1])
            first_kind = new[name].value if new_kinds[name][1] <= all_objects[name] else "object"
            raise MappingConflict(name, id_list[i], first_kind, "object" if first_kind != "object" else new[name].value)
    for name, first in all_objects.items():
        if name in mapping:
            raise MappingConflict(name, id_list[first], mapping[name].value, "object")
    extended = mapping.with_fields(new)

    n = len(docs)
    cols = []
    for name, ftype in extended.fields:
        vals: list[Any] = [None] * n
        for i, flat in enumerate(docs):
            v = flat.get(name)
            if v is None:
                continue
            if ftype is FieldType.DATE:
                v = _date_ms(v)
            elif ftype is FieldType.DOUBLE:
                v = float(v)
            vals[i] = v
        if ftype is FieldType.DATE:
            cols.append(pa.array(vals, pa.int64()).cast(_DATE_ARROW))
        else:
            cols.append(pa.array(vals, ftype.arrow_type))
    return pa.Table.from_arrays(cols, schema=extended.arrow_schema()), extended


# ---------------------------------------------------------------------------------------
# Sources from Python documents or Arrow tables.
# ---------------------------------------------------------------------------------------

def json_default(value: Any) -> Any:
    """The JSON form of the non-JSON values a Python document may hold (datetime, date, UTF-8 bytes)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8")
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def sources_from_pylist(docs: Iterable[dict[str, Any]]) -> tuple[pa.Array, pa.Array]:
    """``[{"_id": "1", "a": 1, ...}]`` -> ``(ids: string, sources: binary JSON)``.

    The source is the document without ``_id``.  A document without a usable ``_id``
    raises :class:`InvalidDocument`.
    """
    ids: list[Any] = []
    out: list[bytes] = []
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=json_default).encode
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InvalidDocument(i, None, f"document is a {type(doc).__name__}, not a dict")
        doc_id = doc.get("_id")
        if not isinstance(doc_id, str) or not doc_id:
            raise InvalidDocument(i, None if doc_id is None else str(doc_id), "missing or empty _id")
        ids.append(doc_id)
        if "_id" in doc:
            doc = {k: v for k, v in doc.items() if k != "_id"}
        out.append(dumps(doc).encode("utf-8"))
    return pa.array(ids, pa.string()), pa.array(out, pa.binary())
