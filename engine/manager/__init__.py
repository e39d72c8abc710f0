"""The cluster-manager role (docs/design/engine.md, "The cluster manager").

- ``role``: :class:`ManagerRole`: membership, index creation, the allocation round, health; it publishes
  through the remote cluster state;
- ``promotion``: :class:`Promotions`: a shard without a primary promoted, or rebuilt from the store;
- ``allocation``: the pure allocation decisions and :class:`ClusterHealth`;
- ``metadata``: index metadata and routing as the cluster state holds them;
- ``routing_check``: the reconciliation of the routing against what the nodes hold.
"""
