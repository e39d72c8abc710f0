"""One copy of a shard (docs/design/engine.md, "A shard copy").

- ``shard_copy``: :class:`ShardCopy` / :class:`ShardSpec`: a primary or replica over its local
  translog, segments and remote stores; promotion to primary, resync, flush, purge;
- ``staging``, ``staged_write``, ``doc_versions``, ``seq_ranges``: stamping a bulk's operations;
- ``flush_policy``, ``local_disk``: when a copy flushes; local disk failures;
- ``store_recovery``, ``restore_audit``, ``restore_check``: rebuilding a copy from the blob store
  alone and proving nothing acknowledged is missing (``RestoreDataLoss`` otherwise).
"""
