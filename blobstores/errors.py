"""Typed errors of the blob-store layer.

Every error names the backend, the bucket or root, and the key it concerns, and never
a credential: messages are built from a store's *location* (``scheme://bucket/prefix``),
which holds no options.
"""

from __future__ import annotations

import difflib

from shardstore.errors import (
    ConflictError,
    CorruptError,
    InvalidError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)


class BlobStoreError(ShardstoreError):
    """Base of every blob-store error."""

    def __init__(self, message: str, *, location: str = "", key: str | None = None) -> None:
        where = location + (f" key {key!r}" if key is not None else "")
        super().__init__(f"{where}: {message}" if where else message)
        self.location = location
        self.key = key
        self.detail = message


class BlobNotFound(BlobStoreError, NotFoundError):
    """The key does not exist."""


class BlobAlreadyExists(BlobStoreError, ConflictError):
    """A conditional create found the key already written by another writer."""


class InvalidKey(BlobStoreError, InvalidError):
    """The key is not a valid relative, '/'-separated blob key."""


class InvalidRange(BlobStoreError, InvalidError):
    """A byte range with a negative start or length."""


class ConfigError(BlobStoreError, InvalidError):
    """The store URL or its options are wrong (unknown scheme, missing bucket, bad option)."""


class UnknownOption(ConfigError):
    """An option name the store does not accept."""

    def __init__(self, name: str, known: list[str], *, location: str) -> None:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(
            f"unknown option {name!r}{hint}; this store accepts: {', '.join(known) or '(none)'}", location=location
        )
        self.name = name
        self.known = known


class AccessDenied(BlobStoreError, InvalidError):
    """The credentials in use may not perform this operation (fix credentials or policy)."""


class RequestRejected(BlobStoreError, InvalidError):
    """The service refused the request for a reason shardstore does not classify further."""


class TransientError(BlobStoreError, UnavailableError):
    """The request failed in a way that may succeed if repeated (5xx, reset, timeout)."""


class Unreachable(TransientError):
    """Nothing answered at the store's endpoint (the connection was refused): a retry helps only once it is up."""


class Throttled(TransientError):
    """The service asked us to slow down (S3 503 SlowDown, GCS 429, Azure 503)."""


class BlobChanged(BlobStoreError, ConflictError):
    """The blob was replaced or deleted while a stream was reading it."""


class BlobCorrupted(BlobStoreError, CorruptError):
    """Bytes read back do not match what the store promised (size, checksum)."""
