"""The manifest (written last) and the index chunks it points to: records, names, chunking (pure).

**Manifest key** (newest first in one LIST, committed told apart from published-only)::

    <cluster_uuid>/cluster-state/manifest/manifest__<inv term>__<inv version>__<C|P>__<codec>

``inv n`` is ``2**63 - 1 - n`` zero-padded to 19 digits, so a higher term, then a higher
version, sorts first; for one (term, version) the committed manifest ``C`` sorts before
the published-only ``P``.  Both are written with put-if-absent: a state is *persisted*
when its ``P`` manifest exists and *committed* when its ``C`` manifest exists.

**Manifest record** (magic ``CSMF``, format version = the codec version 1), JSON body::

    {"codec": 1, "cluster_uuid", "previous_cluster_uuid" (str|null), "cluster_uuid_committed",
     "committed", "term", "version", "state_uuid", "fingerprint" (hex SHA-256 of the persistent metadata),
     "cluster": {kind: ref}, "chunk_count": n, "index_count": k,
     "chunks": {"<id>": {"key", "checksum", "size", "count"}},
     "diff": {"base": state_uuid|null, "cluster": [kind], "indices": [name], "routing": [name],
              "removed": [name], "chunks": [id]}}

with ``ref = {"key", "version", "checksum", "size"}``.  ``diff.base`` null means a full
write (the lists are then empty: everything is new).

**Chunk record** (magic ``CSCH``, version 1): ``{"v": {"n": n, "id": i, "entries": {index
name: {"uuid", "index": ref, "routing": ref|null}}}}``.  Index ``u`` lives in chunk
``crc32c(u) mod n``; ``n`` is a power of two chosen by :func:`chunk_count` (about
:data:`CHUNK_TARGET` indices per chunk, grown by doubling, shrunk by halving with
hysteresis), so one changed index rewrites one chunk of a few hundred entries, and
unchanged chunks are referenced again by key, never re-uploaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shardstore.cluster_state.entities import MAGIC, EntityRef, prefix
from shardstore.cluster_state.errors import ClusterStateCorrupt
from shardstore.core.path_strategy import invert, uninvert
from shardstore.core.records import RecordCorrupted, crc32c, decode_record, encode_record
from shardstore.errors import InvalidError, UnsupportedFormatVersion

CODEC_VERSION = 1
#: Target number of indices per chunk.
CHUNK_TARGET = 256
_NAME = re.compile(r"manifest__([0-9]{19})__([0-9]{19})__([CP])__([0-9]+)")


@dataclass(frozen=True, order=True)
class ManifestName:
    """A parsed manifest key: what its name tells without reading it."""

    term: int
    version: int
    committed: bool
    codec: int
    key: str = field(compare=False)
    cluster_uuid: str = field(compare=False, default="")


def manifest_prefix(cluster_uuid: str) -> str:
    """The LIST prefix of a cluster UUID's manifests."""
    return prefix(cluster_uuid, "manifest")


def manifest_key(cluster_uuid: str, term: int, version: int, committed: bool, codec: int = CODEC_VERSION) -> str:
    """The key of a manifest (see the module docstring)."""
    return f"{manifest_prefix(cluster_uuid)}manifest__{invert(term)}__{invert(version)}__{'C' if committed else 'P'}__{codec}"


def parse_manifest_key(key: str) -> ManifestName | None:
    """The ManifestName of ``key``, or None when it is not a manifest key."""
    head, _, leaf = key.rpartition("/")
    m = _NAME.fullmatch(leaf)
    if not m or not head.endswith("/cluster-state/manifest"):
        return None
    cluster_uuid = head[: -len("/cluster-state/manifest")]
    return ManifestName(uninvert(m[1]), uninvert(m[2]), m[3] == "C", int(m[4]), key, cluster_uuid)


def chunk_count(previous: int, indices: int) -> int:
    """Chunks to use for ``indices`` indices, given the previous count (power of two, hysteresis)."""
    n = max(1, previous)
    while indices > n * CHUNK_TARGET:
        n *= 2
    while n > 1 and indices < n * CHUNK_TARGET // 4:
        n //= 2
    return n


def chunk_of(index_uuid: str, n: int) -> int:
    """The chunk id of an index: CRC32C of its UUID modulo ``n`` (stable across states)."""
    return crc32c(index_uuid.encode()) % n


@dataclass(frozen=True)
class ChunkRef:
    """One chunk blob of index references."""

    id: int
    key: str
    checksum: int
    size: int
    count: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the id is the map key)."""
        return {"key": self.key, "checksum": self.checksum, "size": self.size, "count": self.count}


@dataclass(frozen=True)
class IndexEntry:
    """What a chunk holds for one index: its UUID and the refs of its metadata and routing table."""

    uuid: str
    index: EntityRef
    routing: EntityRef | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"uuid": self.uuid, "index": self.index.to_dict(),
                "routing": None if self.routing is None else self.routing.to_dict()}

    @staticmethod
    def from_dict(name: str, d: Mapping[str, Any]) -> IndexEntry:
        """Inverse of :meth:`to_dict`."""
        r = d.get("routing")
        return IndexEntry(d["uuid"], EntityRef.from_dict("index", name, d["index"]),
                          None if r is None else EntityRef.from_dict("routing", name, r))


def chunk_value(n: int, chunk_id: int, entries: Mapping[str, IndexEntry]) -> dict[str, Any]:
    """The value stored in a chunk blob."""
    return {"n": n, "id": chunk_id, "entries": {name: e.to_dict() for name, e in sorted(entries.items())}}


def chunk_entries(value: Mapping[str, Any], key: str) -> dict[str, IndexEntry]:
    """The entries of a decoded chunk value; ClusterStateCorrupt if malformed."""
    try:
        return {name: IndexEntry.from_dict(name, e) for name, e in value["entries"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterStateCorrupt(key, f"malformed chunk: {exc!r}") from None


@dataclass(frozen=True)
class ManifestDiff:
    """Which entities changed since the state ``base`` (None: a full write)."""

    base: str | None = None
    cluster: tuple[str, ...] = ()
    indices: tuple[str, ...] = ()
    routing: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    chunks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"base": self.base, "cluster": list(self.cluster), "indices": list(self.indices),
                "routing": list(self.routing), "removed": list(self.removed), "chunks": list(self.chunks)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ManifestDiff:
        """Inverse of :meth:`to_dict`."""
        return ManifestDiff(d["base"], tuple(d["cluster"]), tuple(d["indices"]), tuple(d["routing"]),
                            tuple(d["removed"]), tuple(int(c) for c in d["chunks"]))


@dataclass(frozen=True)
class Manifest:
    """The consolidated view of one state: every entity's ref, the chunk refs and the diff."""

    cluster_uuid: str
    previous_cluster_uuid: str | None
    cluster_uuid_committed: bool
    committed: bool
    term: int
    version: int
    state_uuid: str
    fingerprint: str
    cluster: dict[str, EntityRef]
    chunk_count: int
    index_count: int
    chunks: dict[int, ChunkRef]
    diff: ManifestDiff
    codec: int = CODEC_VERSION
    key: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        """The key this manifest is (or will be) stored under."""
        return manifest_key(self.cluster_uuid, self.term, self.version, self.committed, self.codec)

    def as_committed(self) -> Manifest:
        """The committed twin of this manifest (same refs, ``committed`` and ``cluster_uuid_committed`` set)."""
        m = replace(self, committed=True, cluster_uuid_committed=True)
        return replace(m, key=m.name)

    def refs(self) -> list[tuple[str, int, int]]:
        """(key, checksum, size) of the cluster entities and chunks (index refs live in the chunks)."""
        out = [(r.key, r.checksum, r.size) for r in self.cluster.values()]
        out += [(c.key, c.checksum, c.size) for c in self.chunks.values()]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the manifest record's body)."""
        return {
            "codec": self.codec, "cluster_uuid": self.cluster_uuid, "previous_cluster_uuid": self.previous_cluster_uuid,
            "cluster_uuid_committed": self.cluster_uuid_committed, "committed": self.committed,
            "term": self.term, "version": self.version, "state_uuid": self.state_uuid,
            "fingerprint": self.fingerprint,
            "cluster": {k: r.to_dict() for k, r in self.cluster.items()},
            "chunk_count": self.chunk_count, "index_count": self.index_count,
            "chunks": {str(i): c.to_dict() for i, c in sorted(self.chunks.items())},
            "diff": self.diff.to_dict(),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any], key: str = "") -> Manifest:
        """Inverse of :meth:`to_dict`."""
        return Manifest(
            cluster_uuid=d["cluster_uuid"], previous_cluster_uuid=d["previous_cluster_uuid"],
            cluster_uuid_committed=bool(d["cluster_uuid_committed"]), committed=bool(d["committed"]),
            term=int(d["term"]), version=int(d["version"]), state_uuid=d["state_uuid"], fingerprint=d["fingerprint"],
            cluster={k: EntityRef.from_dict(k, k, r) for k, r in d["cluster"].items()},
            chunk_count=int(d["chunk_count"]), index_count=int(d["index_count"]),
            chunks={int(i): ChunkRef(int(i), c["key"], int(c["checksum"]), int(c["size"]), int(c["count"]))
                    for i, c in d["chunks"].items()},
            diff=ManifestDiff.from_dict(d["diff"]), codec=int(d["codec"]), key=key,
        )


def encode_manifest(m: Manifest) -> bytes:
    """The manifest blob."""
    if m.codec != CODEC_VERSION:
        raise InvalidError(f"this build writes manifest codec {CODEC_VERSION}, not {m.codec}")
    return encode_record(MAGIC["manifest"], m.codec, m.to_dict())


def decode_manifest(data: bytes, key: str) -> Manifest:
    """A manifest blob read from ``key``; ClusterStateCorrupt or UnsupportedFormatVersion on failure."""
    name = parse_manifest_key(key)
    if name is not None and name.codec > CODEC_VERSION:
        raise UnsupportedFormatVersion(f"manifest {key}", name.codec, CODEC_VERSION)
    try:
        _v, body = decode_record(data, magic=MAGIC["manifest"], supported=CODEC_VERSION, where=key, what="manifest")
        m = Manifest.from_dict(body, key)
    except RecordCorrupted as exc:
        raise ClusterStateCorrupt(key, str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterStateCorrupt(key, f"malformed manifest body: {exc!r}") from None
    if name is not None and (name.term, name.version, name.committed) != (m.term, m.version, m.committed):
        raise ClusterStateCorrupt(key, f"body says term {m.term} version {m.version} committed {m.committed}, "
                                       f"unlike its name")
    return m


def newest_first(names: Iterable[ManifestName]) -> list[ManifestName]:
    """Manifest names ordered newest state first, committed before published-only."""
    return sorted(names, key=lambda n: (-n.term, -n.version, not n.committed))
