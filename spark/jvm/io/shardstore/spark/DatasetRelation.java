package io.shardstore.spark;

import java.util.function.Function;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.PrunedFilteredScan;
import org.apache.spark.sql.types.StructType;

/**
 * A relation whose rows come from another DataFrame, built per scan for the columns it needs.
 *
 * <p>{@code native}: the fast path's plan (Spark's Parquet scans of the segment files, the
 * anti-join of deleted rows, the translog tail). {@code arrow}: the Python data source, loaded
 * with a schema of just the needed columns, which is how that source reads fewer columns.
 * Spark's filters go into that DataFrame too (Parquet row-group pruning, or the Python source's
 * pushFilters); Spark evaluates every filter again above the scan, so the relation reports them
 * all unhandled. Rows cross as Spark's internal rows ({@code needConversion() == false}).
 */
public final class DatasetRelation extends SchemaRelation implements PrunedFilteredScan {
  private final Function<String[], Dataset<Row>> source;
  private final Dataset<Row> whole;
  private volatile String lastScan = "";

  /**
   * source: a DataFrame holding at least the given columns; whole: the native read's DataFrame
   * (all columns: its plan is inlined and gives the stats), or null for the Python source.
   */
  DatasetRelation(SQLContext context, StructType schema, Function<String[], Dataset<Row>> source,
      Dataset<Row> whole) {
    super(context, schema);
    this.source = source;
    this.whole = whole;
  }

  @Override
  public boolean needConversion() {
    return false;
  }

  /** The native plan's own estimate (so joins may broadcast a small index), else Spark's default. */
  @Override
  public long sizeInBytes() {
    if (whole != null) {
      try {
        return whole.queryExecution().optimizedPlan().stats().sizeInBytes().longValue();
      } catch (RuntimeException e) {
        // fall through: Spark's default size
      }
    }
    return super.sizeInBytes();
  }

  @Override
  @SuppressWarnings({"unchecked", "rawtypes"})
  public RDD<Row> buildScan(String[] requiredColumns, Filter[] filters) {
    Dataset<Row> d = source.apply(requiredColumns);
    for (Filter f : filters) {
      Column c = Filters.toColumn(f);
      if (c != null) d = d.where(c);
    }
    Column[] cols = new Column[requiredColumns.length];
    for (int i = 0; i < cols.length; i++) cols[i] = column(requiredColumns[i]);
    Dataset<Row> scan = d.select(cols);
    lastScan = scan.queryExecution().executedPlan().toString();
    // internal rows, as needConversion() == false promises
    return (RDD) scan.queryExecution().toRdd();
  }

  /** Whether the optimizer may replace this relation by its DataFrame's own plan (native reads). */
  boolean inlinable() {
    return whole != null;
  }

  /** The optimized plan of the native DataFrame (for {@link InlineFastPath}). */
  org.apache.spark.sql.catalyst.plans.logical.LogicalPlan optimizedPlan() {
    return whole.queryExecution().optimizedPlan();
  }

  /** native or arrow: which reader serves this relation. */
  public String kind() {
    return whole != null ? "native" : "arrow";
  }

  /** The physical plan of the last scan built (what Spark's own explain() cannot show). */
  public String lastScanPlan() {
    return lastScan;
  }

  @Override
  public String toString() {
    return "shardstore[" + kind() + "]";
  }

  static Column column(String name) {
    return functions.col("`" + name.replace("`", "``") + "`");
  }
}
