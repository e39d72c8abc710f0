"""Spark filters pushed into a ``format("shardstore")`` read: compiled, pruned, evaluated.

Spark filters become picklable tuples ``(op, column, value)`` (``("not", column, inner)``
for negations), then one pyarrow expression.  Only filters pyarrow evaluates exactly as
Spark does are kept: on string, integer, boolean and metadata columns.  Double columns
(Spark orders NaN above every number and NaN = NaN; pyarrow does not) and timestamps
(time-zone handling of Python literals) go back to Spark.  :func:`segment_may_match`
prunes whole segments by the stats their commit carries (docs/design/spark.md, "Filter
pushdown").
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.segments.segment import SegmentInfo

_CMP = {"EqualTo": "eq", "EqualNullSafe": "eq", "GreaterThan": "gt", "GreaterThanOrEqual": "ge",
        "LessThan": "lt", "LessThanOrEqual": "le"}
_STR = {"StringStartsWith": "startswith", "StringEndsWith": "endswith", "StringContains": "contains"}


def _value_ok(t: pa.DataType, v: Any) -> bool:
    if pa.types.is_string(t):
        return isinstance(v, str)
    if pa.types.is_integer(t):
        return isinstance(v, int) and not isinstance(v, bool)
    if pa.types.is_boolean(t):
        return isinstance(v, bool)
    return False


def _compile(f: Any, types: dict[str, pa.DataType]) -> tuple | None:
    kind = type(f).__name__
    if kind == "Not":
        if type(f.child).__name__ == "EqualNullSafe" and f.child.value is not None:
            return None  # NOT (a <=> 1) keeps null rows; the pushed form would drop them
        inner = _compile(f.child, types)
        return None if inner is None else ("not", inner[1], inner)
    attr = getattr(f, "attribute", ())
    if len(attr) != 1 or attr[0] not in types:
        return None
    col, t = attr[0], types[attr[0]]
    if kind in ("IsNull", "IsNotNull"):
        return ("null" if kind == "IsNull" else "notnull", col, None)
    value = getattr(f, "value", None)
    if kind == "EqualNullSafe" and value is None:
        return ("null", col, None)
    if kind in _CMP and _value_ok(t, value):
        return (_CMP[kind], col, value)
    if kind == "In" and value and all(_value_ok(t, v) for v in value):
        return ("in", col, tuple(value))
    if kind in _STR and pa.types.is_string(t) and isinstance(value, str):
        return (_STR[kind], col, value)
    return None


def compile_filters(filters: list, types: dict[str, pa.DataType]) -> tuple[list[tuple], list]:
    """(pushed filters as tuples, the Spark filters Spark must still evaluate)."""
    pushed, rest = [], []
    for f in filters:
        c = _compile(f, types)
        if c is None:
            rest.append(f)
        else:
            pushed.append(c)
    return pushed, rest


def _expr(f: tuple) -> pc.Expression:
    op, col, v = f
    fld = pc.field(col)
    if op == "not":  # Spark: NOT(null) is null, so a null column never passes a negation
        inner = v
        if inner[0] == "null":
            return fld.is_valid()
        if inner[0] == "notnull":
            return fld.is_null()
        return pc.invert(_expr(inner)) & fld.is_valid()
    if op == "null":
        return fld.is_null()
    if op == "notnull":
        return fld.is_valid()
    if op == "in":
        return fld.isin(list(v))
    if op in ("startswith", "endswith"):
        return getattr(pc, "starts_with" if op == "startswith" else "ends_with")(fld, pattern=v)
    if op == "contains":
        return pc.match_substring(fld, pattern=v)
    return {"eq": fld == v, "gt": fld > v, "ge": fld >= v, "lt": fld < v, "le": fld <= v}[op]


def to_expression(filters: list[tuple]) -> pc.Expression | None:
    """The AND of the pushed filters as one pyarrow expression (None without filters)."""
    out = None
    for f in filters:
        e = _expr(f)
        out = e if out is None else out & e
    return out


def _bounds(info: SegmentInfo, col: str) -> tuple[Any, Any, int] | None:
    """(min, max, null count) of a column in a segment; None when unknown."""
    if col == "_id":
        return info.min_id, info.max_id, 0
    if col == "_seq_no":
        return info.min_seq_no, info.max_seq_no, 0
    st = info.column(col)
    if st is None:
        return None
    return st.min, st.max, st.null_count


def segment_may_match(info: SegmentInfo, filters: list[tuple]) -> bool:
    """False when a segment's stats prove no row passes the pushed filters (whole-segment pruning)."""
    for op, col, v in filters:
        b = _bounds(info, col)
        if b is None or op not in ("eq", "gt", "ge", "lt", "le", "in", "notnull"):
            continue
        lo, hi, nulls = b
        if op == "notnull":
            if nulls >= info.doc_count and lo is None:
                return False
            continue
        if lo is None or hi is None or isinstance(lo, bool) or type(lo) is not type(v if op != "in" else v[0]):
            if lo is None and hi is None and nulls >= info.doc_count:
                return False  # every value null: no comparison holds
            continue
        if op == "eq" and not lo <= v <= hi:
            return False
        if op == "in" and not any(lo <= x <= hi for x in v):
            return False
        if (op == "gt" and hi <= v) or (op == "ge" and hi < v) or (op == "lt" and lo >= v) or (op == "le" and lo > v):
            return False
    return True


__all__ = ["compile_filters", "segment_may_match", "to_expression"]
