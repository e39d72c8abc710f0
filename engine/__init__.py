"""shardstore.engine: not built yet (see the issues)."""
