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
import org.apache.spark.sql.catalyst.expressions.XXH64;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.SerializableConfiguration;

/**
 * The sink's fast path writer: every Spark task routes its rows and writes one segment file per
 * shard with Spark's own Parquet writer (shardstore.spark.fast_write calls {@link #write}), its rows
 * handed to parquet-mr by {@link SegmentWriteSupport} (Spark's schema, settings and footer; a leaner loop).
 *
 * <p>Spark's partitioned write measured about 1.5 s of a 4.5 s write of 5M rows: once a task
 * holds one writer per shard it sorts the rest of its rows by shard. Here a task keeps one
 * {@link OutputWriter} per shard open (up to {@code maxOpen}; an index of more shards gets its
 * rows sorted by shard first, and one open file) and hands each row to its shard's writer, in input order,
 * so there is no sort and no partition column (docs/design/spark.md, "The fast write path").
 *
 * <p>The frame's first three columns are {@code _id}, {@code _seq_no} and {@code _primary_term}
 * (the last two placeholders the writer fills in place): per row, in the task's input order,
 * the shard ({@link Routing}), then with {@code stamp} the shard's next seq# from the job's
 * counters ({@link SinkFunctions#start}; a later write of an id gets the higher seq#), without
 * it the seq# of the frame's {@code _seq_no}, which then holds {@link SinkFunctions#stamp}'s whole
 * value, taken before a join or a sort that may reorder rows (the task fails unless the stamp's
 * shard is the one the row routes to), and the shard's term. A null {@code _id} or one over 512 UTF-8 bytes fails
 * the task. Each task returns {@code "<shard>\t<path>\t<sorted>"} of its files ({@code sorted}: 1 when
 * the file's ids never decrease, as segments.segment.in_id_order says); a failed attempt's files
 * are never returned, so the driver commits only what the successful attempts wrote.
 *
 * <p>Next to each file, {@code <path>.ids64} holds a 64-bit fingerprint of every row's id (XXH64 of
 * its UTF-8 bytes, seed {@link #FINGERPRINT_SEED}, little-endian, row order): the driver sorts a
 * shard's fingerprints to learn that no id repeats without reading the ids back; only where a
 * fingerprint repeats does it read them (shardstore.spark.segment_files.fingerprints_repeat).
 */
public final class SegmentWriter {
  static final int ID = 0;
  static final int SEQ_NO = 1;
  static final int PRIMARY_TERM = 2;
  /** Seed of the ids' fingerprints (any fixed value: only equality matters). */
  public static final long FINGERPRINT_SEED = 16L;
  /** Suffix of a file's fingerprint file. */
  public static final String FINGERPRINTS = ".ids64";
  /**
   * Bytes of rows each open file batches before it hands them to its Parquet writer. A task's rows
   * alternate between its shards' files; written one by one, each row lands in another file's column
   * writers than the row before (their dictionaries, statistics and page buffers out of the CPU's caches):
   * 5M rows into 2 shards took 0.4 s longer than into 1. In runs of about 64 KiB they cost what one
   * file costs (docs/design/spark.md, "The fast write path").
   */
  public static final int BATCH_BYTES = 64 << 10;

  private SegmentWriter() {}

  /**
   * Write {@code frame} into {@code dir}: per task, one Parquet file per shard it routes rows to, with at
   * most {@code maxOpen} open at once (when a task needs another, the file written to longest ago is
   * closed; a later row of its shard starts a new file). Give rows sorted by shard within each task
   * and {@code maxOpen} 1 for an index of many shards: every open file buffers a row group.
   */
  public static String[] write(Dataset<Row> frame, String dir, String job, long[] terms, boolean stamp, int maxOpen,
      Map<String, String> options) throws java.io.IOException {
    if (stamp) SinkFunctions.counters(job);  // fail here, not in every task, when the counters were not started
    return run(frame, requiredKeys(frame.schema()), dir, job, terms, stamp, false, maxOpen, options);
  }

  /**
   * Write {@code frame}, whose first column is {@code _id} (string), into {@code dir} routed: per task, one Parquet
   * file per shard (of {@code shards}) it holds rows of, its rows in input order and the frame's columns as they are,
   * with no seq# or term: the live cluster adopts the files as segments and stamps them
   * (shardstore.spark.routed_stage; docs/design/adoption.md). The same files, fingerprints and answers as
   * {@link #write}.
   */
  public static String[] writeRouted(Dataset<Row> frame, String dir, String job, int shards, int maxOpen,
      Map<String, String> options) throws java.io.IOException {
    if (shards < 1) throw new IllegalArgumentException("shardstore sink: " + shards + " shards");
    return run(frame, requiredId(frame.schema()), dir, job, new long[shards], false, true, maxOpen, options);
  }

  private static String[] run(Dataset<Row> frame, StructType schema, String dir, String job, long[] terms,
      boolean stamp, boolean routed, int maxOpen, Map<String, String> options) throws java.io.IOException {
    if (maxOpen < 1) throw new IllegalArgumentException("shardstore sink: maxOpen " + maxOpen + " must be at least 1");
    SparkSession spark = frame.sparkSession();
    scala.collection.immutable.Map<String, String> opts =
        scala.collection.immutable.Map$.MODULE$.from(scala.jdk.javaapi.CollectionConverters.asScala(options));
    Job hadoop = Job.getInstance(spark.sessionState().newHadoopConfWithOptions(opts));
    OutputWriterFactory factory = new ParquetFileFormat().prepareWrite(spark, hadoop, opts, schema);
    // Spark's file and settings, written by a leaner row loop (5.05M rows: 0.5 s of a 3.3 s job; docs/design/spark.md)
    hadoop.getConfiguration().set(org.apache.parquet.hadoop.ParquetOutputFormat.WRITE_SUPPORT_CLASS,
        SegmentWriteSupport.class.getName());
    Task task = new Task(factory, new SerializableConfiguration(hadoop.getConfiguration()), schema, dir, job,
        terms.clone(), stamp, routed, maxOpen);
    org.apache.spark.sql.execution.QueryExecution qe = frame.queryExecution();
    scala.Function0<List<String>> run = () -> qe.toRdd().toJavaRDD().mapPartitionsWithIndex(task, false).collect();
    // as Spark's own writers: one SQL execution (the session's SQL settings reach the tasks; the UI shows the write)
    List<String> files = org.apache.spark.sql.execution.SQLExecution.withNewExecutionId(qe,
        scala.Option.apply("shardstore sink " + job), run);
    return files.toArray(new String[0]);
  }

  /** The frame's schema with its first column {@code _id} (string) checked and required (non-null). */
  static StructType requiredId(StructType in) {
    StructField[] fields = in.fields().clone();
    if (fields.length == 0 || !fields[ID].name().equals("_id") || !fields[ID].dataType().equals(DataTypes.StringType)) {
      throw new IllegalArgumentException("shardstore sink: the frame's columns " + java.util.Arrays.toString(in.fieldNames())
          + " do not start with _id (string)");
    }
    fields[ID] = new StructField("_id", DataTypes.StringType, false, fields[ID].metadata());
    return new StructType(fields);
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

  /** One task: route, stamp and write its rows, at most {@code maxOpen} files open at once. */
  static final class Task implements Function2<Integer, Iterator<InternalRow>, Iterator<String>> {
    private static final long serialVersionUID = 1L;
    private final OutputWriterFactory factory;
    private final SerializableConfiguration conf;
    private final StructType schema;
    private final String dir;
    private final String job;
    private final long[] terms;
    private final boolean stamp;
    private final boolean routed;  // routed only: no seq# or term columns (writeRouted)
    private final int maxOpen;

    Task(OutputWriterFactory factory, SerializableConfiguration conf, StructType schema, String dir, String job,
        long[] terms, boolean stamp, boolean routed, int maxOpen) {
      this.factory = factory;
      this.conf = conf;
      this.schema = schema;
      this.dir = dir;
      this.job = job;
      this.terms = terms;
      this.stamp = stamp;
      this.routed = routed;
      this.maxOpen = maxOpen;
    }

    @Override
    public Iterator<String> call(Integer partition, Iterator<InternalRow> rows) throws Exception {
      int shards = terms.length;
      TaskContext task = TaskContext.get();
      long attempt = task == null ? 0 : task.taskAttemptId();  // unique in the SparkContext, across stage attempts
      AtomicLongArray counters = stamp ? SinkFunctions.counters(job) : null;
      TaskAttemptContextImpl context = new TaskAttemptContextImpl(conf.value(),
          new TaskAttemptID("shardstore", 0, TaskType.MAP, partition, (int) (attempt & Integer.MAX_VALUE)));
      SegmentFile[] open = new SegmentFile[shards];  // each shard's open file, if any
      int opened = 0;
      int fileNo = 0;
      List<String> files = new ArrayList<>();
      UnsafeProjection toUnsafe = null;
      long n = 0;
      try {
        while (rows.hasNext()) {
          InternalRow next = rows.next();
          if (next.isNullAt(ID)) {
            throw new IllegalArgumentException(SinkFunctions.NULL_ID);
          }
          UnsafeRow row;
          if (next instanceof UnsafeRow u) {
            row = u;
          } else {  // Spark's projections give UnsafeRows; anything else is copied into one
            if (toUnsafe == null) toUnsafe = UnsafeProjection.create(schema);
            row = toUnsafe.apply(next);
          }
          UTF8String id = row.getUTF8String(ID);
          SinkFunctions.checkLength(id);
          int shard = Routing.shard(id, shards);
          if (routed) {  // nothing to stamp: the cluster adopts the file
          } else if (stamp) {
            row.setLong(SEQ_NO, counters.getAndIncrement(shard));
          } else {  // the frame carries SinkFunctions.stamp's whole value: the seq# and the shard it was taken for
            if (row.isNullAt(SEQ_NO)) {
              throw new IllegalStateException("shardstore sink: a row reached the writer without its seq#");
            }
            long stamped = row.getLong(SEQ_NO);
            if ((int) (stamped & ((1L << SinkFunctions.SHARD_BITS) - 1)) != shard) {
              throw new IllegalStateException("shardstore sink: a row stamped for shard "
                  + (stamped & ((1L << SinkFunctions.SHARD_BITS) - 1)) + " routes to shard " + shard);
            }
            row.setLong(SEQ_NO, stamped >>> SinkFunctions.SHARD_BITS);
          }
          if (!routed) row.setLong(PRIMARY_TERM, terms[shard]);
          SegmentFile f = open[shard];
          if (f == null) {
            if (opened == maxOpen) {  // close the file written to longest ago (rows sorted by shard: the previous one)
              int oldest = -1;
              for (int s = 0; s < shards; s++) {
                if (open[s] != null && (oldest < 0 || open[s].lastRow < open[oldest].lastRow)) oldest = s;
              }
              SegmentFile done = open[oldest];
              open[oldest] = null;
              opened--;
              files.add(done.close());
            }
            String path = dir + "/shard-" + shard + "-part-" + partition + "-task-" + attempt + "-file-" + (fileNo++)
                + ".parquet";
            f = open[shard] = new SegmentFile(shard, path, factory, schema, context);
            opened++;
          }
          f.write(row, id, n++);
        }
        for (int s = 0; s < shards; s++) {
          SegmentFile done = open[s];
          if (done == null) continue;
          open[s] = null;
          files.add(done.close());
        }
      } catch (Throwable error) {  // close what is still open (its files are never returned) and report the error
        for (SegmentFile f : open) {
          if (f == null) continue;
          try {
            f.count = 0;  // its rows are not written: the file is never returned
            f.close();
          } catch (Throwable t) {
            first(error, t);
          }
        }
        throw error;
      }
      return files.iterator();
    }
  }

  /** The first error of a clean-up, the later one suppressed into it (never into itself). */
  static Throwable first(Throwable error, Throwable later) {
    if (error == null) return later;
    if (later != error) error.addSuppressed(later);
    return error;
  }

  /** One segment file being written: its Parquet writer, its ids' fingerprints, whether its ids never decreased. */
  static final class SegmentFile {
    final int shard;
    final String path;
    final OutputWriter writer;
    final java.io.DataOutputStream prints;  // the ids' fingerprints, streamed to <path>.ids64
    UTF8String last;  // the previous id while the ids never decreased
    boolean unsorted;
    long lastRow;
    final byte[] batch = new byte[BATCH_BYTES];  // rows not yet handed to the writer, back to back
    final int[] sizes = new int[BATCH_BYTES / 16];  // their sizes (an UnsafeRow takes at least 16 bytes)
    final UnsafeRow view;  // points at one batched row at a time
    int count;
    int used;

    SegmentFile(int shard, String path, OutputWriterFactory factory, StructType schema,
        TaskAttemptContextImpl context) throws java.io.IOException {
      this.shard = shard;
      this.path = path;
      this.view = new UnsafeRow(schema.length());
      this.prints = new java.io.DataOutputStream(new java.io.BufferedOutputStream(java.nio.file.Files.newOutputStream(
          java.nio.file.Path.of(path + FINGERPRINTS), java.nio.file.StandardOpenOption.CREATE_NEW,
          java.nio.file.StandardOpenOption.WRITE), 1 << 16));
      OutputWriter w;
      try {  // a local file whatever the session's default file system (a Hadoop path string: no percent-encoding)
        w = factory.newInstance(new org.apache.hadoop.fs.Path(new java.io.File(path).getAbsoluteFile().toURI()).toString(),
            schema, context);
      } catch (Throwable t) {
        prints.close();
        throw t;
      }
      this.writer = w;
    }

    void write(UnsafeRow row, UTF8String id, long n) throws java.io.IOException {
      long print = XXH64.hashUnsafeBytes(id.getBaseObject(), id.getBaseOffset(), id.numBytes(), FINGERPRINT_SEED);
      prints.writeLong(Long.reverseBytes(print));  // little-endian
      if (!unsorted) {
        if (last != null && id.binaryCompare(last) < 0) {  // unsigned byte order, as Arrow compares strings
          unsorted = true;
          last = null;
        } else {
          last = id.clone();  // the row's bytes are reused for the next row
        }
      }
      lastRow = n;
      int size = row.getSizeInBytes();
      if (used + size > batch.length || count == sizes.length) flush();
      if (size > batch.length) {  // a row bigger than the batch: written on its own, after the ones before it
        writer.write(row);
        return;
      }
      Platform.copyMemory(row.getBaseObject(), row.getBaseOffset(), batch, Platform.BYTE_ARRAY_OFFSET + used, size);
      sizes[count++] = size;
      used += size;
    }

    /** Hand the batched rows, in their order, to the Parquet writer. */
    void flush() throws java.io.IOException {
      long at = Platform.BYTE_ARRAY_OFFSET;
      for (int i = 0; i < count; i++) {
        view.pointTo(batch, at, sizes[i]);
        writer.write(view);
        at += sizes[i];
      }
      count = 0;
      used = 0;
    }

    /** Close the file and its fingerprints; return {@code "<shard>\t<path>\t<sorted>"}. */
    String close() throws java.io.IOException {
      Throwable error = null;
      try {
        flush();
      } catch (Throwable t) {
        error = t;
      }
      try {  // closed whatever the flush did: its stream, its buffers and its share of parquet-mr's memory pool
        writer.close();
      } catch (Throwable t) {
        error = first(error, t);
      }
      try {
        prints.close();
      } catch (Throwable t) {
        error = first(error, t);
      }
      if (error instanceof java.io.IOException e) throw e;
      if (error instanceof RuntimeException e) throw e;
      if (error instanceof Error e) throw e;
      if (error != null) throw new java.io.IOException(error);
      return shard + "\t" + path + "\t" + (unsorted ? 0 : 1);
    }
  }
}
