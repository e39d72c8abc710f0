"""The neutral shard core below translog, segments and cluster_state (issue 17).

What those packages all speak, so that none of them imports another:

* :mod:`.ops`: the operation types (``OpType``) and the "no operations" seq# (``NO_OPS``);
* :mod:`.records`: the checksummed JSON record framing (magic, version, CRC32C) and
  ``RecordCorrupted``;
* :mod:`.path_strategy`: the remote layouts (plain, hashed prefix) and term-marker keys;
* :mod:`.address`: ``ShardAddress`` (cluster, index, shard, and its path strategy);
* :mod:`.settings`: names of index settings several layers read (``DATA_CLUSTER_UUID``).

It imports only :mod:`shardstore.errors` and the key rules of :mod:`shardstore.blobstores`.
"""
