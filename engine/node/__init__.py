"""A node: the process that hosts the roles (docs/design/engine.md, "One set of roles, launched two ways").

- ``process``: :class:`NodeProcess` composes one node's roles behind one transport, and
  ``run_node`` runs it as a ``shardstore node`` process;
- ``data_role``: the data role, :class:`NodeService`: a node's shard copies, their handlers
  (bulk, replicate, refresh, flush, get, scan) and both ends of a peer recovery;
- ``fault_detection``: leader and follower checks (the pure failure counter);
- ``read_lease``: how long a node serves reads after a manager last confirmed it;
- ``datadir``, ``file_budget``, ``remote``: the data directory lock, the open-file budget,
  the node's remote translog stream.
"""
