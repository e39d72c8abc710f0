"""Writing a segment file: rows sorted by ``_id`` (or not, format version 2), byte-sized row groups,
a codec per column (:func:`~.segment_info.column_codecs`), CRC32C computed without re-reading, written to a temporary name, fsynced and renamed.

See :mod:`.segment` for the design of segment files.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import uuid
from typing import Any

import google_crc32c
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.core.arrays import one_array, take_rows
from shardstore.fileio import disk_fault, fsync_dir
from shardstore.fileio import fsync as fsync_file

from .segment_info import (
    _BASE_NAMES,
    BASE_SCHEMA,
    DELTA_COLUMNS,
    IN_MEMORY_WRITE_BYTES,
    MAX_ROW_GROUP_ROWS,
    METADATA_KEY,
    MIN_ROW_GROUP_ROWS,
    STAMPED_FORMAT_VERSION,
    TAKE_BYTES,
    TARGET_ROW_GROUP_BYTES,
    UNIQUE_COLUMNS,
    ZSTD_LEVEL,
    SegmentInfo,
    column_codecs,
    file_crc32c,
    footer_column_stats,
    format_version_of,
    id_bounds,
    in_id_order,
    metadata_info,
)
from .stamp import STAMPED_COLUMNS, Stamp


class _CrcWriter(io.RawIOBase):
    """A write-only file computing the CRC32C and size of what goes through it."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.crc = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        try:
            self.crc = google_crc32c.extend(self.crc, b)
        except TypeError:  # the C extension takes only read-only buffers
            b = bytes(b)
            self.crc = google_crc32c.extend(self.crc, b)
        nbytes = memoryview(b).nbytes
        n = self._f.write(b)
        self.size += nbytes
        return nbytes if n is None else n

    def flush(self) -> None:
        self._f.flush()


def _normalize(table: pa.Table) -> pa.Table:
    missing = [n for n in _BASE_NAMES if n not in table.column_names]
    if missing:
        raise ValueError(f"segment table lacks the base columns {missing}")
    cols, fields = [], []
    for f in BASE_SCHEMA:
        col = table.column(f.name)
        if col.type != f.type:
            col = col.cast(f.type)
        if not f.nullable and col.null_count:
            raise ValueError(f"column {f.name} has nulls")
        cols.append(col)
        fields.append(f)
    for name in table.column_names:
        if name not in _BASE_NAMES:
            cols.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _row_group_rows(table: pa.Table) -> int:
    if table.num_rows == 0:
        return MIN_ROW_GROUP_ROWS
    per_row = max(1, table.nbytes // table.num_rows)
    return int(min(MAX_ROW_GROUP_ROWS, max(MIN_ROW_GROUP_ROWS, TARGET_ROW_GROUP_BYTES // per_row)))


def _stat_columns(table: pa.Table) -> list[str]:
    """The field columns a segment info keeps min/max/null counts of (scalar types)."""
    out = []
    for f in table.schema:
        t = f.type
        if f.name not in _BASE_NAMES and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                                          or pa.types.is_timestamp(t) or pa.types.is_string(t)
                                          or pa.types.is_large_string(t)):
            out.append(f.name)
    return out




def _encoding(schema: pa.Schema, rows: int, row_group: int, compression_level: int) -> dict[str, Any]:
    """The ParquetWriter options every segment file is encoded with (:func:`write_segment`, :func:`encode_stamped`)."""
    codecs = column_codecs(schema)
    return {
        "compression": codecs,
        "compression_level": {c: compression_level for c, codec in codecs.items() if codec == "zstd"},
        # unique per row: no dictionary (_version is mostly 1: a dictionary page, and the
        # writer falls back to plain pages by itself where an index rewrote its ids often)
        "use_dictionary": [c for c in schema.names if c not in UNIQUE_COLUMNS],
        "column_encoding": {c: e for c, e in DELTA_COLUMNS.items() if c in schema.names} or None,
        "write_statistics": [c for c in schema.names if c != "_source"],
        # a Parquet bloom filter on _id: Spark/DuckDB prune row groups on ``_id = x`` with it
        "bloom_filter_options": {"_id": {"ndv": max(1, min(rows, row_group)), "fpp": 0.01}},
        "store_schema": True,
    }


def _base_stats(table: pa.Table, order: pa.Array | None, id_sorted: bool = True) -> dict[str, Any]:
    """Seq#, term and ``_id`` bounds (ids taken at the ends when the rows, or ``order``, are in id order)."""
    n = table.num_rows
    if not n:
        return {"min_seq_no": -1, "max_seq_no": -1, "max_primary_term": 0, "min_id": None, "max_id": None}
    seq = pc.min_max(table.column("_seq_no"))
    ids = table.column("_id")
    if order is not None:  # the ends of the order: the smallest and the largest id
        ids = ids.take(pa.array([order[0].as_py(), order[n - 1].as_py()], pa.int64()))
    lo, hi = id_bounds(ids, id_sorted)
    return {
        "min_seq_no": seq["min"].as_py(),
        "max_seq_no": seq["max"].as_py(),
        "max_primary_term": pc.max(table.column("_primary_term")).as_py(),
        "min_id": lo,
        "max_id": hi,
    }


def write_segment(
    path: str,
    table: pa.Table,
    *,
    name: str,
    rows: pa.Array | None = None,
    row_group_size: int | None = None,
    compression_level: int = ZSTD_LEVEL,
    sort: bool = True,
    fsync: bool = True,
) -> SegmentInfo:
    """Write ``table`` (base columns + field columns) as the segment file ``path``.

    Rows are sorted by ``_id`` (stable: rows of one id keep their input order, which
    is ``_seq_no`` order when the caller appends in that order) unless ``sort=False``:
    rows then stay in the given order, and rows not in ``_id`` order make an unsorted
    segment (format :data:`UNSORTED_FORMAT_VERSION`).  ``rows``: write only these rows of
    ``table``, in this order, which must be ``_id`` order unless ``sort=False`` (ValueError
    otherwise); they are taken a part at a time, so a copy of a big table is never whole in
    memory (a refresh's rows: issue 16), and a run of consecutive rows is sliced, not copied.
    Atomic: a reader sees the whole file or nothing.
    Returns the :class:`SegmentInfo` with the file's size and CRC32C.
    """
    table = _normalize(table).combine_chunks()
    rg = row_group_size or _row_group_rows(table)
    order = None
    if rows is not None:
        rows = one_array(rows).cast(pa.int64())
        picked = take_rows(table.select(["_id", "_seq_no", "_primary_term"]), rows)
        ids = picked.column("_id")
        n = len(rows)
        id_sorted = in_id_order(ids)
        if sort and not id_sorted:
            raise ValueError(f"segment {name}: the rows to write are not in _id order")
        base = _base_stats(picked, None, id_sorted)
        nbytes = table.nbytes * n // max(1, table.num_rows)
    else:
        n = table.num_rows
        id_sorted = in_id_order(table.column("_id"))
        if sort and not id_sorted:  # already sorted: no sort, no copy
            order = pc.array_sort_indices(table.column("_id"))  # stable: rows of one id keep their input order
            id_sorted = True
        base = _base_stats(table, order, id_sorted)
        nbytes = table.nbytes
    n_groups = max(1, (n + rg - 1) // rg)  # an empty table still makes one (empty) row group
    # the field columns' min/max/null counts come from the Parquet statistics once the file is written (the
    # footer is their copy in the file; the key-value copy of the info leaves them out)
    meta_info = metadata_info(name, n, n_groups, rg, id_sorted, base)
    schema = table.schema.with_metadata({**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta_info).encode()})
    table = table.replace_schema_metadata(schema.metadata)

    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    in_memory = nbytes <= IN_MEMORY_WRITE_BYTES
    try:
        with open(tmp, "wb") as raw:
            disk_fault("write", path)  # an injected disk full (the simulator); a torn tmp file is removed below
            sink: Any = pa.BufferOutputStream() if in_memory else _CrcWriter(raw)
            with pq.ParquetWriter(
                sink,
                schema,
                sorting_columns=[pq.SortingColumn(0)] if id_sorted else None,
                **_encoding(schema, n, rg, compression_level),
            ) as writer:
                if rows is None:
                    # (one take of the whole table: per-row-group takes on a helper thread
                    # measured slower on 2 cores)
                    writer.write_table(table if order is None else table.take(order), row_group_size=rg)
                else:  # whole row groups of at most TAKE_BYTES per take (no rows: one empty group): one take
                    # per refresh part (a 32 MiB buffer), never a sorted copy of a giant table whole in memory;
                    # a take per row group cost 0.1 s more of 0.3 s per 200,000 flights rows (issue 44)
                    per_row = max(1, table.nbytes // max(1, table.num_rows))
                    chunk = max(rg, TAKE_BYTES // per_row // rg * rg)
                    for start in range(0, max(n, 1), chunk):
                        writer.write_table(take_rows(table, rows.slice(start, chunk)), row_group_size=rg)
            md = writer.writer.metadata
            if in_memory:
                buf = sink.getvalue()
                size, crc = buf.size, google_crc32c.value(buf)
                raw.write(buf)
            else:
                size, crc = sink.size, sink.crc
            raw.flush()
            if fsync:
                fsync_file(raw.fileno(), path)
        os.replace(tmp, path)
        if fsync:
            fsync_dir(directory)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    columns = tuple(footer_column_stats(md, table.schema.get_field_index(c), c, table.schema.field(c).type,
                                        lambda c=c: table.column(c) if rows is None else table.column(c).take(rows))
                    for c in _stat_columns(table))
    return SegmentInfo(
        name=name,
        file_name=os.path.basename(path),
        size=size,
        checksum=crc,
        doc_count=n,
        columns=columns,
        row_groups=n_groups,
        format_version=format_version_of(id_sorted),
        **base,
    )


def encode_stamped(ids: pa.Array, fields: pa.Table, *, compression_level: int = ZSTD_LEVEL) -> pa.Buffer:
    """The bytes of a stamped segment file (segments/stamp.py) of ``ids`` and their typed ``fields``, rows in the
    given order, columns encoded as :func:`write_segment` encodes a segment's (codecs, dictionaries, statistics,
    the ``_id`` bloom filter): a bulk part written once is placed and logged as these bytes
    (engine/shard/write_once.py; translog/parquet_frames.py)."""
    schema = pa.schema([pa.field("_id", pa.string()), *fields.schema])
    table = pa.Table.from_arrays([one_array(ids), *(one_array(c) for c in fields.columns)], schema=schema)
    n = table.num_rows
    rg = _row_group_rows(table)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, **_encoding(schema, n, rg, compression_level)) as writer:
        writer.write_table(table, row_group_size=rg)
    return sink.getvalue()


def stamped_info(path: str, name: str, stamp: Stamp) -> SegmentInfo:
    """The info of a stamped segment (segments/stamp.py): a Parquet file written elsewhere with ``_id`` and the
    fields but no metadata columns, described as it is (nothing rewritten): size and CRC32C of its bytes, its
    row groups, id bounds and field statistics from its footer, seq#s ``stamp.seq_no_base`` onwards."""
    size, crc = file_crc32c(path)
    with pq.ParquetFile(path) as pf:
        schema, md = pf.schema_arrow, pf.metadata
        present = [n for n in STAMPED_COLUMNS if schema.get_field_index(n) >= 0]
        if schema.get_field_index("_id") < 0 or present:
            raise ValueError(f"{path}: a stamped segment file holds _id and no {present or list(STAMPED_COLUMNS)}")
        wrong = [f"{n} is {schema.field(n).type}" for n, t in (("_id", pa.string()), ("_source", pa.binary()))
                 if schema.get_field_index(n) >= 0 and schema.field(n).type != t]
        if wrong:
            raise ValueError(f"{path}: a stamped segment file's _id is a string and its _source binary; {wrong}")
        n = md.num_rows
        ids = footer_column_stats(md, schema.get_field_index("_id"), "_id", pa.string(),
                                  lambda: pf.read(columns=["_id"]).column("_id"))
        if ids.null_count:
            raise ValueError(f"{path}: {ids.null_count} rows have no _id")
        columns = tuple(footer_column_stats(md, schema.get_field_index(c), c, schema.field(c).type,
                                            lambda c=c: pf.read(columns=[c]).column(c))
                        for c in _stat_columns(schema.empty_table()))
    return SegmentInfo(name=name, file_name=os.path.basename(path), size=size, checksum=crc, doc_count=n,
                       min_seq_no=stamp.seq_no_base if n else -1, max_seq_no=stamp.seq_no_base + n - 1 if n else -1,
                       max_primary_term=stamp.primary_term if n else 0, min_id=ids.min, max_id=ids.max,
                       columns=columns, row_groups=md.num_row_groups, format_version=STAMPED_FORMAT_VERSION,
                       stamp=stamp)


def place_stamped(src: str, dest: str, name: str, stamp: Stamp, *, link: bool = False, fsync: bool = True) -> SegmentInfo:
    """Put the file ``src`` at ``dest`` as a stamped segment, durable when ``fsync``, and describe it
    (:func:`stamped_info`); ValueError (``dest`` removed) when it is not a stamped segment file.

    A copy, unless ``link``: a hard link then (a copy where the file system has none), and the caller
    promises ``src`` is never rewritten in place (a download cache writes a new file and renames it):
    the segment shares its bytes.
    """
    try:
        linked = False
        if link:
            try:
                os.link(src, dest)
                linked = True
            except OSError:  # another file system, or no hard links there
                pass
        if not linked:
            shutil.copyfile(src, dest)
        if fsync:  # a linked file may come from a cache written without fsync
            with open(dest, "rb") as f:
                fsync_file(f.fileno(), dest)
            fsync_dir(os.path.dirname(os.path.abspath(dest)))
        return stamped_info(dest, name, stamp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise


__all__ = ["encode_stamped", "place_stamped", "stamped_info", "write_segment"]
