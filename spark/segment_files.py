"""Segment files written by Spark's own Parquet writer, made into committed parts (the sink's fast write path).

:mod:`shardstore.spark.fast_write` has Spark's tasks write one Parquet file per task and shard into a
local directory (the bridge's ``SegmentWriter``, which returns each file's shard and path).  :func:`collect_parts`
turns each into what :meth:`~shardstore.spark.writer.ShardstoreArrowWriter.commit` takes: the
file's :class:`~shardstore.segments.segment.SegmentInfo` (row count, row groups, per-column
min/max/null counts from the Parquet footer, seq# and id bounds; also written into the footer's
key-value metadata under ``shardstore.segment`` by the bridge, as the segment writer keeps it;
then size and CRC32C of the bytes), uploaded under a fresh key of the job's term (``if_absent``), with its ids and seq#s
(the commit's duplicate check: an id written more than once keeps its highest seq#) and, for ids
the base commit holds live, the rows of their old copies (deleted by the commit through live docs).
The writer keeps the rows in the task's input order: a file in ``_id`` order makes a format 1
segment, any other an unsorted one (format 2; docs/design/segments.md, "Unsorted segments").
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.blobstores.base import BlobStore
from shardstore.errors import CorruptError
from shardstore.segments.remote_metadata import RemoteFile, data_key
from shardstore.segments.segment import (
    BASE_SCHEMA,
    METADATA_KEY,
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

_BASE = frozenset(BASE_SCHEMA.names)


class SparkSegmentMismatch(CorruptError):
    """A file Spark wrote does not hold what the fast path asked for (a bug, never a user error)."""


def _column_stats(pf: pq.ParquetFile, name: str, t: pa.DataType) -> ColumnStats:
    """Min/max/null count of one field column from the footer (read from the data when a row group lacks them)."""
    return footer_column_stats(pf.metadata, pf.schema_arrow.get_field_index(name), name, t,
                               lambda: pf.read(columns=[name]).column(name))


@dataclass(frozen=True)
class KeyBounds:
    """A file's id order and the bounds of its ids and seq#s (what its segment info needs of them)."""

    id_sorted: bool  # the ids never decrease in row order (a format 1 segment)
    min_id: str | None
    max_id: str | None
    min_seq_no: int | None
    max_seq_no: int | None


def key_bounds(ids: pa.Array, seq_nos: pa.Array) -> KeyBounds:
    """The key bounds of a file from its ids and seq#s, read back in row order."""
    seq = pc.min_max(seq_nos)
    id_sorted = in_id_order(ids)
    return KeyBounds(id_sorted, *id_bounds(ids, id_sorted), seq["min"].as_py(), seq["max"].as_py())


def footer_key_bounds(path: str, id_sorted: bool) -> KeyBounds:
    """The key bounds of a file from its footer's ``_id`` / ``_seq_no`` statistics (``id_sorted`` as its writer saw it).

    A row group without statistics has its column read instead (footer_column_stats).
    """
    with pq.ParquetFile(path) as pf:
        ids, seqs = _column_stats(pf, "_id", pa.string()), _column_stats(pf, "_seq_no", pa.int64())
    return KeyBounds(id_sorted, ids.min, ids.max, seqs.min, seqs.max)


def segment_info(path: str, name: str, keys: KeyBounds, term: int,
                 add_footer: Callable[[str, str, str, bool], Any] | None = None) -> SegmentInfo:
    """The segment info of a file Spark wrote, given its key bounds.

    Rows in ``_id`` order make a format 1 segment, any other order an unsorted one (format
    :data:`~shardstore.segments.segment.UNSORTED_FORMAT_VERSION`).  ``add_footer(path, key,
    value, sorted_by_id)`` (the bridge's ``SegmentFooter.addKeyValue``) stores the
    size/checksum-free part in the file's key-value metadata under ``shardstore.segment``, as
    :func:`~shardstore.segments.segment.write_segment` does, and declares a sorted file's
    sorting column; size and CRC32C are taken after it.
    """
    with pq.ParquetFile(path) as pf:
        schema = pf.schema_arrow
        if schema.names[:len(BASE_SCHEMA)] != BASE_SCHEMA.names:
            raise SparkSegmentMismatch(f"{path}: columns {schema.names} do not start with {BASE_SCHEMA.names}")
        cols = []
        for f in schema:
            t = f.type
            if f.name in _BASE or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                                       or pa.types.is_timestamp(t) or pa.types.is_string(t)):
                continue
            cols.append(_column_stats(pf, f.name, t))
        md = pf.metadata
        n, groups = md.num_rows, md.num_row_groups
        largest = max((md.row_group(g).num_rows for g in range(groups)), default=0)
    base = {"min_seq_no": keys.min_seq_no, "max_seq_no": keys.max_seq_no, "max_primary_term": term,
            "min_id": keys.min_id, "max_id": keys.max_id}
    if add_footer is not None:
        meta = metadata_info(name, n, groups, largest, keys.id_sorted, base, cols)
        add_footer(path, METADATA_KEY.decode(), json.dumps(meta), keys.id_sorted)
    size, crc = file_crc32c(path)
    return SegmentInfo(name=name, file_name=segment_file_name(name), size=size, checksum=crc, doc_count=n,
                       columns=tuple(cols), row_groups=groups, format_version=format_version_of(keys.id_sorted),
                       **base)


def check_seq_no_range(path: str, lo: int | None, hi: int | None, first: int, end: int) -> None:
    """SparkSegmentMismatch unless a file's seq#s ``lo..hi`` lie inside ``[first, end)``, the range its shard handed out.

    One outside it is a file of another job or shard, or a counter not started where the claim said.
    """
    if lo is not None and (lo < first or hi is None or hi >= end):
        raise SparkSegmentMismatch(f"{path}: seq#s {lo}..{hi} are outside the job's range [{first}, {end}) "
                                   f"for this shard")


#: Suffix of the file of 64-bit id fingerprints the JVM writer leaves next to each segment file (``SegmentWriter``).
FINGERPRINTS = ".ids64"


def fingerprints_repeat(paths: list[str], rows: list[int]) -> bool:
    """Whether a 64-bit id fingerprint appears twice over the files' fingerprint files (then an id may repeat).

    ``rows[k]``: the row count of ``paths[k]``; a fingerprint file of another length refuses
    (a short one could hide a repeated id).  No repeat means every id is unique, and the
    commit needs neither the ids nor a duplicate check; a repeat (an id written twice, or a
    fingerprint collision) sends the caller to read the ids and decide exactly.
    """
    if len(paths) != len(rows):
        raise ValueError(f"fingerprints_repeat: {len(paths)} files but {len(rows)} row counts")
    prints = np.empty(sum(rows), dtype="<u8")  # every file read into one array, sorted in place (no copies)
    at = 0
    for path, n in zip(paths, rows):
        size = os.path.getsize(path + FINGERPRINTS)
        if size != 8 * n:
            raise SparkSegmentMismatch(f"{path}{FINGERPRINTS}: {size} bytes of id fingerprints for {n} rows "
                                       f"(8 bytes a row)")
        with open(path + FINGERPRINTS, "rb") as f:
            got = f.readinto(memoryview(prints[at:at + n]).cast("B"))
        if got != size:
            raise SparkSegmentMismatch(f"{path}{FINGERPRINTS}: read {got} of its {size} bytes")
        at += n
    if at < 2:
        return False
    prints.sort()
    return bool(np.any(prints[1:] == prints[:-1]))


def read_keys(path: str, first: int, end: int, versions: bool = True) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    """A file's ``_id``, ``_seq_no`` and (``versions``) ``_version`` columns, its seq#s checked inside ``[first, end)``.

    The seq#s are the range the job's counters handed out for the file's shard; one outside it
    (a file of another job or shard, a counter not started where the claim said) refuses the file.
    """
    names = ["_id", "_seq_no", "_version"] if versions else ["_id", "_seq_no"]
    t = pq.read_table(path, columns=names, use_threads=False)
    ids, seqs = t.column("_id").combine_chunks(), t.column("_seq_no").combine_chunks()
    if len(seqs):
        lo, hi = (v.as_py() for v in pc.min_max(seqs).values())
        check_seq_no_range(path, lo, hi, first, end)
    return ids, seqs, t.column("_version").combine_chunks() if versions else None


def check_shard_seq_nos(shard: int, seq_nos: list[pa.Array | None], rows: int, handed_out: int) -> None:
    """SparkSegmentMismatch unless every row of a shard's files took its own seq#.

    ``seq_nos``: each part's seq#s as read back, None for a part the fingerprint screen took
    from its footer (its writer took each row's seq# as it wrote the row, so its rows must
    merely not outnumber the ``handed_out`` seq#s); ``rows``: the rows of all the parts.
    """
    read = [s for s in seq_nos if s is not None]
    if len(read) < len(seq_nos) and rows > handed_out:
        raise SparkSegmentMismatch(f"shard {shard}: {rows} rows in the files Spark wrote, more than the "
                                   f"{handed_out} seq#s it handed out")
    check_unique_seq_nos(shard, read)


def check_unique_seq_nos(shard: int, seq_nos: list[pa.Array]) -> None:
    """SparkSegmentMismatch if a seq# appears twice in a shard's files (each row must have taken its own).

    The job's counters hand every stamped row a new seq#; a row seen twice in the files (a row
    duplicated after the stamp, e.g. by a join that matched two rows) would publish one seq#
    for two documents.
    """
    seqs = pa.chunked_array(seq_nos, type=pa.int64())
    if len(seqs) > 1 and len(pc.unique(seqs)) != len(seqs):
        raise SparkSegmentMismatch(f"shard {shard}: a seq# appears on more than one row of the files Spark wrote")


def upload(store: BlobStore, prefix: str, path: str, info: SegmentInfo, token: str) -> RemoteFile:
    """Upload one segment file under a fresh key of ``prefix`` (``if_absent``), as its info describes it."""
    key = f"{prefix}/{data_key(info.file_name, uuid.uuid4().hex)}"
    with open(path, "rb") as f:
        store.put_stream(key, f, if_absent=True, token=token)
    return RemoteFile(key, info.size, info.checksum)


def new_name() -> str:
    """A fresh segment name (the Python sink's form)."""
    return f"seg_{uuid.uuid4().hex[:16]}"


def in_parallel(fn: Any, items: list[Any], workers: int = 4) -> list[Any]:
    """``fn`` over ``items`` on a small thread pool (pyarrow, CRC32C and uploads release the GIL)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


__all__ = ["FINGERPRINTS", "KeyBounds", "SparkSegmentMismatch", "check_seq_no_range", "check_shard_seq_nos",
           "check_unique_seq_nos",
           "file_crc32c", "fingerprints_repeat", "footer_key_bounds", "in_parallel", "key_bounds", "new_name", "read_keys",
           "segment_info", "upload"]
