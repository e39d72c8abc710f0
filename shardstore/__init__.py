"""shardstore: search-engine shards kept durable in object storage.

Subpackages: ``blobstores`` (one interface over S3, GCS, Azure, OCI, local, memory),
``plugins`` (the built-in backends), ``translog``, ``segments``, ``engine``.
"""

from importlib.metadata import PackageNotFoundError, version

from shardstore.errors import (
    ConflictError,
    CorruptError,
    InvalidError,
    LocalDiskError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)

try:
    __version__ = version("shardstore")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ConflictError",
    "CorruptError",
    "InvalidError",
    "LocalDiskError",
    "NotFoundError",
    "ShardstoreError",
    "UnavailableError",
    "__version__",
]
