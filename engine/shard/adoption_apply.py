"""A shard copy's side of adoption: fetch the file an adopted run names, checked, and adopt it (issue 43).

Every copy adopts the same bytes: the primary and each replica (and a replay of the translog
after a restart, a peer recovery, a restore from the store) GET the staged file the run names,
check its size and CRC32C against the run's head (engine/shard/adopted_ops.py), and hand it to
``ShardDirectory.adopt`` as a hard link of the downloaded file (no second copy of its bytes).
A file that is gone or not those bytes raises :class:`~.adopted_ops.AdoptedFileLost`, naming the
blob and the seq#s it held: a copy never adopts other rows under those seq#s.

Downloads go to ``adopting-<uuid>.parquet`` beside the copy's ``index`` directory (the same file
system, so the link holds) and are removed once adopted; :func:`remove_leftovers` deletes those a
killed process left.
"""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobNotFound
from shardstore.core.ops import FIELDS_COLUMN, OpType, with_fields
from shardstore.core.records import crc32c
from shardstore.engine.shard.adopted_ops import (
    AdoptedFile,
    AdoptedFileLost,
    AdoptedRun,
    decode_reason,
    has_adopted,
    plain_end,
    run_marks,
)
from shardstore.fileio import disk_fault
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.directory_records import Adopted
from shardstore.segments.stamp import Stamp
from shardstore.translog.errors import InvalidOperation
from shardstore.translog.operations import SCHEMA
from shardstore.translog.replay import unify_fields

_PREFIX = "adopting-"


def fetch_adopted(store: BlobStore | None, file: AdoptedFile, into: str, first: int | None) -> str:
    """``file`` downloaded into a new file under ``into`` and checked (size, CRC32C, row count); its path.

    ``first``: the seq# its first row takes (for the error; None: a primary that takes none before the file is
    checked).  AdoptedFileLost when the store lacks it or holds other bytes; ValueError when the bytes are right but
    hold another number of rows than the run says.
    """
    data = fetch_bytes(store, file, first)
    os.makedirs(into, exist_ok=True)
    path = os.path.join(into, f"{_PREFIX}{uuid.uuid4().hex}.parquet")
    with open(path, "wb") as f:  # not fsynced: ShardDirectory.adopt fsyncs the segment it links to these bytes
        f.write(data)
    return path


def stage_bytes(data: pa.Buffer | bytes, into: str) -> str:
    """``data`` written to a new file under ``into`` to be adopted from (a part written once); its path.  Not
    fsynced: ``ShardDirectory.adopt`` fsyncs the segment it links to these bytes; :func:`remove_leftovers` deletes
    one a killed process left."""
    path = os.path.join(into, f"{_PREFIX}{uuid.uuid4().hex}.parquet")
    disk_fault("write", path)  # an injected disk fault (the simulator), as a segment write meets one
    with open(path, "wb") as f:
        f.write(data)
    return path


def fetch_bytes(store: BlobStore | None, file: AdoptedFile, first: int | None) -> bytes:
    """``file``'s bytes from the store, checked as :func:`fetch_adopted` checks them."""
    last = None if first is None else first + file.rows - 1
    if store is None:
        raise AdoptedFileLost(file.key, first, last, "this copy has no blob store to fetch it from")
    try:
        data = store.get(file.key)
    except BlobNotFound:
        raise AdoptedFileLost(file.key, first, last, "gone from the store; the rows it held cannot be applied "
                                                     "here") from None
    got = crc32c(data)
    if len(data) != file.size or got != file.crc32c:
        raise AdoptedFileLost(file.key, first, last, f"{len(data)} bytes, CRC32C {got:08x} in the store; its run "
                                                     f"recorded {file.size} bytes, {file.crc32c:08x}")
    rows = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
    if rows != file.rows:
        raise ValueError(f"adopted file {file.key}: {rows} rows, its run says {file.rows}")
    return data


def as_index_operations(ops: pa.Table, store: BlobStore | None, where: str,
                        find_head: Callable[[int], tuple[AdoptedFile, int]] | None = None) -> pa.Table:
    """``ops`` (translog operations, seq# order) with each adopted run replaced by the index operations it stands
    for: its file's rows as typed operations (their fields in ``fields``, no source), at the run's seq#s, term and
    versions.  For readers of the translog that report documents (the changes feed, Spark's translog tail, a bulk
    load folding the tail).  A reader's seq# bounds may cut a run: its rows here are taken from the file all the
    same, and a run whose head lies below ``ops`` is found with ``find_head(seq#)`` (``(file, S)``; without it,
    InvalidOperation).  AdoptedFileLost names a file that is gone."""
    if ops.num_rows == 0 or not any(has_adopted(b) for b in ops.to_batches()):
        return ops
    batch = ops.combine_chunks().to_batches()[0]
    adopted, heads = run_marks(batch)
    seq = batch.column("seq_no").to_numpy()
    terms = batch.column("primary_term").to_numpy()
    plain = batch.select(SCHEMA.names) if FIELDS_COLUMN in batch.schema.names else batch
    pieces: list[pa.Table] = []
    files: dict[AdoptedFile, pa.Table] = {}
    i, n = 0, batch.num_rows
    while i < n:
        if not adopted[i]:
            j = plain_end(adopted, i)
            pieces.append(pa.Table.from_batches([batch.slice(i, j - i)]))
            i = j
            continue
        if heads[i]:
            file, base = decode_reason(batch.column("reason")[i].as_py(), where)
        elif find_head is not None:
            file, base = find_head(int(seq[i]))
        else:
            raise InvalidOperation(i, None, f"{where}: an adopted operation (seq# {int(seq[i])}) without its run's head")
        first_row = int(seq[i]) - base
        if not 0 <= first_row < file.rows:
            raise InvalidOperation(i, None, f"{where}: seq# {int(seq[i])} is not in the adopted run of {file.key} "
                                            f"at seq# {base} ({file.rows} rows)")
        j = i + 1
        while j < n and adopted[j] and not heads[j] and seq[j] == seq[j - 1] + 1 and seq[j] < base + file.rows:
            j += 1
        if np.any(terms[i:j] != terms[i]):
            raise InvalidOperation(i, None, f"{where}: the adopted run of {file.key} at seq# {base} has two terms")
        if file not in files:  # by key, size, CRC32C and rows: a key staged again under another job is other bytes
            files[file] = pq.read_table(pa.BufferReader(fetch_bytes(store, file, base)))
        rows = files[file].slice(first_row, j - i)
        fields = rows.drop_columns([c for c in ("_id", "_source") if c in rows.column_names])
        part = plain.slice(i, j - i).set_column(2, SCHEMA.field("op_type"), pa.array(np.zeros(j - i, np.int8)))
        pieces.append(pa.Table.from_batches([with_fields(part, fields)]))
        i = j
    return pa.concat_tables(unify_fields(pieces))


def find_run_head(read: Callable[[int, int], Iterable[pa.RecordBatch]], seq_no: int, where: str
                  ) -> tuple[AdoptedFile, int]:
    """``(file, S)`` of the adopted run holding ``seq_no``, its head searched below it in widening windows of
    ``read(lo, hi)`` (translog operations with lo <= seq# <= hi); InvalidOperation when there is none."""
    span = 1024
    while True:
        lo = max(0, seq_no - span)
        best: tuple[AdoptedFile, int] | None = None
        for b in read(lo, seq_no):
            mask = pc.and_(pc.equal(b.column("op_type"), int(OpType.ADOPTED)), pc.is_valid(b.column("reason")))
            for reason in b.column("reason").filter(pc.fill_null(mask, False)).to_pylist():
                file, base = decode_reason(reason, where)
                if base <= seq_no < base + file.rows and (best is None or base > best[1]):
                    best = (file, base)
        if best is not None:
            return best
        if lo == 0:
            raise InvalidOperation(None, None, f"{where}: no adopted run's head holds seq# {seq_no}")
        span *= 8


def adopt_fetched(directory: ShardDirectory, path: str, stamp: Stamp, versions: pa.Array | None = None) -> Adopted:
    """Adopt the downloaded ``path`` (hard-linked into the directory), then remove the download."""
    try:
        return directory.adopt(path, stamp, link=True,
                               versions=None if versions is None else versions.to_numpy(zero_copy_only=False))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def adopt_run(directory: ShardDirectory, run: AdoptedRun, store: BlobStore | None, into: str) -> Adopted:
    """A replica's or a replay's adoption of ``run``: the primary's file, seq#s, term and versions."""
    path = fetch_adopted(store, run.file, into, run.seq_no_base)
    return adopt_fetched(directory, path, Stamp(run.seq_no_base, run.primary_term), run.ops.column("version"))


def remove_leftovers(into: str) -> int:
    """Delete downloads a killed process left under ``into``; how many."""
    n = 0
    for path in glob.glob(os.path.join(glob.escape(into), f"{_PREFIX}*.parquet")):
        with contextlib.suppress(OSError):
            os.unlink(path)
            n += 1
    return n


__all__ = ["adopt_fetched", "adopt_run", "as_index_operations", "fetch_adopted", "fetch_bytes", "find_run_head",
           "remove_leftovers", "stage_bytes"]
