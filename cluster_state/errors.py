"""Typed errors of the remote cluster state, each under one kind of :mod:`shardstore.errors`."""

from __future__ import annotations

from collections.abc import Iterable

from shardstore.errors import (
    ConflictError,
    CorruptError,
    InvalidError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)


class ClusterStateError(ShardstoreError):
    """Base of every cluster-state error."""


class ClusterStateCorrupt(ClusterStateError, CorruptError):
    """A blob failed its checksum, framing or decoding; restore falls back to an older manifest."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(
            f"cluster-state blob {key!r}: {reason}; the state referencing it cannot be read "
            f"(restore falls back to the newest older complete manifest)"
        )
        self.key = key
        self.reason = reason


class MissingEntity(ClusterStateError, NotFoundError):
    """A manifest references a blob that is not in the store."""

    def __init__(self, key: str, manifest: str) -> None:
        super().__init__(
            f"blob {key!r} referenced by manifest {manifest!r} is missing; that manifest is incomplete "
            f"(restore falls back to the newest older complete manifest)"
        )
        self.key = key
        self.manifest = manifest


class MultipleClusterUUIDs(ClusterStateError, InvalidError):
    """Seed 000's algorithm found more than one valid head cluster UUID."""

    def __init__(self, heads: Iterable[str]) -> None:
        self.heads = tuple(sorted(heads))
        super().__init__(
            "the remote store holds more than one valid latest cluster UUID: "
            + ", ".join(self.heads)
            + "; inspect their latest manifests (`shardstore cluster-state show URL`) and delete the "
            "cluster-state of the ones you do not want to keep"
        )


class ClusterUUIDCycle(ClusterStateError, CorruptError):
    """The previous-cluster-UUID links of the store form a cycle."""

    def __init__(self, uuids: Iterable[str]) -> None:
        self.uuids = tuple(sorted(uuids))
        super().__init__(
            f"cluster UUIDs {', '.join(self.uuids)} name each other as previous UUID in a cycle; "
            f"the chain cannot be ordered: delete the cluster-state of the bogus UUIDs by hand"
        )


class NoClusterState(ClusterStateError, NotFoundError):
    """No cluster UUID in the store has a committed, complete manifest."""

    def __init__(self, location: str, detail: str = "") -> None:
        super().__init__(
            f"{location}: no committed, complete cluster state found{': ' + detail if detail else ''}; "
            f"bootstrap a new cluster instead of restoring"
        )


class StaleTerm(ClusterStateError, ConflictError):
    """A message or write carries a term lower than one already known."""

    def __init__(self, what: str, term: int, current: int) -> None:
        super().__init__(
            f"{what}: term {term} is older than the current term {current}; "
            f"a newer cluster-manager was elected: re-read the state and retry on it"
        )
        self.term = term
        self.current = current


class NoQuorum(ClusterStateError, UnavailableError):
    """Too few master-eligible nodes answered to elect or to commit."""

    def __init__(self, what: str, got: Iterable[str], config: Iterable[str]) -> None:
        self.got = tuple(sorted(got))
        self.config = tuple(sorted(config))
        super().__init__(
            f"{what}: only {list(self.got)} of voting configuration {list(self.config)} answered, "
            f"not a majority; nothing was committed; reconnect the master-eligible nodes and retry"
        )


class ManifestConflict(ClusterStateError, ConflictError):
    """Another writer already published a different state under the same term and version."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"manifest {key!r} already exists with another state; another cluster-manager published "
            f"this term and version: this node is stale, step down and re-read the state"
        )
        self.key = key


class NotMaster(ClusterStateError, ConflictError):
    """A master task was submitted to a node that is not the elected cluster-manager."""

    def __init__(self, node: str, master: str | None) -> None:
        super().__init__(f"node {node!r} is not the elected cluster-manager (known master: {master!r}); submit there")
        self.node = node
        self.master = master


class ClusterStateSuperseded(ClusterStateError, ConflictError):
    """This cluster's UUID was taken over by a restore/bootstrap on the same store: it must stop."""

    def __init__(self, cluster_uuid: str, superseded_by: str, node: str | None = None) -> None:
        super().__init__(
            f"cluster UUID {cluster_uuid} was superseded by cluster UUID {superseded_by}"
            f"{f' (bootstrapped by node {node!r})' if node else ''}, which restored its cluster state from the "
            f"same store; this cluster's publications are no longer acknowledged: stop it, and restore its data "
            f"from the store (Cluster.restore) instead of running two clusters on one store"
        )
        self.cluster_uuid = cluster_uuid
        self.superseded_by = superseded_by
        self.node = node
