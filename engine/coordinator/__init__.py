"""The coordinator role: a node routing document requests (docs/design/engine.md, "The coordinator").

- ``role``: :class:`Coordinator`: routing of a write to its primary, retries across a failover,
  the ``client.*`` actions;
- ``documents``: the one document API (bulk, index, delete, get, scan, count) with per-item results;
- ``bulk_parts``: a bulk's per-shard parts sent to each primary node at once;
- ``routing``: Elasticsearch-compatible murmur3 routing of an id to a shard;
- ``validation``: the door's checks of names, ids and documents.
"""
