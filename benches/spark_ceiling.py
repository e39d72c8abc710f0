"""What Spark's Python data-source API costs by itself: a source and a sink that do no work.

The ``format("shardstore")`` targets of issue 7 are ratios to Spark's own Parquet reader
and writer.  These two data sources measure the ceiling any Python source or sink can
reach on this machine, so a missed target can be told apart from our own overhead:

- ``shardstore-bench-ceiling`` (read): every partition yields one pre-decoded Arrow batch
  (the first row group of a real segment file, conformed to the schema Spark asked for)
  over and over until it has produced its share of ``rows``.  No file is read past that
  batch, no filter runs: what remains is Spark's Python worker, the Arrow transfer to the
  JVM and the JVM's conversion of the batches into rows.
- ``shardstore-bench-null-sink`` (write): a :class:`DataSourceArrowWriter` whose tasks
  only count the rows of the batches Spark hands them.

Both are registered by the Spark bench (``benches/spark.py``) in its own session; Spark's
Python workers import this module, so the bench puts the repository root on their
``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

BATCH_ROWS = 16_384


class _Share(InputPartition):
    """How many rows one partition yields."""

    def __init__(self, rows: int) -> None:
        self.rows = rows


class CeilingReader(DataSourceReader):
    """Yields the same in-memory batch until each partition has its rows."""

    def __init__(self, options: dict[str, Any], schema: StructType) -> None:
        self.file, self.rows = options["file"], int(options["rows"])
        self.partitions_n = int(options.get("partitions", "2"))
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        """``partitions`` shares of ``rows``."""
        base, extra = divmod(self.rows, self.partitions_n)
        return [_Share(base + (1 if i < extra else 0)) for i in range(self.partitions_n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The first row group's rows, repeated (sliced at the end) up to the partition's share."""
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        from shardstore.segments.segment import conform

        schema = to_arrow_schema(self.schema, timezone="UTC")
        table = pq.ParquetFile(self.file).read_row_group(0, columns=[n for n in schema.names])
        batch = conform(table, schema).combine_chunks().to_batches(max_chunksize=BATCH_ROWS)[0]
        left = partition.rows
        while left > 0:
            out = batch if batch.num_rows <= left else batch.slice(0, left)
            left -= out.num_rows
            yield out


class CeilingSource(DataSource):
    """A read-only source that does no work of its own (options: file, rows, partitions; schema given)."""

    @classmethod
    def name(cls) -> str:
        """``format("shardstore-bench-ceiling")``."""
        return "shardstore-bench-ceiling"

    def schema(self) -> StructType:
        """Refuses: the bench passes the schema with ``.schema(...)``."""
        raise ValueError("shardstore-bench-ceiling needs .schema(...)")

    def reader(self, schema: StructType) -> DataSourceReader:
        """A :class:`CeilingReader`."""
        return CeilingReader(dict(self.options), schema)


class _Rows(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class NullArrowWriter(DataSourceArrowWriter):
    """Counts the rows of the batches and keeps nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """One task: the batches' row count."""
        return _Rows(sum(b.num_rows for b in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo."""


class NullSinkSource(DataSource):
    """A write-only sink that does no work of its own."""

    @classmethod
    def name(cls) -> str:
        """``format("shardstore-bench-null-sink")``."""
        return "shardstore-bench-null-sink"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A :class:`NullArrowWriter`."""
        return NullArrowWriter()


def register(spark: Any) -> None:
    """Register both bench sources in ``spark`` (its Python workers must be able to import this module)."""
    spark.dataSource.register(CeilingSource)
    spark.dataSource.register(NullSinkSource)


def put_repo_on_worker_path() -> None:
    """Add the repository root to ``PYTHONPATH`` (call before the session starts: workers inherit it)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])
