"""Arrow helpers of the ``shardstore`` sink (:mod:`shardstore.spark.writer`): dedupe, typed fields, duplicates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.segments.mapping import Mapping, parse_sources
from shardstore.segments.versions import first_of_runs


def last_per_id(rows: pa.Table) -> pa.Table:
    """The last row of each id, sorted by ``_id`` (one stable sort: Spark's last write of an id in a task wins)."""
    n = rows.num_rows
    if n < 2:
        return rows
    ids = rows.column("_id").combine_chunks()
    if pc.all(pc.less(ids.slice(0, n - 1), ids.slice(1))).as_py():  # already sorted, no id twice
        return rows
    order = pc.array_sort_indices(ids)  # stable: the rows of one id keep their input order
    ids = ids.take(order)
    # the last row of each run of equal ids
    last = pa.concat_arrays([pc.not_equal(ids.slice(0, n - 1), ids.slice(1)), pa.array([True])])
    if pc.all(last).as_py():
        return rows.take(order)
    return rows.take(order.filter(last))


SAMPLE_ROWS = 1024


def typed_fields(rows: pa.Table, ids: pa.Array, sources: pa.Array, mapping: Mapping) -> tuple[pa.Table, Mapping]:
    """The field columns the engine would parse from ``sources``, and the mapping they need.

    The JSON of a sample is parsed (:func:`parse_sources`: dynamic mapping, conflicts);
    then every column of the frame is cast to its mapped type and checked equal to the
    sample's parse, which saves parsing the JSON of every row back.  Anything else
    (struct or dotted columns, a field first seen after the sample, a lossy cast) parses
    all the sources, exactly as the engine does.
    """
    n = len(ids)
    k = min(n, SAMPLE_ROWS)
    sample, mapped = parse_sources(ids.slice(0, k), sources.slice(0, k), mapping, dynamic=True)
    columns = [c for c in rows.column_names if c != "_id"]
    names = {name for name, _t in mapped.items()}
    fast = k == n or all(c in names and not pa.types.is_struct(rows.schema.field(c).type) for c in columns)
    out = []
    for f in mapped.arrow_schema():
        if not fast:
            break
        if f.name not in rows.column_names:
            out.append(pa.nulls(n, f.type))
            continue
        try:
            col = rows.column(f.name).combine_chunks().cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            fast = False
            break
        fast = col.slice(0, k).equals(sample.column(f.name).combine_chunks())
        out.append(col)
    if k == n:
        return sample, mapped
    if not fast:
        return parse_sources(ids, sources, mapping, dynamic=True)
    return pa.table(out, schema=mapped.arrow_schema()), mapped


def superseded_copies(parts: list[Any]) -> dict[int, list[int]]:
    """Part index -> rows of its segment superseded by a higher-seq# copy of the same id (in another part or its own).

    An id two tasks wrote, or one task wrote twice (the fast path keeps every write, each with
    its own seq#): the copy with the highest seq# wins, as the engine's refresh decides.
    """
    ids = pa.chunked_array([p.ids for p in parts], type=pa.string())
    if len(ids) < 2 or len(pc.unique(ids)) == len(ids):  # the common case, no id twice: one hash pass
        return {}
    t = pa.table({
        "_id": ids,
        "_seq_no": pa.concat_arrays([p.seq_nos for p in parts]),
        "part": pa.concat_arrays([pa.array(np.full(len(p.ids), k, dtype=np.int64)) for k, p in enumerate(parts)]),
        "row": pa.concat_arrays([pa.array(np.arange(len(p.ids), dtype=np.int64)) for p in parts]),
    })
    counts = t.group_by("_id").aggregate([("_id", "count")])
    dup_ids = counts.filter(pc.greater(counts.column("_id_count"), 1)).column("_id")
    if len(dup_ids) == 0:
        return {}
    t = t.filter(pc.is_in(t.column("_id"), value_set=dup_ids.combine_chunks()))
    t = t.take(pc.sort_indices(t, sort_keys=[("_id", "ascending"), ("_seq_no", "descending")]))
    losers = t.filter(pc.invert(first_of_runs(t.column("_id").combine_chunks())))
    part_np, row_np = losers.column("part").to_numpy(), losers.column("row").to_numpy()
    return {int(k): row_np[part_np == k].tolist() for k in np.unique(part_np)}


__all__ = ["SAMPLE_ROWS", "last_per_id", "superseded_copies", "typed_fields"]
