"""The Python data source's routed staging: a task's Arrow batches as one Parquet file per shard (issue 43).

On a ``local[...]`` master the live sink writes routed files through the JVM bridge (spark/routed_stage.py).
Elsewhere the Python data source's tasks stage what they get (spark/live_sink.py ``stage_rows``); this module
gives them the same routed layout, so the cluster adopts their files as segments instead of indexing rows
(docs/design/adoption.md, step 5):

- :func:`arrow_layout` decides once per task from the batches' Arrow schema: every column is ``_id`` (a
  string), a metadata column (dropped), or a mapped field whose Arrow type casts to the mapped one exactly
  (integers into ``long``, ``int8``-``int32`` into ``integer``, floats into ``double``, strings into
  ``keyword``/``text``, booleans, timestamps into ``date``: milliseconds in UTC, as segment files hold them).
  Anything else keeps the row layout.
- :class:`RoutedFiles` routes each batch's rows by ES murmur3 of ``_id`` (engine/coordinator/routing.py),
  keeps each shard's rows in input order (a later row of a repeated id must stay later), and stages a file per
  shard once the task holds ``file_rows`` rows (its largest shard's first), so a task keeps at most about one
  file's rows in memory whatever the shard count.
- A value the mapped type cannot hold as it is stays as it is: a timestamp with sub-millisecond digits keeps its
  column's own type in the file (never truncated), and a null ``_id`` goes into shard 0's file.  The
  coordinator's check then refuses the file for adoption (the type) or the job (the id), as the row path
  refuses the same rows, naming them.

The coordinator checks each file again before anything is adopted (engine/coordinator/ingest_adopt.py): a
wrong guess here costs speed, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.blobstores.base import BlobStore
from shardstore.engine.coordinator.ingest import IGNORED_COLUMNS, stage_table
from shardstore.engine.coordinator.ingest_job import StagedFile
from shardstore.engine.coordinator.routing import shard_ids
from shardstore.segments.mapping import FieldType, Mapping

__all__ = ["RoutedFiles", "arrow_layout"]

_INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")


def _exact(t: pa.DataType, ftype: FieldType) -> bool:
    """Whether a column of Arrow type ``t`` casts to a mapped ``ftype`` without changing a value (module doc)."""
    if ftype is FieldType.LONG:
        return pa.types.is_integer(t) and str(t) in _INTS
    if ftype is FieldType.INTEGER:
        return str(t) in ("int8", "int16", "int32", "uint8", "uint16")
    if ftype is FieldType.DOUBLE:
        return pa.types.is_floating(t) and not pa.types.is_float16(t)
    if ftype in (FieldType.KEYWORD, FieldType.TEXT):
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if ftype is FieldType.BOOLEAN:
        return pa.types.is_boolean(t)
    if ftype is FieldType.DATE:
        return pa.types.is_timestamp(t)
    return False


def arrow_layout(schema: pa.Schema, mapping: dict[str, Any]) -> pa.Schema | None:
    """The routed files' schema (``_id`` then the frame's mapped columns, as the mapped Arrow types), or None when a
    column keeps the row layout (module docstring)."""
    mapped = Mapping.from_dict(mapping)
    if "_id" not in schema.names:
        return None
    fields = [pa.field("_id", pa.string())]
    for f in schema:
        if f.name == "_id":
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                return None
            continue
        if f.name in IGNORED_COLUMNS:
            continue
        if f.name not in mapped or "." in f.name or not _exact(f.type, mapped[f.name]):
            return None
        fields.append(pa.field(f.name, mapped[f.name].arrow_type))
    return pa.schema(fields)


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``, column by column; a timestamp column whose values do not fit milliseconds exactly keeps
    its own type (module docstring)."""
    columns = []
    for f in schema:
        col = table.column(f.name)
        if pa.types.is_timestamp(f.type) and col.type != f.type:
            try:
                col = col.cast(f.type, safe=True)
            except pa.ArrowInvalid:  # sub-millisecond digits: kept (in UTC), so the file is not adopted and the
                col = col.cast(pa.timestamp(col.type.unit, tz="UTC"))  # row path refuses the row, naming it
        else:
            col = col.cast(f.type)
        columns.append(col)
    return pa.table(columns, names=schema.names)


class RoutedFiles:
    """One task attempt's routed files: batches in, staged files out, one shard each (module docstring)."""

    def __init__(self, store: BlobStore, prefix: str, where: str, schema: pa.Schema, shards: int,
                 file_rows: int, stage: Callable[..., StagedFile] = stage_table) -> None:  # noqa: D107
        self.store, self.prefix, self.where, self.schema, self.shards = store, prefix, where, schema, shards
        self.file_rows = file_rows
        self._stage = stage
        self._pending: dict[int, list[pa.Table]] = {}
        self._rows: dict[int, int] = {}
        self.files: list[StagedFile] = []

    def add(self, batch: pa.RecordBatch) -> None:
        """Route ``batch``'s rows to their shards (input order kept per shard); stage the shards that filled a file."""
        if batch.num_rows == 0:
            return
        table = _cast(pa.Table.from_batches([batch]).select(self.schema.names), self.schema)
        ids = table.column("_id")
        null = None
        if ids.null_count:  # into shard 0's file: the coordinator's check names the row (module docstring)
            null = np.asarray(ids.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            ids = pc.fill_null(ids, "")
        shards = np.array(shard_ids(ids, self.shards).to_numpy(zero_copy_only=False))
        if null is not None:
            shards[null] = 0
        order = np.argsort(shards, kind="stable")  # rows of one shard keep their input order
        cuts = np.flatnonzero(np.diff(shards[order])) + 1
        for rows in np.split(order, cuts):
            shard = int(shards[rows[0]])
            self._pending.setdefault(shard, []).append(table.take(pa.array(rows)))
            self._rows[shard] = self._rows.get(shard, 0) + len(rows)
        while sum(self._rows.values()) >= self.file_rows:  # about one file's rows held at most
            self._flush(max(self._rows, key=lambda k: self._rows[k]))

    def finish(self) -> list[StagedFile]:
        """Stage every shard's rows left; the task's files."""
        for shard in sorted(self._pending):
            self._flush(shard)
        return self.files

    def _flush(self, shard: int) -> None:
        parts = self._pending.pop(shard, [])
        self._rows.pop(shard, None)
        if not parts:
            return
        # a batch whose timestamps kept their own type (sub-millisecond digits) widens the column for the whole file
        table = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
        staged = self._stage(self.store, self.prefix, f"{self.where}-s{shard}-{len(self.files)}", table)
        self.files.append(replace(staged, shard=shard))

