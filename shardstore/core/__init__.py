"""The neutral shard core below translog, segments and cluster_state (issue 17).

What those packages all speak, so that none of them imports another: today the operation
types and the "no operations" sequence number (``ops``).  The checksummed record format,
``ShardAddress`` and the path strategy are to move here next (see the issue).
"""
