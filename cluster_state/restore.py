"""Restore after a quorum loss: bootstrap new cluster-manager nodes with empty disks from the store.

1. List the cluster UUIDs (the markers) and read each one's newest committed manifest.
2. Pick the latest valid UUID with seed 000's algorithm (:mod:`.uuids`).
3. Read its newest committed state that is complete (falling back past corrupt or
   incomplete manifests, reported in :attr:`ClusterRestore.skipped` and as a warning).
4. Build the state of a new cluster: a fresh cluster UUID whose previous UUID is the old
   one, the new voting configuration, term and version one above the restored ones;
   every index keeps its metadata and primary terms (so its shards can be restored from
   the remote segment store and translog); nodes, routing, blocks and transient settings
   are dropped (they described the lost nodes).
5. Write it in full and commit it (its committed manifest names the previous UUID).

Before step 3 the old UUID is fenced (:mod:`.fence`): its cluster managers, if any still
run, fail every later publication instead of acknowledging a state this restore missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NoClusterState
from shardstore.cluster_state.manifest import Manifest
from shardstore.cluster_state.model import ClusterState, CoordinationMetadata, VotingConfig, new_uuid
from shardstore.cluster_state.remote import RemoteClusterStateService, RestoreResult
from shardstore.cluster_state.uuids import latest_of_settled_view, uuid_chain


@dataclass
class ClusterRestore:
    """The outcome of :func:`restore_cluster_state`."""

    state: ClusterState
    manifest: Manifest
    previous_cluster_uuid: str
    restored_from: Manifest
    chain: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        """True when newer committed manifests of the old UUID could not be read."""
        return bool(self.skipped)


def find_latest(svc: RemoteClusterStateService) -> tuple[str, list[str]]:
    """(latest valid cluster UUID, its chain newest first); NoClusterState when there is none."""
    infos, head = latest_of_settled_view(lambda: {u: svc.uuid_info(u)[0] for u in svc.cluster_uuids()})
    if head is None:
        raise NoClusterState(svc.store.location,
                             f"{len(infos)} cluster UUID(s) found, none with a committed manifest" if infos else "")
    return head, uuid_chain(infos, head)


def restored_state(old: ClusterState, voting_config: tuple[str, ...] | list[str], *,
                   cluster_uuid: str | None = None) -> ClusterState:
    """The first state of a new cluster restored from ``old`` (pure; see the module docstring)."""
    config = VotingConfig(tuple(voting_config))
    term = old.term + 1
    return replace(
        old, cluster_uuid=cluster_uuid or new_uuid(), cluster_uuid_committed=False, term=term,
        version=old.version + 1, state_uuid=new_uuid(), coordination=CoordinationMetadata(term, config, config),
        transient_settings={}, routing={}, nodes={}, blocks={},
    )


@dataclass
class TakeOver:
    """The old head taken over (fenced, then read) and the first state of the new cluster built from it."""

    head: str
    chain: list[str]
    restored: RestoreResult
    state: ClusterState


def take_over(svc: RemoteClusterStateService, voting_config: tuple[str, ...] | list[str], *,
              cluster_uuid: str | None = None, node: str | None = None) -> TakeOver:
    """Fence the latest cluster UUID, then read its newest committed state into a new cluster's first state.

    The order is the fencing argument (docs/design/cluster_state.md, "Fencing a superseded
    cluster"): a manager of the old head either sees the fence before it acknowledges, or
    wrote its committed manifest before the fence, and the read below sees it.
    NoClusterState when the store holds none.
    """
    head, chain = find_latest(svc)
    cluster_uuid = cluster_uuid or new_uuid()
    svc.supersede(head, cluster_uuid, node)
    res = svc.restore_latest(head)
    return TakeOver(head, chain, res, restored_state(res.state, voting_config, cluster_uuid=cluster_uuid))


def restore_cluster_state(store: BlobStore, voting_config: tuple[str, ...] | list[str], *,
                          cluster_uuid: str | None = None,
                          svc: RemoteClusterStateService | None = None) -> ClusterRestore:
    """Restore the latest committed cluster state into a new cluster UUID, written and committed."""
    svc = svc or RemoteClusterStateService(store)
    taken = take_over(svc, voting_config, cluster_uuid=cluster_uuid)
    published = svc.write_full(taken.state, previous_cluster_uuid=taken.head)
    committed = svc.mark_committed(published)
    return ClusterRestore(replace(taken.state, cluster_uuid_committed=True), committed, taken.head,
                          taken.restored.manifest, taken.chain, taken.restored.skipped)
