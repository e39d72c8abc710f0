"""Which stored-source documents need their JSON kept: pure decisions, no I/O (issue 31).

A stored-source index promises that a document comes back as it was given.  Most documents
are given in a shape their typed field columns rebuild byte for byte
(:func:`~shardstore.segments.synthetic.synthesize_sources`, members in the index mapping's
:attr:`~shardstore.segments.mapping.Mapping.order`): for those, a second JSON copy in the
translog and in the segment is waste.  Such a row is written with a null ``source`` and its
typed fields (a typed translog frame, as on a synthetic-source index); every reader rebuilds
it (``fill_sources`` / ``op_sources``).  A row the fields would not rebuild exactly (a key
order the mapping does not have, ``5`` in a ``double`` field, a date written another way, an
unmapped field of a ``dynamic: false`` index, nested objects) keeps its JSON.  Design:
docs/design/segments.md, "Stored source without a second copy".

Two decisions:

* :func:`table_rebuilds_exactly`: for a bulk given as an Arrow table whose fields came
  straight from its columns (``fields_from_table``), from the schema alone, without building
  any JSON.  Its JSON (``sources_from_table``) writes each row's non-null members in column
  order; the rebuild writes the same members in mapping order with the mapped types.  They
  are the same bytes when every column that holds a value has a flat name, is mapped, is
  mapped to a type that writes its values as the column does, and the columns come in
  mapping order.
* :func:`kept_sources`: for any bulk with JSON sources, row by row: the rebuilt JSON is
  compared with the given bytes; rows with a value in a dotted field keep their JSON (where
  an object's members land depends on the other columns of the segment it is read with).

Both are conservative: a ``False`` / a kept source costs bytes, never a different document.
``tests/segments/test_source_keep.py`` checks every row they drop against the rebuild.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.segments.mapping import FieldType, Mapping, json_kind_of
from shardstore.segments.synthetic import synthesize_sources

__all__ = ["kept_sources", "table_rebuilds_exactly"]

#: Mapped types whose JSON text equals the text of the column kinds (``mapping.json_kind_of``) that
#: feed them (a long column into a double field does not: ``5`` is rebuilt ``5.0``).
_SAME_TEXT = {
    FieldType.LONG: "long", FieldType.INTEGER: "long", FieldType.DOUBLE: "double", FieldType.KEYWORD: "keyword",
    FieldType.TEXT: "keyword", FieldType.BOOLEAN: "boolean", FieldType.DATE: "date",
}


def _kind(t: pa.DataType) -> str:
    return json_kind_of(t.value_type if pa.types.is_dictionary(t) else t)


def table_rebuilds_exactly(table: pa.Table, mapping: Mapping) -> bool:
    """Whether every row of ``table`` (``_id`` + field columns, fields taken from its columns) is rebuilt exactly."""
    rank = {name: i for i, name in enumerate(mapping.order)}
    last = -1
    for f in table.schema:
        if f.name == "_id":
            continue
        if "." in f.name:
            return False  # a table's JSON writes "o":{} for a row without any o.* value; the rebuild writes nothing
        col = table.column(f.name)
        if pa.types.is_null(f.type) or col.null_count == len(col):
            continue  # no value in any row: absent from both
        ftype = mapping.get(f.name)
        kind = _kind(f.type)
        if ftype is None or kind != _SAME_TEXT.get(ftype):
            return False
        if rank[f.name] <= last:
            return False  # the rebuild would write the members in another order
        last = rank[f.name]
    return True


def kept_sources(sources: pa.Array, fields: pa.Table, mapping: Mapping) -> pa.Array:
    """``sources`` with null where the rows' ``fields`` (conformed to ``mapping``) rebuild them byte for byte."""
    n = len(sources)
    if n == 0:
        return sources
    rebuilt = synthesize_sources(fields, n, mapping.order)
    same = pc.fill_null(pc.equal(sources.cast(pa.binary()), rebuilt.cast(pa.binary())), False)
    for name in fields.column_names:
        col = fields.column(name)
        if "." in name and col.null_count < n:
            same = pc.and_(same, col.is_null())
    return pc.if_else(same, pa.scalar(None, pa.binary()), sources.cast(pa.binary()))
