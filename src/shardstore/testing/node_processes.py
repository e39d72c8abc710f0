"""Real node processes on 127.0.0.1 for tests and benches: :mod:`shardstore.engine.launcher`, under its test-tool name."""

from shardstore.engine.launcher import NodeHandle, NodeStartFailed, ProcessCluster, free_port, process_cluster

__all__ = ["NodeHandle", "NodeStartFailed", "ProcessCluster", "free_port", "process_cluster"]
