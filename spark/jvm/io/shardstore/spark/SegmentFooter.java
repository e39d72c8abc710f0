package io.shardstore.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.format.RowGroup;
import org.apache.parquet.format.SortingColumn;
import org.apache.parquet.format.Util;
import org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.FileMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;

/**
 * Adds a key-value entry to the footer of a Parquet file Spark wrote (the segment info a segment
 * file keeps under {@code shardstore.segment}, see segments/segment.py) and, for a file whose rows
 * are in {@code _id} order (a format 1 segment), declares them sorted by the first column, as segment
 * files do: the footer is read, the entry (and the sorting columns) added, and the footer written
 * again in place of the old one. Data pages, column and offset indexes and bloom filters sit before
 * the footer and keep their offsets.
 */
public final class SegmentFooter {
  private static final byte[] MAGIC = "PAR1".getBytes(StandardCharsets.US_ASCII);

  private SegmentFooter() {}

  /** Rewrite the footer of the local file {@code path} with {@code key = value} (and the sort order when {@code sortedById}). */
  public static void addKeyValue(String path, String key, String value, boolean sortedById) throws IOException {
    ParquetMetadata md = ParquetFileReader.readFooter(new Configuration(), new Path("file://" + path),
        ParquetMetadataConverter.NO_FILTER);
    FileMetaData old = md.getFileMetaData();
    Map<String, String> kv = new LinkedHashMap<>(old.getKeyValueMetaData());
    kv.put(key, value);
    ParquetMetadata updated = new ParquetMetadata(new FileMetaData(old.getSchema(), kv, old.getCreatedBy()),
        md.getBlocks());
    org.apache.parquet.format.FileMetaData thrift = new ParquetMetadataConverter().toParquetMetadata(1, updated);
    if (sortedById) {
      for (RowGroup g : thrift.getRow_groups()) {  // rows sorted by the first column (_id), ascending
        g.setSorting_columns(List.of(new SortingColumn(0, false, false)));
      }
    }
    ByteArrayOutputStream footer = new ByteArrayOutputStream();
    Util.writeFileMetaData(thrift, footer);
    try (RandomAccessFile f = new RandomAccessFile(path, "rw")) {
      long size = f.length();
      byte[] tail = new byte[8];
      f.seek(size - 8);
      f.readFully(tail);
      for (int i = 0; i < 4; i++) {
        if (tail[4 + i] != MAGIC[i]) throw new IOException(path + ": not a Parquet file (no PAR1 at the end)");
      }
      int oldLength = (tail[0] & 0xff) | (tail[1] & 0xff) << 8 | (tail[2] & 0xff) << 16 | (tail[3] & 0xff) << 24;
      long start = size - 8 - oldLength;
      byte[] body = footer.toByteArray();
      f.setLength(start);
      f.seek(start);
      f.write(body);
      int n = body.length;
      f.write(new byte[] {(byte) n, (byte) (n >>> 8), (byte) (n >>> 16), (byte) (n >>> 24)});
      f.write(MAGIC);
    }
  }
}
