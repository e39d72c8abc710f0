package io.shardstore.spark;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.sources.*;

/**
 * Spark's data-source filters as Columns, applied to the fast path's DataFrame so that Spark's
 * Parquet reader prunes row groups with them. Spark evaluates every filter again above the scan
 * (the relation reports them all as unhandled), so a filter left out here costs speed, never rows.
 */
final class Filters {
  private Filters() {}

  /** The filter as a Column keeping at least its rows (a weaker filter when a part has no Column form), or null. */
  static Column toColumn(Filter f) {
    return convert(f, false);
  }

  /** exact: the whole filter or null (under NOT, a weaker filter would drop rows). */
  private static Column convert(Filter f, boolean exact) {
    if (f instanceof EqualTo e) return col(e.attribute()).equalTo(functions.lit(e.value()));
    if (f instanceof EqualNullSafe e) return col(e.attribute()).eqNullSafe(functions.lit(e.value()));
    if (f instanceof GreaterThan e) return col(e.attribute()).gt(functions.lit(e.value()));
    if (f instanceof GreaterThanOrEqual e) return col(e.attribute()).geq(functions.lit(e.value()));
    if (f instanceof LessThan e) return col(e.attribute()).lt(functions.lit(e.value()));
    if (f instanceof LessThanOrEqual e) return col(e.attribute()).leq(functions.lit(e.value()));
    if (f instanceof IsNull e) return col(e.attribute()).isNull();
    if (f instanceof IsNotNull e) return col(e.attribute()).isNotNull();
    if (f instanceof StringStartsWith e) return col(e.attribute()).startsWith(e.value());
    if (f instanceof StringEndsWith e) return col(e.attribute()).endsWith(e.value());
    if (f instanceof StringContains e) return col(e.attribute()).contains(e.value());
    if (f instanceof In e) {
      return col(e.attribute()).isin(e.values());
    }
    if (f instanceof And e) {
      Column l = convert(e.left(), exact), r = convert(e.right(), exact);
      if (l != null && r != null) return l.and(r);
      return exact ? null : l == null ? r : l;
    }
    if (f instanceof Or e) {
      Column l = convert(e.left(), exact), r = convert(e.right(), exact);
      return l == null || r == null ? null : l.or(r);
    }
    if (f instanceof Not e) {
      Column c = convert(e.child(), true);
      return c == null ? null : functions.not(c);
    }
    return null;
  }

  /** A column by its data-source attribute name (nested or dotted names come back-quoted). */
  private static Column col(String attribute) {
    return functions.col(attribute);
  }
}
