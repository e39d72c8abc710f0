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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardstore.blobstores.base import BlobStore
from shardstore.cluster_state.errors import NoClusterState
from shardstore.cluster_state.manifest import Manifest
from shardstore.cluster_state.model import ClusterState, CoordinationMetadata, VotingConfig, new_uuid
from shardstore.cluster_state.remote import RemoteClusterStateService
from shardstore.cluster_state.uuids import latest_cluster_uuid, uuid_chain


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
    infos = {u: svc.uuid_info(u)[0] for u in svc.cluster_uuids()}
    head = latest_cluster_uuid(infos)
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


def restore_cluster_state(store: BlobStore, voting_config: tuple[str, ...] | list[str], *,
                          cluster_uuid: str | None = None,
                          svc: RemoteClusterStateService | None = None) -> ClusterRestore:
    """Restore the latest committed cluster state into a new cluster UUID, written and committed."""
    svc = svc or RemoteClusterStateService(store)
    head, chain = find_latest(svc)
    res = svc.restore_latest(head)
    state = restored_state(res.state, voting_config, cluster_uuid=cluster_uuid)
    published = svc.write_full(state, previous_cluster_uuid=head)
    committed = svc.mark_committed(published)
    return ClusterRestore(replace(state, cluster_uuid_committed=True), committed, head, res.manifest, chain,
                          res.skipped)
