"""The ``shardstore`` PySpark data source: one class, reading (:mod:`.reader`) and writing (:mod:`.writer`).

Options (``.option(k, v)``, all strings): ``store`` (URL, required), ``index`` (required),
and the store's own options (endpoint, credentials...) passed through to
:func:`shardstore.blobstores.open_store`; reading and writing add their own (see the
modules).  Spark pickles this object between its workers and to its executors: it holds the
options and, once ``schema()`` ran, the read plan (commit references and translog tails), so a
load plans once and every action of that DataFrame reads the same snapshot.

The same source is also registered as ``format("shardstore-arrow")``: with the JVM bridge jar
loaded, ``format("shardstore")`` names the bridge (:mod:`shardstore.spark.bridge`), which falls
back to this one under that name.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType


class ShardstoreDataSource(DataSource):
    """``format("shardstore")``: an index's documents as a DataFrame, and DataFrames indexed into it."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "shardstore"

    def schema(self) -> StructType:
        """The index's columns (mapped fields, typed, plus _id, _seq_no, _primary_term, _version).

        The read plan made here is kept on the source (Spark pickles the source from the
        worker that asks for the schema to the one that asks for the reader): a load plans once.
        """
        from shardstore.spark.reader import infer_schema, plan_read

        _store, self._plan = plan_read(dict(self.options))
        return infer_schema(dict(self.options), self._plan)

    def reader(self, schema: StructType) -> Any:
        """A reader over the newest remote commit of every shard (or the one the options ask for)."""
        from shardstore.spark.reader import make_reader

        return make_reader(dict(self.options), schema, getattr(self, "_plan", None))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        """A writer indexing the DataFrame's rows: through the live cluster serving the store (never fencing it),
        else straight into the index's shards (a bulk load)."""
        from shardstore.spark.live_sink import LiveArrowWriter, plan_live
        from shardstore.spark.writer import make_writer

        job = plan_live(dict(self.options), schema, "overwrite" if overwrite else "append")
        return LiveArrowWriter(job) if job is not None else make_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:  # noqa: N802 - Spark's name
        """``writeStream.format("shardstore")``: each micro-batch applied once by the live cluster."""
        from shardstore.spark.live_sink import LiveStreamWriter, stream_id

        return LiveStreamWriter(dict(self.options), schema, stream_id(dict(self.options)))


class ShardstoreArrowDataSource(ShardstoreDataSource):
    """``format("shardstore-arrow")``: the same source under the name the JVM bridge falls back to."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "shardstore-arrow"
