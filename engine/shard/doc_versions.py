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
from shardstore.segments.versions import ids_unique, next_versions
from shardstore.translog.operations import OpType


def with_versions(directory: ShardDirectory, ops: pa.RecordBatch, expect: tuple | None,
                  order: pa.Array | None = None, *, all_index: bool = False
                  ) -> tuple[pa.RecordBatch, np.ndarray, SortedKeys | None]:
    """``ops`` with each index/delete's version set to the id's current version + 1 (+1 per earlier op on it),
    per op whether its id is new to the shard (no copy of it found at all: ``ShardDirectory.apply``'s
    ``new_ids``), and the ids' sorted fingerprints when the batch was big enough to sort (``order``) and holds no
    id twice (``apply``'s ``id_keys``), else None; ``expect`` (id, if_seq_no, if_primary_term) checked first
    (VersionConflict)."""
    ids = ops.column("id")
    keys = filled(ids, "")
    unique = ids_unique(keys, order) if order is not None else None  # one check for both lookups below
    # computed once: the buffered runs, the shard-wide id index and then this batch's own run use them
    sorted_keys = SortedKeys.of(keys) if unique else None
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
    return ops.set_column(ops.schema.get_field_index("version"), "version", versions), new_ids, sorted_keys


__all__ = ["with_versions"]
