"""shardstore.translog: not built yet (see the issues)."""
