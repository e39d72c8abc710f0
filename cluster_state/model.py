"""The cluster state as immutable values (pure, no I/O).

A :class:`ClusterState` is replaced, never mutated: every ``with_*`` method returns a new
object that shares the unchanged parts (in particular the :class:`IndexMetadata` objects
of the indices that did not change, which keeps change detection and fingerprints cheap at
10,000 indices).  Mappings held by the dataclasses are plain dicts treated as read-only.

Persistent metadata (kept in the remote store and restored after a quorum loss): cluster
UUID, coordination metadata, persistent settings, indices, templates, customs.  Ephemeral
parts (needed for publication only): transient settings, routing table per index, nodes,
blocks.  Term, version and state UUID identify one published state.
"""

from __future__ import annotations

import hashlib
import json
import uuid as _uuid
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Mapping

from shardstore.core.path_strategy import PathStrategy, PlainPathStrategy
from shardstore.errors import InvalidError


def new_uuid() -> str:
    """A fresh random UUID (32 hex digits), used for cluster, index and state UUIDs."""
    return _uuid.uuid4().hex


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces): the basis of digests and fingerprints."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or value in (".", "..") or not value.isprintable():
        raise InvalidError(f"{what} must be a non-empty printable string without '/', got {value!r}")
    return value


@dataclass(frozen=True)
class VotingConfig:
    """A voting configuration: the master-eligible node ids whose majority decides."""

    node_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_ids", tuple(sorted(set(self.node_ids))))

    def has_quorum(self, votes: set[str] | frozenset[str]) -> bool:
        """True when ``votes`` hold more than half of this configuration."""
        return bool(self.node_ids) and 2 * len(set(self.node_ids) & set(votes)) > len(self.node_ids)


@dataclass(frozen=True)
class CoordinationMetadata:
    """The term of the state and the last committed and last accepted voting configurations."""

    term: int = 0
    last_committed_config: VotingConfig = VotingConfig()
    last_accepted_config: VotingConfig = VotingConfig()
    voting_exclusions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "term": self.term,
            "last_committed_config": list(self.last_committed_config.node_ids),
            "last_accepted_config": list(self.last_accepted_config.node_ids),
            "voting_exclusions": list(self.voting_exclusions),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CoordinationMetadata:
        """Inverse of :meth:`to_dict`."""
        return CoordinationMetadata(
            term=int(d["term"]),
            last_committed_config=VotingConfig(tuple(d["last_committed_config"])),
            last_accepted_config=VotingConfig(tuple(d["last_accepted_config"])),
            voting_exclusions=tuple(d.get("voting_exclusions", ())),
        )


@dataclass(frozen=True)
class IndexMetadata:
    """One index: identity, settings, mappings, shape, per-shard primary terms and in-sync ids."""

    name: str
    uuid: str
    settings: dict[str, Any] = field(default_factory=dict)
    mappings: dict[str, Any] = field(default_factory=dict)
    shards: int = 1
    replicas: int = 0
    primary_terms: tuple[int, ...] = ()
    in_sync: tuple[tuple[str, ...], ...] = ()
    path_strategy: dict[str, Any] = field(default_factory=lambda: PlainPathStrategy().to_dict())
    index_version: int = 1

    def __post_init__(self) -> None:
        _check_name("index name", self.name)
        _check_name("index uuid", self.uuid)
        if not isinstance(self.shards, int) or self.shards < 1:
            raise InvalidError(f"index {self.name!r}: shards must be an int >= 1, got {self.shards!r}")
        if not isinstance(self.replicas, int) or self.replicas < 0:
            raise InvalidError(f"index {self.name!r}: replicas must be an int >= 0, got {self.replicas!r}")
        terms = tuple(int(t) for t in self.primary_terms) or (1,) * self.shards
        in_sync = tuple(tuple(sorted(s)) for s in self.in_sync) or ((),) * self.shards
        if len(terms) != self.shards or len(in_sync) != self.shards:
            raise InvalidError(
                f"index {self.name!r}: {self.shards} shards but {len(terms)} primary terms and "
                f"{len(in_sync)} in-sync sets; give one of each per shard"
            )
        object.__setattr__(self, "primary_terms", terms)
        object.__setattr__(self, "in_sync", in_sync)
        PathStrategy.from_dict(self.path_strategy)  # refuses unknown types and newer versions

    @staticmethod
    def create(name: str, *, shards: int = 1, replicas: int = 0, settings: Mapping[str, Any] | None = None,
               mappings: Mapping[str, Any] | None = None, path_strategy: PathStrategy | None = None,
               uuid: str | None = None) -> IndexMetadata:
        """A new index with a fresh UUID, primary term 1 on every shard and empty in-sync sets."""
        return IndexMetadata(
            name=name, uuid=uuid or new_uuid(), settings=dict(settings or {}), mappings=dict(mappings or {}),
            shards=shards, replicas=replicas,
            path_strategy=(path_strategy or PlainPathStrategy()).to_dict(),
        )

    def strategy(self) -> PathStrategy:
        """The recorded remote path strategy of the index's shards."""
        return PathStrategy.from_dict(self.path_strategy)

    def _bump(self, **changes: Any) -> IndexMetadata:
        return replace(self, index_version=self.index_version + 1, **changes)

    def _shard(self, shard: int) -> int:
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            raise InvalidError(f"index {self.name!r} has shards 0..{self.shards - 1}, not {shard!r}")
        return shard

    def with_primary_term(self, shard: int, term: int) -> IndexMetadata:
        """The index with shard ``shard``'s primary term raised to ``term`` (never lowered)."""
        s = self._shard(shard)
        if term < self.primary_terms[s]:
            raise InvalidError(
                f"index {self.name!r} shard {s}: primary term {term} is lower than the current "
                f"{self.primary_terms[s]}; primary terms only grow"
            )
        terms = list(self.primary_terms)
        terms[s] = int(term)
        return self._bump(primary_terms=tuple(terms))

    def with_in_sync(self, shard: int, allocation_ids: set[str] | tuple[str, ...] | list[str]) -> IndexMetadata:
        """The index with shard ``shard``'s in-sync allocation ids replaced."""
        s = self._shard(shard)
        sets = list(self.in_sync)
        sets[s] = tuple(sorted(allocation_ids))
        return self._bump(in_sync=tuple(sets))

    def with_settings(self, settings: Mapping[str, Any]) -> IndexMetadata:
        """The index with its settings replaced."""
        return self._bump(settings=dict(settings))

    def with_mappings(self, mappings: Mapping[str, Any]) -> IndexMetadata:
        """The index with its mappings replaced."""
        return self._bump(mappings=dict(mappings))

    def with_replicas(self, replicas: int) -> IndexMetadata:
        """The index with another replica count."""
        return self._bump(replicas=replicas)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the body of an index entity)."""
        return {
            "name": self.name, "uuid": self.uuid, "settings": self.settings, "mappings": self.mappings,
            "shards": self.shards, "replicas": self.replicas, "primary_terms": list(self.primary_terms),
            "in_sync": [list(s) for s in self.in_sync], "path_strategy": self.path_strategy,
            "index_version": self.index_version,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> IndexMetadata:
        """Inverse of :meth:`to_dict`."""
        return IndexMetadata(
            name=d["name"], uuid=d["uuid"], settings=dict(d["settings"]), mappings=dict(d["mappings"]),
            shards=int(d["shards"]), replicas=int(d["replicas"]), primary_terms=tuple(d["primary_terms"]),
            in_sync=tuple(tuple(s) for s in d["in_sync"]), path_strategy=dict(d["path_strategy"]),
            index_version=int(d["index_version"]),
        )

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of the canonical JSON (cached: index objects are shared between states)."""
        return hashlib.sha256(canonical_json(self.to_dict())).digest()


@dataclass(frozen=True)
class ClusterState:
    """One cluster state: identity, persistent metadata and the ephemeral publication parts."""

    cluster_uuid: str
    cluster_uuid_committed: bool = False
    term: int = 0
    version: int = 0
    state_uuid: str = field(default_factory=new_uuid)
    coordination: CoordinationMetadata = CoordinationMetadata()
    persistent_settings: dict[str, Any] = field(default_factory=dict)
    transient_settings: dict[str, Any] = field(default_factory=dict)
    indices: dict[str, IndexMetadata] = field(default_factory=dict)
    templates: dict[str, Any] = field(default_factory=dict)
    customs: dict[str, Any] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    blocks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("cluster uuid", self.cluster_uuid)
        for name, im in self.indices.items():
            if im.name != name:
                raise InvalidError(f"indices maps {name!r} to the metadata of index {im.name!r}")
        unknown = set(self.routing) - set(self.indices)
        if unknown:
            raise InvalidError(f"routing tables for unknown indices {sorted(unknown)}; create the indices first")

    @staticmethod
    def initial(voting_config: tuple[str, ...] | list[str], *, cluster_uuid: str | None = None) -> ClusterState:
        """The state a freshly bootstrapped cluster starts from (term 0, version 0)."""
        config = VotingConfig(tuple(voting_config))
        return ClusterState(cluster_uuid=cluster_uuid or new_uuid(),
                            coordination=CoordinationMetadata(0, config, config))

    def successor(self, term: int) -> ClusterState:
        """This state as the next version, published in ``term`` with a fresh state UUID."""
        if term < self.term:
            raise InvalidError(f"a successor of a term-{self.term} state cannot have the older term {term}")
        return replace(self, term=term, version=self.version + 1, state_uuid=new_uuid(),
                       coordination=replace(self.coordination, term=term))

    # -- builders -------------------------------------------------------------------------------

    def with_index(self, index: IndexMetadata) -> ClusterState:
        """The state with ``index`` added or replaced (by name)."""
        old = self.indices.get(index.name)
        if old is not None and old.uuid != index.uuid:
            raise InvalidError(
                f"index {index.name!r} exists with uuid {old.uuid}; delete it before creating another "
                f"with uuid {index.uuid}"
            )
        return replace(self, indices={**self.indices, index.name: index})

    def with_indices(self, indices: list[IndexMetadata] | tuple[IndexMetadata, ...]) -> ClusterState:
        """The state with many indices added or replaced at once (one copy of the map)."""
        merged = dict(self.indices)
        for im in indices:
            old = merged.get(im.name)
            if old is not None and old.uuid != im.uuid:
                raise InvalidError(f"index {im.name!r} exists with uuid {old.uuid}; delete it first")
            merged[im.name] = im
        return replace(self, indices=merged)

    def create_index(self, name: str, **kwargs: Any) -> ClusterState:
        """The state with a new index (see :meth:`IndexMetadata.create`); InvalidError if it exists."""
        if name in self.indices:
            raise InvalidError(f"index {name!r} already exists (uuid {self.indices[name].uuid})")
        return self.with_index(IndexMetadata.create(name, **kwargs))

    def update_index(self, name: str, change: Any) -> ClusterState:
        """The state with ``change(index_metadata)`` in place of index ``name``."""
        if name not in self.indices:
            raise InvalidError(f"no index {name!r}; known: {len(self.indices)} indices")
        return self.with_index(change(self.indices[name]))

    def without_index(self, name: str) -> ClusterState:
        """The state without index ``name`` (and its routing table)."""
        if name not in self.indices:
            raise InvalidError(f"no index {name!r} to delete")
        indices = dict(self.indices)
        del indices[name]
        routing = {k: v for k, v in self.routing.items() if k != name}
        return replace(self, indices=indices, routing=routing)

    def with_settings(self, *, persistent: Mapping[str, Any] | None = None,
                      transient: Mapping[str, Any] | None = None) -> ClusterState:
        """The state with persistent and/or transient settings replaced."""
        return replace(
            self,
            persistent_settings=dict(persistent) if persistent is not None else self.persistent_settings,
            transient_settings=dict(transient) if transient is not None else self.transient_settings,
        )

    def with_template(self, name: str, template: Mapping[str, Any] | None) -> ClusterState:
        """The state with template ``name`` set (None removes it)."""
        templates = {k: v for k, v in self.templates.items() if k != name}
        if template is not None:
            templates[name] = dict(template)
        return replace(self, templates=templates)

    def with_custom(self, name: str, value: Any) -> ClusterState:
        """The state with custom metadata ``name`` set (None removes it)."""
        customs = {k: v for k, v in self.customs.items() if k != name}
        if value is not None:
            customs[name] = value
        return replace(self, customs=customs)

    def with_routing(self, index: str, table: Mapping[str, Any] | None) -> ClusterState:
        """The state with the routing table of ``index`` set (None removes it)."""
        routing = {k: v for k, v in self.routing.items() if k != index}
        if table is not None:
            routing[index] = dict(table)
        return replace(self, routing=routing)

    def with_nodes(self, nodes: Mapping[str, Any]) -> ClusterState:
        """The state with the node list replaced."""
        return replace(self, nodes=dict(nodes))

    def with_blocks(self, blocks: Mapping[str, Any]) -> ClusterState:
        """The state with the cluster blocks replaced."""
        return replace(self, blocks=dict(blocks))

    def with_coordination(self, coordination: CoordinationMetadata) -> ClusterState:
        """The state with other coordination metadata."""
        return replace(self, coordination=coordination)

    # -- comparison -----------------------------------------------------------------------------

    def metadata_fingerprint(self) -> str:
        """SHA-256 (hex) of the persistent metadata: settings, templates, customs and every index.

        Cluster UUID, term, version, coordination and the ephemeral parts are left out, so a
        state restored into a new cluster UUID has the fingerprint of the state it came from
        (seed 000 trims such UUIDs).
        """
        h = hashlib.sha256(canonical_json([self.persistent_settings, self.templates, self.customs]))
        for name in sorted(self.indices):
            h.update(name.encode() + b"\0" + self.indices[name].digest)
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of the whole state (local persistence of an accepted state)."""
        return {
            "cluster_uuid": self.cluster_uuid, "cluster_uuid_committed": self.cluster_uuid_committed,
            "term": self.term, "version": self.version, "state_uuid": self.state_uuid,
            "coordination": self.coordination.to_dict(), "persistent_settings": self.persistent_settings,
            "transient_settings": self.transient_settings,
            "indices": {n: im.to_dict() for n, im in self.indices.items()},
            "templates": self.templates, "customs": self.customs, "routing": self.routing,
            "nodes": self.nodes, "blocks": self.blocks,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ClusterState:
        """Inverse of :meth:`to_dict`."""
        return ClusterState(
            cluster_uuid=d["cluster_uuid"], cluster_uuid_committed=bool(d["cluster_uuid_committed"]),
            term=int(d["term"]), version=int(d["version"]), state_uuid=d["state_uuid"],
            coordination=CoordinationMetadata.from_dict(d["coordination"]),
            persistent_settings=dict(d["persistent_settings"]), transient_settings=dict(d["transient_settings"]),
            indices={n: IndexMetadata.from_dict(x) for n, x in d["indices"].items()},
            templates=dict(d["templates"]), customs=dict(d["customs"]), routing=dict(d["routing"]),
            nodes=dict(d["nodes"]), blocks=dict(d["blocks"]),
        )
