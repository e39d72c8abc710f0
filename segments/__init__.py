"""shardstore.segments: not built yet (see the issues)."""
