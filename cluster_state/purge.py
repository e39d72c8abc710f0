"""Purge of old cluster states: pure plans, an executor and a background runner.

Rules (:func:`plan_purge`, :func:`uuids_to_wipe`):

1. Per cluster UUID keep the newest ``keep`` states (the committed and the published-only
   manifest of each) and, always, the latest committed manifest.
2. Keep every blob a kept manifest references (its cluster entities, its chunks and every
   index and routing entity the chunks list).
3. Never delete an entity whose key names a state newer than the newest kept manifest:
   it belongs to a publication in flight whose manifest is not written yet.
4. Never delete keys this build does not recognise under the prefix.
5. Once a cluster UUID is the valid head (seed 000) and has a committed manifest, the
   UUIDs behind it in the chain are deleted entirely (blobs, manifests, then the marker).
   UUIDs without any committed manifest are left alone: they may be a cluster that is
   bootstrapping right now.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state import entities as E
from shardstore.cluster_state.manifest import (
    ChunkRef,
    IndexEntry,
    Manifest,
    ManifestName,
    newest_first,
    parse_manifest_key,
)
from shardstore.cluster_state.uuids import UuidInfo, latest_of_settled_view, uuid_chain

DEFAULT_KEEP = 10


class PurgeTarget(Protocol):
    """What a purge reads and deletes through: the cluster-state service
    (:class:`~shardstore.cluster_state.remote.RemoteClusterStateService`, whose ``purge`` passes itself)."""

    store: BlobStore

    def cluster_uuids(self) -> list[str]: ...

    def uuid_info(self, cluster_uuid: str) -> tuple[UuidInfo, Manifest | None]: ...

    def list_manifests(self, cluster_uuid: str) -> list[ManifestName]: ...

    def read_manifest(self, key: str) -> Manifest: ...

    def _load_chunk(self, ref: ChunkRef, mkey: str) -> dict[str, IndexEntry]: ...

    def delete_uuid_marker(self, cluster_uuid: str) -> None: ...


def select_manifests(names: Iterable[ManifestName], keep: int = DEFAULT_KEEP) -> list[ManifestName]:
    """The manifests to keep: those of the newest ``keep`` states, plus the latest committed one."""
    ordered = newest_first(names)
    states: list[tuple[int, int]] = []
    for n in ordered:
        if (n.term, n.version) not in states:
            states.append((n.term, n.version))
    kept_states = set(states[: max(1, keep)])
    committed = next((n for n in ordered if n.committed), None)
    return [n for n in ordered if (n.term, n.version) in kept_states or n is committed]


def plan_purge(blob_keys: Iterable[str], kept: list[ManifestName], referenced: set[str]) -> list[str]:
    """The keys to delete under one cluster UUID's prefix, given the kept manifests and what they reference."""
    kept_keys = {n.key for n in kept}
    newest = max(((n.term, n.version) for n in kept), default=None)
    out = []
    for key in blob_keys:
        if key in kept_keys or key in referenced:
            continue
        name = parse_manifest_key(key)
        if name is not None:
            if newest is None or (name.term, name.version) <= newest:
                out.append(key)  # an older manifest: not among the kept ones
            continue  # newer than every kept one: published after the manifests were listed (or hidden from that LIST)
        tv = E.key_term_version(key)
        if tv is None or newest is None or tv > newest:
            continue  # unknown key, or a publication in flight
        out.append(key)
    return sorted(out)


def uuids_to_wipe(infos: Mapping[str, UuidInfo], head: str | None) -> list[str]:
    """The cluster UUIDs behind the committed head in the chain (deleted entirely), oldest first.

    Oldest first, so that a wipe stopped part-way always leaves a contiguous chain ending at
    the head: deleting a link in the middle first would leave two UUIDs that each look like
    the latest (MultipleClusterUUIDs).  A reader reading UUID by UUID *while* the wipe runs
    can still see such a view; it reads again before refusing
    (:func:`~shardstore.cluster_state.uuids.latest_of_settled_view`, chaos seed 636).
    """
    if head is None or not infos.get(head, UuidInfo(None, False, "")).committed:
        return []
    return list(reversed(uuid_chain(infos, head)[1:]))


@dataclass
class PurgeReport:
    """What one purge deleted."""

    cluster_uuid: str | None
    kept_manifests: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    wiped_uuids: list[str] = field(default_factory=list)


def referenced_keys(svc: PurgeTarget, kept: list[ManifestName]) -> set[str]:
    """Every blob key the kept manifests reference (manifests and chunks are read)."""
    out: set[str] = set()
    chunk_refs = {}
    for n in kept:
        m = svc.read_manifest(n.key)
        out.update(k for k, _c, _s in m.refs())
        for ref in m.chunks.values():
            chunk_refs[ref.key] = (ref, n.key)
    for ref, mkey in chunk_refs.values():
        for e in svc._load_chunk(ref, mkey).values():
            out.add(e.index.key)
            if e.routing is not None:
                out.add(e.routing.key)
    out.update(t for k in list(out) if (t := E.twin_key(k)) is not None)
    return out


def purge(svc: PurgeTarget, cluster_uuid: str | None = None, keep: int = DEFAULT_KEEP) -> PurgeReport:
    """Delete old states of ``cluster_uuid`` (default: the valid head) and the UUIDs behind a committed head."""
    def read() -> dict[str, UuidInfo]:
        return {u: svc.uuid_info(u)[0] for u in svc.cluster_uuids()}

    if cluster_uuid is None:
        infos, head = latest_of_settled_view(read)
    else:
        infos, head = read(), cluster_uuid
    report = PurgeReport(head)
    if head is None:
        return report
    names = svc.list_manifests(head)  # manifests first: entities listed after them are protected by rule 3
    kept = select_manifests(names, keep)
    report.kept_manifests = [n.key for n in kept]
    if kept:
        referenced = referenced_keys(svc, kept)
        blobs = [b.key for b in svc.store.list(E.prefix(head))]
        report.deleted = plan_purge(blobs, kept, referenced)
        if report.deleted:
            svc.store.delete(report.deleted)
    for old in uuids_to_wipe(infos, head):
        keys = [b.key for b in svc.store.list(E.prefix(old))]
        # entities first, manifests last, the marker at the very end: an interrupted wipe leaves a readable prefix
        keys.sort(key=lambda k: parse_manifest_key(k) is not None)
        if keys:
            svc.store.delete(keys)
        svc.delete_uuid_marker(old)
        report.wiped_uuids.append(old)
    return report


class PurgeTask:
    """A purge running in a background thread; :meth:`wait` returns its report or raises its error."""

    def __init__(self, svc: PurgeTarget, cluster_uuid: str | None = None, keep: int = DEFAULT_KEEP) -> None:
        self._report: PurgeReport | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(svc, cluster_uuid, keep), name="cluster-state-purge",
                                        daemon=True)
        self._thread.start()

    def _run(self, svc: PurgeTarget, cluster_uuid: str | None, keep: int) -> None:
        try:
            self._report = purge(svc, cluster_uuid, keep)
        except BaseException as exc:  # handed to wait()
            self._error = exc

    def done(self) -> bool:
        """True once the purge finished (successfully or not)."""
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> PurgeReport:
        """Block until the purge finished; return its report or raise its error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"cluster-state purge still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report
