package io.shardstore.spark;

import org.apache.spark.sql.SparkSessionExtensions;
import scala.runtime.BoxedUnit;

/**
 * {@code spark.sql.extensions=io.shardstore.spark.Extensions} (set by shardstore.spark.configure):
 * adds {@link InlineFastPath} to the optimizer, so a native read's plan becomes the fast path's
 * own plan instead of a scan of rows handed over by {@link DatasetRelation}.
 */
public final class Extensions implements scala.Function1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectOptimizerRule(session -> new InlineFastPath());
    return BoxedUnit.UNIT;
  }
}
