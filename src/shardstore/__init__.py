"""shardstore: search-engine shards kept durable in object storage.

The public surface is small (issue 17): :func:`open_store` (a blob store for a URL),
:class:`Cluster` (nodes, shards, replication, failover, restore), :func:`open_commit`
(read a shard commit from the store as Arrow), :func:`connect` (a client of a cluster of node
processes, ``shardstore.connect("h1:9400,h2:9400")``: the same document API), the error kinds every error derives from
(:class:`ShardstoreError`, :class:`ConflictError`, :class:`CorruptError`,
:class:`InvalidError`, :class:`NotFoundError`, :class:`UnavailableError`,
:class:`LocalDiskError`) and ``__version__``.  ``Cluster``, ``connect``, ``open_commit`` and
``open_store`` are imported on first use (PEP 562), so ``import shardstore`` and
``import shardstore.errors`` stay light and load neither the engine nor the segments.

Subpackages: ``blobstores`` (one interface over S3, GCS, Azure, OCI, local, memory),
``plugins`` (the built-in backends), ``core`` (operation types, record format, path
strategies, ``ShardAddress``), ``translog``, ``segments``, ``cluster_state``, ``engine``,
``spark`` (PySpark sources and the JVM bridge) and ``testing`` (emulators and fault
injection for tests and benches); the ``transport`` module (the in-process node
transport).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from shardstore.errors import (
    ConflictError,
    CorruptError,
    InvalidError,
    LocalDiskError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)

if TYPE_CHECKING:
    from shardstore.blobstores import open_store
    from shardstore.engine import Cluster
    from shardstore.engine.client import connect
    from shardstore.segments.reader import open_commit

try:
    __version__ = version("shardstore")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Cluster",
    "ConflictError",
    "CorruptError",
    "InvalidError",
    "LocalDiskError",
    "NotFoundError",
    "ShardstoreError",
    "UnavailableError",
    "__version__",
    "connect",
    "open_commit",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """The heavy names, imported on first access and then cached in the module."""
    if name == "Cluster":
        from shardstore.engine import Cluster as value
    elif name == "connect":
        from shardstore.engine.client import connect as value
    elif name == "open_commit":
        from shardstore.segments.reader import open_commit as value
    elif name == "open_store":
        from shardstore.blobstores import open_store as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones included."""
    return sorted(set(globals()) | set(__all__))
