package io.shardstore.spark;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.DataFrameReader;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.RelationProvider;
import org.apache.spark.sql.sources.SchemaRelationProvider;
import org.apache.spark.sql.sources.StreamSinkProvider;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * {@code format("shardstore")} on the JVM: the index read through Spark's native Parquet reader.
 *
 * <p>With this jar on the classpath ({@code spark.jars}), Spark resolves the name to this class
 * before the Python data source of the same name. A read asks the PySpark driver's {@link Planner}
 * (installed by {@code shardstore.spark.register(spark)}) for the fast path's DataFrame; with no
 * planner, or when it declines, the Python data source ({@code format("shardstore-arrow")}) reads,
 * given a schema of only the columns each query needs. A write goes to the planner's fast write path
 * (Spark's own Parquet writer makes the segment files), else to the Python sink.
 * See docs/design/spark.md, "The JVM bridge".
 */
public final class DefaultSource
    implements RelationProvider, SchemaRelationProvider, CreatableRelationProvider, DataSourceRegister,
        StreamSinkProvider {
  private static final com.fasterxml.jackson.databind.ObjectMapper JSON =
      new com.fasterxml.jackson.databind.ObjectMapper();

  @Override
  public String shortName() {
    return "shardstore";
  }

  @Override
  public BaseRelation createRelation(SQLContext ctx, scala.collection.immutable.Map<String, String> parameters) {
    return relation(ctx, parameters, null);
  }

  @Override
  public BaseRelation createRelation(
      SQLContext ctx, scala.collection.immutable.Map<String, String> parameters, StructType schema) {
    return relation(ctx, parameters, schema);
  }

  @Override
  public BaseRelation createRelation(
      SQLContext ctx, SaveMode mode, scala.collection.immutable.Map<String, String> parameters, Dataset<Row> data) {
    Planner planner = Bridge.planner();
    if (planner != null) {
      Map<String, String> options = new HashMap<>(scala.jdk.javaapi.CollectionConverters.asJava(parameters));
      boolean done;
      try {
        done = planner.write(ctx.sparkSession(), json(options), mode.name(), data);
      } catch (RuntimeException e) {
        throw Bridge.userError(e);
      }
      if (done) {
        return new SchemaRelation(ctx, data.schema());
      }
    }
    data.write().format(Bridge.arrowFormat()).mode(mode).options(parameters).save();
    return new SchemaRelation(ctx, data.schema());  // what a save returns: Spark reads nothing from it
  }

  @Override
  public Sink createSink(SQLContext ctx, scala.collection.immutable.Map<String, String> parameters,
      scala.collection.immutable.Seq<String> partitionColumns, OutputMode outputMode) {
    Map<String, String> options = new HashMap<>(scala.jdk.javaapi.CollectionConverters.asJava(parameters));
    String optionsJson = json(options);
    return new Sink() {
      @Override
      public void addBatch(long batchId, Dataset<Row> data) {
        Planner planner = Bridge.planner();
        if (planner == null) {
          throw new IllegalStateException("shardstore: writeStream needs shardstore.spark.register(spark) in the "
              + "driver (the bridge's planner applies each micro-batch)");
        }
        Dataset<Row> batch = plainBatch(data);
        try {
          planner.writeBatch(data.sparkSession(), optionsJson, batchId, batch);
        } catch (RuntimeException e) {
          throw Bridge.userError(e);
        }
      }

      @Override
      public String toString() {
        return "shardstore";
      }
    };
  }

  /**
   * A micro-batch as a plain (not streaming) DataFrame a job may write like any other: its rows as a
   * LogicalRDD, as Spark's own foreachBatch sink hands a batch over.
   */
  @SuppressWarnings("unchecked")
  private static Dataset<Row> plainBatch(Dataset<Row> data) {
    org.apache.spark.sql.classic.Dataset<Row> classic = (org.apache.spark.sql.classic.Dataset<Row>) (Object) data;
    org.apache.spark.sql.execution.LogicalRDD$ rdds = org.apache.spark.sql.execution.LogicalRDD$.MODULE$;
    org.apache.spark.sql.execution.LogicalRDD node =
        rdds.fromDataset(classic.queryExecution().toRdd(), classic, false, rdds.fromDataset$default$4());
    return org.apache.spark.sql.classic.Dataset$.MODULE$.ofRows(
        (org.apache.spark.sql.classic.SparkSession) (Object) data.sparkSession(), node);
  }

  private static BaseRelation relation(
      SQLContext ctx, scala.collection.immutable.Map<String, String> parameters, StructType userSchema) {
    Map<String, String> options = new HashMap<>(scala.jdk.javaapi.CollectionConverters.asJava(parameters));
    Planner planner = Bridge.planner();
    if (planner != null) {
      Dataset<Row> fast;
      try {
        fast = planner.read(ctx.sparkSession(), json(options), userSchema == null ? null : userSchema.json());
      } catch (RuntimeException e) {
        throw Bridge.userError(e);
      }
      if (fast != null) {
        return new DatasetRelation(ctx, fast.schema(), cols -> fast, fast);
      }
    }
    StructType schema = userSchema != null ? userSchema : arrow(ctx, options).load().schema();
    // a fresh reader per scan: DataFrameReader.schema() mutates the reader it is called on
    return new DatasetRelation(ctx, schema, cols -> arrow(ctx, options).schema(narrow(schema, cols)).load(), null);
  }

  private static String json(Map<String, String> options) {
    try {
      return JSON.writeValueAsString(options);
    } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
      throw new IllegalArgumentException("shardstore: options that cannot be written as JSON: " + e.getMessage(), e);
    }
  }

  private static DataFrameReader arrow(SQLContext ctx, Map<String, String> options) {
    return ctx.sparkSession().read().format(Bridge.arrowFormat()).options(options);
  }

  /** The fields of {@code schema} named by {@code cols}; for no columns (count), its narrowest one. */
  static StructType narrow(StructType schema, String[] cols) {
    if (cols.length == 0) {
      String[] names = schema.fieldNames();
      String pick = names.length == 0 ? null : names[0];
      for (String n : names) if (n.equals("_seq_no")) pick = n;
      return pick == null ? schema : new StructType(new StructField[] {schema.apply(pick)});
    }
    StructField[] fields = new StructField[cols.length];
    for (int i = 0; i < cols.length; i++) fields[i] = schema.apply(cols[i]);
    return new StructType(fields);
  }
}
