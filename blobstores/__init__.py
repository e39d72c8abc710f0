"""One repository interface over S3, GCS, Azure Blob, OCI, the local filesystem and memory.

>>> from shardstore.blobstores import open_store
>>> store = open_store("memory://demo")
>>> store.put("a/b", b"hi", if_absent=True).size
2
"""

from shardstore.blobstores.base import BlobInfo, BlobStore
from shardstore.blobstores.errors import (
    AccessDenied,
    BlobAlreadyExists,
    BlobCorrupted,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    InvalidKey,
    InvalidRange,
    Throttled,
    TransientError,
)
from shardstore.blobstores.faulty import FaultRule, FaultyStore, SimulatedCrash
from shardstore.blobstores.open import open_backend, open_store
from shardstore.blobstores.registry import PluginInfo, plugin_class, plugins, schemes
from shardstore.blobstores.retrying import RetryingStore, RetryPolicy

__all__ = [
    "AccessDenied",
    "BlobAlreadyExists",
    "BlobCorrupted",
    "BlobInfo",
    "BlobNotFound",
    "BlobStore",
    "BlobStoreError",
    "ConfigError",
    "FaultRule",
    "FaultyStore",
    "InvalidKey",
    "InvalidRange",
    "PluginInfo",
    "RetryPolicy",
    "RetryingStore",
    "SimulatedCrash",
    "Throttled",
    "TransientError",
    "open_backend",
    "open_store",
    "plugin_class",
    "plugins",
    "schemes",
]
