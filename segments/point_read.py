"""Point reads of one document: an in-memory id map and a one-row decode (issue 31).

A ``get`` used to cost ~0.3 ms, most of it in Arrow calls of fixed cost: a batch id lookup
(fingerprints of a one-element array, a binary search in Python), a ``take`` of one row over
every column of the cached row group, a ``to_pylist`` of the one-row table and the columnar
JSON writer for one row.  Here each step is a few Python operations:

* :class:`PointIndex`, per segment: the ``_id`` column's Python ``hash`` values sorted, with
  their rows.  A lookup is one ``hash``, one ``numpy.searchsorted`` and a comparison of the
  candidate ids (a hash collision never yields a wrong row).  ``hash`` of a ``str`` is salted
  per process (``PYTHONHASHSEED``), which is why the map lives in memory only and is built
  when first needed.  Memory: 16 bytes a document beside the ``_id`` column the reader
  already keeps (a million documents: ~16 MB).
* :func:`row_values`: the row's values straight from the cached, decoded row group
  (``row_cache``), one scalar per column, over the group's columns split once per cached
  group (:class:`GroupColumns`, ``RowGroupCache.columns``).

``tests/segments/test_point_read.py`` checks them against the batch paths they bypass.
"""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

__all__ = ["GroupColumns", "PointIndex", "group_columns", "row_values"]


class PointIndex:
    """``doc id -> rows`` of one segment, by the ids' Python hashes (process-local; module docstring)."""

    def __init__(self, ids: pa.Array | list[str]) -> None:
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        values = ids if isinstance(ids, list) else ids.to_pylist()
        hashes = np.fromiter((hash(s) for s in values), dtype=np.int64, count=len(values))
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._rows = order.astype(np.int64)
        self._ids = ids  # the candidates' ids (Arrow: compact), compared to rule out a collision
        self._is_list = isinstance(ids, list)

    def rows(self, doc_id: str) -> list[int]:
        """The rows holding ``doc_id`` (0 or more, ascending), deletions not applied."""
        h = hash(doc_id)
        hashes = self._hashes
        i = int(np.searchsorted(hashes, h))
        out = []
        while i < len(hashes) and hashes[i] == h:
            r = int(self._rows[i])
            if (self._ids[r] if self._is_list else self._ids[r].as_py()) == doc_id:
                out.append(r)
            i += 1
        return sorted(out)


class GroupColumns(NamedTuple):
    """A decoded row group's column names and arrays, split once: a Table or RecordBatch makes a new Python
    wrapper per column on every ``.columns`` (about 70 us of a 24-column row's 110, measured in stop 53)."""

    names: tuple[str, ...]
    arrays: tuple[pa.Array | pa.ChunkedArray, ...]


def group_columns(group: pa.Table | pa.RecordBatch) -> GroupColumns:
    """``group`` split into its names and arrays (a one-chunk column as its chunk: indexing skips the chunk search)."""
    arrays = tuple(c.chunk(0) if isinstance(c, pa.ChunkedArray) and c.num_chunks == 1 else c for c in group.columns)
    return GroupColumns(tuple(group.column_names), arrays)


def row_values(group: pa.Table | pa.RecordBatch | GroupColumns, starts: list[int], row: int) -> dict[str, Any]:
    """Row ``row`` of a segment as ``{column: value}``, from its decoded row group ``group`` (``starts``: first rows)."""
    local = row - starts[bisect.bisect_right(starts, row) - 1]
    cols = group if isinstance(group, GroupColumns) else group_columns(group)
    return {name: col[local].as_py() for name, col in zip(cols.names, cols.arrays)}
