package io.shardstore.spark;

import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.types.StructType;

/** A relation of known columns and no scan of its own: what a save returns, and the base of {@link DatasetRelation}. */
class SchemaRelation extends BaseRelation {
  private final SQLContext context;
  private final StructType schema;

  SchemaRelation(SQLContext context, StructType schema) {
    this.context = context;
    this.schema = schema;
  }

  @Override
  public SQLContext sqlContext() {
    return context;
  }

  @Override
  public StructType schema() {
    return schema;
  }
}
