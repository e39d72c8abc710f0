"""Segment files: immutable Parquet files of documents (zstd, and snappy for fixed-width columns).

A segment holds the base columns ``_id`` (string), ``_seq_no``, ``_primary_term``,
``_version`` (int64), ``_source`` (binary: the original JSON bytes) and one typed
column per mapped field (dotted names, see :mod:`.mapping`).  It is plain Parquet:
Spark, DuckDB and pyarrow read it and push filters into it with the column
statistics written for every column but ``_source`` (and a Parquet bloom filter on
``_id``).

Design:

* format version 1 (:data:`FORMAT_VERSION`, what a merge writes) keeps rows **sorted by
  ``_id``** (stable: rows of one id keep their input order; declared as the file's sorting
  column).  Row groups then cover disjoint ``_id`` ranges, so a cold ``get`` reads the
  ``_id`` chunk of the one row group whose statistics can hold the id, then that row
  group's columns only.  Format version 2 (:data:`UNSORTED_FORMAT_VERSION`: a refresh,
  which keeps the buffer's order unless its ids happen to ascend, and the Spark sink's
  fast path) holds its rows in any order, an id possibly twice: every lookup goes through
  the id index, as Lucene finds an id through its terms index in a segment kept in
  insertion order (docs/design/segments.md, "Unsorted segments" and "Refreshed segments
  keep the buffer's order").
* row groups are sized by bytes: about :data:`TARGET_ROW_GROUP_BYTES` of Arrow data
  (uncompressed), between :data:`MIN_ROW_GROUP_ROWS` and :data:`MAX_ROW_GROUP_ROWS`
  rows; small enough that a ``get`` decompresses little, big enough for scans.
* a codec per column (:func:`~.segment_info.column_codecs`): zstd for ids, sequence
  numbers, ``_source`` and strings, snappy for fixed-width values (docs/design/segments.md, "Codecs").
* batch id lookups (an indexing batch asking which of its ids exist) use a
  per-segment in-memory index built once per reader from the ``_id`` column: 64-bit
  fingerprints of the ids, sorted, searched with ``numpy.searchsorted``; candidates
  are confirmed by comparing the ids themselves.  Measured against ``pc.index_in``
  (its hash table is rebuilt on every call) and ``searchsorted`` over the id bytes:
  see :meth:`SegmentReader.lookup`.
* the file is encoded into memory (or, above :data:`IN_MEMORY_WRITE_BYTES`, streamed
  through a CRC-computing file), checksummed (CRC32C) without re-reading, written to
  a temporary name, fsynced, renamed, and its directory fsynced.
* :class:`SegmentInfo` (stats a reader prunes with without opening the file) is
  JSON-able for the commit point; its size/checksum-free part is also stored in the
  Parquet key-value metadata under ``shardstore.segment``.
* scans with deletions read runs of row groups and drop deleted rows with the live
  mask; :func:`scan_segments` runs the runs of many segments on a small thread pool.

This module reads segments (:class:`SegmentReader`, lookups, scans).  What a segment is
without opening it (format constants, :class:`SegmentInfo`) is in :mod:`.segment_info`, and
:func:`write_segment` in :mod:`.segment_writer`; their names are importable from here too.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from shardstore.core.records import crc32c
from shardstore.fileio import write_atomic

from . import row_cache
from .dictionary_read import dense_schema, open_segment_file, parquet_source
from .errors import SegmentCorrupted
from .id_index import SortedKeys, _ArrowSeq, _bisect_all, _IdIndex, fingerprints
from .livedocs import LiveDocs
from .open_files import open_segment_files
from .point_read import PointIndex, row_values
from .segment_info import (  # the info and the writer live apart; their names stay importable from here
    _LIVE_COLUMN,
    BASE_SCHEMA,
    FORMAT_VERSION,
    MAX_FORMAT_VERSION,
    METADATA_KEY,
    SCAN_READ_BYTES,
    UNSORTED_FORMAT_VERSION,
    ZSTD_LEVEL,
    ColumnStats,
    SegmentInfo,
    file_crc32c,
    footer_column_stats,
    format_version_of,
    id_bounds,
    in_id_order,
    metadata_info,
    segment_file_name,
)
from .segment_writer import write_segment
from .stamp import STAMPED_COLUMNS, group_starts, read_groups, stamp_columns, stamped_schema

__all__ = [
    "BASE_SCHEMA",
    "ColumnStats",
    "FORMAT_VERSION",
    "MAX_FORMAT_VERSION",
    "UNSORTED_FORMAT_VERSION",
    "SegmentInfo",
    "SegmentReader",
    "write_segment",
    "segment_file_name",
    "scan_segments",
    "lookup_segments",
    "fingerprints",
    "in_id_order",
    "id_bounds",
    "file_crc32c",
    "format_version_of",
    "metadata_info",
    "footer_column_stats",
    "METADATA_KEY",
    "ZSTD_LEVEL",
    "conform",
    "mentions",
    "prunable",
]


class SegmentReader:
    """Reads one segment file, or its verified bytes held in memory (``data``: written to ``path`` only if asked).
    Holds only ``path``, ``info`` (and ``data``) when pickled; the Parquet footer, row-group bounds and id index
    are loaded lazily and cached."""

    #: Above this many candidate ids a lookup loads the segment's whole ``_id``
    #: column and fingerprint index; below it, in a sorted (format 1) segment, reads the
    #: ``_id`` chunks of the row groups whose bounds can hold them and binary-searches
    #: them.  An unsorted (format 2) segment always uses the index.
    SMALL_LOOKUP = 64

    def __init__(self, path: str, info: SegmentInfo, *, data: pa.Buffer | None = None) -> None:
        self._path = path
        self.info = info
        self.data = data  # the file's bytes, already checked against the commit (segments/reader.py)
        self._pf: pq.ParquetFile | None = None
        self._rg_cache: dict[int, pa.Array] = {}
        self._index: _IdIndex | None = None
        self._point: PointIndex | None = None  # built on the first point read
        self._starts: list[int] | None = None  # each row group's first row
        self._bounds: tuple[list[str], list[str], np.ndarray] | None = None
        self._ds: ds.FileSystemDataset | None = None

    @property
    def path(self) -> str:
        """The segment's local file; a reader of bytes in memory writes them there on first use (for DuckDB, tools)."""
        if self.data is not None and not self.__dict__.get("_written"):
            try:
                same = file_crc32c(self._path) == (self.data.size, self.info.checksum)  # a copy already there
            except FileNotFoundError:
                same = False
            if not same:
                directory, name = os.path.split(self._path)
                os.makedirs(directory, exist_ok=True)
                write_atomic(directory, name, self.data, fsync=False)  # verified bytes; a cache, as fetch_verified's
            self._written = True
        return self._path

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path, "info": self.info, "data": self.data}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["info"], data=state.get("data"))  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"SegmentReader({self._path!r}, {self.info.name!r}, docs={self.info.doc_count})"

    # -- opening --------------------------------------------------------------------
    @property
    def _source(self) -> str | pa.Buffer:
        """What the reader opens: the file, or the bytes held in memory."""
        return self._path if self.data is None else self.data

    @property
    def _where(self) -> str:
        return self._path

    def _file(self) -> pq.ParquetFile:
        pf = self._pf  # one read: another thread may drop it meanwhile (open_files), never close it under us
        if pf is None:
            try:
                # low-cardinality strings decode through their dictionaries; reads cast them back (dictionary_read.py)
                pf = open_segment_file(self._source)
            except FileNotFoundError:
                raise
            except (pa.ArrowException, OSError) as exc:
                raise SegmentCorrupted(self._where, f"not a readable Parquet file: {exc}") from None
            md = pf.metadata
            if md.num_rows != self.info.doc_count or md.num_row_groups != self.info.row_groups:
                raise SegmentCorrupted(
                    self._where,
                    f"file holds {md.num_rows} rows in {md.num_row_groups} row groups, "
                    f"the segment info says {self.info.doc_count} in {self.info.row_groups}",
                )
            self._pf = pf
        if self.data is None:  # bytes in memory hold no file handle: they never count against the process's bound
            open_segment_files().used(self)  # past the bound, the least recently used reader drops its file
        return pf

    def _drop_file(self) -> None:
        """Let go of the open file without closing it (segments/open_files.py): a read in flight keeps it."""
        self._pf = None

    def _group_starts(self) -> np.ndarray:
        return group_starts(self._file().metadata)

    def _read_groups(self, pf: pq.ParquetFile, groups: Sequence[int], columns: Sequence[str] | None = None,
                     use_threads: bool = True) -> pa.Table:
        """Row groups of the file, a stamped segment's virtual columns made (segments/stamp.py)."""
        return read_groups(pf, self.info.stamp, groups, columns, use_threads=use_threads)


    def _row_group_bounds(self) -> tuple[list[str], list[str], np.ndarray]:
        if self._bounds is None:
            md = self._file().metadata
            col = self._file().schema_arrow.get_field_index("_id")
            mins, maxs = [], []
            for i in range(md.num_row_groups):
                st = md.row_group(i).column(col).statistics
                if st is None or not st.has_min_max:
                    mins.append(self.info.min_id or "")
                    maxs.append(self.info.max_id or "\U0010ffff")
                else:
                    mn, mx = st.min, st.max
                    mins.append(mn.decode() if isinstance(mn, bytes) else mn)
                    maxs.append(mx.decode() if isinstance(mx, bytes) else mx)
            self._bounds = (mins, maxs, self._group_starts())
        return self._bounds

    def close(self) -> None:
        """Close the open Parquet file (it reopens lazily if used again)."""
        pf, self._pf = self._pf, None
        if pf is not None:
            pf.close()
            open_segment_files().closed(self)

    @property
    def schema(self) -> pa.Schema:
        """The segment's Arrow schema (base columns + the fields mapped when it was written; a stamped file's
        virtual columns included)."""
        return stamped_schema(dense_schema(self._file().schema_arrow), self.info.stamp)

    # -- integrity ------------------------------------------------------------------
    def verify(self) -> None:
        """Check the file's size and full CRC32C against the segment info."""
        try:
            size = os.path.getsize(self._path) if self.data is None else self.data.size
        except FileNotFoundError:
            raise SegmentCorrupted(self._where, "segment file is missing") from None
        if size != self.info.size:
            raise SegmentCorrupted(self._where, f"file has {size} bytes, the segment info says {self.info.size}")
        crc = file_crc32c(self._path)[1] if self.data is None else crc32c(memoryview(self.data))
        if crc != self.info.checksum:
            raise SegmentCorrupted(self._where, f"checksum {crc:#010x} != {self.info.checksum:#010x} in the segment info")

    def read_metadata_info(self) -> dict[str, Any]:
        """The segment info stored in the Parquet key-value metadata (no size/checksum)."""
        meta = self._file().schema_arrow.metadata or {}
        raw = meta.get(METADATA_KEY)
        if raw is None:
            raise SegmentCorrupted(self._where, "no shardstore.segment metadata")
        return json.loads(raw)

    # -- ids ------------------------------------------------------------------------
    def ids(self) -> pa.Array:
        """All ``_id`` values in row order (sorted by id in a format 1 segment), cached."""
        if self._index is None:
            self._load_index()
        assert self._index is not None
        return self._index.ids

    def _whole_column(self, name: str) -> pa.Array:
        """One column of the whole file, read through a handle of its own.

        Never through the shared ``_file()``: a scan reads row groups from it on other
        threads, outside the directory lock, and a whole-file read racing those inside one
        pyarrow ParquetFile hung (fault simulator).  Checked against the segment info first.
        """
        self._file()  # the footer against the segment info (SegmentCorrupted names a mismatch)
        if self.info.stamp is not None and name in STAMPED_COLUMNS:
            return stamp_columns(self.info.stamp, np.arange(self.info.doc_count, dtype=np.int64), [name])[0]
        with pq.ParquetFile(parquet_source(self._source)) as pf:
            return pf.read(columns=[name], use_threads=False).column(name).combine_chunks()

    @property
    def index_loaded(self) -> bool:
        """Whether the id index is built (a lookup then reads no ``_id`` column)."""
        return self._index is not None

    def install_index(self, ids: pa.Array, keys: SortedKeys | None = None) -> None:
        """Adopt an id index built elsewhere from this segment's whole ``_id`` column (the warmer's own read);
        ``keys``: their sorted fingerprints with this segment's rows, when the writer has them (a refresh's).

        Only when none is loaded yet; the reader's own file is never touched, so a thread
        that warms never shares a ParquetFile with one that reads (concurrent reads of one
        pyarrow ParquetFile can hang: seen in the fault simulator).
        """
        if self._index is None and len(ids) == self.info.doc_count:
            self._index = _IdIndex(ids, keys)

    def id_index(self) -> _IdIndex:
        """The segment's id index (sorted fingerprints, their rows, the ids), built from ``_id`` on first use."""
        if self._index is None:
            self._load_index()
        assert self._index is not None
        return self._index

    def _load_index(self) -> None:
        try:
            col = self._whole_column("_id")
        except pa.ArrowException as exc:
            raise SegmentCorrupted(self._where, f"cannot read _id: {exc}") from None
        self._index = _IdIndex(col)
        self._rg_cache.clear()

    def _group_ids(self, g: int) -> pa.Array:
        arr = self._rg_cache.get(g)
        if arr is None:
            try:
                arr = row_cache.row_groups.get(  # shared and byte-bounded: a warm get decodes nothing
                    (self._path, self.info.checksum, -1 - g),
                    lambda: self._file().read_row_group(g, columns=["_id"])).column("_id").combine_chunks()
            except pa.ArrowException as exc:
                raise SegmentCorrupted(self._where, f"cannot read _id of row group {g}: {exc}") from None
            if len(self._rg_cache) > 8:
                self._rg_cache.pop(next(iter(self._rg_cache)))
            self._rg_cache[g] = arr
        return arr

    def lookup(self, ids: pa.Array, *, id_fingerprints: np.ndarray | None = None) -> tuple[pa.Array, pa.Array]:
        """Which of ``ids`` exist here: ``(query_positions, segment_rows)`` (int64,
        ascending by query position then row; an id present twice gives two pairs).

        Queries outside the segment's ``[min_id, max_id]`` are dropped first.  Few
        remaining queries (<= :attr:`SMALL_LOOKUP`, index not loaded) in a sorted
        segment: the ``_id`` chunk of each row group whose min/max can hold them is read
        and binary searched.  Otherwise, and always in an unsorted (format 2) segment,
        the fingerprint index (built once per reader) is searched with
        ``numpy.searchsorted``.

        ``id_fingerprints`` (:func:`fingerprints` of ``ids``) saves recomputing them
        when the same ids are looked up in many segments (:func:`lookup_segments`).

        Measured (5M random ids in 50 segments of 100k, 50k lookups half present,
        shared 2-core box), core search only: fingerprint ``searchsorted`` with sorted
        queries 125 ms; ``searchsorted`` over fixed-width id bytes 500 ms;
        ``pc.index_in(queries, value_set=segment ids)`` 1150 ms and
        ``pc.index_in(segment ids, value_set=queries)`` 610 ms (hash tables rebuilt
        per call, nothing to cache); one ``index_in`` over all 5M ids 956 ms.  One id
        over 50 segments: 0.4 ms with a sorted index vs 1.6 s with ``index_in``.
        End to end through :func:`lookup_segments` (warm): ~240 ms for the 50k ids,
        ~3 ms for one id; building the indexes (reading 50 ``_id`` columns) ~4 s once.
        Min/max pruning alone does nothing for random ids (every range covers all).
        """
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not pa.types.is_string(ids.type):
            ids = ids.cast(pa.string())
        empty = (pa.array([], pa.int64()), pa.array([], pa.int64()))
        if self.info.doc_count == 0 or len(ids) == 0:
            return empty
        if len(ids) <= self.SMALL_LOOKUP:
            # a few ids (a get): plain Python comparisons cost less than kernels
            lo_id, hi_id = self.info.min_id, self.info.max_id
            qs = ids.to_pylist()
            qpos = np.array([i for i, x in enumerate(qs) if x is not None and lo_id <= x <= hi_id], dtype=np.int64)
            if qpos.size == 0:
                return empty
            keys = [qs[i] for i in qpos]
            if not self.info.id_sorted:  # rows in any order: only the id index finds them
                return self._indexed(pa.array(keys, pa.string()), qpos)
            if self._index is not None:
                qp, rows = _bisect_all(self._index.ids, keys, 0)
            else:
                qp, rows = self._lookup_small(keys)
            return pa.array(qpos[qp] if qp.size else qp, pa.int64()), pa.array(rows, pa.int64())
        inside = pc.and_(
            pc.greater_equal(ids, pa.scalar(self.info.min_id, pa.string())),
            pc.less_equal(ids, pa.scalar(self.info.max_id, pa.string())),
        )
        inside = pc.fill_null(inside, False)
        qpos = np.flatnonzero(np.asarray(inside.to_numpy(zero_copy_only=False), dtype=bool))
        if qpos.size == 0:
            return empty
        q = ids.take(pa.array(qpos)) if qpos.size != len(ids) else ids
        if self.info.id_sorted and self._index is not None and qpos.size <= self.SMALL_LOOKUP:
            qp, rows = _bisect_all(self._index.ids, q.to_pylist(), 0)
            qp = qpos[qp] if qp.size else qp
        elif self.info.id_sorted and self._index is None and qpos.size <= self.SMALL_LOOKUP:
            qp, rows = self._lookup_small(q.to_pylist())
            qp = qpos[qp] if qp.size else qp
        else:
            return self._indexed(q, qpos, None if id_fingerprints is None else id_fingerprints[qpos])
        return pa.array(qp, pa.int64()), pa.array(rows, pa.int64())

    def _indexed(self, q: pa.Array, qpos: np.ndarray, qh: np.ndarray | None = None) -> tuple[pa.Array, pa.Array]:
        """``lookup`` through the fingerprint index (built on first use): any row order, an id any number of times."""
        if self._index is None:
            self._load_index()
        assert self._index is not None
        qp, rows = self._index.lookup(q, qpos, qh)
        return pa.array(qp, pa.int64()), pa.array(rows, pa.int64())

    def _lookup_small(self, qs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Binary search in the ``_id`` chunks of the row groups whose bounds can hold
        each id (rows are sorted by ``_id``: format 1 only)."""
        mins, maxs, starts = self._row_group_bounds()
        out_q: list[int] = []
        out_r: list[int] = []
        for i, key in enumerate(qs):
            g = bisect.bisect_left(maxs, key)
            while g < len(mins) and mins[g] <= key:
                arr = self._group_ids(g)
                seq = _ArrowSeq(arr)
                j = bisect.bisect_left(seq, key)
                while j < len(arr) and arr[j].as_py() == key:
                    out_q.append(i)
                    out_r.append(int(starts[g]) + j)
                    j += 1
                if j < len(arr):
                    break
                g += 1
        return np.array(out_q, dtype=np.int64), np.array(out_r, dtype=np.int64)

    # -- reading rows ---------------------------------------------------------------
    def take(self, rows: Any, columns: Sequence[str] | None = None) -> pa.Table:
        """The given rows (in the given order), reading only the row groups that hold them."""
        if isinstance(rows, (pa.Array, pa.ChunkedArray)):
            r = np.asarray(rows.to_numpy(zero_copy_only=False), dtype=np.int64)
        else:
            r = np.asarray(rows, dtype=np.int64).reshape(-1)
        pf = self._file()
        cols = list(columns) if columns is not None else None
        if r.size and (r.min() < 0 or r.max() >= self.info.doc_count):
            raise IndexError(f"row numbers must be in [0, {self.info.doc_count})")
        if r.size == 0:
            schema = self.schema
            if cols is not None:
                schema = pa.schema([schema.field(c) for c in cols])
            return schema.empty_table()
        starts = self._group_starts()
        groups = np.searchsorted(starts, r, side="right") - 1
        needed = np.unique(groups)
        try:
            if cols is None and len(needed) <= 2 and row_cache.row_groups.max_bytes > 0:  # a point read
                t = pa.concat_tables([row_cache.row_groups.get(
                    (self._path, self.info.checksum, int(g)), lambda g=int(g): self._read_groups(pf, [g]))
                    for g in needed])
            else:
                t = self._read_groups(pf, needed.tolist(), cols)
        except pa.ArrowException as exc:
            raise SegmentCorrupted(self._where, f"cannot read row groups {needed.tolist()}: {exc}") from None
        sizes = starts[needed + 1] - starts[needed]
        base_in_read = np.concatenate([[0], np.cumsum(sizes)])[:-1]
        where = np.searchsorted(needed, groups)
        local = r - starts[groups] + base_in_read[where]
        return t.take(pa.array(local))

    def point_rows(self, doc_id: str) -> list[int]:
        """The rows holding ``doc_id`` (0 or more), by the in-memory point index (segments/point_read.py)."""
        index = self._point
        if index is None:
            index = self._point = PointIndex(self.ids())
        return index.rows(doc_id)

    def row(self, r: int) -> dict[str, Any]:
        """Row ``r`` as ``{column: value}``, decoded from its cached row group (a point read's path)."""
        if not 0 <= r < self.info.doc_count:
            raise IndexError(f"row numbers must be in [0, {self.info.doc_count})")
        starts = self._starts
        if starts is None:
            starts = self._starts = self._group_starts().tolist()
        g = bisect.bisect_right(starts, r) - 1
        pf = self._file()
        try:
            group = row_cache.row_groups.columns((self._path, self.info.checksum, g), lambda: self._read_groups(pf, [g]))
        except pa.ArrowException as exc:
            raise SegmentCorrupted(self._where, f"cannot read row group {g}: {exc}") from None
        return row_values(group, starts, r)

    def get(self, doc_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows holding ``doc_id`` (0 or more) — deletions not applied."""
        _, rows = self.lookup(pa.array([doc_id], pa.string()))
        return self.take(rows, columns)

    def _dataset(self) -> ds.FileSystemDataset:
        if self._ds is None:
            self._file()  # validates the footer against the info
            if self.data is None:
                self._ds = ds.dataset(self._path, format="parquet")
            else:
                fmt = ds.ParquetFileFormat()
                frag = fmt.make_fragment(self.data)
                self._ds = ds.FileSystemDataset([frag], frag.physical_schema, fmt)
        return self._ds

    def seq_nos(self) -> pa.Array:
        """The ``_seq_no`` column in row order (read once, then cached; the installed version columns' when there)."""
        versions = self.__dict__.get("_version_cache")
        if versions is not None:  # a refresh's older-copy check reads no file it wrote itself (issue 44)
            return versions[0]
        return self._seq_nos()[0]

    def _seq_nos(self) -> tuple[pa.Array, bool]:
        """The ``_seq_no`` column (row order) and whether its values are unique."""
        cached = self.__dict__.get("_seq_cache")
        if cached is None:
            try:
                col = self._whole_column("_seq_no")
            except pa.ArrowException as exc:
                raise SegmentCorrupted(self._where, f"cannot read _seq_no: {exc}") from None
            unique = pc.count_distinct(col).as_py() == len(col)
            cached = (col, unique)
            self.__dict__["_seq_cache"] = cached
        return cached

    def version_columns(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """``_seq_no``, ``_primary_term`` and ``_version`` in row order, read once and cached (24 bytes a row).

        A bulk's version lookup takes its hits' rows from here: its ids fall anywhere in the segment, and reading
        them with :meth:`take` decoded every row group holding one (1,000 ids into 1M documents: all of them,
        per bulk; issue 44)."""
        cached = self.__dict__.get("_version_cache")
        if cached is None:
            try:
                cached = tuple(_int64(a) for a in (self._seq_nos()[0], self._whole_column("_primary_term"),
                                                   self._whole_column("_version")))
            except pa.ArrowException as exc:
                raise SegmentCorrupted(self._where, f"cannot read the version columns: {exc}") from None
            self.__dict__["_version_cache"] = cached
        return cached

    def install_version_columns(self, seq_no: pa.Array, primary_term: pa.Array, version: pa.Array) -> None:
        """Adopt the version columns its writer had in memory (a refresh: rows in the file's order), so the next
        version lookup reads none of them back; ignored when one is installed already or a length differs."""
        n = self.info.doc_count
        if "_version_cache" in self.__dict__ or not len(seq_no) == len(primary_term) == len(version) == n:
            return
        self.__dict__["_version_cache"] = tuple(_int64(a) for a in (seq_no, primary_term, version))

    def live_filter(self, live: LiveDocs | None) -> pc.Expression | None:
        """An expression keeping only the live rows (``~_seq_no.isin(deleted)``), or
        None when nothing is deleted, the segment's ``_seq_no`` values repeat, or it is stamped."""
        if live is None or live.deleted_count == 0 or self.info.stamp is not None:
            return None  # a stamped file holds no _seq_no: an engine reading it raw would drop every row
        seq, unique = self._seq_nos()
        if not unique:
            return None
        return ~pc.field("_seq_no").isin(seq.take(live.deleted_rows()))

    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,  # noqa: A002 - the pyarrow name
        live: LiveDocs | None = None,
        *,
        batch_size: int = 128 * 1024,
        use_threads: bool = True,
    ) -> Iterator[pa.RecordBatch]:
        """Record batches of the live rows matching ``filter`` (row groups pruned by
        their statistics).  Deleted rows are never returned.

        Without deletions this is the plain Arrow dataset scan.  With deletions, runs of
        the row groups left by the filter's statistics pruning (about
        :data:`SCAN_READ_BYTES` each) are read with ``ParquetFile.read_row_groups``
        (threaded over columns), then the live mask and the filter are applied to the
        run as a whole: measured as fast as the raw dataset scan without a filter.
        (``live_filter`` gives the same deletions as a ``_seq_no`` expression, for
        engines such as Spark that only take filters; it costs an extra column.)
        """
        dset = self._dataset()
        cols = list(columns) if columns is not None else list(self.schema.names)
        if live is not None and live.doc_count != self.info.doc_count:
            raise ValueError(f"live docs of {live.doc_count} rows for a segment of {self.info.doc_count}")
        if live is not None and live.live_count == 0:
            return
        if (live is None or live.deleted_count == 0) and self.info.stamp is None:  # a stamp needs row positions
            for batch in dset.to_batches(columns=cols, filter=filter, batch_size=batch_size, use_threads=use_threads):
                if batch.num_rows:
                    yield batch
            return
        yield from self._scan_positional(dset, cols, filter, live, batch_size, use_threads)

    def _scan_positional(self, dset: ds.Dataset, cols: list[str], filter: pc.Expression | None,  # noqa: A002
                         live: LiveDocs, batch_size: int, use_threads: bool) -> Iterator[pa.RecordBatch]:
        yield from _pipeline(self._runs(cols, filter, live, dset), batch_size, readahead=2 if use_threads else 0)

    def _runs(self, cols: list[str], filter: pc.Expression | None, live: LiveDocs | None,  # noqa: A002
              dset: ds.Dataset | None = None) -> list[Callable[[], pa.Table]]:
        """Tasks, each reading one run of row groups (about :data:`SCAN_READ_BYTES`)
        left by the filter's statistics pruning, with the live mask and the filter
        applied; in row order."""
        pf = self._file()
        md = pf.metadata
        starts = self._group_starts()
        groups: list[int] = list(range(md.num_row_groups))
        if prunable(self.info, filter):  # the dataset only to prune by the filter's
            dset = dset if dset is not None else self._dataset()  # statistics (a cold scan opens none)
            groups = sorted(p.row_groups[0].id for frag in dset.get_fragments() for p in frag.split_by_row_group(filter))
        if live is not None and live.live_count == 0:
            return []
        mask = live.mask() if live is not None and live.deleted_count else None
        extra: list[str] = []
        if filter is not None:
            extra = [n for n in self.schema.names if n not in cols and mentions(filter, n)]
        read_cols = cols + extra
        leaf = {md.schema.column(i).path: i for i in range(md.num_columns)}
        idx = [leaf[c] for c in read_cols if c in leaf]
        where = self._where

        def group_bytes(g: int) -> int:
            rg = md.row_group(g)
            return sum(rg.column(i).total_uncompressed_size for i in idx) if idx else rg.total_byte_size

        key = (self._path, self.info.checksum)

        def task(run: list[int]) -> pa.Table:
            cached = [row_cache.row_groups.peek((*key, g)) for g in run]  # decoded already (warmed, point reads)
            if all(c is not None for c in cached):
                t = pa.concat_tables([c.select(read_cols) for c in cached])
            else:
                try:
                    t = self._read_groups(pf, run, read_cols)
                except pa.ArrowException as exc:
                    raise SegmentCorrupted(where, f"cannot read row groups {run}: {exc}") from None
            m = None
            if mask is not None:
                m = pa.concat_arrays([mask.slice(int(starts[x]), int(starts[x + 1] - starts[x])) for x in run])
                if not m.false_count:
                    m = None
            if filter is not None and m is not None:
                # one filtering pass for both: the live mask as a column of the filter
                t = t.append_column(_LIVE_COLUMN, m).filter(filter & pc.field(_LIVE_COLUMN))
                return t.select(cols)
            if m is not None:
                t = t.filter(m)
            elif filter is not None and t.num_rows:
                t = t.filter(filter)
            return t.select(cols) if extra else t

        tasks: list[Callable[[], pa.Table]] = []
        run: list[int] = []
        run_bytes = 0
        for pos, g in enumerate(groups):
            run.append(g)
            run_bytes += group_bytes(g)
            if run_bytes >= SCAN_READ_BYTES or pos + 1 == len(groups):
                tasks.append(functools.partial(task, run))
                run, run_bytes = [], 0
        return tasks


def lookup_segments(readers: Sequence[SegmentReader], ids: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Find ``ids`` in every segment: ``(query_positions, segment_indexes, rows)``
    (int64; ``segment_indexes`` index ``readers``), ordered by segment then query
    position.  The ids' fingerprints are computed once for all segments."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not pa.types.is_string(ids.type):
        ids = ids.cast(pa.string())
    fp = perm = None
    if len(ids) > SegmentReader.SMALL_LOOKUP:
        # fingerprints once, and the queries in fingerprint order: every segment's
        # searchsorted then walks its index front to back (measured 2x faster)
        fp = fingerprints(ids)
        perm = np.argsort(fp, kind="stable")
        fp = fp[perm]
        ids = ids.take(pa.array(perm))
    qs, segs, rows = [], [], []
    for k, reader in enumerate(readers):
        qp, r = reader.lookup(ids, id_fingerprints=fp)
        if len(qp):
            qpn = qp.to_numpy()
            rn = r.to_numpy()
            if perm is not None:
                qpn = perm[qpn]
                o = np.lexsort((rn, qpn))
                qpn, rn = qpn[o], rn[o]
            qs.append(qpn)
            rows.append(rn)
            segs.append(np.full(len(qpn), k, dtype=np.int64))
    if not qs:
        empty = pa.array([], pa.int64())
        return empty, empty, empty
    return (pa.array(np.concatenate(qs), pa.int64()), pa.array(np.concatenate(segs), pa.int64()),
            pa.array(np.concatenate(rows), pa.int64()))


def _pipeline(tasks: Sequence[Callable[[], pa.Table]], batch_size: int, readahead: int) -> Iterator[pa.RecordBatch]:
    """Run ``tasks`` (GIL-free Arrow work) on a small pool, ``readahead`` ahead of
    the consumer, yielding their batches in task order."""
    if readahead <= 0 or len(tasks) <= 1:
        for task in tasks:
            t = task()
            if t.num_rows:
                yield from t.to_batches(max_chunksize=batch_size)
        return
    with ThreadPoolExecutor(readahead) as pool:
        pending: deque = deque()
        it = iter(tasks)
        for task in it:
            pending.append(pool.submit(task))
            if len(pending) > readahead:
                break
        try:
            while pending:
                t = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(nxt))
                if t.num_rows:
                    yield from t.to_batches(max_chunksize=batch_size)
        finally:
            for f in pending:
                f.cancel()


def scan_segments(
    segments: Sequence[tuple[SegmentReader, LiveDocs | None]],
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,  # noqa: A002 - the pyarrow name
    *,
    batch_size: int = 128 * 1024,
    readahead: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Scan several segments (each with its live docs, or None) as one stream, in
    segment order: the row-group runs of every segment go through one small thread
    pool (``readahead`` runs ahead, default the CPU count), so files are read in
    parallel as a ``pyarrow.dataset`` over them would.  All the segments must have
    the requested columns."""
    tasks: list[Callable[[], pa.Table]] = []
    for reader, live in segments:
        if live is not None and live.doc_count != reader.info.doc_count:
            raise ValueError(f"live docs of {live.doc_count} rows for segment {reader.info.name} of {reader.info.doc_count}")
        if reader.info.doc_count == 0:
            continue
        cols = list(columns) if columns is not None else list(reader.schema.names)
        tasks.extend(reader._runs(cols, filter, live))
    yield from _pipeline(tasks, batch_size, readahead if readahead is not None else (os.cpu_count() or 2))


def prunable(info: SegmentInfo, filter: pc.Expression | None) -> bool:  # noqa: A002
    """Whether a segment file's row-group statistics may prune by ``filter``: there is one, and it reads no column a
    stamped file does not hold (segments/stamp.py: its virtual columns have no statistics in the file)."""
    return filter is not None and not (info.stamp is not None and any(mentions(filter, n) for n in STAMPED_COLUMNS))


def conform(data: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table | pa.RecordBatch:
    """``data`` (a table or a batch) with exactly ``schema``'s columns, in order: absent ones null, types cast."""
    cols = []
    for f in schema:
        i = data.schema.get_field_index(f.name)
        cols.append(data.column(i).cast(f.type) if i >= 0 else pa.nulls(data.num_rows, f.type))
    kind = pa.Table if isinstance(data, pa.Table) else pa.RecordBatch
    return kind.from_arrays(cols, schema=schema)


def mentions(expr: pc.Expression, name: str) -> bool:
    """Whether ``expr`` reads field ``name`` (Expression has no public field listing; its text names them)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", str(expr)) is not None


def _int64(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous int64 array (a version lookup's candidate columns are int64)."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a if a.type == pa.int64() else a.cast(pa.int64())
