"""Reading a segment's dictionary-encoded string columns through their Parquet dictionaries (issue 44).

A segment writes every column but ``_id`` and ``_source`` with a Parquet dictionary
(segments/segment_writer.py).  Decoding such a string column straight to Arrow strings
copies every value through a builder; reading it as an Arrow dictionary array (the
page's indices and the dictionary once) and casting that to strings takes one gather:
about 30 % less CPU per string column of the flights, and 15 % less for a scan of
every column (``python -m benches peers``, "cold scan"; docs/design/segments.md,
"Read plan").  Readers see plain strings either way: :func:`dense` casts back at the
one read every row-group reader goes through (segments/stamp.py ``read_groups``).

The choice is made from the footer alone (:func:`dictionary_strings`, pure): a column
is read through its dictionary only where every row group has a dictionary page and
its pages are no bigger than a dictionary and its indices can be.  A chunk whose writer
fell back to plain pages (its dictionary outgrew the page limit) would make the reader
hash every plain value into a new dictionary, slower than the plain decode.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.core.arrays import dense, dense_schema

from .segment_info import UNIQUE_COLUMNS

#: The largest dictionary page a writer keeps before it falls back to plain pages (pyarrow's default).
DICTIONARY_PAGE_LIMIT = 1 << 20
#: Bytes per value a dictionary index page can take at most (32-bit indices), before compression.
INDEX_BYTES = 4

__all__ = ["DICTIONARY_PAGE_LIMIT", "dense", "dense_schema", "dictionary_strings", "open_segment_file", "parquet_source"]


def dictionary_strings(md: pq.FileMetaData, schema: pa.Schema) -> list[str]:
    """Top-level string columns of the file that every row group holds dictionary-encoded, with no plain fallback."""
    paths = [md.schema.column(i).path for i in range(md.num_columns)]
    leaf = {p: i for i, p in enumerate(paths)}
    out = []
    for field in schema:
        i = leaf.get(field.name)
        # plain string only (a dictionary read gives int32-indexed strings: large_string would come back narrowed);
        # never the unique columns; never a name a nested leaf shares (read_dictionary picks leaves by path)
        if (i is None or not pa.types.is_string(field.type) or field.name in UNIQUE_COLUMNS
                or paths.count(field.name) > 1):
            continue
        chunks = [md.row_group(g).column(i) for g in range(md.num_row_groups)]
        if chunks and all(c.has_dictionary_page and c.total_uncompressed_size
                          <= DICTIONARY_PAGE_LIMIT + INDEX_BYTES * c.num_values + 4096 for c in chunks):
            out.append(field.name)
    return out


def parquet_source(source: str | pa.Buffer) -> str | pa.BufferReader:
    """What ``pq.ParquetFile`` opens for ``source``: the path itself, or a new reader over the bytes."""
    return pa.BufferReader(source) if isinstance(source, pa.Buffer) else source


def open_segment_file(source: str | pa.Buffer) -> pq.ParquetFile:
    """``source`` (a path, or a segment's verified bytes) opened for row-group reads, dictionary strings as such.

    :func:`dictionary_strings` chooses them from the footer, which is parsed once.
    """
    pf = pq.ParquetFile(parquet_source(source))
    try:
        strings = dictionary_strings(pf.metadata, pf.schema_arrow)
    except BaseException:
        pf.close()
        raise
    if not strings:
        return pf
    md = pf.metadata
    pf.close()
    return pq.ParquetFile(parquet_source(source), metadata=md, read_dictionary=strings)
