"""The cluster-manager role (docs/design/engine.md, "The cluster manager").

- ``role``: :class:`ManagerRole`: membership, index creation, promotion (``_promote``), rebuilds
  from the store, the allocation round, health; it publishes through the remote cluster state;
- ``allocation``: the pure allocation decisions and :class:`ClusterHealth`;
- ``metadata``: index metadata and routing as the cluster state holds them;
- ``routing_check``: the reconciliation of the routing against what the nodes hold.
"""
