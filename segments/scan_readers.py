"""Reading live rows from a list of segments (a directory's view, a commit's segments) as batches of a mapping's schema.

Used by :meth:`ShardDirectory.scan <shardstore.segments.directory.ShardDirectory.scan>` (over what
searches see: segments/held_view.py) and :meth:`CommitReader.scan <shardstore.segments.reader.CommitReader.scan>`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.errors import InvalidError
from shardstore.segments.livedocs import LiveDocs
from shardstore.segments.mapping import Mapping
from shardstore.segments.segment import BASE_SCHEMA, SegmentReader, conform, mentions, scan_segments
from shardstore.segments.synthetic import fill_sources

__all__ = ["scan_readers"]


def scan_readers(
    segments: Sequence[tuple[SegmentReader, LiveDocs]],
    mapping: Mapping,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,  # noqa: A002 - the pyarrow name
) -> Iterator[pa.RecordBatch]:
    """Live rows of ``segments`` as batches of the mapping's schema (or ``columns``), filter applied.

    Segments holding every column the query needs are read together
    (:func:`scan_segments`: parallel row-group reads, filter pushed down to row-group
    statistics); an older segment written before a field was mapped is read alone, its
    missing columns filled with nulls before the filter is applied.
    """
    wide = pa.schema(list(BASE_SCHEMA) + list(mapping.arrow_schema()))
    unknown = [c for c in (columns or ()) if c not in wide.names]
    if unknown:
        raise InvalidError(f"unknown column(s) {unknown}: neither a metadata column nor a mapped field "
                           f"(mapped: {list(mapping)})")
    schema = wide if columns is None else pa.schema([wide.field(c) for c in columns])
    if "_source" in schema.names and schema.names != wide.names:
        # a null _source (synthetic source, or a stored row its fields rebuild: segments/source_keep.py) is
        # rebuilt from every field of its row: read them all, rebuild, then keep what was asked
        for batch in scan_readers(segments, mapping, None, filter):
            yield pa.RecordBatch.from_arrays([batch.column(n) for n in schema.names], schema=schema)
        return
    needed = set(schema.names) | ({n for n in wide.names if mentions(filter, n)} if filter is not None else set())
    full, partial = [], []
    for reader, live in segments:
        (full if needed <= set(reader.schema.names) else partial).append((reader, live))
    rebuild = "_source" in schema.names
    if full:
        for batch in scan_segments(full, columns=schema.names, filter=filter):
            yield _with_sources(conform(batch, schema), mapping) if rebuild else conform(batch, schema)
    for reader, live in partial:
        for batch in reader.scan(columns=_present(reader, wide.names), live=live):
            table = pa.Table.from_batches([conform(batch, wide)])
            if filter is not None:
                table = table.filter(filter)
            for b in table.select(schema.names).to_batches():
                if b.num_rows:
                    yield _with_sources(b, mapping) if rebuild else b


def _with_sources(batch: pa.RecordBatch, mapping: Mapping) -> pa.RecordBatch:
    """``batch`` (every column of the mapping) with its null ``_source`` values rebuilt, members in its order."""
    if batch.column(batch.schema.get_field_index("_source")).null_count == 0:
        return batch
    return fill_sources(pa.Table.from_batches([batch]), mapping.order).combine_chunks().to_batches()[0]


def _present(reader: SegmentReader, names: Sequence[str]) -> list[str]:
    """The subset of ``names`` the segment file has (older segments lack newer fields)."""
    have = set(reader.schema.names)
    return [n for n in names if n in have]
