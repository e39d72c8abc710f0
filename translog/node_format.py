"""The node-level translog's blobs: one data blob and one index blob per upload round (issue 30).

A node uploads the sealed translog generations of every shard that changed since its
last round in ONE data blob, and describes them in ONE round index.  Keys, relative to
the store root (a node's *stream* is one :class:`~shardstore.translog.node_translog.NodeTranslog`
instance, i.e. one node process)::

    <cluster_uuid>/node_translog/<stream>/data/<inv_round>.ntl       the sections, then the index
    <cluster_uuid>/node_translog/<stream>/index/<inv_round>          the same index on its own

``inv(x) = 2**63 - 1 - x`` zero-padded to 19 digits, so a listing yields the newest round
first.  Both blobs are written ``if_absent``; the round number is the stream's own
counter, so no two rounds of one stream share a key.

**Data blob.**  ``section_0 | section_1 | ... | index record | u32 index length | b"SSNT"``.
A *section* is one sealed local generation file of one shard, byte for byte (its own
header, schema frame and CRC32C-checked frames, see :mod:`frames`), so every section
decodes exactly like a per-shard data blob of the per-shard format.  The trailer lets a
reader that lost the index blob find the index from the data blob alone.

**Index record** (:class:`RoundIndex`, the index blob, and the data blob's tail), little-endian:

======  ====  ======  ==========================================================
offset  size  type    field
======  ====  ======  ==========================================================
0       4     bytes   magic ``b"SSNR"``
4       2     u16     format version (2: CRC32C, as every translog record from version 2)
6       2     u16     flags (0)
8       4     u32     body length ``n``
12      n     bytes   body: UTF-8 JSON ``{"stream", "round", "node", "sections"}``
12+n    4     u32     CRC32C of bytes 0..12+n-1
======  ====  ======  ==========================================================

Each section is ``[index_uuid, shard, generation, primary_term, offset, size, crc32c,
min_seq_no, max_seq_no, num_ops, trimmed_above_seq_no]``: which shard, which of its
generations and term, where in the data blob, the CRC32C of those bytes, and the seq#s
they hold.  Each index is checked (CRC) before its version is believed; a newer version
raises :class:`~shardstore.errors.UnsupportedFormatVersion`, any flaw
:class:`TranslogCorruptedError` naming the key.

Why both blobs: a reader that finds the data blob but not the index (lost) reads the
data blob's trailer; one that finds the index but not the data blob (lost or corrupt)
knows every shard's lost seq# range from it.  So one lost blob either loses nothing or
is named with its ranges (docs/design/translog.md, "Node-level translog").
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass

from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.records import check_framing, check_version, crc32c
from shardstore.translog.remote_metadata import RemoteGeneration

MAGIC = b"SSNR"
TRAILER_MAGIC = b"SSNT"
FORMAT_VERSION = 2  # the translog records' numbering: version 1 meant zlib CRC32, so the first CRC32C version is 2
NODE_TRANSLOG_DIR = "node_translog"
DATA_DIR = "data/"
INDEX_DIR = "index/"
DATA_SUFFIX = ".ntl"
_HEAD = struct.Struct("<4sHHI")
_CRC = struct.Struct("<I")
TRAILER = struct.Struct("<I4s")
_MAX = 2**63 - 1
_WIDTH = 19


@dataclass(frozen=True, slots=True)
class Section:
    """One shard's sealed generation inside a round's data blob."""

    index_uuid: str
    shard: int
    generation: int
    primary_term: int
    offset: int
    size: int
    crc32: int  # CRC32C of the section's bytes
    min_seq_no: int
    max_seq_no: int
    num_ops: int
    trimmed_above_seq_no: int

    def entry(self, data_key: str) -> RemoteGeneration:
        """This section as an uploaded generation a reader resolves like any other (its bytes: a range of ``data_key``)."""
        return RemoteGeneration(
            generation=self.generation, primary_term=self.primary_term, blob_key=data_key, size=self.size,
            crc32=self.crc32, min_seq_no=self.min_seq_no, max_seq_no=self.max_seq_no, num_ops=self.num_ops,
            trimmed_above_seq_no=self.trimmed_above_seq_no, offset=self.offset)


_SECTION_FIELDS = tuple(Section.__slots__)


@dataclass(frozen=True, slots=True)
class RoundIndex:
    """What one upload round of a node wrote: its sections, per shard."""

    stream: str  # the stream prefix (store-root relative, no trailing '/')
    round: int
    node: str
    sections: tuple[Section, ...] = ()

    @property
    def data_key(self) -> str:
        """The round's data blob."""
        return data_key(self.stream, self.round)

    def for_shard(self, index_uuid: str, shard: int) -> list[RemoteGeneration]:
        """The shard's sections of this round, as uploaded generations."""
        key = self.data_key
        return [s.entry(key) for s in self.sections if s.index_uuid == index_uuid and s.shard == shard]

    def encode(self) -> bytes:
        """The framed index record."""
        body = {"stream": self.stream, "round": self.round, "node": self.node,
                "sections": [[getattr(s, f) for f in _SECTION_FIELDS] for s in self.sections]}
        raw = json.dumps(body, separators=(",", ":")).encode()
        head = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, len(raw)) + raw
        return head + _CRC.pack(crc32c(head))


def decode_index(data: bytes | bytearray | memoryview, key: str) -> RoundIndex:
    """Parse an index record read from ``key``; any flaw raises TranslogCorruptedError naming ``key``."""
    mv = memoryview(data)
    if len(mv) >= _HEAD.size and bytes(mv[:4]) == MAGIC:
        n = _HEAD.unpack_from(mv, 0)[3]
        if _HEAD.size + n + _CRC.size != len(mv):
            raise TranslogCorruptedError(key, 8, f"round index body length {n} does not match its size {len(mv)}")
    end = len(mv) - _CRC.size
    version = check_framing(mv, magic=MAGIC, min_size=_HEAD.size + _CRC.size, crc_at=end, where=key,
                            what="round index")
    check_version(version, FORMAT_VERSION, where=key, what="node translog round index")
    if _HEAD.unpack_from(mv, 0)[2] != 0:
        raise TranslogCorruptedError(key, 6, "unknown round index flags")
    try:
        body = json.loads(bytes(mv[_HEAD.size:end]))
        if any(len(s) != len(_SECTION_FIELDS) for s in body["sections"]):
            raise ValueError("a section with the wrong number of fields")
        sections = tuple(Section(str(s[0]), *(int(v) for v in s[1:])) for s in body["sections"])
        return RoundIndex(str(body["stream"]), int(body["round"]), str(body["node"]), sections)
    except (ValueError, KeyError, TypeError) as exc:
        raise TranslogCorruptedError(key, _HEAD.size, f"undecodable round index body: {exc}") from None


def index_from_data(data: bytes | bytearray | memoryview, key: str) -> RoundIndex:
    """The index at the tail of a round's data blob (the reader lost the index blob)."""
    mv = memoryview(data)
    if len(mv) < TRAILER.size:
        raise TranslogCorruptedError(key, 0, f"short node translog data blob: {len(mv)} bytes")
    n, magic = TRAILER.unpack_from(mv, len(mv) - TRAILER.size)
    if magic != TRAILER_MAGIC or n > len(mv) - TRAILER.size:
        raise TranslogCorruptedError(key, len(mv) - TRAILER.size, "bad node translog data blob trailer")
    start = len(mv) - TRAILER.size - n
    return decode_index(mv[start:len(mv) - TRAILER.size], key)


def trailer(index: bytes) -> bytes:
    """What follows the sections in a data blob: the index record, its length and the trailer magic."""
    return index + TRAILER.pack(len(index), TRAILER_MAGIC)


def _inv(x: int) -> str:
    if not isinstance(x, int) or not 0 <= x <= _MAX:
        raise ValueError(f"a round must be an int in 0..2**63-1, got {x!r}")
    return str(_MAX - x).zfill(_WIDTH)


def stream_prefix(cluster_uuid: str, stream: str) -> str:
    """``<cluster_uuid>/node_translog/<stream>`` (no trailing '/')."""
    if not stream or "/" in stream or not cluster_uuid or "/" in cluster_uuid:
        raise ValueError(f"a cluster uuid and a stream id are non-empty without '/': {cluster_uuid!r}, {stream!r}")
    return f"{cluster_uuid}/{NODE_TRANSLOG_DIR}/{stream}"


#: separates a stream id's owner (the writing process's id) from its own random part
OWNER_SEPARATOR = "."


def new_stream_id(owner: str | None) -> str:
    """A fresh stream id: ``<owner>.<random>`` when the writing process's id is known, else ``<random>``.

    The owner is the node process's ephemeral id, the one it joins the cluster with, so the cluster
    manager can tell the stream of a live member from one whose process is gone (issue 46).
    """
    random_part = uuid.uuid4().hex
    if not owner:
        return random_part
    if "/" in owner or OWNER_SEPARATOR in owner:
        raise ValueError(f"a stream owner has no '/' or {OWNER_SEPARATOR!r}: {owner!r}")
    return f"{owner}{OWNER_SEPARATOR}{random_part}"


def stream_owner(stream: str) -> str | None:
    """The process id a stream id (or its prefix) names as its writer; None for a stream of an older version."""
    name = stream.rstrip("/").rsplit("/", 1)[-1]
    owner, sep, _rest = name.partition(OWNER_SEPARATOR)
    return owner if sep and owner else None


def data_key(prefix: str, round_no: int) -> str:
    """The data blob of round ``round_no`` of the stream at ``prefix``."""
    return f"{prefix}/{DATA_DIR}{_inv(round_no)}{DATA_SUFFIX}"


def index_key(prefix: str, round_no: int) -> str:
    """The index blob of round ``round_no`` of the stream at ``prefix``."""
    return f"{prefix}/{INDEX_DIR}{_inv(round_no)}"


def parse_round(key: str) -> int:
    """The round number of a data or index key; ValueError if ``key`` is neither."""
    name = key.rsplit("/", 1)[-1]
    if name.endswith(DATA_SUFFIX):
        name = name[: -len(DATA_SUFFIX)]
    if len(name) != _WIDTH or not name.isdigit():
        raise ValueError(f"not a node translog round key: {key!r}")
    return _MAX - int(name)


__all__ = [
    "FORMAT_VERSION",
    "RoundIndex",
    "Section",
    "data_key",
    "decode_index",
    "index_from_data",
    "index_key",
    "new_stream_id",
    "parse_round",
    "stream_owner",
    "stream_prefix",
    "trailer",
]
