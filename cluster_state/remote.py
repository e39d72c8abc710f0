"""The remote cluster-state service: write states as entity blobs + manifest, read them back.

Write order of one publication (``write_full`` / ``write_incremental``):

1. (first write of a cluster UUID only) the UUID marker ``cluster-state-uuids/<uuid>``;
2. the changed entities and the changed index chunks, in parallel, each with
   put-if-absent under a fresh content-unique key;
3. the published-only manifest ``...__P__1``, last, with put-if-absent.

``mark_committed`` then writes the committed twin ``...__C__1``.  A crash anywhere before
step 3 leaves only unreferenced blobs (purged later); the store never shows a half-written
state because readers only follow manifests.  Reads verify the CRC32C of every blob
against its reference, the record's own CRC, and the metadata fingerprint of the state.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobAlreadyExists, BlobNotFound
from shardstore.cluster_state import entities as E
from shardstore.cluster_state.errors import ClusterStateCorrupt, ManifestConflict, MissingEntity, NoClusterState
from shardstore.cluster_state.fence import Fence, check_not_superseded, write_fence
from shardstore.cluster_state.manifest import (
    ChunkRef,
    IndexEntry,
    Manifest,
    ManifestDiff,
    ManifestName,
    chunk_count,
    chunk_entries,
    chunk_of,
    chunk_value,
    decode_manifest,
    encode_manifest,
    manifest_key,
    manifest_prefix,
    newest_first,
    parse_manifest_key,
)
from shardstore.cluster_state.model import ClusterState, IndexMetadata
from shardstore.cluster_state.purge import PurgeReport, PurgeTask, purge
from shardstore.cluster_state.uuids import UuidInfo
from shardstore.errors import InvalidError

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

#: Prefix of the cluster-UUID markers (one empty blob per UUID that was ever written).
UUID_MARKERS = "cluster-state-uuids/"


@dataclass
class ReadResult:
    """A state read from the store, and what it cost."""

    state: ClusterState
    manifest: Manifest
    bytes_downloaded: int
    gets: int
    incremental: bool


#: Entity kinds a restore replaces (``restore.restored_state``): unreadable ones do not block it.
RESTORE_REPLACES = frozenset({"coordination", "transient", "nodes", "blocks", "routing"})


@dataclass
class RestoreResult:
    """The newest complete committed state of a cluster UUID, and the manifests skipped to reach it."""

    state: ClusterState
    manifest: Manifest
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        """True when newer committed manifests were incomplete or corrupt."""
        return bool(self.skipped)


@dataclass
class _Upload:
    key: str
    data: bytes


class RemoteClusterStateService:
    """Writes and reads cluster states in one blob store (thread-safe)."""

    def __init__(self, store: BlobStore, *, workers: int = 8, cached_chunks: int = 1024) -> None:
        self.store = store
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._chunks: OrderedDict[str, dict[str, IndexEntry]] = OrderedDict()
        self._cached_chunks = cached_chunks
        self._registered: set[str] = set()
        #: entity key -> why its primary copy was unreadable, for every entity read from its twin
        self.twin_reads: dict[str, str] = {}

    # -- plumbing -----------------------------------------------------------------------------

    def _map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if len(items) <= 1:
            return [fn(x) for x in items]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="cluster-state")
            pool = self._pool
        futures = [pool.submit(fn, x) for x in items]
        errors = [f.exception() for f in futures]  # wait for all: nothing stays in flight
        for err in errors:
            if err is not None:
                raise err
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the upload/download threads (the service may be used again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _put_new(self, up: _Upload) -> None:
        try:
            self.store.put(up.key, up.data, if_absent=True)
        except BlobAlreadyExists:
            # keys are random and unique: the blob there is our own earlier (ambiguous) attempt
            if self.store.get(up.key) != up.data:
                raise
        return None

    def _cache_chunk(self, key: str, entries: dict[str, IndexEntry]) -> None:
        with self._lock:
            self._chunks[key] = entries
            self._chunks.move_to_end(key)
            while len(self._chunks) > self._cached_chunks:
                self._chunks.popitem(last=False)

    def _get(self, key: str, manifest_key_: str) -> bytes:
        try:
            return self.store.get(key)
        except BlobNotFound:
            raise MissingEntity(key, manifest_key_) from None

    def _read_entity(self, kind: str, key: str, checksum: int | None, mkey: str) -> tuple[Any, int]:
        """(decoded value, blob size) of an entity, verified against the reference's checksum; a missing or
        corrupt primary copy is read from its twin (:func:`~shardstore.cluster_state.entities.twin_key`)."""
        try:
            data = self._get(key, mkey)
            return E.decode_entity(kind, data, key, checksum), len(data)
        except (ClusterStateCorrupt, MissingEntity) as exc:
            twin = E.twin_key(key)
            if twin is None:
                raise
            try:
                data = self.store.get(twin)
                value = E.decode_entity(kind, data, twin, checksum)
            except (BlobNotFound, ClusterStateCorrupt):
                raise exc from None  # both copies gone: the primary's error names the blob
            log.warning("cluster state entity %s unreadable (%s); read its twin %s", key, exc, twin)
            with self._lock:
                self.twin_reads[key] = "missing" if isinstance(exc, MissingEntity) else f"corrupt ({exc})"
            return value, len(data)

    def _load_chunk(self, ref: ChunkRef, mkey: str, counter: list[int] | None = None) -> dict[str, IndexEntry]:
        with self._lock:
            hit = self._chunks.get(ref.key)
        if hit is not None and counter is None:
            return hit
        value, size = self._read_entity("chunk", ref.key, ref.checksum, mkey)
        if counter is not None:
            counter[0] += size
            counter[1] += 1
        entries = chunk_entries(value, ref.key)
        self._cache_chunk(ref.key, entries)
        return entries

    # -- writing ------------------------------------------------------------------------------

    def register_cluster_uuid(self, cluster_uuid: str) -> None:
        """Write the marker that lets restore find ``cluster_uuid`` (idempotent)."""
        if cluster_uuid in self._registered:
            return
        try:
            self.store.put(UUID_MARKERS + cluster_uuid, b"", if_absent=True)
        except BlobAlreadyExists:
            pass
        self._registered.add(cluster_uuid)

    def write_full(self, state: ClusterState, *, previous_cluster_uuid: str | None = None) -> Manifest:
        """Upload every entity of ``state``, then its published-only manifest; return the manifest."""
        self.register_cluster_uuid(state.cluster_uuid)
        return self._write(None, None, state, previous_cluster_uuid)

    def write_incremental(self, previous_state: ClusterState, previous_manifest: Manifest,
                          new_state: ClusterState) -> Manifest:
        """Upload only what changed since ``previous_state`` (stored as ``previous_manifest``), then the manifest."""
        if previous_manifest.state_uuid != previous_state.state_uuid:
            raise InvalidError(
                f"previous manifest {previous_manifest.name} is of state {previous_manifest.state_uuid}, not of the "
                f"previous state {previous_state.state_uuid}; pass the manifest the previous state was written as"
            )
        if previous_manifest.cluster_uuid != new_state.cluster_uuid:
            return self.write_full(new_state, previous_cluster_uuid=previous_manifest.cluster_uuid)
        if (new_state.term, new_state.version) <= (previous_manifest.term, previous_manifest.version):
            raise InvalidError(
                f"state term {new_state.term} version {new_state.version} is not newer than the previous "
                f"manifest's term {previous_manifest.term} version {previous_manifest.version}"
            )
        return self._write(previous_state, previous_manifest, new_state, previous_manifest.previous_cluster_uuid)

    def _entity(self, uploads: list[_Upload], cu: str, kind: str, name: str, part: str, value: Any,
                term: int, version: int) -> E.EntityRef:
        data = E.encode_entity(kind, value)
        key = E.entity_key(cu, kind, part, term, version)
        uploads.append(_Upload(key, data))
        return E.EntityRef(kind, name, key, E.FORMAT_VERSION[kind], E.blob_checksum(data), len(data))

    def _write(self, prev: ClusterState | None, prev_m: Manifest | None, new: ClusterState,
               previous_cluster_uuid: str | None) -> Manifest:
        cu, term, version = new.cluster_uuid, new.term, new.version
        diff = E.diff_states(prev, new)
        uploads: list[_Upload] = []
        cluster = {} if prev_m is None else dict(prev_m.cluster)
        for kind in diff.cluster:
            cluster[kind] = self._entity(uploads, cu, kind, kind, kind, E.cluster_entity_value(new, kind), term, version)
        index_refs = {
            name: self._entity(uploads, cu, "index", name, new.indices[name].uuid,
                               new.indices[name].to_dict(), term, version)
            for name in diff.indices
        }
        routing_refs: dict[str, E.EntityRef | None] = {}
        for name in diff.routing:
            value = E.index_entity_value(new, "routing", name)
            routing_refs[name] = None if value is None else self._entity(
                uploads, cu, "routing", name, new.indices[name].uuid, value, term, version)

        n = chunk_count(prev_m.chunk_count if prev_m else 1, len(new.indices))
        rebuild_all = prev_m is None or n != prev_m.chunk_count
        old_entries: dict[int, dict[str, IndexEntry]] = {}
        if prev_m is not None:
            if rebuild_all:
                wanted = list(prev_m.chunks.values())
            else:
                touched_old: set[int] = set()
                for name in (*diff.indices, *diff.routing, *diff.removed):
                    if name in prev.indices:  # type: ignore[union-attr]
                        touched_old.add(chunk_of(prev.indices[name].uuid, n))  # type: ignore[union-attr]
                    if name in new.indices:
                        touched_old.add(chunk_of(new.indices[name].uuid, n))
                wanted = [prev_m.chunks[i] for i in sorted(touched_old) if i in prev_m.chunks]
            loaded = self._map(lambda r: (r.id, self._load_chunk(r, prev_m.key or prev_m.name)), wanted)
            old_entries = dict(loaded)

        # every old entry, placed by the new chunk count; then the changes on top
        merged: dict[int, dict[str, IndexEntry]] = {}
        for entries in old_entries.values():
            for name, e in entries.items():
                if name in new.indices and new.indices[name].uuid == e.uuid:
                    merged.setdefault(chunk_of(e.uuid, n), {})[name] = e
        touched: set[int] = set()
        if prev_m is not None and not rebuild_all:
            touched = set(old_entries)
        for name in sorted(set(diff.indices) | set(diff.routing)):
            im = new.indices[name]
            cid = chunk_of(im.uuid, n)
            touched.add(cid)
            old = merged.get(cid, {}).get(name)
            idx_ref = index_refs.get(name) or (old.index if old else None)
            if idx_ref is None:
                raise InvalidError(f"index {name!r}: no metadata ref in the previous manifest; write a full state")
            rt_ref = routing_refs[name] if name in routing_refs else (old.routing if old else None)
            merged.setdefault(cid, {})[name] = IndexEntry(im.uuid, idx_ref, rt_ref)
        if rebuild_all:
            touched = set(merged)

        chunks = {} if rebuild_all or prev_m is None else dict(prev_m.chunks)
        new_chunk_entries: dict[str, dict[str, IndexEntry]] = {}
        for cid in sorted(touched):
            entries = merged.get(cid, {})
            if not entries:
                chunks.pop(cid, None)
                continue
            data = E.encode_entity("chunk", chunk_value(n, cid, entries))
            key = E.entity_key(cu, "chunk", f"chunk-{n}-{cid}", term, version)
            uploads.append(_Upload(key, data))
            chunks[cid] = ChunkRef(cid, key, E.blob_checksum(data), len(data), len(entries))
            new_chunk_entries[key] = entries
        if sum(c.count for c in chunks.values()) != len(new.indices):
            raise AssertionError(f"chunks list {sum(c.count for c in chunks.values())} indices, "
                                 f"the state has {len(new.indices)}")

        manifest = Manifest(
            cluster_uuid=cu, previous_cluster_uuid=previous_cluster_uuid,
            cluster_uuid_committed=new.cluster_uuid_committed, committed=False, term=term, version=version,
            state_uuid=new.state_uuid, fingerprint=new.metadata_fingerprint(), cluster=cluster, chunk_count=n,
            index_count=len(new.indices), chunks=chunks,
            diff=ManifestDiff() if prev is None else ManifestDiff(
                prev.state_uuid, diff.cluster, diff.indices, diff.routing, diff.removed,
                tuple(sorted(touched))),
        )
        manifest = replace(manifest, key=manifest.name)
        self._map(self._put_new, [*uploads, *(_Upload(t, u.data) for u in uploads
                                               if (t := E.twin_key(u.key)) is not None)])
        for key, entries in new_chunk_entries.items():
            self._cache_chunk(key, entries)
        self._put_manifest(manifest)
        return manifest

    def _put_manifest(self, m: Manifest) -> None:
        data = encode_manifest(m)
        try:
            self.store.put(m.key, data, if_absent=True)
        except BlobAlreadyExists:
            existing = decode_manifest(self.store.get(m.key), m.key)
            if existing.state_uuid != m.state_uuid:
                raise ManifestConflict(m.key) from None

    def mark_committed(self, manifest: Manifest) -> Manifest:
        """Write the committed twin of a published manifest (idempotent); return it."""
        committed = manifest.as_committed()
        self._put_manifest(committed)
        return committed

    # -- reading ------------------------------------------------------------------------------

    def list_manifests(self, cluster_uuid: str) -> list[ManifestName]:
        """Every manifest name of ``cluster_uuid``, newest first (one LIST)."""
        names = (parse_manifest_key(b.key) for b in self.store.list(manifest_prefix(cluster_uuid)))
        return newest_first(n for n in names if n is not None)

    def read_manifest(self, key: str) -> Manifest:
        """The manifest stored at ``key``."""
        try:
            return decode_manifest(self.store.get(key), key)
        except BlobNotFound:
            raise MissingEntity(key, key) from None

    def latest_manifest(self, cluster_uuid: str, committed_only: bool = True) -> Manifest | None:
        """The newest (committed, by default) manifest of ``cluster_uuid``, or None."""
        for name in self.list_manifests(cluster_uuid):
            if name.committed or not committed_only:
                return self.read_manifest(name.key)
        return None

    def manifest_for(self, cluster_uuid: str, term: int, version: int) -> Manifest:
        """The manifest of state (term, version): the committed one if it exists, else the published one."""
        for committed in (True, False):
            key = manifest_key(cluster_uuid, term, version, committed)
            try:
                return decode_manifest(self.store.get(key), key)
            except BlobNotFound:
                continue
        raise MissingEntity(manifest_key(cluster_uuid, term, version, False), "(none)")

    def _read_full(self, m: Manifest, replaceable: frozenset[str] = frozenset(),
                   unread: list[str] | None = None) -> tuple[ClusterState, int, int]:
        """The state ``m`` describes; an entity of a kind in ``replaceable`` that cannot be read is left
        at its default and named in ``unread`` instead of failing the read (restore replaces those)."""
        counter = [0, 0]
        mkey = m.key or m.name

        def fetch(ref: E.EntityRef) -> tuple[E.EntityRef, Any]:
            try:
                return ref, self._read_entity(ref.kind, ref.key, ref.checksum, mkey)[0]
            except (ClusterStateCorrupt, MissingEntity) as exc:
                if ref.kind not in replaceable:
                    raise
                if unread is not None:
                    unread.append(f"{ref.key}: {exc}")
                return ref, None

        cluster = self._map(fetch, m.cluster.values())
        chunk_lists = self._map(lambda r: self._load_chunk(r, mkey, counter), m.chunks.values())
        refs: list[E.EntityRef] = []
        for entries in chunk_lists:
            for e in entries.values():
                refs.append(e.index)
                if e.routing is not None:
                    refs.append(e.routing)
        values = self._map(fetch, refs)
        fields: dict[str, Any] = {}
        for ref, value in cluster:
            if value is not None:
                E.apply_cluster_entity(fields, ref.kind, value)
        indices: dict[str, IndexMetadata] = {}
        routing: dict[str, Any] = {}
        for ref, value in values:
            if value is None:
                continue
            if ref.kind == "index":
                indices[ref.name] = E.decode_index(value)
            else:
                routing[ref.name] = value["table"]
        counter[0] += sum(r.size for r, _ in cluster) + sum(r.size for r, _ in values)
        counter[1] += len(cluster) + len(values)
        state = ClusterState(cluster_uuid=m.cluster_uuid, cluster_uuid_committed=m.cluster_uuid_committed,
                             term=m.term, version=m.version, state_uuid=m.state_uuid, indices=indices,
                             routing=routing, **fields)
        self._check(state, m)
        return state, counter[0], counter[1]

    @staticmethod
    def _check(state: ClusterState, m: Manifest) -> None:
        if len(state.indices) != m.index_count:
            raise ClusterStateCorrupt(m.key or m.name, f"{len(state.indices)} indices read, manifest says {m.index_count}")
        if state.metadata_fingerprint() != m.fingerprint:
            raise ClusterStateCorrupt(m.key or m.name, "the state read back does not match the manifest's fingerprint")

    def read_state(self, manifest: Manifest) -> ClusterState:
        """The full state a manifest describes, every checksum verified."""
        return self._read_full(manifest)[0]

    def read_incremental(self, manifest: Manifest, local_state: ClusterState | None) -> ReadResult:
        """The state of ``manifest``: only its changed entities when ``local_state`` is the diff's base, else all."""
        d = manifest.diff
        if (local_state is None or d.base is None or d.base != local_state.state_uuid
                or local_state.cluster_uuid != manifest.cluster_uuid):
            state, nbytes, gets = self._read_full(manifest)
            return ReadResult(state, manifest, nbytes, gets, False)
        mkey = manifest.key or manifest.name
        counter = [0, 0]
        fields: dict[str, Any] = {}
        for kind in d.cluster:
            ref = manifest.cluster[kind]
            value, size = self._read_entity(kind, ref.key, ref.checksum, mkey)
            counter[0] += size
            counter[1] += 1
            E.apply_cluster_entity(fields, kind, value)
        entries: dict[str, IndexEntry] = {}
        for cid in d.chunks:
            if cid in manifest.chunks:
                entries.update(self._load_chunk(manifest.chunks[cid], mkey, counter))
        wanted: list[E.EntityRef] = []
        try:
            wanted += [entries[name].index for name in d.indices]
            wanted += [entries[name].routing for name in d.routing if entries[name].routing is not None]  # type: ignore[misc]
        except KeyError:  # a changed index outside the changed chunks: not a diff this reader can apply
            state, nbytes, gets = self._read_full(manifest)
            return ReadResult(state, manifest, counter[0] + nbytes, counter[1] + gets, False)

        def fetch(ref: E.EntityRef) -> tuple[E.EntityRef, Any]:
            return ref, self._read_entity(ref.kind, ref.key, ref.checksum, mkey)[0]

        values = self._map(fetch, wanted)
        counter[0] += sum(r.size for r, _ in values)
        counter[1] += len(values)
        indices = {n: im for n, im in local_state.indices.items() if n not in d.removed}
        routing = {n: t for n, t in local_state.routing.items() if n not in d.removed}
        for name in d.routing:
            routing.pop(name, None)
        for ref, value in values:
            if ref.kind == "index":
                indices[ref.name] = E.decode_index(value)
            else:
                routing[ref.name] = value["table"]
        state = replace(local_state, cluster_uuid_committed=manifest.cluster_uuid_committed, term=manifest.term,
                        version=manifest.version, state_uuid=manifest.state_uuid, indices=indices, routing=routing,
                        **fields)
        try:
            self._check(state, manifest)
        except ClusterStateCorrupt:
            full, nbytes, gets = self._read_full(manifest)
            return ReadResult(full, manifest, counter[0] + nbytes, counter[1] + gets, False)
        return ReadResult(state, manifest, counter[0], counter[1], True)

    def read_published(self, cluster_uuid: str, term: int, version: int,
                       local_state: ClusterState | None) -> ReadResult:
        """What a follower does with a (term, version) publication: the manifest, then the changed entities."""
        m = self.manifest_for(cluster_uuid, term, version)
        res = self.read_incremental(m, local_state)
        res.bytes_downloaded += len(encode_manifest(m))
        res.gets += 1
        return res

    def restore_latest(self, cluster_uuid: str) -> RestoreResult:
        """The newest committed state of ``cluster_uuid`` that reads back complete, falling back past broken ones.

        The entities a restore replaces anyway (:data:`RESTORE_REPLACES`: coordination, transient
        settings, nodes, blocks, routing) may be unreadable: they are left at their defaults
        with a warning naming them, since the persistent metadata (checked against the
        manifest's fingerprint) is all a restore keeps (issue 14, single-blob corruption).
        """
        skipped: list[tuple[str, str]] = []
        for name in self.list_manifests(cluster_uuid):
            if not name.committed:
                continue
            unread: list[str] = []
            try:
                m = self.read_manifest(name.key)
                state = self._read_full(m, RESTORE_REPLACES, unread)[0]
            except (ClusterStateCorrupt, MissingEntity) as exc:
                skipped.append((name.key, str(exc)))
                continue
            if unread:
                warnings.warn(f"cluster state {cluster_uuid}: restoring without unreadable entities that a restore "
                              f"replaces: {'; '.join(unread)}", RuntimeWarning, stacklevel=2)
            if skipped:
                warnings.warn(
                    f"cluster state {cluster_uuid}: restored term {m.term} version {m.version}, falling back "
                    f"past {len(skipped)} newer committed manifest(s) that are incomplete or corrupt: "
                    + "; ".join(reason for _, reason in skipped), RuntimeWarning, stacklevel=2)
            return RestoreResult(state, m, skipped)
        raise NoClusterState(self.store.location, f"cluster UUID {cluster_uuid}"
                             + (f" ({len(skipped)} committed manifests unreadable)" if skipped else ""))

    # -- cluster UUIDs --------------------------------------------------------------------------

    def cluster_uuids(self) -> list[str]:
        """Every cluster UUID ever written to this store (from the UUID markers)."""
        return [b.key[len(UUID_MARKERS):] for b in self.store.list(UUID_MARKERS)]

    def delete_uuid_marker(self, cluster_uuid: str) -> None:
        """Delete the marker of ``cluster_uuid``: the last step of a purge wiping that UUID's blobs."""
        self.store.delete([UUID_MARKERS + cluster_uuid])

    def uuid_info(self, cluster_uuid: str) -> tuple[UuidInfo, Manifest | None]:
        """What seed 000's algorithm needs of one UUID, from its newest readable committed manifest."""
        for name in self.list_manifests(cluster_uuid):
            if not name.committed:
                continue
            try:
                m = self.read_manifest(name.key)
            except (ClusterStateCorrupt, MissingEntity):
                continue
            return UuidInfo(m.previous_cluster_uuid, m.cluster_uuid_committed, m.fingerprint), m
        return UuidInfo(None, False, ""), None

    # -- fencing (see :mod:`.fence`) ------------------------------------------------------------

    def supersede(self, cluster_uuid: str, new_cluster_uuid: str, node: str | None = None) -> Fence:
        """Fence ``cluster_uuid`` before taking it over (one put-if-absent): its managers stop acknowledging."""
        return write_fence(self.store, Fence(cluster_uuid, new_cluster_uuid, node))

    def check_not_superseded(self, cluster_uuid: str) -> None:
        """ClusterStateSuperseded if a bootstrap/restore took ``cluster_uuid`` over (one GET)."""
        check_not_superseded(self.store, cluster_uuid)

    # -- purge ----------------------------------------------------------------------------------

    def purge(self, cluster_uuid: str | None = None, keep: int = 10) -> PurgeReport:
        """Delete all but the newest ``keep`` states (and older UUIDs behind a committed head); a PurgeReport."""
        return purge(self, cluster_uuid, keep)

    def purge_async(self, cluster_uuid: str | None = None, keep: int = 10) -> PurgeTask:
        """Start :meth:`purge` in a background thread; a PurgeTask whose ``wait()`` gives the report."""
        return PurgeTask(self, cluster_uuid, keep)
