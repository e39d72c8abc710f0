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
    BlobChanged,
    BlobCorrupted,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    InvalidKey,
    InvalidRange,
    RequestRejected,
    Throttled,
    TransientError,
    UnknownOption,
)
from shardstore.blobstores.faulty import FaultRule, FaultyStore, SimulatedCrash
from shardstore.blobstores.open import open_backend, open_store
from shardstore.blobstores.registry import PluginInfo, plugin_class, plugins, refresh, schemes
from shardstore.blobstores.retrying import RetryingStore, RetryPolicy

__all__ = [
    "AccessDenied",
    "BlobAlreadyExists",
    "BlobChanged",
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
    "RequestRejected",
    "RetryPolicy",
    "RetryingStore",
    "SimulatedCrash",
    "Throttled",
    "TransientError",
    "UnknownOption",
    "open_backend",
    "open_store",
    "plugin_class",
    "plugins",
    "refresh",
    "schemes",
]
