"""How every reader of the translog turns frames into operations (local and remote alike).

Filter to a seq# range, drop operations above a generation's trimmed-above seq#, then
keep one operation per seq#: the highest primary term wins.  Columnar throughout (a sort
and a shifted comparison), no loop per operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from shardstore.translog.checkpoint import UNASSIGNED


def filter_batch(batch: pa.RecordBatch, from_seq_no: int, to_seq_no: int, trimmed_above_seq_no: int) -> pa.RecordBatch:
    """Rows with from <= seq# <= to, and <= the generation's trimmed-above seq# if it has one."""
    seq = batch.column("seq_no")
    keep = pc.and_(pc.greater_equal(seq, from_seq_no), pc.less_equal(seq, to_seq_no))
    if trimmed_above_seq_no != UNASSIGNED:
        keep = pc.and_(keep, pc.less_equal(seq, trimmed_above_seq_no))
    return batch.filter(keep)


def resolve(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One operation per seq#, the highest term winning, in seq# order (columnar, no loop per op)."""
    tables = [pa.Table.from_batches([b]) for b in batches]
    if not tables:
        return iter(())
    merged = pa.concat_tables(tables).sort_by([("seq_no", "ascending"), ("primary_term", "descending")])
    seq = merged.column("seq_no").combine_chunks()
    if len(seq) > 1:
        first = pc.not_equal(seq.slice(1), seq.slice(0, len(seq) - 1))
        merged = merged.filter(pa.concat_arrays([pa.array([True]), first]))
    return iter(merged.combine_chunks().to_batches())
