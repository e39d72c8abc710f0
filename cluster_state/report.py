"""A read-only health report of the cluster state in a store (``shardstore cluster-state show``).

It lists the cluster UUIDs and their chain (seed 000), reads the latest committed manifest
of the head and verifies its whole state (checksums included), and reports problems:

- ``missing``: a blob a kept manifest references is not in the store;
- ``corrupt``: the head's latest committed state does not read back;
- ``degraded``: one copy of a twinned entity (see :mod:`~shardstore.cluster_state.entities`)
  of the latest state is missing or corrupt; the other is intact, so reads and restores
  still work, but the next fault would lose it (a store written before twins existed has
  none and is not reported);
- ``orphan``: a blob no kept manifest references (a crashed upload; purge deletes it);
- ``uuids``: several valid heads, or a cycle (restore would refuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import BlobNotFound
from shardstore.cluster_state import entities as E
from shardstore.cluster_state.errors import ClusterStateError, ClusterUUIDCycle, MissingEntity, MultipleClusterUUIDs
from shardstore.cluster_state.manifest import Manifest, parse_manifest_key
from shardstore.cluster_state.purge import DEFAULT_KEEP, plan_purge, referenced_keys, select_manifests
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.cluster_state.uuids import UuidInfo, latest_cluster_uuid, uuid_chain
from shardstore.errors import CorruptError


@dataclass(frozen=True)
class Problem:
    """One thing found wrong (``kind``: missing, corrupt, degraded, orphan, uuids)."""

    kind: str
    key: str
    detail: str

    @property
    def severe(self) -> bool:
        """True unless it is an orphan (which purge removes)."""
        return self.kind != "orphan"


@dataclass
class Inspection:
    """What :func:`inspect_store` found."""

    location: str
    uuids: dict[str, UuidInfo] = field(default_factory=dict)
    head: str | None = None
    chain: list[str] = field(default_factory=list)
    latest: Manifest | None = None
    verified: bool = False
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no severe problem was found."""
        return not any(p.severe for p in self.problems)


def inspect_store(store: BlobStore, *, keep: int = DEFAULT_KEEP, verify: bool = True) -> Inspection:
    """Inspect the cluster state kept in ``store`` (reads only)."""
    svc = RemoteClusterStateService(store)
    out = Inspection(store.location)
    try:
        out.uuids = {u: svc.uuid_info(u)[0] for u in svc.cluster_uuids()}
        try:
            out.head = latest_cluster_uuid(out.uuids)
        except (MultipleClusterUUIDs, ClusterUUIDCycle) as exc:
            out.problems.append(Problem("uuids", "", str(exc)))
        if out.head is not None:
            out.chain = uuid_chain(out.uuids, out.head)
            out.latest = svc.latest_manifest(out.head)
            if verify and out.latest is not None:
                try:
                    svc.read_state(out.latest)
                    out.verified = True
                except (ClusterStateError, CorruptError) as exc:
                    out.problems.append(Problem(_kind(exc), out.latest.key, str(exc)))
                else:
                    _check_twins(svc, out.latest, out)
        for u in sorted(out.uuids):
            _check_uuid(svc, u, keep, out)
    finally:
        svc.close()
    return out


def _kind(exc: Exception) -> str:
    return "missing" if isinstance(exc, MissingEntity) else "corrupt"


def _copy_fault(store: BlobStore, kind: str, key: str, checksum: int) -> str | None:
    """Why the blob at ``key`` is not a good copy of the entity (missing, corrupt), or None."""
    try:
        E.decode_entity(kind, store.get(key), key, checksum)
    except BlobNotFound:
        return "missing"
    except (ClusterStateError, CorruptError) as exc:
        return f"corrupt ({exc})"
    return None


def _degraded(copy: str, why: str, other: str) -> Problem:
    return Problem("degraded", copy, f"{why}; its twin {other} is intact and is read instead; one more fault "
                                     f"would lose this entity")


def _check_twins(svc: RemoteClusterStateService, m: Manifest, out: Inspection) -> None:
    """Both copies of every twinned entity of the state ``m``, just read back whole by ``svc`` (so one copy of
    each is good): the primaries it had to replace by their twins, then a GET of every twin."""
    if not any(True for _ in svc.store.list(f"{E.prefix(m.cluster_uuid)}{E.TWIN}/")):
        return  # written before twins existed: one copy is all there ever was
    refs = [(r.kind, r.key, r.checksum) for r in m.cluster.values()]
    for c in m.chunks.values():
        refs.append(("chunk", c.key, c.checksum))
        for e in svc._load_chunk(c, m.key or m.name).values():
            refs.append(("index", e.index.key, e.index.checksum))
    for kind, key, checksum in refs:
        twin = E.twin_key(key)
        if twin is None:
            continue
        if key in svc.twin_reads:
            out.problems.append(_degraded(key, svc.twin_reads[key], twin))
        elif (why := _copy_fault(svc.store, kind, twin, checksum)) is not None:
            out.problems.append(_degraded(twin, why, key))


def _check_uuid(svc: RemoteClusterStateService, cluster_uuid: str, keep: int, out: Inspection) -> None:
    names = svc.list_manifests(cluster_uuid)
    kept = select_manifests(names, keep)
    blobs = {b.key for b in svc.store.list(E.prefix(cluster_uuid))}
    referenced: set[str] = set()
    readable = []
    for n in kept:
        try:
            referenced |= referenced_keys(svc, [n])
            readable.append(n)
        except (ClusterStateError, CorruptError) as exc:
            out.problems.append(Problem(_kind(exc), n.key, str(exc)))
    twins = f"{E.prefix(cluster_uuid)}{E.TWIN}/"
    has_twins = any(k.startswith(twins) for k in blobs)
    latest = {p.key for p in out.problems if p.kind == "degraded"}  # the latest state's, already reported
    for key in sorted(referenced - blobs):
        if key in latest:
            continue
        if key.startswith(twins):
            primary = f"{E.prefix(cluster_uuid)}{key[len(twins):]}"
            if has_twins and primary in blobs:
                out.problems.append(_degraded(key, "missing", primary))
            continue  # with its primary gone too, the primary is reported missing
        twin = E.twin_key(key)
        if twin is not None and twin in blobs:
            out.problems.append(_degraded(key, "missing", twin))
            continue
        out.problems.append(Problem("missing", key, f"referenced by a kept manifest of {cluster_uuid}"))
    for key in plan_purge(sorted(blobs), readable, referenced):
        if parse_manifest_key(key) is None:
            out.problems.append(Problem("orphan", key, "referenced by no kept manifest (purge deletes it)"))


def format_inspection(r: Inspection) -> str:
    """The human-readable report printed by the CLI."""
    lines = [f"cluster state in {r.location}"]
    if not r.uuids:
        lines.append("  no cluster UUID found")
    else:
        lines.append("  UUID chain: " + (" <- ".join(r.chain) if r.chain else "(none valid)"))
        for u, i in sorted(r.uuids.items(), key=lambda kv: (kv[0] not in r.chain, kv[0])):
            tag = "head" if u == r.head else ("chain" if u in r.chain else "off-chain")
            lines.append(f"    {u}  {tag:<9}  committed={'yes' if i.committed else 'no':<3}  "
                         f"previous={i.previous or '-'}")
    m = r.latest
    if m is not None:
        lines.append(f"  latest committed manifest: {m.key}")
        lines.append(f"    term {m.term}  version {m.version}  state {m.state_uuid}  previous UUID "
                     f"{m.previous_cluster_uuid or '-'}  codec {m.codec}  verified={'yes' if r.verified else 'no'}")
        lines.append(f"    indices {m.index_count} in {len(m.chunks)} chunk(s) of {m.chunk_count}")
        for kind, ref in sorted(m.cluster.items()):
            lines.append(f"    {kind:<13} v{ref.version}  {ref.size:>8} B  crc32c {ref.checksum:#010x}  {ref.key}")
        for cid, ref in sorted(m.chunks.items()):
            lines.append(f"    chunk {cid:<7} {ref.count:>4} indices  {ref.size:>8} B  {ref.key}")
    problems = [p for p in r.problems if p.kind != "orphan"]
    orphans = [p for p in r.problems if p.kind == "orphan"]
    if problems:
        lines.append(f"  problems ({len(problems)}):")
        lines += [f"    {p.kind:<8} {p.key}  {p.detail}" for p in problems]
    else:
        lines.append("  problems: none")
    if orphans:  # not a fault: superseded or crashed uploads, which the cluster manager's purge deletes
        lines.append(f"  left for the cluster manager's purge ({len(orphans)}: blobs no kept manifest references; "
                     "a live cluster deletes them as it publishes):")
        lines += [f"    {p.kind:<8} {p.key}" for p in orphans]
    return "\n".join(lines)
