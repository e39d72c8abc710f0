"""The remote translog's metadata blob: which uploaded generations exist, and the checkpoint.

One metadata blob is written (``if_absent``) at the end of every upload.  Its key,
relative to the translog prefix, is::

    metadata/<inv_term>__<inv_gen>__<writer>

with ``inv(x) = 2**63 - 1 - x`` zero-padded to 19 digits, so that a plain lexicographic
listing yields the newest (primary term, generation) FIRST: the latest metadata is
found with one LIST.  ``writer`` is the uploading instance's UUID (hex).

Data blobs (one sealed generation file each, byte for byte) live at::

    data/<term>/<generation>__<uuid>.tlog

The unique suffix means a new primary never overwrites an older one's bytes.  The
metadata records each data blob's key relative to the STORE ROOT (prefix included), so
a newer term's metadata may still name blobs under an older term's prefix.

Byte layout of a metadata blob (format version 3, little-endian; version 1 has the same
layout with a CRC32 (zlib), version 2 neither sections nor streams, and both are still read):

======  ====  ======  ==========================================================
offset  size  type    field
======  ====  ======  ==========================================================
0       4     bytes   magic ``b"SSRM"``
4       2     u16     format version (3; 2 and 1 are still read)
6       2     u16     flags (0)
8       4     u32     body length ``n``
12      n     bytes   body: UTF-8 JSON object (see :func:`encode_metadata`)
12+n    4     u32     CRC32C of bytes 0..12+n-1 (version 1: CRC32 (zlib))
======  ====  ======  ==========================================================

Version 3 (issue 30) adds what the node-level translog needs: an entry may carry a 10th
field, its ``offset`` (the generation is ``size`` bytes of a node round's data blob from
there, see :mod:`node_format`), and the body may hold ``streams``: ``[[stream prefix,
first round, index_uuid, shard], ...]``, the node streams whose rounds from that round on hold this
translog's later generations.  A version 2 reader refuses a version 3 blob
(:class:`~shardstore.errors.UnsupportedFormatVersion`) instead of missing those.

As with the generation header, the checksum is picked by the version field and checked
before the version is believed: a flipped bit
anywhere is :class:`TranslogCorruptedError` (naming the blob key); a record with a good
CRC and a newer version raises :class:`~shardstore.errors.UnsupportedFormatVersion`.
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass

from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.records import check_framing, check_version, checksum_for

MAGIC = b"SSRM"
FORMAT_VERSION = 3
_HEAD = struct.Struct("<4sHHI")
_CRC = struct.Struct("<I")
_MAX = 2**63 - 1
_WIDTH = 19
METADATA_DIR = "metadata/"
DATA_DIR = "data/"


@dataclass(frozen=True, slots=True)
class RemoteGeneration:
    """One uploaded generation: where its bytes are and what they hold."""

    generation: int
    primary_term: int
    blob_key: str  # relative to the store root
    size: int
    crc32: int  # checksum of the whole blob (the generation file up to its sealed offset): see generation_checksum
    min_seq_no: int
    max_seq_no: int
    num_ops: int
    trimmed_above_seq_no: int
    #: -1: the whole blob is this generation (per-shard format); else the generation is the ``size`` bytes
    #: of ``blob_key`` from here on, a section of a node-level round's data blob (issue 30, node_format.py)
    offset: int = -1


@dataclass(frozen=True, slots=True)
class RemoteTranslogMetadata:
    """What one metadata blob says: the retained uploaded generations and the checkpoint."""

    primary_term: int
    generation: int  # newest generation this upload covered (sealed)
    translog_uuid: uuid.UUID
    min_seq_no: int
    max_seq_no: int
    global_checkpoint: int
    min_translog_generation: int
    entries: tuple[RemoteGeneration, ...] = ()
    #: The last ``trim_operations_above(seq_no, term)`` of this translog, as (seq_no, term):
    #: operations of terms below ``term`` above ``seq_no`` are void, in ANY prefix a reader
    #: merges with this one (a new primary that never held the old term's blobs).
    trim: tuple[int, int] | None = None
    #: (stream prefix, first round, index_uuid, shard): this translog's generations uploaded after ``entries``
    #: were written are sections of that shard in those node-level streams' rounds from that round on
    #: (format version 3, issue 30)
    streams: tuple[tuple[str, int, str, int], ...] = ()

    def encode(self) -> bytes:
        """The framed bytes of this record."""
        return encode_metadata(self)


_ENTRY_FIELDS = (
    "generation", "primary_term", "blob_key", "size", "crc32",
    "min_seq_no", "max_seq_no", "num_ops", "trimmed_above_seq_no",
)


def encode_metadata(md: RemoteTranslogMetadata) -> bytes:
    """Frame ``md`` (JSON body with entries as compact arrays in ``_ENTRY_FIELDS`` order)."""
    body = {
        "primary_term": md.primary_term,
        "generation": md.generation,
        "translog_uuid": str(md.translog_uuid),
        "min_seq_no": md.min_seq_no,
        "max_seq_no": md.max_seq_no,
        "global_checkpoint": md.global_checkpoint,
        "min_translog_generation": md.min_translog_generation,
        "entries": [[getattr(e, f) for f in _ENTRY_FIELDS] + ([e.offset] if e.offset >= 0 else [])
                    for e in md.entries],
    }
    if md.trim is not None:
        body["trim"] = list(md.trim)
    if md.streams:
        body["streams"] = [list(s) for s in md.streams]
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, len(raw)) + raw
    return head + _CRC.pack(checksum_for(FORMAT_VERSION)(head, 0))


def decode_metadata(data: bytes | bytearray | memoryview, key: str) -> RemoteTranslogMetadata:
    """Parse a metadata blob read from ``key``; any flaw raises TranslogCorruptedError naming ``key``."""
    mv = memoryview(data)
    if len(mv) >= _HEAD.size:
        n = _HEAD.unpack_from(mv, 0)[3]
        if _HEAD.size + n + _CRC.size != len(mv):
            raise TranslogCorruptedError(key, 8, f"metadata body length {n} does not match the blob size {len(mv)}")
    end = len(mv) - _CRC.size
    version = check_framing(mv, magic=MAGIC, min_size=_HEAD.size + _CRC.size, crc_at=end, where=key, what="metadata")
    _magic, _version, flags, n = _HEAD.unpack_from(mv, 0)
    check_version(version, FORMAT_VERSION, where=key, what="remote translog metadata")
    if flags != 0:
        raise TranslogCorruptedError(key, 6, f"unknown metadata flags {flags:#06x}")
    try:
        body = json.loads(bytes(mv[_HEAD.size:end]))
        widths = (len(_ENTRY_FIELDS), len(_ENTRY_FIELDS) + 1) if version >= 3 else (len(_ENTRY_FIELDS),)
        if any(len(e) not in widths for e in body["entries"]):
            raise ValueError("entry with the wrong number of fields")
        entries = tuple(RemoteGeneration(*e) for e in body["entries"])
        return RemoteTranslogMetadata(
            primary_term=int(body["primary_term"]),
            generation=int(body["generation"]),
            translog_uuid=uuid.UUID(body["translog_uuid"]),
            min_seq_no=int(body["min_seq_no"]),
            max_seq_no=int(body["max_seq_no"]),
            global_checkpoint=int(body["global_checkpoint"]),
            min_translog_generation=int(body["min_translog_generation"]),
            entries=entries,
            trim=(int(body["trim"][0]), int(body["trim"][1])) if body.get("trim") is not None else None,
            streams=tuple((str(p), int(r), str(i), int(n)) for p, r, i, n in body.get("streams", ())),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TranslogCorruptedError(key, _HEAD.size, f"undecodable metadata body: {exc}") from None


def generation_checksum(data: bytes | bytearray | memoryview) -> int:
    """Checksum of a whole data blob: CRC32 (zlib) for a format version 1 generation file, else CRC32C."""
    version = struct.unpack_from("<H", data, 4)[0] if len(data) >= 6 else 0
    return checksum_for(version)(data, 0)


def _inv(x: int, what: str) -> str:
    if not isinstance(x, int) or not 0 <= x <= _MAX:
        raise ValueError(f"{what} must be an int in 0..2**63-1, got {x!r}")
    return str(_MAX - x).zfill(_WIDTH)


def metadata_key(term: int, generation: int, writer_uuid: str) -> str:
    """``metadata/<inv_term>__<inv_gen>__<writer>``: newest (term, generation) sorts first."""
    if not writer_uuid or "/" in writer_uuid or "__" in writer_uuid:
        raise ValueError(f"writer id must be non-empty without '/' or '__': {writer_uuid!r}")
    return f"{METADATA_DIR}{_inv(term, 'term')}__{_inv(generation, 'generation')}__{writer_uuid}"


def parse_metadata_key(key: str) -> tuple[int, int, str]:
    """(term, generation, writer) of a metadata key (with or without a leading prefix)."""
    name = key.rsplit("/", 1)[-1]
    parts = name.split("__")
    if len(parts) != 3 or len(parts[0]) != _WIDTH or len(parts[1]) != _WIDTH or not (parts[0] + parts[1]).isdigit():
        raise ValueError(f"not a remote translog metadata key: {key!r}")
    return _MAX - int(parts[0]), _MAX - int(parts[1]), parts[2]


def data_key(term: int, generation: int, unique: str) -> str:
    """``data/<term>/<generation>__<unique>.tlog`` (relative to the translog prefix)."""
    return f"{DATA_DIR}{term}/{generation}__{unique}.tlog"


__all__ = [
    "FORMAT_VERSION",
    "RemoteGeneration",
    "RemoteTranslogMetadata",
    "data_key",
    "decode_metadata",
    "encode_metadata",
    "generation_checksum",
    "metadata_key",
    "parse_metadata_key",
]
