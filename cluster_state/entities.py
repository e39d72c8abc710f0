"""A cluster state as entity blobs: kinds, keys, codecs, checksums and change detection (pure).

Entity kinds and their record magics (every one format version 1):

==============  =======  =========  =====================================================
kind            magic    per        body ``{"v": ...}`` holds
==============  =======  =========  =====================================================
coordination    ``CSCO``  cluster    :meth:`CoordinationMetadata.to_dict`
settings        ``CSST``  cluster    persistent settings (the global metadata)
templates       ``CSTP``  cluster    name -> template
customs         ``CSCU``  cluster    name -> custom metadata
transient       ``CSTS``  cluster    transient settings (ephemeral)
nodes           ``CSND``  cluster    node id -> node attributes (ephemeral)
blocks          ``CSBL``  cluster    cluster blocks (ephemeral)
index           ``CSIX``  index      :meth:`IndexMetadata.to_dict`
routing         ``CSRT``  index      ``{"index": name, "table": routing table}`` (ephemeral)
==============  =======  =========  =====================================================

Each blob is a record of :mod:`shardstore.core.records` (magic, u16 version, u16
flags, u32 length, JSON body zstd-compressed over 4 KiB, CRC32C), so a flipped bit is
caught by the record's own CRC; the reference to a blob carries the CRC32C of the blob
without its trailer (:func:`blob_checksum`), checked first, which also catches a blob swapped
for another intact one.

Keys are content-unique: ``<cluster_uuid>/cluster-state/<kind>/<part>__<term>__<version>__<rand>``
(``part`` is the kind for cluster entities, the index UUID for index and routing entities,
``chunk-<n>-<id>`` for index chunks; ``rand`` is 12 random hex digits).  A blob is
written once with put-if-absent and never overwritten, so a crashed or retried upload of
a later state can never change a blob an existing manifest references.

**Twins.**  Entities a restore cannot rebuild (:data:`TWINNED_KINDS`: settings, templates,
customs, index metadata and index chunks) are written twice, the second copy at
:func:`twin_key` (``<cluster_uuid>/cluster-state/twin/<kind>/<same name>``), byte for byte
the same blob under the same reference checksum.  An unchanged entity is shared by every
manifest written after it, so without a twin one flipped byte in, say, the customs written
at bootstrap made every manifest unreadable and the whole cluster state unrestorable
(found by the fault simulator, issue 14; docs/design/cluster_state.md, "Single-blob
faults").  A reader tries the primary copy, then the twin; the reference checksum decides
which is intact.  Manifests, which are one per state, need no twin: a reader falls back to
the previous state's.  Older stores without twins read as before.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardstore.cluster_state.errors import ClusterStateCorrupt
from shardstore.cluster_state.model import ClusterState, CoordinationMetadata, IndexMetadata
from shardstore.core.records import RecordCorrupted, crc32c, decode_record, encode_record
from shardstore.errors import InvalidError

#: Cluster-wide entities, in the order they are listed.
CLUSTER_KINDS = ("coordination", "settings", "templates", "customs", "transient", "nodes", "blocks")
#: Entities that exist once per index.
INDEX_KINDS = ("index", "routing")
#: The cluster entities that are persistent metadata (the rest is ephemeral).
PERSISTENT_KINDS = ("coordination", "settings", "templates", "customs", "index")

MAGIC: dict[str, bytes] = {
    "coordination": b"CSCO", "settings": b"CSST", "templates": b"CSTP", "customs": b"CSCU",
    "transient": b"CSTS", "nodes": b"CSND", "blocks": b"CSBL", "index": b"CSIX", "routing": b"CSRT",
    "chunk": b"CSCH", "manifest": b"CSMF",
}
#: Newest format version this build writes and reads, per kind.
FORMAT_VERSION: dict[str, int] = dict.fromkeys(MAGIC, 1)

ROOT = "cluster-state"
#: The entity kinds written twice (see "Twins" above): the persistent metadata a restore keeps.
TWINNED_KINDS = ("settings", "templates", "customs", "index", "chunk")
TWIN = "twin"

#: (kind, name): ``name`` is the kind itself for cluster entities, the index name otherwise.
EntityId = tuple[str, str]


@dataclass(frozen=True)
class EntityRef:
    """Where one entity blob is and how to check it: key, format version, CRC32C and size."""

    kind: str
    name: str
    key: str
    version: int
    checksum: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``kind`` and ``name`` are implied by where the ref is stored)."""
        return {"key": self.key, "version": self.version, "checksum": self.checksum, "size": self.size}

    @staticmethod
    def from_dict(kind: str, name: str, d: Mapping[str, Any]) -> EntityRef:
        """Inverse of :meth:`to_dict`."""
        return EntityRef(kind, name, str(d["key"]), int(d["version"]), int(d["checksum"]), int(d["size"]))


def prefix(cluster_uuid: str, kind: str | None = None) -> str:
    """``<cluster_uuid>/cluster-state/`` or ``<cluster_uuid>/cluster-state/<kind>/``."""
    base = f"{cluster_uuid}/{ROOT}/"
    return base if kind is None else f"{base}{kind}/"


def entity_key(cluster_uuid: str, kind: str, part: str, term: int, version: int) -> str:
    """A fresh, content-unique key for an entity of state (term, version)."""
    if kind not in MAGIC or kind == "manifest":
        raise InvalidError(f"unknown entity kind {kind!r}; known: {', '.join(k for k in MAGIC if k != 'manifest')}")
    return f"{prefix(cluster_uuid, kind)}{part}__{term}__{version}__{secrets.token_hex(6)}"


def twin_key(key: str) -> str | None:
    """Where the twin of the entity at ``key`` lives, or None if its kind has no twin."""
    head, sep, rest = key.partition(f"/{ROOT}/")
    kind = rest.split("/", 1)[0]
    if not sep or kind not in TWINNED_KINDS:
        return None
    return f"{head}/{ROOT}/{TWIN}/{rest}"


def key_term_version(key: str) -> tuple[int, int] | None:
    """(term, version) of the state an entity key was written for; None if the key is not an entity key."""
    parts = key.rsplit("/", 1)[-1].rsplit("__", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])


def encode_entity(kind: str, value: Any) -> bytes:
    """The blob of one entity: a record of the kind's magic and format version."""
    return encode_record(MAGIC[kind], FORMAT_VERSION[kind], {"v": value})


def decode_entity(kind: str, data: bytes, key: str, checksum: int | None = None) -> Any:
    """The value of an entity blob; ClusterStateCorrupt on a bad checksum or record, UnsupportedFormatVersion if newer."""
    if checksum is not None:
        actual = blob_checksum(data)
        if actual != checksum:
            raise ClusterStateCorrupt(key, f"CRC32C {actual:#010x} does not match the referenced {checksum:#010x}")
    try:
        _version, body = decode_record(data, magic=MAGIC[kind], supported=FORMAT_VERSION[kind], where=key,
                                       what=f"{kind} entity")
    except RecordCorrupted as exc:
        raise ClusterStateCorrupt(key, str(exc)) from None
    if "v" not in body:
        raise ClusterStateCorrupt(key, f"{kind} entity body has no value")
    return body["v"]


def blob_checksum(data: bytes) -> int:
    """The checksum stored in a reference: CRC32C of the blob without its 4-byte CRC trailer.

    Not of the whole blob: a CRC over data followed by its own CRC is the same constant
    for every intact record, which would not tell two intact blobs apart.
    """
    return crc32c(memoryview(data)[:-4]) if len(data) >= 4 else crc32c(data)


# -- splitting a state ---------------------------------------------------------------------------


def cluster_entity_value(state: ClusterState, kind: str) -> Any:
    """The JSON value of cluster entity ``kind`` of ``state``."""
    if kind == "coordination":
        return state.coordination.to_dict()
    return {
        "settings": state.persistent_settings, "templates": state.templates, "customs": state.customs,
        "transient": state.transient_settings, "nodes": state.nodes, "blocks": state.blocks,
    }[kind]


def index_entity_value(state: ClusterState, kind: str, name: str) -> Any:
    """The JSON value of index entity ``kind`` of index ``name`` (None: no routing table)."""
    if kind == "index":
        return state.indices[name].to_dict()
    table = state.routing.get(name)
    return None if table is None else {"index": name, "table": table}


def apply_cluster_entity(fields: dict[str, Any], kind: str, value: Any) -> None:
    """Put a decoded cluster entity into ``fields`` (keyword arguments of ClusterState)."""
    if kind == "coordination":
        fields["coordination"] = CoordinationMetadata.from_dict(value)
    else:
        name = {"settings": "persistent_settings", "transient": "transient_settings"}.get(kind, kind)
        fields[name] = dict(value)


def decode_index(value: Any) -> IndexMetadata:
    """IndexMetadata of a decoded index entity."""
    return IndexMetadata.from_dict(value)


def _cluster_changed(prev: ClusterState, new: ClusterState, kind: str) -> bool:
    if kind == "coordination":
        return prev.coordination != new.coordination
    return cluster_entity_value(prev, kind) != cluster_entity_value(new, kind)


@dataclass(frozen=True)
class StateDiff:
    """What changed between two states: cluster entities, indices, routing tables, removed indices."""

    cluster: tuple[str, ...]
    indices: tuple[str, ...]
    routing: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def empty(self) -> bool:
        """True when nothing changed."""
        return not (self.cluster or self.indices or self.routing or self.removed)


def diff_states(prev: ClusterState | None, new: ClusterState) -> StateDiff:
    """The entities of ``new`` that differ from ``prev`` (everything when ``prev`` is None)."""
    if prev is None:
        return StateDiff(CLUSTER_KINDS, tuple(sorted(new.indices)), tuple(sorted(new.routing)), ())
    cluster = tuple(k for k in CLUSTER_KINDS if _cluster_changed(prev, new, k))
    indices, routing = [], []
    for name, im in new.indices.items():
        old = prev.indices.get(name)
        if old is None or (old is not im and old != im):
            indices.append(name)
        if prev.routing.get(name) != new.routing.get(name) or (old is not None and old.uuid != im.uuid):
            routing.append(name)
    removed = tuple(sorted(n for n in prev.indices if n not in new.indices))
    return StateDiff(cluster, tuple(sorted(indices)), tuple(sorted(routing)), removed)
