"""A primary's versions and seq#s for a bulk: one part at a time, or a node's parts in one columnar pass.

A bulk of 1,000 documents over a 100-shard index reaches a node as about 100 parts of ~10
rows (engine/coordinator/bulk_parts.py).  Staged one by one, each part paid the fixed cost of some thirty
Arrow calls (its version lookup, stamping, checks, the buffered documents table), ~0.4 ms a
part: most of the bulk's time (issue 30).  :func:`stage_columnar` stages them together:

1. every copy is held (:meth:`ShardCopy.staging`, in path order) and its part checked;
2. the parts are concatenated once; each copy looks up its ids' current versions (a dict
   lookup per id while its buffer alone decides), and the next versions are counted once,
   repeats ranked per (part, id);
3. the batch is stamped with provisional seq#s and checked once as a whole (a bad row sends
   every part back to the one-part path, which names it, before any seq# is taken);
4. each copy takes its seq# range; the seq# and term columns are built with numpy, the
   buffered documents table once;
5. each copy buffers and logs its zero-copy slice (:meth:`ShardCopy.stage_run`), the log
   trusting the pass's summary (its ranges are bounds for a slice, which is what the checks need).

What is written is the same as the one-part path writes, byte for byte (the frames, the
buffered rows, the versions): tests/engine/test_staging.py compares the two.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shardstore.engine.shard.doc_versions import with_versions  # re-exported: the one-part path, below the shard
from shardstore.engine.shard.shard_copy import ShardCopy
from shardstore.segments.index_buffer import buffered_docs
from shardstore.segments.mapping import Mapping
from shardstore.segments.versions import SMALL_BATCH, next_versions
from shardstore.translog.errors import InvalidOperation
from shardstore.translog.operations import Summary, check, stamp, summarize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColumnarPart:
    """One part a node stages in the columnar pass: the primary copy and its unstamped index operations."""

    copy: ShardCopy
    ops: pa.RecordBatch
    fields: pa.Table | None


def takes_columnar(copy: ShardCopy, ops: pa.RecordBatch, fields: pa.Table | None, mapping: Mapping | None) -> bool:
    """Whether a part may join the columnar pass: index operations only, parsed against the index's mapping
    (the coordinator's), small (a big part pays its fixed costs once and keeps its sort for the refresh), and
    a copy that logs to a remote translog (a primary's, whichever writer: translog/factory.py)."""
    return (fields is not None and mapping is not None and 0 < ops.num_rows <= SMALL_BATCH
            and fields.num_rows == ops.num_rows and copy.remote_translog is not None)


Staged = tuple[pa.RecordBatch, Any]  # (the stamped part, the pending upload ShardCopy.settle waits for)


def stage_columnar(parts: Sequence[ColumnarPart], mapping: Mapping) -> list[Staged | BaseException | None]:
    """Stage ``parts`` (each :func:`takes_columnar`) in one pass; per part (stamped, pending), the error that
    failed it alone, or None: not staged, nothing of it applied (the one-part path takes it)."""
    out: list[Staged | BaseException | None] = [None] * len(parts)
    with contextlib.ExitStack() as held:
        live: list[int] = []
        for i in sorted(range(len(parts)), key=lambda i: parts[i].copy.path):  # one lock order for every pass
            copy = parts[i].copy
            try:
                held.enter_context(copy.staging())
                copy.directory.merge_mapping(mapping)
            except Exception as exc:  # noqa: BLE001 - this part alone fails (StalePrimary, MappingConflict)
                out[i] = exc
                continue
            if copy.directory.mapping == mapping:  # else the one-part path parses it against the copy's own
                live.append(i)
        live.sort()
        if live:
            _stage_held([parts[i] for i in live], live, out)
    return out


@dataclass(frozen=True)
class _Pass:
    """Steps 2-3 of the module's pass done: the parts' operations stamped with provisional seq#s, and checked."""

    provisional: pa.RecordBatch
    fields: pa.Table
    summary: Summary
    id_list: list[str]
    versions: list[int]
    lens: np.ndarray
    starts: np.ndarray


def _prepare(parts: list[ColumnarPart]) -> _Pass | None:
    """Steps 2-3 for ``parts`` (every copy held): None when they cannot go together (the one-part path takes each)."""
    first = parts[0]
    if any(not (p.ops.schema.equals(first.ops.schema) and p.fields is not None and first.fields is not None
                and p.fields.schema.equals(first.fields.schema)) for p in parts[1:]):
        return None  # parts parsed apart (not one bulk's)
    lens = np.array([p.ops.num_rows for p in parts], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    ops = _concat_batches([p.ops for p in parts])
    fields = pa.concat_tables([p.fields for p in parts]).combine_chunks() if len(parts) > 1 else parts[0].fields
    assert fields is not None
    ids = ops.column("id")
    id_list = ids.to_pylist()
    current = np.concatenate([np.asarray(p.copy.directory.current_version_numbers(id_list[a:a + n], ids.slice(a, n)),
                                         dtype=np.int64) for p, a, n in zip(parts, starts.tolist(), lens.tolist())])
    versions = _next_versions(ids, id_list, current, lens)
    provisional = stamp(ops.set_column(ops.schema.get_field_index("version"), "version", versions), 0, 1)
    summary = summarize(provisional)
    try:
        check(summary, max_source_bytes=min(p.copy.translog.max_source_bytes for p in parts))
    except InvalidOperation:
        return None  # the one-part path names the bad row
    return _Pass(provisional, fields, summary, id_list, versions.to_pylist(), lens, starts)


def _stage_held(parts: list[ColumnarPart], where: list[int],
                out: list[Staged | BaseException | None]) -> None:
    """Steps 2-5 of the module's pass for ``parts``, every copy held; results go to ``out`` at ``where``."""
    try:
        prepared = _prepare(parts)
    except Exception as exc:  # noqa: BLE001 - no seq# taken yet: each part meets (and reports) it on its own path
        log.debug("a columnar staging pass gave way to the one-part path: %r", exc)
        return
    if prepared is None:
        return
    lens, starts, s = prepared.lens, prepared.starts, prepared.summary
    firsts = np.array([p.copy.tracker.generate_seq_nos(int(n)) for p, n in zip(parts, lens)], dtype=np.int64)
    terms = np.array([p.copy.primary_term for p in parts], dtype=np.int64)
    seq = np.repeat(firsts - starts, lens) + np.arange(int(lens.sum()), dtype=np.int64)
    schema = prepared.provisional.schema  # the operation schema's fields (seq# and term are not null)
    stamped = prepared.provisional.set_column(0, schema.field(0), pa.array(seq)).set_column(
        1, schema.field(1), pa.array(np.repeat(terms, lens)))
    docs = buffered_docs(stamped, prepared.fields)
    row_bytes = docs.nbytes / len(prepared.id_list)  # a part's share (nbytes of each slice costs ~14 us a part)
    for k, (part, a, n) in enumerate(zip(parts, starts.tolist(), lens.tolist())):
        first, term = int(firsts[k]), int(terms[k])
        piece = stamped.slice(a, n)
        # the pass's summary for the slice: its own seq# range and term; the other ranges bound it
        sliced = Summary(piece, s.all_index, (first, first + n - 1), (term, term), s.id_bytes,
                         s.source_bytes_max, s.typed, s.fields_complete, contiguous=True)
        try:
            pending = part.copy.stage_run(piece, sliced, docs.slice(a, n), prepared.id_list[a:a + n],
                                          prepared.versions[a:a + n], round(row_bytes * n))
        except Exception as exc:  # noqa: BLE001 - this part alone fails (a local disk error fails its copy)
            out[where[k]] = exc
            continue
        out[where[k]] = (piece, pending)


def _next_versions(ids: pa.Array, id_list: list[str], current: np.ndarray, lens: np.ndarray) -> pa.Array:
    """The next version of every row: its id's current + 1, +1 per earlier row of the same id in the same part."""
    if len(set(id_list)) == len(id_list):  # no id twice (the common bulk): no ranks to count
        return pa.array(current + 1, pa.int64())
    codes = np.asarray(ids.dictionary_encode().indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    part_of = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    keys = pa.array(codes * len(lens) + part_of)  # an id repeated in another part is another shard's id
    return next_versions(keys, pa.array(current, pa.int64()))


def _concat_batches(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch of ``batches`` (the same schema), copied once."""
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


__all__ = ["ColumnarPart", "stage_columnar", "takes_columnar", "with_versions"]
