package io.shardstore.spark;

/** Where the PySpark driver installs its {@link Planner} (shardstore.spark.register does it). */
public final class Bridge {
  private static volatile Planner planner;

  private Bridge() {}

  /** Install (or, with null, remove) the planner that reads through the fast path. */
  public static void install(Planner p) {
    planner = p;
  }

  /** The installed planner, or null. */
  public static Planner planner() {
    return planner;
  }

  /** The format name of the Arrow (pure Python) data source this bridge falls back to. */
  public static String arrowFormat() {
    return "shardstore-arrow";
  }
}
