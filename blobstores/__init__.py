"""One blob-store interface over S3, GCS, Azure Blob, OCI, the local filesystem and memory.

Entry points: :func:`open_store` (a URL through its plugin, wrapped in
:class:`RetryingStore`; ``read_only=True`` refuses writes) and :func:`open_backend` (the
plugin's store alone); :class:`BlobStore` (the interface: conditional ``put``,
``put_stream``, ``get``, ``get_range``, ``open_read``, ``stat``, ``list``, ``delete``,
``metrics``) and :class:`BlobInfo`; the plugin registry (:func:`plugins`, :func:`schemes`,
:func:`plugin_class`, :func:`refresh`; entry-point group ``shardstore.blobstores``); the
typed errors under :class:`BlobStoreError`; and the store self-test
(:mod:`.selfcheck`).  The backends live in :mod:`shardstore.plugins`; the fault-injecting
``FaultyStore`` is a test tool, in :mod:`shardstore.testing`.

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
    Unreachable,
)
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
    "InvalidKey",
    "InvalidRange",
    "PluginInfo",
    "RequestRejected",
    "RetryPolicy",
    "RetryingStore",
    "Throttled",
    "TransientError",
    "Unreachable",
    "UnknownOption",
    "open_backend",
    "open_store",
    "plugin_class",
    "plugins",
    "refresh",
    "schemes",
]
