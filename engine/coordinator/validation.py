"""Validation at the door: index names, request arguments and documents, checked before anything is routed,
stamped or created (issue 15).

Pure functions, no I/O.  A request-level problem (a bad index name, ``shards='2'``, a table
whose columns cannot be documents) raises :class:`~shardstore.engine.errors.InvalidRequest`
and nothing happens.  A document-level problem rejects that one item with
:class:`~shardstore.engine.errors.DocumentRejected` naming the field and the rule; the item
gets no seq# and exists on no copy, and the rest of the bulk goes on.

Limits (README "Limits", next to Elasticsearch's):

=====================  ==================================  ===================================
what                   shardstore                          Elasticsearch
=====================  ==================================  ===================================
index name             ES rules, at most 255 UTF-8 bytes   the same
``_id``                1..512 UTF-8 bytes, valid UTF-8     512 bytes
object depth           20 (``a.b.c`` is depth 2)           ``index.mapping.depth.limit`` 20
fields per document    1,000 leaf fields                   (no per-document limit)
fields per index       1,000 mapped fields                 ``index.mapping.total_fields.limit`` 1,000
integers               -2^63 .. 2^63-1 (long)              the same for ``long``
floating point         finite only (no NaN / ±inf)         refused (not JSON)
arrays                 refused (one scalar per field)      allowed
=====================  ==================================  ===================================

Values a Python document may hold: ``None`` (absent), ``bool``, ``int``, ``float``, ``str``,
``dict`` (an object), ``datetime``/``date`` (written ISO-8601), and ``bytes`` that are UTF-8
text.  Anything else (a set, a tuple, a custom object, bytes that are not UTF-8, a string
with a lone surrogate) rejects the item.  Field names are strings with no empty part
(``"a..b"``, ``""``, ``".a"``) and no metadata name (``_id``, ``_source``...) at the top;
``{"o.x": 1, "o": {"x": 2}}`` spells the field ``o.x`` twice and is rejected, as is a name
that is both an object and a value (``{"a": 1, "a.b": 2}``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Iterable
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import one_array, validate_full
from shardstore.engine.errors import DocumentRejected, InvalidIndexName, InvalidRequest
from shardstore.errors import ShardstoreError
from shardstore.segments.mapping import (
    DATE_RANGE_MS,
    LONG_RANGE,
    METADATA_FIELDS,
    Mapping,
    json_default,
    sources_from_table,
)
from shardstore.segments.synthetic import SOURCE_MODES
from shardstore.translog.operations import MAX_ID_BYTES

__all__ = [
    "MAX_DEPTH",
    "MAX_DOC_FIELDS",
    "MAX_INDEX_FIELDS",
    "MAX_INDEX_NAME_BYTES",
    "MAX_SHARDS",
    "CheckedDocs",
    "check_create_args",
    "check_doc_id",
    "check_expectation",
    "check_index_name",
    "check_mapping",
    "check_source_mode",
    "docs_from_pylist",
    "docs_from_table",
]

MAX_INDEX_NAME_BYTES = 255
MAX_DEPTH = 20
MAX_DOC_FIELDS = 1000
MAX_INDEX_FIELDS = 1000
MAX_SHARDS = 1024  # Elasticsearch's index.number_of_shards limit
_DATE_MIN_MS, _DATE_MAX_MS = DATE_RANGE_MS  # years 1 to 9999, as Python's datetime
_INT64 = LONG_RANGE
_NAME_FORBIDDEN = frozenset('\\/*?"<>|,#: ')


# -- request arguments ----------------------------------------------------------------------

def check_index_name(name: object) -> str:
    """``name`` if it is a valid index name (Elasticsearch's rules), else InvalidIndexName naming the rule."""
    if not isinstance(name, str):
        raise InvalidIndexName(name, f"must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidIndexName(name, "must not be empty")
    if name in (".", ".."):
        raise InvalidIndexName(name, "must not be '.' or '..'")
    if name[0] in "-_+":
        raise InvalidIndexName(name, "must not start with '-', '_' or '+'")
    if name != name.lower():
        raise InvalidIndexName(name, "must be lowercase")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidIndexName(name, "is not valid UTF-8 (it holds a lone surrogate)") from None
    bad = sorted({c for c in name if c in _NAME_FORBIDDEN or not c.isprintable()})
    if bad:
        raise InvalidIndexName(name, f"must not contain {' '.join(repr(c) for c in bad)} "
                                     f"(nor any of \\ / * ? \" < > | , # : space or a control character)")
    if size > MAX_INDEX_NAME_BYTES:
        raise InvalidIndexName(name, f"is {size} bytes, at most {MAX_INDEX_NAME_BYTES} are allowed")
    return name


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_create_args(shards: object, replicas: object, durability: object) -> tuple[int, int, str]:
    """The shard count, replica count and durability of a new index, checked; InvalidRequest naming the bad one."""
    if not _is_int(shards) or not 1 <= int(shards) <= MAX_SHARDS:  # type: ignore[call-overload]
        raise InvalidRequest(f"shards must be an int from 1 to {MAX_SHARDS}, got {shards!r}")
    if not _is_int(replicas) or int(replicas) < 0:  # type: ignore[call-overload]
        raise InvalidRequest(f"replicas must be an int >= 0, got {replicas!r}")
    if durability not in ("request", "async"):
        raise InvalidRequest(f"durability must be 'request' or 'async', not {durability!r}")
    return int(shards), int(replicas), str(durability)  # type: ignore[call-overload]


def check_source_mode(source: object) -> str:
    """An index's ``source`` option, checked: ``stored`` or ``synthetic`` (InvalidRequest otherwise)."""
    if source not in SOURCE_MODES:
        raise InvalidRequest(f"source must be one of {', '.join(repr(m) for m in SOURCE_MODES)}, not {source!r}")
    return str(source)


def check_expectation(if_seq_no: object, if_primary_term: object) -> None:
    """Optimistic-concurrency arguments: both None, or an int seq# >= 0 and an int term >= 1."""
    if if_seq_no is None and if_primary_term is None:
        return
    if if_seq_no is None or if_primary_term is None:
        raise InvalidRequest("if_seq_no and if_primary_term go together: give both or neither")
    if not _is_int(if_seq_no) or not 0 <= int(if_seq_no) <= _INT64[1]:  # type: ignore[call-overload]
        raise InvalidRequest(f"if_seq_no must be an int from 0 to 2^63-1, got {if_seq_no!r}")
    if not _is_int(if_primary_term) or not 1 <= int(if_primary_term) <= _INT64[1]:  # type: ignore[call-overload]
        raise InvalidRequest(f"if_primary_term must be an int from 1 to 2^63-1, got {if_primary_term!r}")


def check_mapping(mappings: object) -> Mapping:
    """The mapping given to create_index, checked: InvalidRequest (nothing created) when it is not a valid one."""
    if mappings is None:
        return Mapping(())
    if not isinstance(mappings, MappingABC):
        raise InvalidRequest(f"mappings must be a dict, got {type(mappings).__name__}")
    try:
        mapping = Mapping.from_dict(dict(mappings))
    except (ShardstoreError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise InvalidRequest(f"mappings: {type(exc).__name__}: {exc}") from None
    if len(mapping) > MAX_INDEX_FIELDS:
        raise InvalidRequest(f"mappings: {len(mapping)} fields, an index may have at most {MAX_INDEX_FIELDS}")
    for name in mapping:  # a field no document could hold is a mistake
        if name.count(".") >= MAX_DEPTH or not name.isprintable():
            raise InvalidRequest(f"mappings: field {name!r} is nested deeper than {MAX_DEPTH} objects or holds "
                                 f"a control character")
        if not _utf8(name):
            raise InvalidRequest(f"mappings: field {name!r} is not valid UTF-8")
    return mapping


def check_doc_id(doc_id: object) -> str:
    """``doc_id`` if it is a usable document id (the bulk rules), else InvalidRequest naming the rule."""
    try:
        return _check_id(doc_id)
    except _Bad as bad:
        raise InvalidRequest(f"document id {doc_id!r}: {bad.rule}") from None


# -- documents ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckedDocs:
    """A bulk after the door: the accepted items as ids + JSON sources, where each came from, and the rejected ones."""

    ids: pa.Array  # string
    sources: pa.Array | None  # binary JSON objects; None for a table bulk that did not ask for them (json_sources)
    positions: pa.Array  # int64: each accepted item's place in the bulk
    rejected: tuple[DocumentRejected, ...]
    total: int
    #: the accepted rows as the caller's Arrow table (a table bulk), for the columnar field path
    table: pa.Table | None = None

    def without(self, keep: pa.Array, more: Iterable[DocumentRejected]) -> CheckedDocs:
        """The same bulk keeping only the accepted items at ``keep`` (indices), with ``more`` rejections."""
        rejected = tuple(sorted((*self.rejected, *more), key=lambda r: r.position))
        # the caller's table is carried on only while the JSON sources are not built (they are built from it)
        built = self.sources if self.sources is not None else self.__dict__.get("_json")
        sources = None if built is None else built.take(keep)
        table = None if built is not None or self.table is None else self.table.take(keep)
        return CheckedDocs(self.ids.take(keep), sources, self.positions.take(keep), rejected, self.total, table)

    def json_sources(self) -> pa.Array:
        """The accepted items' JSON sources (built from the caller's table when the bulk did not ask for them).

        Built at most once per bulk, and only when asked: by the field parse when it falls back to
        the JSON path, or by a stored-source bulk whose fields do not rebuild every row exactly
        (:mod:`~shardstore.segments.source_keep`).
        """
        if self.sources is not None:
            return self.sources
        built = self.__dict__.get("_json")
        if built is None:
            assert self.table is not None, "a bulk without sources keeps its table"
            built = _table_sources(self.table, self.ids)
            object.__setattr__(self, "_json", built)  # a cache of a pure function of the frozen fields
        return built


class _Bad(Exception):
    def __init__(self, field: str | None, rule: str) -> None:
        super().__init__(rule)
        self.field = field
        self.rule = rule


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_id(doc_id: object) -> str:
    if doc_id is None:
        raise _Bad("_id", "missing; every document needs a non-empty string _id")
    if not isinstance(doc_id, str):
        raise _Bad("_id", f"must be a string, got {type(doc_id).__name__}")
    if not doc_id:
        raise _Bad("_id", "must not be empty")
    try:
        size = len(doc_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise _Bad("_id", "is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > MAX_ID_BYTES:
        raise _Bad("_id", f"is {size} bytes, at most {MAX_ID_BYTES} are allowed")
    return doc_id


class _Walk:
    """One document's field names: leaves and object paths seen, for duplicates, clashes and the limits."""

    __slots__ = ("leaves", "objects")

    def __init__(self) -> None:
        self.leaves: set[str] = set()
        self.objects: set[str] = set()

    def _object(self, name: str) -> None:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            p = ".".join(parts[:i])
            if p in self.leaves:
                raise _Bad(p, "is both a value and an object in this document")
            self.objects.add(p)

    def walk(self, obj: MappingABC[Any, Any], prefix: str) -> None:
        for key, value in obj.items():
            if not isinstance(key, str):
                raise _Bad(f"{prefix}{key!r}", f"field names must be strings, got {type(key).__name__}")
            name = prefix + key
            if not key or key[0] == "." or key[-1] == "." or ".." in key:
                raise _Bad(name, "a field name must not be empty or have an empty part")
            if not prefix and key.split(".", 1)[0] in METADATA_FIELDS:
                raise _Bad(name, "is a metadata field; a document may not hold it")
            if name.count(".") >= MAX_DEPTH:
                raise _Bad(name, f"is nested deeper than {MAX_DEPTH} objects")
            if isinstance(value, dict):
                self._object(name)
                self.walk(value, name + ".")
                continue
            if value is None:
                continue
            _check_value(name, value)
            if name in self.leaves or name in self.objects:
                raise _Bad(name, "is given twice ({'a.b': ..} and {'a': {'b': ..}} spell one field)"
                           if name in self.leaves else "is both a value and an object in this document")
            if "." in key:
                self._object(name.rsplit(".", 1)[0])
            self.leaves.add(name)
            if len(self.leaves) > MAX_DOC_FIELDS:
                raise _Bad(name, f"the document has more than {MAX_DOC_FIELDS} fields")


def _check_value(name: str, value: Any) -> None:
    if isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise _Bad(name, f"integer {value} is outside the long range -2^63..2^63-1")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad(name, f"{value} is not a finite number (JSON has no NaN or infinity)")
        return
    if isinstance(value, (_dt.datetime, _dt.date)):
        return
    if isinstance(value, (bytes, bytearray)):
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Bad(name, f"bytes that are not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        return
    if isinstance(value, list):
        raise _Bad(name, "arrays are not supported (a field holds one value)")
    raise _Bad(name, f"a value of type {type(value).__name__} cannot be stored as JSON")


def _plain_keys(keys: tuple[Any, ...]) -> bool:
    """True when every key is a non-empty string without a dot, not starting with ``_``, and there are not too many."""
    if len(keys) > MAX_DOC_FIELDS:
        return False
    for key in keys:
        if type(key) is not str or not key or key[0] == "_" or "." in key:
            return False
    return True


#: A JSON source that may hold something the per-document key check did not see: a nested
#: object or an array (a ``{`` or ``[`` after the opening brace, also inside strings: then it
#: is only a false alarm), or an integer of 19 digits or more (possibly beyond the long range).
_SUSPECT = r"(?s).[{\[]|\d{19}"


def _surrogate_field(doc: MappingABC[str, Any], prefix: str = "") -> str | None:
    """The first field (name or value) holding a lone surrogate (the error path only)."""
    for key, value in doc.items():
        name = prefix + key
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return name
        if isinstance(value, dict):
            found = _surrogate_field(value, name + ".")
            if found is not None:
                return found
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=json_default).encode


def docs_from_pylist(docs: Iterable[MappingABC[str, Any]]) -> CheckedDocs:
    """Check each Python document (see the module docstring); the accepted ones as ids + JSON sources."""
    if isinstance(docs, (str, bytes, MappingABC)):
        raise InvalidRequest(f"a bulk is a list of documents (dicts), got one {type(docs).__name__}")
    try:
        items = iter(docs)
    except TypeError:
        raise InvalidRequest(f"a bulk is a list of documents (dicts) or an Arrow table, "
                             f"got {type(docs).__name__}") from None
    ids: list[str] = []
    sources: list[bytes] = []
    bodies: list[dict[Any, Any]] = []
    positions: list[int] = []
    walked: list[bool] = []
    bad_items: dict[int, DocumentRejected] = {}
    plain_keys: set[tuple[Any, ...]] = set()  # key tuples already found plain, checked once per bulk
    i = -1
    for i, doc in enumerate(items):
        is_map = type(doc) is dict or isinstance(doc, MappingABC)  # the ABC check is slow: dicts skip it
        doc_id: object = doc.get("_id") if is_map else None
        try:
            if not is_map:
                raise _Bad(None, f"a document must be a JSON object (a dict), got {type(doc).__name__}")
            _check_id(doc_id)
            body = {k: v for k, v in doc.items() if k != "_id"}
            keys = tuple(body)
            walk = keys not in plain_keys
            if walk:
                if _plain_keys(keys):
                    plain_keys.add(keys)
                    walk = False
                else:
                    _Walk().walk(body, "")
            try:
                data = _DUMPS(body).encode("utf-8")
            except UnicodeEncodeError:
                raise _Bad(_surrogate_field(body), "is not valid UTF-8 (it holds a lone surrogate)") from None
            except (ValueError, TypeError, RecursionError) as exc:  # NaN/infinity, a non-JSON value, too deep
                _Walk().walk(body, "")
                raise _Bad(None, f"cannot be written as JSON ({exc})") from None
        except _Bad as bad:
            shown = doc_id if isinstance(doc_id, str) and _utf8(doc_id) else None
            bad_items[i] = DocumentRejected(i, shown, bad.field, bad.rule)
            continue
        ids.append(doc_id)  # type: ignore[arg-type]
        sources.append(data)
        bodies.append(body)
        positions.append(i)
        walked.append(walk)
    src = pa.array(sources, pa.binary())
    keep = np.ones(len(ids), dtype=bool)
    if len(src):
        # values the per-document pass did not look at (nested objects, arrays, long integers): one
        # columnar scan over the sources finds the documents that may hold one, and only those are walked
        suspect = pc.match_substring_regex(src.view(pa.string()), _SUSPECT).to_numpy(zero_copy_only=False)
        for j in np.flatnonzero(suspect):
            if walked[j]:
                continue
            try:
                _Walk().walk(bodies[j], "")
            except _Bad as bad:
                keep[j] = False
                doc_id = ids[j]
                bad_items[positions[j]] = DocumentRejected(positions[j], doc_id if _utf8(doc_id) else None,
                                                           bad.field, bad.rule)
    rejected = tuple(bad_items[k] for k in sorted(bad_items))
    id_arr, pos_arr = pa.array(ids, pa.string()), pa.array(positions, pa.int64())
    if not keep.all():
        mask = pa.array(keep)
        id_arr, src, pos_arr = id_arr.filter(mask), src.filter(mask), pos_arr.filter(mask)
    return CheckedDocs(id_arr, src, pos_arr, rejected, i + 1)


def _leaf_columns(name: str, t: pa.DataType, out: list[tuple[str, pa.DataType, list[str]]], path: list[str]) -> None:
    if pa.types.is_struct(t):
        for f in t:
            _leaf_columns(f"{name}.{f.name}", f.type, out, [*path, f.name])
    else:
        out.append((name, t, path))


def _table_schema_checks(table: pa.Table) -> None:
    """Request-level problems of a table (they concern every row): InvalidRequest naming the column."""
    if "_id" not in table.column_names:
        raise InvalidRequest("the table has no _id column")
    t = table.schema.field("_id").type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)
            or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type))):
        raise InvalidRequest(f"the _id column must hold strings, it is {t}")
    if len(set(table.column_names)) != len(table.column_names):
        raise InvalidRequest("the table has two columns of the same name")
    try:
        validate_full(table)  # string columns hold valid UTF-8 (one bad value poisoned its shard)
    except pa.ArrowInvalid as exc:
        raise InvalidRequest(f"the table is not valid Arrow data: {exc}") from None
    leaves: list[tuple[str, pa.DataType, list[str]]] = []
    for f in table.schema:
        if f.name == "_id":
            continue
        if not f.name or any(not p for p in f.name.split(".")):
            raise InvalidRequest(f"column {f.name!r}: a field name must not be empty or have an empty part")
        if f.name.split(".", 1)[0] in METADATA_FIELDS:
            raise InvalidRequest(f"column {f.name!r} is a metadata field; a document may not hold it")
        _leaf_columns(f.name, f.type, leaves, [f.name])
    if len(leaves) > MAX_DOC_FIELDS:
        raise InvalidRequest(f"the table has {len(leaves)} fields, a document may have at most {MAX_DOC_FIELDS}")
    seen: set[str] = set()
    objects: set[str] = set()
    for name, t, _path in leaves:  # one spelling per field: a.b as a dotted column and as a struct child clash
        parts = name.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))}
        if name in seen or name in objects or parents & seen:
            raise InvalidRequest(f"column {name!r}: the field is given twice (a dotted name and a struct child, "
                                 f"or two struct children of one name), or is both a value and an object")
        seen.add(name)
        objects |= parents
    for name, t, _path in leaves:
        if name.count(".") >= MAX_DEPTH:
            raise InvalidRequest(f"column {name!r} is nested deeper than {MAX_DEPTH} objects")
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_map(t):
            raise InvalidRequest(f"column {name!r} holds {t}: arrays are not supported (a field holds one value)")


def _leaf_values(table: pa.Table, path: list[str]) -> pa.ChunkedArray:
    col = table.column(path[0])
    for p in path[1:]:
        col = pc.struct_field(col, p)
    return col


def _table_sources(accepted: pa.Table, ids: pa.Array) -> pa.Array:
    """The JSON sources of a checked table's rows (``ids``: their checked ``_id`` column)."""
    try:
        return sources_from_table(accepted.set_column(accepted.schema.get_field_index("_id"), "_id", ids))[1]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # values under null struct parents...
        raise InvalidRequest(f"the table's columns cannot be written as documents: {exc}") from None


def docs_from_table(table: pa.Table, *, sources: bool = True) -> CheckedDocs:
    """Check an Arrow table of documents column by column; the accepted rows as ids + JSON sources.

    ``sources=False`` (a synthetic-source index) leaves the JSON sources unbuilt:
    :meth:`CheckedDocs.json_sources` builds them if the field parse needs them after all.
    """
    _table_schema_checks(table)
    n = table.num_rows
    ids = one_array(table.column("_id"))
    if pa.types.is_dictionary(ids.type):
        ids = ids.cast(ids.type.value_type)
    ids = ids.cast(pa.string())
    try:
        validate_full(ids)
    except pa.ArrowInvalid as exc:
        raise InvalidRequest(f"the _id column is not valid UTF-8: {exc}") from None
    bad = np.zeros(n, dtype=bool)
    reasons: dict[int, tuple[str | None, str]] = {}

    def flag(mask: pa.Array | pa.ChunkedArray, field: str | None, rule: str) -> None:
        m = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)
        for i in np.flatnonzero(m & ~bad)[:]:
            reasons[int(i)] = (field, rule)
        bad[m] = True

    lengths = pc.binary_length(ids)
    flag(pc.is_null(ids), "_id", "missing; every document needs a non-empty string _id")
    flag(pc.equal(lengths, 0), "_id", "must not be empty")
    flag(pc.greater(lengths, MAX_ID_BYTES), "_id", f"is longer than {MAX_ID_BYTES} bytes")
    leaves: list[tuple[str, pa.DataType, list[str]]] = []
    for f in table.schema:
        if f.name != "_id":
            _leaf_columns(f.name, f.type, leaves, [f.name])
    for name, t, path in leaves:
        if pa.types.is_floating(t):
            col = _leaf_values(table, path)
            flag(pc.and_(pc.is_valid(col), pc.invert(pc.is_finite(col))), name,
                 "is not a finite number (JSON has no NaN or infinity)")
        elif pa.types.is_timestamp(t):
            col = _leaf_values(table, path)
            per_ms = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
            ticks = col.cast(pa.int64())
            ms = ticks if per_ms == 1 else pc.divide(ticks, per_ms)
            if t.unit == "s":
                ms = pc.multiply_checked(ticks, 1000)
            flag(pc.or_(pc.less(ms, _DATE_MIN_MS), pc.greater(ms, _DATE_MAX_MS)), name,
                 "is a date outside years 1 to 9999")
            if per_ms > 1:
                rest = pc.subtract(ticks, pc.multiply(ms, per_ms))  # integer division
                flag(pc.not_equal(rest, 0), name, "has sub-millisecond precision; a date field keeps milliseconds")
        elif pa.types.is_uint64(t):
            col = _leaf_values(table, path)
            flag(pc.greater(col, pa.scalar(_INT64[1], pa.uint64())), name,
                 "integer is outside the long range -2^63..2^63-1")
    rejected = tuple(DocumentRejected(i, ids[i].as_py(), field, rule)
                     for i, (field, rule) in sorted(reasons.items()))
    keep = pa.array(np.flatnonzero(~bad), pa.int64())
    accepted = table.take(keep) if rejected else table
    if not accepted.num_rows:
        return CheckedDocs(pa.array([], pa.string()), pa.array([], pa.binary()), keep, rejected, n, accepted)
    acc_ids = ids.take(keep) if rejected else ids
    return CheckedDocs(acc_ids, _table_sources(accepted, acc_ids) if sources else None, keep, rejected, n, accepted)
