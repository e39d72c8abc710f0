"""Which rows of an adopted file stay stamped, and the versions of those applied again (pure; docs/design/adoption.md).

A shard copy adopts a file of rows (``ShardDirectory.adopt``): row ``r`` takes seq# ``S + r``.
Its stamp (segments/stamp.py) says every row has version 1, which holds only for a row whose id
the shard has never seen and which no other row of the file repeats.  Every other row is
*re-applied*: it is deleted from the adopted segment through live docs and buffered as an ordinary
index operation at the same seq# ``S + r``, with the version a bulk of the same rows in file order
would give it: the id's current version plus its occurrences so far in the file.  The refresh
then deletes its older copies as it does for any write.

The decision depends only on the file's ids and the shard's answers for them, so a replica or a
replay of the same file over the same history decides the same.  A replica or a replay does not
rely on that: it passes the primary's per-row versions (``given``, from the adopted operations in
the translog), and every row the primary re-applied (a version other than 1) is re-applied with
the primary's version, so the copies agree on every version even where their histories differ
(a copy that merged a tombstone away, a replay over rows already there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import filled, one_array
from shardstore.segments.errors import MappingConflict
from shardstore.segments.mapping import Mapping
from shardstore.segments.segment_info import BASE_SCHEMA


@dataclass(frozen=True)
class Reapplied:
    """The rows of an adopted file applied again as operations, and their versions (file order)."""

    rows: np.ndarray  # int64 row numbers, ascending
    versions: np.ndarray  # int64, one per row of ``rows``


def reapply_plan(ids: pa.Array | pa.ChunkedArray, seen: pa.Array | np.ndarray, versions: pa.Array,
                 given: np.ndarray | None = None, *, distinct: bool = False) -> Reapplied:
    """The rows to re-apply and their versions.

    ``ids``: the file's ``_id`` column in row order; ``seen``: per row, whether the shard holds any copy of
    its id (live, deleted, or a buffered operation: ``current_versions(..., seen=True)``); ``versions``: per
    row, the version of the id's newest live copy (null when none).  ``given``: per row, the version the
    primary logged (a replica's or a replay's adoption): the rows re-applied are then those this copy would
    re-apply and those the primary gave a version other than 1, each with the primary's version.  ``distinct``:
    the caller knows no id occurs twice in ``ids`` (its id index found no equal fingerprints): the ids are not
    sorted to find repeats.
    """
    ids = one_array(ids)
    n = len(ids)
    seen_np = np.asarray(seen.to_numpy(zero_copy_only=False) if isinstance(seen, (pa.Array, pa.ChunkedArray))
                         else seen, dtype=bool)
    if seen_np.size != n or len(versions) != n or (given is not None and len(given) != n):
        raise ValueError(f"reapply_plan: {n} ids, {seen_np.size} seen flags, {len(versions)} versions"
                         + ("" if given is None else f", {len(given)} given versions"))
    if n == 0:
        return Reapplied(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    if distinct:
        by_row = np.zeros(n, dtype=np.int64)  # every row is its id's first (and only) one in the file
        again = seen_np
    else:
        order = np.asarray(pc.array_sort_indices(ids).to_numpy(), dtype=np.int64)  # stable: rows of an id ascend
        sorted_ids = ids.take(pa.array(order))
        starts = np.ones(n, dtype=bool)
        if n > 1:
            starts[1:] = np.asarray(pc.not_equal(sorted_ids.slice(1), sorted_ids.slice(0, n - 1))
                                    .to_numpy(zero_copy_only=False), dtype=bool)
        group = np.cumsum(starts) - 1  # per sorted row, its id's group
        sizes = np.bincount(group)
        first = np.flatnonzero(starts)
        repeated = np.empty(n, dtype=bool)
        repeated[order] = sizes[group] > 1
        by_row = np.empty(n, dtype=np.int64)
        by_row[order] = np.arange(n, dtype=np.int64) - first[group]  # 0 for an id's first row in the file
        again = seen_np | repeated
    if given is not None:
        given = np.asarray(given, dtype=np.int64)
        rows = np.flatnonzero(again | (given != 1)).astype(np.int64)
        return Reapplied(rows, given[rows])
    base = np.asarray(filled(versions, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = np.flatnonzero(again).astype(np.int64)
    return Reapplied(rows, base[rows] + by_row[rows] + 1)


def row_versions(rows: int, again: Reapplied) -> np.ndarray:
    """Every row's version after an adoption: 1 (what its stamp says), or the version it was re-applied with."""
    out = np.ones(rows, dtype=np.int64)
    out[again.rows] = again.versions
    return out


def check_adoptable(schema: pa.Schema, mapping: Mapping, where: str) -> None:
    """MappingConflict unless every field column of a file to adopt is mapped, as the same Arrow type (the file's
    columns are read as they are: a mismatch would read wrong, not fail); ValueError for an ``_id`` that is not a
    string or a ``_source`` that is not binary (a merge could not concatenate it with other segments)."""
    mapped = {f.name: f.type for f in mapping.arrow_schema()}
    for f in schema:
        if f.name in ("_id", "_source") and f.type != (pa.string() if f.name == "_id" else pa.binary()):
            raise ValueError(f"{where}: {f.name} is {f.type}, not {'string' if f.name == '_id' else 'binary'}")
        if f.name in BASE_SCHEMA.names:
            continue
        if f.name not in mapped:
            raise MappingConflict(f.name, None, "(not mapped)", f"{f.type} in {where}")
        if f.type != mapped[f.name]:
            raise MappingConflict(f.name, None, str(mapped[f.name]), f"{f.type} in {where}")


__all__ = ["Reapplied", "check_adoptable", "reapply_plan", "row_versions"]
