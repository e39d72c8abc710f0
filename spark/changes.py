"""``format("shardstore-changes")``: an index's operations in seq# order per shard, batch and streaming (issue 7).

Columns: ``op_type`` (``"index"`` / ``"delete"``), ``_id``, ``_seq_no``, ``_primary_term``,
``_version``, ``_source`` (the JSON document, index ops only) and ``shard``.

Where operations come from, per shard (seed 004's Changes API over our remote store):

- the **remote translog** of every term that claimed the shard, read with
  :meth:`RemoteTranslog.read_operations`, which resolves stale-term operations: per
  seq# the highest primary term wins, and what a newer primary trimmed above its max
  seq# on promotion is dropped (a fenced primary's unacknowledged tail);
- the **newest remote commit's segments** for seq#s the translog no longer retains (it
  is purged up to each flush's checkpoint): there the feed returns the commit's *live
  documents* as index operations.  Below the translog's retained range, overwritten
  copies and deletes are therefore gone (a document's latest state remains), as in
  Elasticsearch once soft-deletes retention has passed.  Documents written by the Spark
  sink live only in segments, and come from there.

A seq# present in both keeps the operation of the highest term (the translog's when
equal).  No-ops (gap fillers after a promotion) are not returned.

Batch options: ``fromSeqNo`` (default 0) and ``toSeqNo`` (default: everything), per shard,
inclusive.  Streaming (``spark.readStream``): offsets are per-shard global checkpoints,
JSON ``{"<shard>": seq_no}`` (every operation at or below it is durable in the store);
a micro-batch reads ``(start, end]`` per shard, so a query restarted from its
checkpointLocation resumes where it left off.  ``trigger(availableNow=True)`` is supported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from shardstore.blobstores.base import BlobStore
from shardstore.core.address import ShardAddress
from shardstore.core.ops import OP_NAMES, OpType
from shardstore.engine.shard.adopted_ops import AdoptedFileLost
from shardstore.engine.shard.adoption_apply import as_index_operations, find_run_head
from shardstore.errors import InvalidError
from shardstore.segments.errors import CommitNotFound
from shardstore.segments.mapping import Mapping
from shardstore.segments.read_plan import CommitPlan
from shardstore.segments.remote_store import iter_commits, latest_commit, list_terms
from shardstore.segments.segment import BASE_SCHEMA
from shardstore.segments.synthetic import op_sources
from shardstore.spark.catalog import open_from_options, resolve_index
from shardstore.translog.remote import RemoteTranslog, translog_state_key

SCHEMA = pa.schema([
    pa.field("op_type", pa.string()), pa.field("_id", pa.string()), pa.field("_seq_no", pa.int64()),
    pa.field("_primary_term", pa.int64()), pa.field("_version", pa.int64()), pa.field("_source", pa.string()),
    pa.field("shard", pa.int32()),
])
SPARK_SCHEMA = StructType([
    StructField("op_type", StringType()), StructField("_id", StringType()), StructField("_seq_no", LongType()),
    StructField("_primary_term", LongType()), StructField("_version", LongType()), StructField("_source", StringType()),
    StructField("shard", IntegerType()),
])
_OP_NAMES = pa.array([OP_NAMES[t] for t in sorted(OpType)])  # indexed by the op type's value
_TOP = 2**63 - 1
_SEGMENT_COLUMNS = pa.schema([BASE_SCHEMA.field(c) for c in ("_id", "_seq_no", "_primary_term", "_version", "_source")])


@dataclass(frozen=True)
class ShardRange(InputPartition):
    """One shard's seq# range ``[from_seq_no, to_seq_no]`` to read."""

    shard: int
    address: ShardAddress
    from_seq_no: int
    to_seq_no: int | None
    order: tuple[str, ...] = ()  # the index's field order: a null _source is rebuilt with its members in it


def _int_option(options: dict[str, str], *names: str, default: int | None) -> int | None:
    """The first of ``names`` given, as an int (InvalidError if it is not one), else ``default``."""
    for name in names:
        if name in options:
            try:
                return int(options[name])
            except ValueError:
                raise InvalidError(f"option {name}={options[name]!r} must be an integer seq#") from None
    return default


def shard_operations(store: BlobStore, address: ShardAddress, shard: int, from_seq_no: int,
                     to_seq_no: int | None = None, *, order: tuple[str, ...] = ()) -> pa.Table:
    """The shard's operations with seq# in ``[from_seq_no, to_seq_no]`` (translog, then segments), seq# order.

    ``order``: the index mapping's field order; a null ``_source`` (a synthetic-source index, or a stored row
    its fields rebuild exactly) is rebuilt from the fields with its members in it.
    """
    top = _TOP if to_seq_no is None else to_seq_no
    prefixes = [address.translog_prefix(t) for t in list_terms(store, address)]
    ops = [b for b in RemoteTranslog.read_operations(store, prefixes, from_seq_no, to_seq_no) if b.num_rows]
    parts = []
    try:
        md = latest_commit(store, address)
    except CommitNotFound:
        md = None
    if ops:
        t = pa.Table.from_batches(ops)
        where = f"shard {address.index_uuid}/{shard}"

        def typed(table: pa.Table) -> pa.Table:  # adopted runs as their files' rows (a cut run's head found below)
            return as_index_operations(table, store, where, lambda seq: find_run_head(
                lambda lo, hi: RemoteTranslog.read_operations(store, prefixes, lo, hi), seq, where))

        try:
            t = typed(t)
        except AdoptedFileLost:
            if md is None:
                raise
            # the files of runs the commit holds may be collected (ingest_gc.py rule 4): those rows come from its
            # segments below; a run above the commit still needs its file
            t = typed(t.filter(pc.or_(pc.not_equal(t.column("op_type"), int(OpType.ADOPTED)),
                                      pc.greater(t.column("seq_no"), md.commit.local_checkpoint))))
        t = t.filter(pc.not_equal(t.column("op_type"), int(OpType.NO_OP)))
        parts.append(pa.table({
            "op_type": pc.take(_OP_NAMES, t.column("op_type").cast(pa.int32())), "_id": t.column("id"),
            "_seq_no": t.column("seq_no"), "_primary_term": t.column("primary_term"), "_version": t.column("version"),
            "_source": op_sources(t, order).cast(pa.string()),  # typed operations: rebuilt from their fields
            "_rank": pa.array(np.ones(t.num_rows, dtype=np.int8)),
        }))
    if md is not None:  # the commit's read plan: only segments whose seq# range meets the asked one
        tasks = CommitPlan(shard, md).tasks(keep=lambda info: info.max_seq_no >= from_seq_no
                                            and info.min_seq_no <= top)
        flt = (pc.field("_seq_no") >= from_seq_no) & (pc.field("_seq_no") <= top)
        # a null _source (synthetic source, or a stored row its fields rebuild) is rebuilt by the read
        got = [b for t in tasks for b in t.read(store, _SEGMENT_COLUMNS, flt) if b.num_rows]
        if got:
            d = pa.Table.from_batches(got)
            parts.append(pa.table({
                "op_type": pa.array(np.full(d.num_rows, OP_NAMES[OpType.INDEX], dtype=object), pa.string()),
                "_id": d.column("_id"), "_seq_no": d.column("_seq_no"), "_primary_term": d.column("_primary_term"),
                "_version": d.column("_version"), "_source": d.column("_source").cast(pa.string()),
                "_rank": pa.array(np.zeros(d.num_rows, dtype=np.int8)),
            }))
    if not parts:
        return SCHEMA.empty_table()
    allops = pa.concat_tables(parts)
    # per seq#: the highest term wins, the translog's copy on a tie
    allops = allops.take(pc.sort_indices(allops, sort_keys=[("_seq_no", "ascending"), ("_primary_term", "descending"),
                                                            ("_rank", "descending")]))
    seq = allops.column("_seq_no").combine_chunks()
    n = len(seq)
    first = pa.concat_arrays([pa.array([True]), pc.not_equal(seq.slice(1), seq.slice(0, n - 1))]) if n else seq
    allops = allops.filter(first).drop_columns(["_rank"])
    return allops.append_column("shard", pa.array(np.full(allops.num_rows, shard, dtype=np.int32))).cast(SCHEMA)


def shard_checkpoint(store: BlobStore, address: ShardAddress) -> int:
    """The shard's durable global checkpoint in the store: every seq# at or below it is committed or logged."""
    try:
        md = latest_commit(store, address)
        cp = md.commit.local_checkpoint
    except CommitNotFound:
        cp = -1
    prefixes = [address.translog_prefix(t) for t in list_terms(store, address)]
    seqs = [b.column("seq_no") for b in RemoteTranslog.read_operations(store, prefixes, cp + 1) if b.num_rows]
    if not seqs:
        return cp
    s = np.unique(pa.concat_arrays(seqs).to_numpy())
    # the contiguous run right above the commit's checkpoint
    run = np.flatnonzero(s != np.arange(cp + 1, cp + 1 + len(s)))
    return int(cp + (len(s) if len(run) == 0 else run[0]))


def shard_state_key(store: BlobStore, address: ShardAddress) -> tuple:
    """What :func:`shard_checkpoint` reads, named by LISTs alone: the newest commit key and each term's
    translog state key (its newest metadata key and the newest round of each node stream it names).

    Commit, translog metadata and round blobs are written once under unique keys, so an
    unchanged state key means an unchanged checkpoint: an idle stream polls with LISTs
    only (and one GET per new metadata blob) instead of reading the retained translog.
    """
    newest_commit = next(iter(iter_commits(store, address)), None)
    terms = list_terms(store, address)
    return newest_commit, tuple((t, translog_state_key(store, address.translog_prefix(t))) for t in terms)


def _to_batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """The table's non-empty batches of at most 64K rows."""
    yield from (b for b in table.to_batches(max_chunksize=64 * 1024) if b.num_rows)


class ShardstoreChangesReader(DataSourceReader):
    """Batch reader: one partition per shard, ``fromSeqNo``..``toSeqNo``."""

    def __init__(self, options: dict[str, str]) -> None:
        """Parse ``fromSeqNo``/``toSeqNo``."""
        self.options = options
        self.from_seq_no = _int_option(options, "fromSeqNo", "fromseqno", default=0)
        self.to_seq_no = _int_option(options, "toSeqNo", "toseqno", default=None)

    def partitions(self) -> list[ShardRange]:
        """One range per shard of the index."""
        store = open_from_options(self.options)
        loc = resolve_index(store, _index(self.options))
        order = Mapping.from_dict(loc.mappings).order
        return [ShardRange(s, loc.address(s), self.from_seq_no, self.to_seq_no, order)
                for s in range(loc.shards)]

    def read(self, partition: ShardRange) -> Iterator[pa.RecordBatch]:
        """The shard's operations in the range as Arrow batches."""
        store = open_from_options(self.options)
        yield from _to_batches(shard_operations(store, partition.address, partition.shard, partition.from_seq_no,
                                                partition.to_seq_no, order=partition.order))


class ShardstoreChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reader: offsets are per-shard global checkpoints ``{"<shard>": seq_no}``."""

    def __init__(self, options: dict[str, str]) -> None:
        """No store access until Spark asks for offsets."""
        self.options = options
        self._target: dict[str, int] | None = None
        self._loc = None
        self._store: BlobStore | None = None
        self._known: dict[int, tuple[tuple, int]] = {}  # shard -> (state key, its checkpoint)

    def _location(self) -> Any:
        """The index's location (resolved once)."""
        if self._loc is None:
            self._loc = resolve_index(open_from_options(self.options), _index(self.options))
        return self._loc

    def _latest(self) -> dict[str, int]:
        """Every shard's durable global checkpoint now (recomputed only for shards whose state key moved)."""
        if self._store is None:
            self._store = open_from_options(self.options)
        loc = self._location()
        out = {}
        for s in range(loc.shards):
            key = shard_state_key(self._store, loc.address(s))
            known = self._known.get(s)
            if known is None or known[0] != key:
                known = (key, shard_checkpoint(self._store, loc.address(s)))
                self._known[s] = known
            out[str(s)] = known[1]
        return out

    def initialOffset(self) -> dict:
        """Before every operation (or just below ``fromSeqNo`` when given)."""
        first = _int_option(self.options, "fromSeqNo", "fromseqno", default=0)
        return {str(s): first - 1 for s in range(self._location().shards)}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        """Each shard's current global checkpoint (capped at the availableNow target)."""
        latest = self._latest()
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, v)) for k, v in latest.items()}
        return {k: max(v, int(start.get(k, -1))) for k, v in latest.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target offset: what is durable now."""
        self._target = self._latest()

    def partitions(self, start: dict, end: dict) -> list[ShardRange]:
        """One range ``(start, end]`` per shard that moved."""
        loc = self._location()
        order = Mapping.from_dict(loc.mappings).order
        return [ShardRange(int(k), loc.address(int(k)), int(start.get(k, -1)) + 1, int(v), order)
                for k, v in sorted(end.items(), key=lambda kv: int(kv[0])) if int(v) > int(start.get(k, -1))]

    def read(self, partition: ShardRange) -> Iterator[pa.RecordBatch]:
        """The shard's operations in the range."""
        store = open_from_options(self.options)
        yield from _to_batches(shard_operations(store, partition.address, partition.shard, partition.from_seq_no,
                                                partition.to_seq_no, order=partition.order))

    def commit(self, end: dict) -> None:
        """Nothing to release: the store keeps no per-consumer state."""


def _index(options: dict[str, str]) -> str:
    """The ``index`` option (InvalidError when missing)."""
    index = options.get("index")
    if not index:
        raise InvalidError("format('shardstore-changes') needs .option('index', '<name>')")
    return index


class ShardstoreChangesDataSource(DataSource):
    """``format("shardstore-changes")``: operations of an index per shard, batch and streaming."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "shardstore-changes"

    def schema(self) -> StructType:
        """op_type, _id, _seq_no, _primary_term, _version, _source, shard."""
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> ShardstoreChangesReader:
        """Batch reader over ``fromSeqNo``..``toSeqNo``."""
        return ShardstoreChangesReader(dict(self.options))

    def streamReader(self, schema: StructType) -> ShardstoreChangesStreamReader:
        """Streaming reader following the shards' global checkpoints."""
        return ShardstoreChangesStreamReader(dict(self.options))


__all__ = ["ShardstoreChangesDataSource", "shard_checkpoint", "shard_operations"]
