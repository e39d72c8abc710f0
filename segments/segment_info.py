"""What a segment is, without opening it: the format constants, the base schema, :class:`SegmentInfo`
(stats a reader prunes with, JSON-able for the commit point) and the helpers that compute them.

See :mod:`.segment` for the design of segment files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardstore.core.records import crc32c
from shardstore.errors import UnsupportedFormatVersion
from shardstore.fileio import mapped

from .errors import SegmentCorrupted
from .stamp import Stamp

#: Format of the segments the engine writes: rows sorted by ``_id``.
FORMAT_VERSION = 1
#: Format of a segment whose rows are in any order (an id may repeat; live docs say which copy counts).
UNSORTED_FORMAT_VERSION = 2
#: Format of a stamped segment: rows in any order, no metadata columns in the file; its info's
#: :class:`~.stamp.Stamp` gives them (segments/stamp.py, docs/design/adoption.md).
STAMPED_FORMAT_VERSION = 3
#: The newest segment format this code reads (a newer one: ``UnsupportedFormatVersion``).
MAX_FORMAT_VERSION = STAMPED_FORMAT_VERSION
METADATA_KEY = b"shardstore.segment"
#: Arrow bytes per row group: 8 MiB (about 42,000 flights rows) since issue 44, when 4 MiB groups with every
#: column in zstd decoded a cold scan at 0.75 of deltalake's speed (docs/design/segments.md, "Codecs").
TARGET_ROW_GROUP_BYTES = 8 << 20
MIN_ROW_GROUP_ROWS = 1024
MAX_ROW_GROUP_ROWS = 128 * 1024
ZSTD_LEVEL = 1
#: Base columns nearly unique per row: no dictionary pages, and :data:`DENSE_CODEC` whatever their type.
UNIQUE_COLUMNS = ("_id", "_seq_no", "_source")
#: The codec of a column whose values are long or nearly unique (ids, sequence numbers, JSON source, strings).
DENSE_CODEC = "zstd"
#: The codec of a fixed-width column (numbers, booleans, dates and times): dictionary pages already shrink
#: them, zstd saved little on top and cost the most decoding time per byte.  Not LZ4: Spark 4.1's Parquet
#: reader (airlift's LZ4_RAW) refuses pyarrow's LZ4_RAW pages ("all input must be consumed").
FIXED_WIDTH_CODEC = "snappy"
#: Base columns written with a Parquet encoding of their own instead of plain pages: ``_seq_no`` ascends within a
#: refreshed segment, so delta-packed it is a few bits a row (plain and zstd: ~1 byte) and encodes ~3x faster.
DELTA_COLUMNS = MappingProxyType({"_seq_no": "DELTA_BINARY_PACKED"})
#: Segments whose Arrow data is at most this big are encoded into memory, then
#: checksummed and written in one go; bigger ones stream through a CRC-computing file.
IN_MEMORY_WRITE_BYTES = 512 << 20
#: A segment written from chosen ``rows`` of a table takes at most this many Arrow bytes of them at a time.
TAKE_BYTES = 64 << 20
#: A scan with deletions reads runs of row groups of about this many bytes (uncompressed).
SCAN_READ_BYTES = 64 << 20
_LIVE_COLUMN = "__shardstore_live__"

BASE_SCHEMA = pa.schema(
    [
        pa.field("_id", pa.string(), nullable=False),
        pa.field("_seq_no", pa.int64(), nullable=False),
        pa.field("_primary_term", pa.int64(), nullable=False),
        pa.field("_version", pa.int64(), nullable=False),
        pa.field("_source", pa.binary()),
    ]
)
_BASE_NAMES = tuple(BASE_SCHEMA.names)


def column_codecs(schema: pa.Schema) -> dict[str, str]:
    """The Parquet codec of each column of a segment with ``schema``: :data:`DENSE_CODEC` for the base
    columns but the term and version and for strings, binaries and nested values; :data:`FIXED_WIDTH_CODEC`
    for fixed-width values (docs/design/segments.md, "Codecs")."""
    def fixed(f: pa.Field) -> bool:
        t = f.type
        return f.name not in UNIQUE_COLUMNS and (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_temporal(t) or pa.types.is_decimal(t))

    return {path: FIXED_WIDTH_CODEC if fixed(f) else DENSE_CODEC for f in schema for path in _leaf_paths(f)}


def _leaf_paths(field: pa.Field, prefix: str = "") -> list[str]:
    """The Parquet column paths of ``field`` (a codec per column applies to leaves: a nested field not named
    leaf by leaf would be written uncompressed)."""
    name, t = prefix + field.name, field.type
    if pa.types.is_struct(t):
        return [p for i in range(t.num_fields) for p in _leaf_paths(t.field(i), name + ".")]
    if pa.types.is_map(t):
        return _leaf_paths(t.key_field, name + ".key_value.") + _leaf_paths(t.item_field, name + ".key_value.")
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaf_paths(pa.field("element", t.value_type), name + ".list.")
    return [name]


def segment_file_name(name: str) -> str:
    return f"{name}.parquet"


def _json_value(v: Any) -> Any:
    """Statistic value -> JSON-able (timestamps as epoch milliseconds)."""
    if isinstance(v, pa.Scalar):
        if pa.types.is_timestamp(v.type):
            return v.cast(pa.timestamp("ms", v.type.tz)).value if v.is_valid else None
        v = v.as_py()
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    if isinstance(v, bytes):
        return None
    return v


@dataclass(frozen=True)
class ColumnStats:
    """Min/max of a mapped scalar column (timestamps as epoch ms); None when all null."""

    name: str
    type: str
    min: Any
    max: Any
    null_count: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "min": self.min, "max": self.max, "null_count": self.null_count}


@dataclass(frozen=True)
class SegmentInfo:
    """What a reader needs to know of a segment without opening it."""

    name: str
    file_name: str
    size: int
    checksum: int  # CRC32C of the whole file
    doc_count: int
    min_seq_no: int
    max_seq_no: int
    max_primary_term: int
    min_id: str | None
    max_id: str | None
    columns: tuple[ColumnStats, ...] = ()
    row_groups: int = 0
    format_version: int = FORMAT_VERSION
    #: a stamped segment's metadata columns (format :data:`STAMPED_FORMAT_VERSION` only)
    stamp: Stamp | None = None

    def __post_init__(self) -> None:
        if (self.stamp is not None) != (self.format_version == STAMPED_FORMAT_VERSION):
            raise ValueError(f"segment {self.name}: format version {self.format_version} with stamp {self.stamp} "
                             f"(a stamp goes with format {STAMPED_FORMAT_VERSION} and only with it)")

    @property
    def id_sorted(self) -> bool:
        """Whether the rows are in ``_id`` order (format 1); format 2 rows are in any order."""
        return self.format_version < UNSORTED_FORMAT_VERSION

    def column(self, name: str) -> ColumnStats | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file_name": self.file_name,
            "size": self.size,
            "checksum": self.checksum,
            "doc_count": self.doc_count,
            "min_seq_no": self.min_seq_no,
            "max_seq_no": self.max_seq_no,
            "max_primary_term": self.max_primary_term,
            "min_id": self.min_id,
            "max_id": self.max_id,
            "columns": {c.name: c.to_dict() for c in self.columns},
            "row_groups": self.row_groups,
            "format_version": self.format_version,
            **({"stamp": self.stamp.to_dict()} if self.stamp is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "segment info") -> SegmentInfo:
        try:
            version = int(d["format_version"])
            if version > MAX_FORMAT_VERSION:
                raise UnsupportedFormatVersion(where, version, MAX_FORMAT_VERSION)
            if version < FORMAT_VERSION:
                raise ValueError(f"format version {version}")
            return cls(
                name=str(d["name"]),
                file_name=str(d["file_name"]),
                size=int(d["size"]),
                checksum=int(d["checksum"]),
                doc_count=int(d["doc_count"]),
                min_seq_no=int(d["min_seq_no"]),
                max_seq_no=int(d["max_seq_no"]),
                max_primary_term=int(d["max_primary_term"]),
                min_id=d["min_id"],
                max_id=d["max_id"],
                columns=tuple(
                    ColumnStats(k, v["type"], v["min"], v["max"], int(v.get("null_count", 0)))
                    for k, v in d.get("columns", {}).items()
                ),
                row_groups=int(d["row_groups"]),
                format_version=version,
                stamp=Stamp.from_dict(d["stamp"]) if "stamp" in d else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SegmentCorrupted(where, f"bad segment info: {exc!r}") from None



def stat_value(t: pa.DataType, st: Any, which: str) -> Any:
    """A Parquet row group's min or max as the segment info keeps it (timestamps as epoch ms, NaN/inf as None)."""
    if pa.types.is_timestamp(t):
        raw = getattr(st, which + "_raw")
        return int(raw) if t.unit == "ms" else int(pa.scalar(raw, pa.int64()).cast(t).cast(pa.timestamp("ms")).value)
    v = getattr(st, which)
    if isinstance(v, bytes):
        v = v.decode("utf-8")
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    return v


def footer_column_stats(md: pq.FileMetaData, index: int, name: str, t: pa.DataType,
                        values: Callable[[], pa.ChunkedArray | pa.Array]) -> ColumnStats:
    """A column's stats from the row groups' Parquet statistics (what the writer computed anyway); ``values()``
    gives the column's data for a file whose statistics lack them (a string over the writer's statistics size)."""
    lo = hi = None
    nulls = 0
    for g in range(md.num_row_groups):
        cc = md.row_group(g).column(index)
        st = cc.statistics
        if st is None or not st.has_null_count or (not st.has_min_max and st.null_count < cc.num_values):
            col = values()
            mm = pc.min_max(col)
            return ColumnStats(name, str(t), _json_value(mm["min"]), _json_value(mm["max"]), col.null_count)
        nulls += st.null_count
        if st.has_min_max:
            a, b = stat_value(t, st, "min"), stat_value(t, st, "max")
            lo = a if lo is None or (a is not None and a < lo) else lo
            hi = b if hi is None or (b is not None and b > hi) else hi
    return ColumnStats(name, str(t), lo, hi, nulls)


def in_id_order(ids: pa.Array | pa.ChunkedArray) -> bool:
    """Whether ``ids`` never decrease (equal neighbours allowed: rows of one id); never with a null among them."""
    n = len(ids)
    if ids.null_count:
        return False
    return n < 2 or bool(pc.all(pc.less_equal(ids.slice(0, n - 1), ids.slice(1))).as_py())


def id_bounds(ids: pa.Array | pa.ChunkedArray, id_sorted: bool) -> tuple[str | None, str | None]:
    """The smallest and largest id: the ends of ids in id order, else a min/max pass (None, None when empty)."""
    n = len(ids)
    if not n:
        return None, None
    if id_sorted:
        return ids[0].as_py(), ids[n - 1].as_py()
    lo, hi = pc.min_max(ids).values()
    return lo.as_py(), hi.as_py()


def format_version_of(id_sorted: bool) -> int:
    """The segment format of a file whose rows are (or are not) in ``_id`` order."""
    return FORMAT_VERSION if id_sorted else UNSORTED_FORMAT_VERSION


def metadata_info(name: str, doc_count: int, row_groups: int, row_group_size: int, id_sorted: bool,
                  base: dict[str, Any], columns: Sequence[ColumnStats] | None = None) -> dict[str, Any]:
    """The size/checksum-free segment info a segment file keeps under ``shardstore.segment`` (``base``: seq#,
    term and id bounds; ``columns``: field stats, left out where the footer's statistics are their copy)."""
    meta = {"name": name, "doc_count": doc_count, "row_groups": row_groups, "format_version": format_version_of(id_sorted),
            "row_group_size": row_group_size, "sorted_by": "_id" if id_sorted else None}
    if columns is not None:
        meta["columns"] = {c.name: c.to_dict() for c in columns}
    return {**meta, **base}


def file_crc32c(path: str) -> tuple[int, int]:
    """(size, CRC32C) of a local file's bytes, read through a memory map (no copy in memory)."""
    with open(path, "rb") as f, mapped(f) as view:
        return len(view), crc32c(view)
