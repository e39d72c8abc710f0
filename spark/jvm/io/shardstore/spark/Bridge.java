package io.shardstore.spark;

/** Where the PySpark driver installs its {@link Planner} (shardstore.spark.register does it). */
public final class Bridge {
  private static volatile Planner planner;
  /** The line the Python planner marks a shardstore error with (shardstore.spark.bridge.USER_ERROR). */
  private static final java.util.regex.Pattern MARKED =
      java.util.regex.Pattern.compile("\\[shardstore\\] ([^\\r\\n]*)");

  private Bridge() {}

  /** Install (or, with null, remove) the planner that reads through the fast path. */
  public static void install(Planner p) {
    planner = p;
  }

  /** The installed planner, or null. */
  public static Planner planner() {
    return planner;
  }

  /**
   * A planner's failure as the user should read it: a shardstore error (marked by the Python planner)
   * becomes one line, an {@code IllegalArgumentException} PySpark shows as it is, not a Py4J stack of
   * the Python traceback; anything else is {@code e} itself.
   */
  public static RuntimeException userError(RuntimeException e) {
    String message = e.getMessage();
    if (message == null) {
      return e;
    }
    java.util.regex.Matcher found = MARKED.matcher(message);
    String line = null;
    while (found.find()) {
      line = found.group(1);
    }
    return line == null ? e : new IllegalArgumentException("shardstore: " + line);
  }

  /** The format name of the Arrow (pure Python) data source this bridge falls back to. */
  public static String arrowFormat() {
    return "shardstore-arrow";
  }
}
