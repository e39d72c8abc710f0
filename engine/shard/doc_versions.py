"""A primary's versions for one part of a bulk: the one-part path of :meth:`ShardCopy.primary_apply`.

:mod:`shardstore.engine.shard.staging` (the columnar pass over many copies, which imports the shard)
re-exports :func:`with_versions`; the shard imports it from here, below both (issue 42: no cycle).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardstore.core.arrays import filled
from shardstore.engine.errors import VersionConflict
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.id_index import SortedKeys
from shardstore.segments.version_map import SEEN
from shardstore.segments.versions import id_order, ids_unique, next_versions
from shardstore.translog.operations import OpType


def with_versions(directory: ShardDirectory, ops: pa.RecordBatch, expect: tuple | None, big: bool = False, *,
                  all_index: bool = False) -> tuple[pa.RecordBatch, np.ndarray, SortedKeys | None, pa.Array | None]:
    """``ops`` with each index/delete's version set to the id's current version + 1 (+1 per earlier op on it),
    per op whether its id is new to the shard (no copy of it found at all: ``ShardDirectory.apply``'s
    ``new_ids``), the ids' sorted fingerprints when the batch is ``big`` and they are all different (then no id is
    there twice: ``apply``'s ``id_keys``), else None, and the permutation sorting the ids when it was computed (a
    ``big`` batch whose fingerprints repeat: ``apply``'s ``id_order``), else None; ``expect`` (id, if_seq_no,
    if_primary_term) checked first (VersionConflict).

    A big batch's ids are fingerprinted and sorted once (issue 44): distinct fingerprints prove the ids unique, so
    the string sort of the ids is skipped (the refresh needs none either: segments/refresh_plan.py)."""
    ids = ops.column("id")
    keys = filled(ids, "")
    order = unique = sorted_keys = None
    if big:
        # computed once: the buffered runs, the shard-wide id index and then this batch's own run use them
        sorted_keys = SortedKeys.of(keys)
        if sorted_keys.distinct:
            unique = True
        else:  # an id twice, or two ids sharing a fingerprint: the ids themselves decide
            order = id_order(keys)
            unique = ids_unique(keys, order)
            sorted_keys = sorted_keys if unique else None
    current = directory.current_versions(keys, unique=bool(unique), seen=True, keys=sorted_keys)
    new_ids = ~np.asarray(current.column(SEEN).to_numpy(), dtype=bool)
    if expect is not None:
        doc_id, if_seq_no, if_term = expect
        pos = pc.index(ids, doc_id).as_py()
        row = current.slice(pos, 1).to_pylist()[0] if pos >= 0 else {"_seq_no": None, "_primary_term": None}
        if (row["_seq_no"], row["_primary_term"]) != (if_seq_no, if_term):
            raise VersionConflict(doc_id, if_seq_no, if_term, row["_seq_no"], row["_primary_term"])
    versions = next_versions(keys, current.column("_version"), order, unique=unique)
    op_type = ops.column("op_type")
    if not all_index and pc.any(pc.equal(op_type, int(OpType.NO_OP))).as_py():
        versions = pc.if_else(pc.equal(op_type, int(OpType.NO_OP)), pa.nulls(len(versions), pa.int64()), versions)
    return ops.set_column(ops.schema.get_field_index("version"), "version", versions), new_ids, sorted_keys, order


__all__ = ["with_versions"]
