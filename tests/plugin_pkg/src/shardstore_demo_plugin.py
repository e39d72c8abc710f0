"""``demo://name/prefix``: a third-party scheme that reuses shardstore's in-memory backend.

Everything a plugin needs is a :class:`~shardstore.blobstores.base.BlobStore` class built
as ``cls(url, **options)`` and an entry point in the ``shardstore.blobstores`` group.
"""

from __future__ import annotations

from shardstore.plugins.memory import MemoryStore

__all__ = ["DemoStore"]


class DemoStore(MemoryStore):
    """The memory store under its own scheme (same options: ``page_size``)."""

    scheme = "demo"
