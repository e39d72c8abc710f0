"""Document routing: which shard of an index holds a document id, exactly as Elasticsearch routes.

Elasticsearch's default routing (``Murmur3HashFunction`` + ``IndexRouting``) hashes the
id's UTF-16 code units, each as two little-endian bytes, with Murmur3 x86 32-bit and seed
0 (Lucene's ``StringHelper.murmurhash3_x86_32``, a signed Java int), then takes
``floorMod(hash, routing_num_shards) / routing_factor``.  For an index whose
``routing_num_shards`` equals its shard count that is ``floorMod(hash, num_shards)``,
the default here.  (Elasticsearch 7+ defaults ``index.number_of_routing_shards`` to a
larger multiple, to allow splits; pass ``routing_num_shards`` to match such an index.)

The engine and the Spark writer both route with these functions, so a document lands on
the same shard whichever path wrote it.

:func:`shard_ids` routes an Arrow array of ids: the UTF-8 to UTF-16LE transcoding (one codec
call over the whole data buffer, offsets remapped with numpy) and the modulo are
vectorised; the one per-id step is the C call ``mmh3.hash`` over each id's bytes (mapped
with ``map``, no Python bytecode per id).
"""

from __future__ import annotations

import mmh3
import numpy as np
import pyarrow as pa

from shardstore.engine.errors import InvalidRequest


def _factor(num_shards: int, routing_num_shards: int | None) -> tuple[int, int]:
    """(modulus, divisor) of the routing; InvalidRequest when the shard counts are unusable."""
    if isinstance(num_shards, bool) or not isinstance(num_shards, (int, np.integer)) or num_shards < 1:
        raise InvalidRequest(f"the number of shards must be an integer >= 1, not {num_shards!r}")
    if routing_num_shards is None:
        return int(num_shards), 1
    if (
        isinstance(routing_num_shards, bool)
        or not isinstance(routing_num_shards, (int, np.integer))
        or routing_num_shards < num_shards
        or routing_num_shards % num_shards
    ):
        raise InvalidRequest(
            f"routing_num_shards must be a multiple of the number of shards ({num_shards}), "
            f"not {routing_num_shards!r}")
    return int(routing_num_shards), int(routing_num_shards) // int(num_shards)


def murmur3_hash(doc_id: str) -> int:
    """Elasticsearch's ``Murmur3HashFunction.hash(String)``: a signed 32-bit int."""
    if not isinstance(doc_id, str):
        raise InvalidRequest(f"a document id must be a string, not {type(doc_id).__name__}")
    # surrogatepass: a lone surrogate is one UTF-16 code unit in Java too
    return mmh3.hash(doc_id.encode("utf-16-le", "surrogatepass"), 0)


def shard_id(doc_id: str, num_shards: int, *, routing_num_shards: int | None = None) -> int:
    """The shard of ``doc_id`` in an index of ``num_shards`` shards (Elasticsearch's default routing)."""
    modulus, divisor = _factor(num_shards, routing_num_shards)
    return (murmur3_hash(doc_id) % modulus) // divisor  # Python's % is floorMod for a positive modulus


def _utf16le(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-16LE bytes, int64 byte offsets) of a non-null string array (one C transcode of the whole buffer + numpy)."""
    values = values.cast(pa.large_string())
    n = len(values)
    _, off_buf, data_buf = values.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64, count=values.offset + n + 1)[values.offset:]
    if n == 0 or offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.uint8), np.zeros(n + 1, dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    u8 = np.frombuffer(data_buf, dtype=np.uint8, count=hi)[lo:]
    offsets = offsets - lo
    if not (u8 & 0x80).any():  # all ASCII: one code unit per byte
        units = u8.astype("<u2")
        return units.view(np.uint8), offsets * 2
    # Transcode the whole buffer at once (C codecs; Arrow strings are valid UTF-8, and row
    # boundaries fall on code point boundaries), then map each row's byte offset to its
    # UTF-16 offset: a lead byte starts one code unit, a 4-byte lead (0xF0-0xF4) two.
    data = np.frombuffer(u8.tobytes().decode("utf-8").encode("utf-16-le"), dtype=np.uint8)
    units = (u8 & 0xC0) != 0x80
    units = units.astype(np.int64) + (u8 >= 0xF0)
    before = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(units)])
    return data, before[offsets] * 2


def _check_ids(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``ids`` as one string array; InvalidRequest for ids that are not strings or are null."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    if not isinstance(ids, pa.Array):
        ids = pa.array(ids, type=pa.string())
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)
            or pa.types.is_string_view(ids.type) or pa.types.is_dictionary(ids.type)):
        raise InvalidRequest(f"document ids must be strings, not {ids.type}")
    if pa.types.is_dictionary(ids.type):
        ids = ids.cast(ids.type.value_type)
    if ids.null_count:
        first = int(np.flatnonzero(~np.asarray(ids.is_valid()))[0])
        raise InvalidRequest(f"document {first} has a null id")
    return ids


def murmur3_hashes(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Elasticsearch's ``Murmur3HashFunction.hash`` of each id (int32); InvalidRequest on a null id."""
    ids = _check_ids(ids)
    data, offsets = _utf16le(ids)
    n = len(ids)
    blobs = pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    hashes = np.fromiter(map(mmh3.hash, blobs.to_pylist()), dtype=np.int32, count=n)
    return pa.array(hashes, type=pa.int32())


def shard_ids(
    ids: pa.Array | pa.ChunkedArray, num_shards: int, *, routing_num_shards: int | None = None
) -> pa.Array:
    """The shard of each id (int32), equal to :func:`shard_id` row by row."""
    modulus, divisor = _factor(num_shards, routing_num_shards)
    if modulus == 1:  # every id routes to shard 0: check the ids as the hash would, hash nothing
        _check_ids(ids)
        return pa.array(np.zeros(len(ids), dtype=np.int32))
    hashes = murmur3_hashes(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    return pa.array((np.mod(hashes, modulus) // divisor).astype(np.int32), type=pa.int32())


def split_by_shard(
    table: pa.Table | pa.RecordBatch,
    num_shards: int,
    *,
    id_column: str | None = None,
    routing_num_shards: int | None = None,
) -> dict[int, pa.Table]:
    """Split rows by the shard of their id: ``{shard: rows}``, one take per non-empty shard, order kept.

    The id column is ``id_column``, else ``_id`` (Spark rows) or ``id`` (translog
    operations), whichever the schema has.
    """
    names = table.schema.names
    if id_column is None:
        present = [c for c in ("_id", "id") if c in names]
        if len(present) != 1:
            raise InvalidRequest(
                f"pass id_column: the schema has {'both' if present else 'neither'} of the columns '_id' and 'id'")
        id_column = present[0]
    elif id_column not in names:
        raise InvalidRequest(f"no column {id_column!r} to route by; the columns are {names}")
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    shards = shard_ids(table.column(id_column), num_shards, routing_num_shards=routing_num_shards)
    order, runs = shard_runs(shards)
    if order is not None:
        table = table.take(pa.array(order))
    return {shard: table.slice(lo, hi - lo) for shard, lo, hi in runs}


def shard_runs(shards: pa.Array) -> tuple[np.ndarray | None, list[tuple[int, int, int]]]:
    """Group rows by shard: (the stable permutation putting them in shard order, or None when they all go to
    one shard; then (shard, start, end) of each shard's rows in that order).  One sort, whatever the shards."""
    ids = np.asarray(shards.to_numpy(zero_copy_only=False), dtype=np.int64)
    if len(ids) == 0:
        return None, []
    if (ids == ids[0]).all():
        return None, [(int(ids[0]), 0, len(ids))]
    order = np.argsort(ids, kind="stable")  # rows grouped by shard, original order within a shard
    ordered = ids[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(ordered)]
    return order, [(int(ordered[a]), int(a), int(b)) for a, b in zip(starts, ends)]
