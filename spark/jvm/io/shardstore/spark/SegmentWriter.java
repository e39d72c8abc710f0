package io.shardstore.spark;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLongArray;

import org.apache.hadoop.mapreduce.Job;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.TaskType;
import org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.SerializableConfiguration;

/**
 * The sink's fast path writer: every Spark task routes its rows and writes one segment file per
 * shard with Spark's own Parquet writer (shardstore.spark.fast_write calls {@link #write}).
 *
 * <p>Spark's partitioned write measured about 1.5 s of a 4.5 s write of 5M rows: once a task
 * holds one writer per shard it sorts the rest of its rows by shard. Here a task keeps one
 * {@link OutputWriter} per shard open and hands each row to its shard's writer, in input order,
 * so there is no sort and no partition column (docs/design/spark.md, "The fast write path").
 *
 * <p>The frame's first three columns are {@code _id}, {@code _seq_no} and {@code _primary_term}
 * (the last two placeholders the writer fills in place): per row, in the task's input order,
 * the shard ({@link Routing}), then with {@code stamp} the shard's next seq# from the job's
 * counters ({@link SinkFunctions#start}; a later write of an id gets the higher seq#), without
 * it the frame's own {@code _seq_no} (stamped by {@link SinkFunctions#stamp} before a join that
 * may reorder rows), and the shard's term. A null {@code _id} or one over 512 UTF-8 bytes fails
 * the task. Each task returns {@code "<shard>\t<path>"} of its files; a failed attempt's files
 * are never returned, so the driver commits only what the successful attempts wrote.
 */
public final class SegmentWriter {
  static final int ID = 0;
  static final int SEQ_NO = 1;
  static final int PRIMARY_TERM = 2;

  private SegmentWriter() {}

  /** Write {@code frame} into {@code dir}: per task, one Parquet file per shard it routes rows to. */
  public static String[] write(Dataset<Row> frame, String dir, String job, long[] terms, boolean stamp,
      Map<String, String> options) throws java.io.IOException {
    StructType schema = requiredKeys(frame.schema());
    if (stamp) SinkFunctions.counters(job);  // fail here, not in every task, when the counters were not started
    SparkSession spark = frame.sparkSession();
    scala.collection.immutable.Map<String, String> opts =
        scala.collection.immutable.Map$.MODULE$.from(scala.jdk.javaapi.CollectionConverters.asScala(options));
    Job hadoop = Job.getInstance(spark.sessionState().newHadoopConfWithOptions(opts));
    OutputWriterFactory factory = new ParquetFileFormat().prepareWrite(spark, hadoop, opts, schema);
    Task task = new Task(factory, new SerializableConfiguration(hadoop.getConfiguration()), schema, dir, job,
        terms.clone(), stamp);
    List<String> files = frame.queryExecution().toRdd().toJavaRDD().mapPartitionsWithIndex(task, false).collect();
    return files.toArray(new String[0]);
  }

  /** The frame's schema with {@code _id}, {@code _seq_no}, {@code _primary_term} checked and required (non-null). */
  static StructType requiredKeys(StructType in) {
    String[] names = {"_id", "_seq_no", "_primary_term"};
    StructField[] fields = in.fields().clone();
    for (int i = 0; i < names.length; i++) {
      if (fields.length <= i || !fields[i].name().equals(names[i])
          || !fields[i].dataType().equals(i == ID ? DataTypes.StringType : DataTypes.LongType)) {
        throw new IllegalArgumentException("shardstore sink: the frame's columns " + java.util.Arrays.toString(in.fieldNames())
            + " do not start with _id (string), _seq_no (bigint), _primary_term (bigint)");
      }
      fields[i] = new StructField(names[i], fields[i].dataType(), false, fields[i].metadata());
    }
    return new StructType(fields);
  }

  /** One task: route, stamp and write its rows, one open writer per shard. */
  static final class Task implements Function2<Integer, Iterator<InternalRow>, Iterator<String>> {
    private static final long serialVersionUID = 1L;
    private final OutputWriterFactory factory;
    private final SerializableConfiguration conf;
    private final StructType schema;
    private final String dir;
    private final String job;
    private final long[] terms;
    private final boolean stamp;

    Task(OutputWriterFactory factory, SerializableConfiguration conf, StructType schema, String dir, String job,
        long[] terms, boolean stamp) {
      this.factory = factory;
      this.conf = conf;
      this.schema = schema;
      this.dir = dir;
      this.job = job;
      this.terms = terms;
      this.stamp = stamp;
    }

    @Override
    public Iterator<String> call(Integer partition, Iterator<InternalRow> rows) throws Exception {
      int shards = terms.length;
      int attempt = TaskContext.get() == null ? 0 : TaskContext.get().attemptNumber();
      AtomicLongArray counters = stamp ? SinkFunctions.counters(job) : null;
      TaskAttemptContextImpl context = new TaskAttemptContextImpl(conf.value(),
          new TaskAttemptID("shardstore", 0, TaskType.MAP, partition, attempt));
      OutputWriter[] writers = new OutputWriter[shards];
      List<String> files = new ArrayList<>();
      UnsafeProjection toUnsafe = null;
      boolean written = false;
      try {
        while (rows.hasNext()) {
          InternalRow next = rows.next();
          UnsafeRow row;
          if (next instanceof UnsafeRow u) {
            row = u;
          } else {  // Spark's projections give UnsafeRows; anything else is copied into one
            if (toUnsafe == null) toUnsafe = UnsafeProjection.create(schema);
            row = toUnsafe.apply(next);
          }
          if (row.isNullAt(ID)) {
            throw new IllegalArgumentException("shardstore sink: a row has a null _id; every row needs an id");
          }
          UTF8String id = row.getUTF8String(ID);
          SinkFunctions.checkLength(id);
          int shard = Routing.shard(id, shards);
          if (stamp) {
            row.setLong(SEQ_NO, counters.getAndIncrement(shard));
          } else if (row.isNullAt(SEQ_NO)) {
            throw new IllegalStateException("shardstore sink: a row reached the writer without its seq#");
          }
          row.setLong(PRIMARY_TERM, terms[shard]);
          OutputWriter w = writers[shard];
          if (w == null) {
            String path = dir + "/shard-" + shard + "-part-" + partition + "-attempt-" + attempt + ".parquet";
            w = writers[shard] = factory.newInstance(path, schema, context);
            files.add(shard + "\t" + path);
          }
          w.write(row);
        }
        written = true;
      } finally {
        Throwable first = null;
        for (OutputWriter w : writers) {
          if (w == null) continue;
          try {
            w.close();
          } catch (Throwable t) {  // a failed write's files are never returned; report the first close error only
            if (first == null) first = t;
          }
        }
        if (written && first != null) throw new java.io.IOException("shardstore sink: closing a segment file failed", first);
      }
      return files.iterator();
    }
  }
}
