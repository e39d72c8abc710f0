package io.shardstore.spark;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLongArray;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * The seq# counters and the per-row functions of the sink's fast write path
 * (shardstore.spark.fast_write; {@link SegmentWriter} writes the rows).
 *
 * <ul>
 *   <li>{@link #start} / {@link #finish}: the job's per-shard seq# counters, which the driver
 *       starts at each shard's first free seq# and reads back after the job. {@link SegmentWriter}
 *       takes each row's seq# from them as it writes the row, in the task's input order.
 *   <li>{@link #stamp}: the same, as a column, for a frame whose rows are reordered before the
 *       writer (a join with the base's versions, a sort by shard): gives each row, in the task's
 *       input order, its shard and that shard's next seq#. An id written twice gets two seq#s,
 *       the later write the higher one; the driver deletes the older copy through live docs, as
 *       it does for an id two tasks wrote. Stateful, so nondeterministic: the optimizer never
 *       moves it below the sort nor evaluates it twice. The counters live in the driver's JVM:
 *       only tasks running in it (a {@code local[...]} master) find them; anywhere else the task
 *       fails.
 *   <li>{@link #route}: the shard of each {@code _id} as a column ({@link Routing}; a null id
 *       fails the task; the tests compare it with the engine's routing through Spark rows).
 * </ul>
 */
public final class SinkFunctions {
  private static final ConcurrentHashMap<String, AtomicLongArray> COUNTERS = new ConcurrentHashMap<>();

  private SinkFunctions() {}

  /** Start a job's seq# counters: {@code first[s]} is shard s's first seq#. */
  public static void start(String job, long[] first) {
    if (COUNTERS.putIfAbsent(job, new AtomicLongArray(first)) != null) {
      throw new IllegalStateException("shardstore: seq# counters of job " + job + " already started");
    }
  }

  /** End a job's counters: per shard, the seq# after the last one handed out (null if never started). */
  public static long[] finish(String job) {
    AtomicLongArray a = COUNTERS.remove(job);
    if (a == null) return null;
    long[] out = new long[a.length()];
    for (int i = 0; i < out.length; i++) out[i] = a.get(i);
    return out;
  }

  /** The shard of each id (an int column, never null). */
  public static Column route(Column id, int shards) {
    UserDefinedFunction f = functions.udf(new Route(shards), DataTypes.IntegerType).asNonNullable();
    return f.apply(id);
  }

  /** Bits of {@link #stamp}'s value that hold the shard; the seq# sits above them. */
  public static final int SHARD_BITS = 16;

  /**
   * One call per row, in the task's input order: {@code seqNo << SHARD_BITS | shard} with the
   * shard's next seq# from the job's counters. Nondeterministic (stateful): evaluate it once per
   * row, in a projection of its own, before anything that may reorder the rows.
   */
  public static Column stamp(String job, Column id, int shards) {
    if (shards < 1 || shards > (1 << SHARD_BITS)) {
      throw new IllegalArgumentException("shardstore sink: " + shards + " shards is more than the fast path routes");
    }
    UserDefinedFunction f = functions.udf(new Stamp(job, shards), DataTypes.LongType).asNonNullable().asNondeterministic();
    return f.apply(id);
  }

  static final class Stamp implements UDF1<String, Long> {
    private static final long serialVersionUID = 1L;
    private final String job;
    private final int shards;
    private transient AtomicLongArray counters;

    Stamp(String job, int shards) {
      this.job = job;
      this.shards = shards;
    }

    @Override
    public Long call(String id) {
      if (id == null) {
        throw new IllegalArgumentException(NULL_ID);
      }
      checkLength(id);
      if (counters == null) counters = counters(job);
      int shard = Routing.shard(id, shards);
      return (counters.getAndIncrement(shard) << SHARD_BITS) | shard;
    }
  }

  /** The error of a row without an {@code _id} (every writer of the fast path refuses it). */
  static final String NULL_ID = "shardstore sink: a row has a null _id; every row needs an id";

  /** The engine's limit on an id's UTF-8 bytes (translog/operations.py MAX_ID_BYTES). */
  public static final int MAX_ID_BYTES = 512;

  /** IllegalArgumentException naming the size if {@code id} is longer than {@link #MAX_ID_BYTES} in UTF-8. */
  static void checkLength(String id) {
    int n = id.length();
    if (n * 3 <= MAX_ID_BYTES) return;  // at most 3 UTF-8 bytes per UTF-16 code unit
    int bytes = id.getBytes(java.nio.charset.StandardCharsets.UTF_8).length;
    if (bytes > MAX_ID_BYTES) {
      throw new IllegalArgumentException("shardstore sink: an _id of " + bytes + " bytes (starting "
          + id.substring(0, 32) + "...) is longer than the " + MAX_ID_BYTES + " bytes an id may have");
    }
  }

  /** As {@link #checkLength(String)}, for an id as Spark holds it (UTF-8 bytes). */
  static void checkLength(org.apache.spark.unsafe.types.UTF8String id) {
    if (id.numBytes() > MAX_ID_BYTES) checkLength(id.toString());
  }

  static AtomicLongArray counters(String job) {
    AtomicLongArray a = COUNTERS.get(job);
    if (a == null) {
      throw new IllegalStateException("shardstore sink: no seq# counters for job " + job + " in this JVM; the "
          + "fast write path runs on a local[...] master only (use fastPath=false)");
    }
    return a;
  }

  static final class Route implements UDF1<String, Integer> {
    private static final long serialVersionUID = 1L;
    private final int shards;

    Route(int shards) {
      this.shards = shards;
    }

    @Override
    public Integer call(String id) {
      if (id == null) {
        throw new IllegalArgumentException(NULL_ID);
      }
      return Routing.shard(id, shards);
    }
  }
}
