package io.shardstore.spark;

import java.util.IdentityHashMap;
import java.util.Map;

import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import scala.collection.immutable.Seq;
import scala.runtime.AbstractPartialFunction;

/**
 * An optimizer rule: a native {@link DatasetRelation} is replaced by the optimized plan of the
 * fast path's DataFrame under a Project that keeps the relation's attribute ids. Spark's
 * operator optimization (it runs in that batch) then prunes columns and pushes filters into
 * the Parquet scans, and the query runs as if it had been written against read_index: columnar
 * scans, whole-stage code generation, no row hand-over.
 *
 * <p>A relation that occurs more than once in one plan (a self-join or self-union of one loaded
 * DataFrame) is left to the row hand-over: inlining both copies would give both sides of the
 * join the same attribute ids.
 */
public final class InlineFastPath extends Rule<LogicalPlan> {
  @Override
  public LogicalPlan apply(LogicalPlan plan) {
    Map<DatasetRelation, Integer> seen = new IdentityHashMap<>();
    plan.foreach(node -> {
      DatasetRelation r = nativeRelation(node);
      if (r != null) seen.merge(r, 1, Integer::sum);
      return scala.runtime.BoxedUnit.UNIT;
    });
    if (seen.isEmpty()) return plan;
    return plan.transformUp(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
      @Override
      public boolean isDefinedAt(LogicalPlan node) {
        DatasetRelation r = nativeRelation(node);
        return r != null && seen.get(r) == 1;
      }

      @Override
      public <A1 extends LogicalPlan, B1> B1 applyOrElse(A1 node, scala.Function1<A1, B1> fallback) {
        if (!isDefinedAt(node)) return fallback.apply(node);
        @SuppressWarnings("unchecked")
        B1 out = (B1) inline((LogicalRelation) node, nativeRelation(node));
        return out;
      }
    });
  }

  private static DatasetRelation nativeRelation(LogicalPlan node) {
    if (node instanceof LogicalRelation lr && lr.relation() instanceof DatasetRelation r && r.inlinable()) return r;
    return null;
  }

  private static LogicalPlan inline(LogicalRelation relation, DatasetRelation r) {
    LogicalPlan inner = r.optimizedPlan();
    Seq<Attribute> in = inner.output();
    Seq<?> out = relation.output();
    java.util.List<NamedExpression> list = new java.util.ArrayList<>();
    for (int i = 0; i < out.size(); i++) {
      Attribute o = (Attribute) out.apply(i);
      list.add(new Alias(in.apply(i), o.name(), o.exprId(), o.qualifier(), scala.Option.empty(),
          scala.collection.immutable.List$.MODULE$.empty()));
    }
    return new Project(scala.jdk.javaapi.CollectionConverters.asScala(list).toList(), inner);
  }
}
