package io.shardstore.spark;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * The Python side of the bridge: shardstore.spark.bridge implements it through Py4J.
 *
 * <p>{@code read} resolves the index's commits and live docs in the PySpark driver and returns
 * the fast path's DataFrame (Spark's native Parquet reader over the verified segment files), or
 * {@code null} when the Arrow data source should read instead (remote executors that cannot see
 * the driver's cache, or {@code fastPath=false}). {@code write} is the sink's fast path.
 */
public interface Planner {
  /**
   * The index's live documents for these options (a JSON object of strings: one Py4J value, not a
   * Map Python would walk entry by entry over the socket) and user schema (StructType JSON, or null).
   */
  Dataset<Row> read(SparkSession session, String optionsJson, String userSchemaJson);

  /**
   * Write {@code data} through the sink's fast path (shardstore.spark.fast_write): true when done,
   * false when the Python sink ({@code format("shardstore-arrow")}) should write instead.
   */
  boolean write(SparkSession session, String optionsJson, String mode, Dataset<Row> data);

  /**
   * Apply one micro-batch of {@code writeStream.format("shardstore")} once: the batch is an ingest job
   * named by the stream and {@code batchId}, so a batch Spark runs again after a restart applies nothing
   * twice (shardstore.spark.live_sink).
   */
  void writeBatch(SparkSession session, String optionsJson, long batchId, Dataset<Row> data);
}
