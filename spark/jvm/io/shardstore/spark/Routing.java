package io.shardstore.spark;

/**
 * Elasticsearch's default document routing, as shardstore.engine.routing computes it: Murmur3 x86
 * 32-bit, seed 0, over the id's UTF-16 code units (each as two little-endian bytes), then
 * {@code floorMod(hash, shards)}. A Java String is those code units, so no transcoding is needed.
 */
public final class Routing {
  private static final int C1 = 0xcc9e2d51;
  private static final int C2 = 0x1b873593;

  private Routing() {}

  /** Elasticsearch's {@code Murmur3HashFunction.hash(String)}: a signed 32-bit int. */
  public static int murmur3(String id) {
    int n = id.length();
    int h = 0;
    int i = 0;
    for (; i + 1 < n; i += 2) {  // one 4-byte block: two code units, little-endian
      h = block(h, (id.charAt(i) & 0xffff) | (id.charAt(i + 1) << 16));
    }
    if (i < n) {  // a 2-byte tail: the last code unit
      h ^= mixK(id.charAt(i) & 0xffff);
    }
    return mix(h, n);
  }

  /**
   * {@link #murmur3(String)} of an id as Spark holds it: hashed from its UTF-8 bytes while they are
   * ASCII (one byte is then one code unit), else from its Java string.
   */
  public static int murmur3(org.apache.spark.unsafe.types.UTF8String id) {
    int n = id.numBytes();
    int h = 0;
    int i = 0;
    for (; i + 1 < n; i += 2) {
      int b0 = id.getByte(i);
      int b1 = id.getByte(i + 1);
      if ((b0 | b1) < 0) return murmur3(id.toString());  // a byte >= 0x80: not ASCII
      h = block(h, b0 | (b1 << 16));
    }
    if (i < n) {
      int k = id.getByte(i);
      if (k < 0) return murmur3(id.toString());
      h ^= mixK(k);
    }
    return mix(h, n);
  }

  private static int mixK(int k) {
    k *= C1;
    k = Integer.rotateLeft(k, 15);
    return k * C2;
  }

  private static int block(int h, int k) {
    h ^= mixK(k);
    h = Integer.rotateLeft(h, 13);
    return h * 5 + 0xe6546b64;
  }

  private static int mix(int h, int units) {
    h ^= 2 * units;
    h ^= h >>> 16;
    h *= 0x85ebca6b;
    h ^= h >>> 13;
    h *= 0xc2b2ae35;
    h ^= h >>> 16;
    return h;
  }

  /** The shard of an id as Spark holds it. */
  public static int shard(org.apache.spark.unsafe.types.UTF8String id, int shards) {
    return Math.floorMod(murmur3(id), shards);
  }

  /** The shard of {@code id} in an index of {@code shards} shards. */
  public static int shard(String id, int shards) {
    return Math.floorMod(murmur3(id), shards);
  }

  /** The shards of many ids at once (one Py4J call for a test's whole list). */
  public static int[] shards(String[] ids, int shards) {
    int[] out = new int[ids.length];
    for (int i = 0; i < ids.length; i++) out[i] = shard(ids[i], shards);
    return out;
  }
}
