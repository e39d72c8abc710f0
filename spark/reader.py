"""Reading an index through ``spark.read.format("shardstore")``: commits, partitions, filters, Arrow batches.

The driver (:func:`plan_read`, once per load: the source keeps the plan from ``schema()``
for ``reader()``) picks one remote commit per shard (the newest, or the one ``asOfCommit`` /
``asOfSeqNo`` asks for) as a segments-owned :class:`~shardstore.segments.read_plan.CommitPlan`
and, with ``includeTranslog``, the newest remote-translog operation per id above that
commit's checkpoint.  :class:`ShardstoreReader` wraps the plan's
:class:`~shardstore.segments.read_plan.ReadTask` s (one per segment, or per range of
``rowGroupsPerPartition`` row groups: blob keys, sizes, CRC32Cs and the segment's stats) in
partitions.  ``read()`` runs on the executors: the task reads itself through the verified
cache, the pushed filters' row groups, live docs and the translog's supersessions, and
yields Arrow record batches.  Spark holds no segment-reading code of its own.

Options (case-insensitive): ``store``, ``index`` (required); ``asOfCommit`` (``"7"``: generation
7 of every shard, or ``"0:7,1:4"``: per shard, unnamed shards newest); ``asOfSeqNo``
(``"N"`` or ``"0:N,1:M"``: per shard the newest commit holding no operation above N, i.e.
``max_seq_no <= N``); ``includeTranslog`` (``true``: also every acknowledged operation
above the commit's local checkpoint, up to ``asOfSeqNo`` when given); ``includeSource``;
``rowGroupsPerPartition`` (default: ranges of about 1M rows); ``cacheDir``.  See docs/design/spark.md.

Spark 4.3 caches a Python source's planned read, pushed filters included, on the
DataFrame: an unfiltered action after a filtered one on the *same* DataFrame reuses the
filtered read.  Load anew per query (docs/design/spark.md, "Filter pushdown").
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from shardstore.blobstores.base import BlobStore
from shardstore.core.ops import OpType
from shardstore.engine.shard.adopted_ops import AdoptedFileLost
from shardstore.engine.shard.adoption_apply import as_index_operations, find_run_head
from shardstore.errors import InvalidError
from shardstore.segments.errors import CommitNotFound
from shardstore.segments.mapping import Mapping
from shardstore.segments.read_plan import DEFAULT_CACHE_DIR, CommitPlan, ReadTask
from shardstore.segments.reader import open_commit
from shardstore.segments.remote_metadata import RemoteCommitMetadata
from shardstore.segments.remote_store import latest_commit, list_terms
from shardstore.segments.segment import BASE_SCHEMA, conform
from shardstore.segments.synthetic import index_op_fields, op_sources
from shardstore.spark.catalog import IndexLocation, open_from_options, resolve_index
from shardstore.spark.filters import compile_filters, segment_may_match, to_expression

META_COLUMNS = ("_id", "_seq_no", "_primary_term", "_version")


# --------------------------------------------------------------------------- options


def lower_options(options: dict[str, Any]) -> dict[str, str]:
    """Options with lower-cased keys (Spark passes them case-insensitively)."""
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _flag(options: dict[str, str], name: str) -> bool:
    value = options.get(name, "false").strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidError(f"option {name}={value!r}: expected true or false")
    return value in ("true", "1", "yes")


def per_shard(value: str | None, shards: int, name: str) -> dict[int, int]:
    """``"7"`` -> 7 for every shard; ``"0:7,1:4"`` -> those shards only."""
    if value is None or not str(value).strip():
        return {}
    text = str(value).strip()
    try:
        if ":" not in text:
            return {s: int(text) for s in range(shards)}
        out = {}
        for item in text.split(","):
            shard, _, num = item.strip().partition(":")
            out[int(shard)] = int(num)
    except ValueError:
        raise InvalidError(f"option {name}={value!r}: expected an integer or 'shard:value,shard:value'") from None
    bad = sorted(s for s in out if not 0 <= s < shards)
    if bad:
        raise InvalidError(f"option {name}={value!r}: the index has shards 0..{shards - 1}, not {bad}")
    return out


# --------------------------------------------------------------------------- the plan (driver side)


@dataclass(frozen=True)
class ShardRead:
    """What one shard contributes: its commit's read plan and the translog's newest operation per id above it."""

    shard: int
    commit: CommitPlan  # the translog tail's ids are its superseded ids
    translog: pa.Table | None = None  # id, op_type, seq_no, primary_term, version, source (newest per id)

    @property
    def metadata(self) -> RemoteCommitMetadata:
        """The chosen remote commit."""
        return self.commit.metadata


@dataclass(frozen=True)
class ReadPlan:
    """The commits (and translog tails) a read returns, with the merged mapping."""

    location: IndexLocation
    shards: tuple[ShardRead, ...]
    mapping: Mapping


def _choose_commit(store: BlobStore, loc: IndexLocation, shard: int, generation: int | None,
                   seq_no: int | None) -> RemoteCommitMetadata:
    """The shard's commit the options ask for (segments' ``open_commit``), with the option to change in the error."""
    try:
        return open_commit(store, loc.address(shard), generation, max_seq_no=seq_no).metadata
    except CommitNotFound as exc:
        if seq_no is not None:
            hint = " (pick a larger asOfSeqNo)"
        elif generation is not None:
            hint = " (asOfCommit names a generation the store does not hold)"
        else:
            hint = " (nothing of the shard was flushed to the store yet: flush the index)"
        raise CommitNotFound(f"index {loc.name!r} shard {shard}: {exc}{hint}") from None


def newest_per_id(ops: pa.Table) -> pa.Table:
    """The newest operation (highest seq#) of every id; no-ops dropped."""
    ops = ops.filter(pc.not_equal(ops["op_type"], int(OpType.NO_OP)))
    if ops.num_rows == 0:
        return ops
    ops = ops.sort_by([("id", "ascending"), ("seq_no", "descending")]).combine_chunks()
    ids = ops.column("id").chunk(0) if ops.column("id").num_chunks else pa.array([], pa.string())
    first = pa.concat_arrays([pa.array([True]), pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))])
    return ops.filter(first)


def _translog_tail(store: BlobStore, loc: IndexLocation, shard: int, md: RemoteCommitMetadata,
                   to_seq_no: int | None) -> pa.Table:
    from shardstore.translog.operations import SCHEMA
    from shardstore.translog.remote import RemoteTranslog

    address = loc.address(shard)
    prefixes = [address.translog_prefix(t) for t in list_terms(store, address)]
    cp = md.commit.local_checkpoint
    batches = list(RemoteTranslog.read_operations(store, prefixes, cp + 1, to_seq_no))
    # one schema: SCHEMA, or SCHEMA + the typed ``fields`` of a synthetic-source index (resolve unifies them)
    ops = pa.Table.from_batches(batches, batches[0].schema if batches else SCHEMA)
    where = f"index {loc.name!r} shard {shard}"  # adopted runs as their files' rows, typed (a cut run: found below)
    try:
        ops = as_index_operations(ops, store, where, lambda seq: find_run_head(
            lambda lo, hi: RemoteTranslog.read_operations(store, prefixes, lo, hi), seq, where))
    except AdoptedFileLost as exc:
        if to_seq_no is None:
            raise
        raise CommitNotFound(f"index {loc.name!r} shard {shard}: an adopted file above commit {md.commit.generation} "
                             f"is collected ({exc}); read asOfSeqNo without includeTranslog, or a seq# of a newer "
                             f"commit") from None
    if to_seq_no is not None:  # an older commit: a newer one may have let the primary purge the ops above it
        need = min(to_seq_no, latest_commit(store, address).commit.local_checkpoint)
        seqs = ops.column("seq_no")
        have = pc.sum(pc.and_(pc.greater(seqs, cp), pc.less_equal(seqs, need))).as_py() or 0 if ops.num_rows else 0
        if need > cp and have != need - cp:
            raise CommitNotFound(f"index {loc.name!r} shard {shard}: the remote translog no longer holds seq# "
                                 f"{cp + 1}..{need} above commit {md.commit.generation} (purged after a newer "
                                 f"commit); read asOfSeqNo without includeTranslog, or a seq# of a newer commit")
    return newest_per_id(ops)


def plan_read(options: dict[str, Any]) -> tuple[BlobStore, ReadPlan]:
    """Resolve the store, the index and one commit per shard (plus translog tails) from the options."""
    opts = lower_options(options)
    index = opts.get("index")
    if not index:
        raise InvalidError("the shardstore data source needs .option('index', '<name>')")
    store = open_from_options(opts)
    loc = resolve_index(store, index)
    gens = per_shard(opts.get("asofcommit"), loc.shards, "asOfCommit")
    seqs = per_shard(opts.get("asofseqno"), loc.shards, "asOfSeqNo")
    with_translog = _flag(opts, "includetranslog")
    if with_translog and gens:
        raise InvalidError("includeTranslog cannot be combined with asOfCommit (the translog above an old commit "
                           "may be purged); use asOfSeqNo with includeTranslog for an exact point in time")

    def one(shard: int) -> ShardRead:
        md = _choose_commit(store, loc, shard, gens.get(shard), seqs.get(shard))
        tail = _translog_tail(store, loc, shard, md, seqs.get(shard)) if with_translog else None
        ids = tail.column("id").combine_chunks() if tail is not None and tail.num_rows else None
        return ShardRead(shard, CommitPlan(shard, md).with_superseded(ids), tail)

    with ThreadPoolExecutor(max_workers=max(1, min(8, loc.shards))) as pool:
        shards = tuple(pool.map(one, range(loc.shards)))
    mapping = Mapping()
    for s in shards:
        m = Mapping.from_dict(s.metadata.commit.mapping)
        mapping = mapping.with_fields({n: t for n, t in m.items() if n not in mapping})
    return store, ReadPlan(loc, shards, mapping)


# --------------------------------------------------------------------------- schemas


def _spark_arrow_type(t: pa.DataType) -> pa.DataType:
    return pa.timestamp("us", tz="UTC") if pa.types.is_timestamp(t) else t


def full_arrow_schema(mapping: Mapping, include_source: bool) -> pa.Schema:
    """The columns a read returns, as Spark receives them (timestamps in microseconds)."""
    fields = [f for f in BASE_SCHEMA if f.name in META_COLUMNS or (include_source and f.name == "_source")]
    fields += list(mapping.arrow_schema())
    return pa.schema([pa.field(f.name, _spark_arrow_type(f.type), nullable=True) for f in fields])


def to_struct_type(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow schema (string, long, int, double, boolean, timestamp, binary)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def check_columns(names: list[str], known: pa.Schema, index: str) -> None:
    """InvalidError naming the columns of a user schema that the index does not have."""
    unknown = [n for n in names if n not in known.names]
    if unknown:
        raise InvalidError(f"index {index!r} has no column(s) {unknown}; its columns are {known.names}")


def infer_schema(options: dict[str, Any], plan: ReadPlan | None = None) -> StructType:
    """Mapped fields (typed) plus _id, _seq_no, _primary_term, _version; _source with includeSource."""
    if plan is None:
        _store, plan = plan_read(options)
    return to_struct_type(full_arrow_schema(plan.mapping, _flag(lower_options(options), "includesource")))


# --------------------------------------------------------------------------- partitions


class SegmentPartition(InputPartition):
    """One read task of a shard's commit (a segment or a range of its row groups): keys, sizes, checksums, stats."""

    def __init__(self, task: ReadTask) -> None:
        self.task = task

    @property
    def row_groups(self) -> tuple[int, int]:
        """The task's row-group range."""
        return self.task.row_groups


class TranslogPartition(InputPartition):
    """One shard's acknowledged-but-unflushed documents (newest index operation per id)."""

    def __init__(self, shard: int, ops: pa.Table, mapping: dict) -> None:
        self.shard, self.ops, self.mapping = shard, ops, mapping


class EmptyPartition(InputPartition):
    """Stands for an index with nothing to read (Spark wants at least one partition)."""

    def __init__(self) -> None:
        self.value = None


def segment_partitions(plan: ReadPlan, filters: list[tuple], per_partition: int) -> list[InputPartition]:
    """Partitions of the plan's read tasks (segments pruned by their stats) and translog tails."""
    parts: list[InputPartition] = []
    for s in plan.shards:
        tasks = s.commit.tasks(keep=lambda info: segment_may_match(info, filters), row_groups_per_task=per_partition)
        parts.extend(SegmentPartition(t) for t in tasks)
        if s.translog is not None:
            live = s.translog.filter(pc.equal(s.translog["op_type"], int(OpType.INDEX)))
            if live.num_rows:
                parts.append(TranslogPartition(s.shard, live, s.metadata.commit.mapping))
    return parts or [EmptyPartition()]


def parse_sources_table(ops: pa.Table, mapping: dict, *, source: bool = True) -> pa.Table:
    """Translog index operations as documents: metadata columns, ``_source`` and typed mapped fields.

    Typed operations carry their fields, and a null ``source`` is rebuilt from them (in the
    index's field order, as a segment's is) when ``source``; else it stays null.
    """
    ops = ops.filter(pc.equal(ops["op_type"], int(OpType.INDEX)))
    ids = ops.column("id").combine_chunks()
    index_mapping = Mapping.from_dict(mapping)
    fields, _mapping = index_op_fields(ops, index_mapping, dynamic=False)
    cols = {"_id": ids, "_seq_no": ops.column("seq_no"), "_primary_term": ops.column("primary_term"),
            "_version": ops.column("version"),
            "_source": op_sources(ops, index_mapping.order) if source else ops.column("source")}
    cols.update({n: fields.column(n) for n in fields.column_names})
    return pa.table(cols)


def read_translog(part: TranslogPartition, schema: pa.Schema, expr: pc.Expression | None,
                  work: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The typed documents of one shard's unflushed index operations, filtered, as batches of ``schema``."""
    table = parse_sources_table(part.ops, part.mapping, source="_source" in schema.names)
    if expr is not None:
        table = conform(table, work).filter(expr)
    if table.num_rows:
        yield from conform(table, schema).to_batches()


class ShardstoreReader(DataSourceReader):
    """Reads one plan: partitions per segment (row-group ranges), Arrow batches, pushed filters."""

    def __init__(self, options: dict[str, Any], schema: StructType, plan: ReadPlan | None = None) -> None:
        self.options = lower_options(options)
        if plan is None:
            self.store, self.plan = plan_read(self.options)
        else:  # planned by the source's schema(): a load plans once
            self.store, self.plan = open_from_options(self.options), plan
        known = full_arrow_schema(self.plan.mapping, True)
        check_columns(schema.fieldNames(), known, self.plan.location.name)
        from pyspark.sql.pandas.types import to_arrow_schema

        # a user schema may pick other types for a column (cast while reading; Spark checks the batches' schema)
        self.schema = to_arrow_schema(schema, timezone="UTC")
        out = {f.name: f.type for f in self.schema}
        self.types = {f.name: f.type for f in known if out.get(f.name, f.type) == f.type}  # pushable columns
        self.filters: list[tuple] = []
        self.cache_dir = self.options.get("cachedir") or DEFAULT_CACHE_DIR
        text = self.options.get("rowgroupsperpartition", "0")  # 0: about ROWS_PER_TASK rows each
        if not text.isdigit():
            raise InvalidError(f"option rowGroupsPerPartition={text!r}: expected a positive integer")
        self.per_partition = int(text)

    def pushFilters(self, filters: list) -> Iterator:  # noqa: N802 - Spark's name
        """Keep the filters pyarrow evaluates exactly as Spark does; return the rest."""
        accepted, rest = compile_filters(filters, self.types)
        self.filters.extend(accepted)
        yield from rest

    def partitions(self) -> list[InputPartition]:
        """One partition per segment (or row-group range) of every shard's commit, plus translog tails."""
        return segment_partitions(self.plan, self.filters, self.per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The partition's live, filtered rows as Arrow record batches."""
        expr = to_expression(self.filters)
        extra = sorted({f[1] for f in self.filters} - set(self.schema.names))
        work = pa.schema(list(self.schema) + [pa.field(n, self.types[n]) for n in extra])
        if isinstance(partition, SegmentPartition):
            yield from partition.task.read(self.store, self.schema, expr, work, self.cache_dir)
        elif isinstance(partition, TranslogPartition):
            yield from read_translog(partition, self.schema, expr, work)


def make_reader(options: dict[str, Any], schema: StructType, plan: ReadPlan | None = None) -> ShardstoreReader:
    """The DataSourceReader for ``format("shardstore")`` (over ``plan`` when the source planned already)."""
    return ShardstoreReader(options, schema, plan)


__all__ = ["ReadPlan", "ShardRead", "ShardstoreReader", "check_columns", "infer_schema", "make_reader", "plan_read"]
