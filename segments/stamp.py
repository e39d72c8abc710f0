"""Stamped segments: a file with no metadata columns, stamped by its commit entry (issue 43, docs/design/adoption.md).

A file written by another engine (Spark's own Parquet writer) holds a shard's rows but none of
``_seq_no``, ``_primary_term`` and ``_version``: those are known only when a primary adopts it,
long after the file was written.  Rewriting it to add them would cost as much as indexing the
rows.  So its segment info carries a :class:`Stamp` instead (format version
:data:`~.segment_info.STAMPED_FORMAT_VERSION`), and the columns are *virtual*:

- row ``r`` (in file order) has ``_seq_no = seq_no_base + r``;
- every row has ``_primary_term = primary_term`` and ``_version = 1``.

A row that updates a live document, or repeats an id of the same file, is not stamped: the
adopter re-applies it as an ordinary operation at seq# ``seq_no_base + r`` (its real version) and
deletes the file's row through live docs, so every version read from a stamp is right.

:func:`stamp_columns` is the one place the virtual values are made; :class:`~.segment.SegmentReader`
and the read plan's tasks call it wherever they read rows of a stamped file (scans, takes, point
reads through the row cache, version lookups), so a stamped segment reads exactly as the same rows
written out with those columns would (tests/segments/test_stamped_segments.py).  A merge reads
through the reader and writes the columns out for real.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstore.core.arrays import dense, dense_schema

#: The metadata columns a stamp stands for, in the base schema's order.
STAMPED_COLUMNS = ("_seq_no", "_primary_term", "_version")
#: What a stamped segment reads as, in order, when its file lacks them: the stamped columns and a null ``_source``
#: (rebuilt from the row's fields as a synthetic source is: segments/synthetic.py ``fill_sources``).
_FIELDS = {**{name: pa.field(name, pa.int64(), nullable=False) for name in STAMPED_COLUMNS},
           "_source": pa.field("_source", pa.binary())}


@dataclass(frozen=True)
class Stamp:
    """The metadata columns of a stamped segment: seq# ``seq_no_base + row``, one term, version 1."""

    seq_no_base: int
    primary_term: int

    def __post_init__(self) -> None:
        if self.seq_no_base < 0 or self.primary_term < 1:
            raise ValueError(f"a stamp needs seq_no_base >= 0 and primary_term >= 1, got {self}")

    def to_dict(self) -> dict[str, int]:
        """The stamp as its segment info's JSON keeps it."""
        return {"seq_no_base": self.seq_no_base, "primary_term": self.primary_term}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stamp:
        """The stamp of a segment info's JSON (KeyError/ValueError when malformed: the caller names the segment)."""
        return cls(int(d["seq_no_base"]), int(d["primary_term"]))


def stamp_columns(stamp: Stamp, rows: np.ndarray, names: Sequence[str] = STAMPED_COLUMNS) -> list[pa.Array]:
    """The virtual columns ``names`` for the file rows ``rows`` (int64 row numbers, in the order wanted)."""
    out = []
    for name in names:
        if name == "_seq_no":
            out.append(pa.array(np.asarray(rows, dtype=np.int64) + stamp.seq_no_base, pa.int64()))
        elif name == "_primary_term":
            out.append(pa.array(np.full(len(rows), stamp.primary_term, dtype=np.int64), pa.int64()))
        elif name == "_version":
            out.append(pa.array(np.ones(len(rows), dtype=np.int64), pa.int64()))
        elif name == "_source":
            out.append(pa.nulls(len(rows), pa.binary()))
        else:
            raise KeyError(f"{name!r} is not a virtual column of a stamped segment (those are {list(_FIELDS)})")
    return out


def stamped_schema(file_schema: pa.Schema, stamp: Stamp | None) -> pa.Schema:
    """The schema a segment reads as: a stamped file's has the base columns first (``_id``, the stamped ones, and
    ``_source``, null when the file has none), then the file's other columns in its order."""
    if stamp is None:
        return file_schema
    base = [file_schema.field(file_schema.get_field_index("_id"))]
    for name, f in _FIELDS.items():
        i = file_schema.get_field_index(name)
        base.append(f if i < 0 or name in STAMPED_COLUMNS else file_schema.field(i))
    names = {f.name for f in base}
    return pa.schema(base + [f for f in file_schema if f.name not in names], metadata=file_schema.metadata)


def group_rows(starts: Sequence[int] | np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """The file rows of row groups ``groups`` (in that order), given each group's first row (and the end)."""
    if not len(groups):
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(int(starts[g]), int(starts[g + 1]), dtype=np.int64) for g in groups])


def group_starts(md: pq.FileMetaData) -> np.ndarray:
    """Each row group's first row, then the row count (``len == row groups + 1``)."""
    counts = np.array([md.row_group(i).num_rows for i in range(md.num_row_groups)], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)])


def read_groups(pf: pq.ParquetFile, stamp: Stamp | None, groups: Sequence[int], columns: Sequence[str] | None = None,
                *, use_threads: bool = True, starts: Sequence[int] | np.ndarray | None = None) -> pa.Table:
    """Row groups ``groups`` of a segment file (``columns``, or all), with a stamped file's virtual columns made.

    The one read every row-group reader of a segment goes through (scans, takes, the row cache, read
    tasks): an unstamped file is read as it is; a stamped one reads the columns its file holds and
    gets the others from :func:`stamp_columns`, in the order of ``columns`` (or of :func:`stamped_schema`).
    The stamped columns are always virtual: a stamped file's own ``_seq_no`` (it should hold none) is ignored.
    A file opened with ``read_dictionary`` (segments/dictionary_read.py) reads those columns back as plain strings.
    """
    groups = [int(g) for g in groups]
    if stamp is None:
        if len(groups) == 1:
            return dense(pf.read_row_group(groups[0], columns=columns, use_threads=use_threads))
        return dense(pf.read_row_groups(groups, columns=columns, use_threads=use_threads))
    schema = stamped_schema(dense_schema(pf.schema_arrow), stamp)
    names = list(schema.names) if columns is None else list(columns)
    have = set(pf.schema_arrow.names) - set(STAMPED_COLUMNS)
    t = dense(pf.read_row_groups(groups, columns=[n for n in names if n in have], use_threads=use_threads))
    virtual = [n for n in names if n not in have]
    made = dict(zip(virtual, stamp_columns(stamp, group_rows(group_starts(pf.metadata) if starts is None
                                                              else starts, groups), virtual)))
    fields = [schema.field(n) for n in names]
    return pa.Table.from_arrays([made[n] if n in made else t.column(n) for n in names], schema=pa.schema(fields))


__all__ = ["STAMPED_COLUMNS", "Stamp", "group_rows", "group_starts", "read_groups", "stamp_columns", "stamped_schema"]
