"""Common plumbing of backend stores: URL, typed options, key checks, metrics, pickling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from shardstore.blobstores.base import BlobStore, Metrics
from shardstore.blobstores.errors import ConfigError
from shardstore.blobstores.keys import join_root, validate_key, validate_prefix
from shardstore.blobstores.options import Option, StoreURL, coerce_options, parse_url


def _rebuild(cls: type[BackendStore], url: str, options: dict[str, Any]) -> BackendStore:
    return cls(url, **options)


class BackendStore(BlobStore):
    """Base of the plugin classes: built as ``cls(url, **options)``, pickled the same way."""

    #: Options this backend accepts (name -> declaration).
    OPTIONS: ClassVar[Mapping[str, Option]] = {}

    def __init__(self, url: str, **options: Any) -> None:
        self._url_text = url
        self.url: StoreURL = parse_url(url)
        if self.scheme and self.url.scheme != self.scheme:
            raise ConfigError(
                f"{type(self).__name__} serves {self.scheme}:// URLs, not {self.url.scheme}://",
                location=self.url.location,
            )
        if self.url.scheme != "file" and not self.url.bucket:
            raise ConfigError("the URL names no bucket/container", location=self.url.location)
        self._given_options = dict(options)
        self.options = coerce_options(self.OPTIONS, options, location=self.url.location)
        self._metrics = Metrics()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._url_text, self._given_options))

    @property
    def location(self) -> str:
        """``scheme://bucket/prefix``, without options."""
        return self.url.location

    def _check(self, key: str) -> str:
        """Validate ``key`` (InvalidKey names the problem)."""
        return validate_key(key, location=self.location)

    def _check_prefix(self, prefix: str) -> str:
        """Validate a listing prefix."""
        return validate_prefix(prefix, location=self.location)

    def _full(self, key: str) -> str:
        """The bucket-relative path of a validated key."""
        return join_root(self.url.prefix, key)

    def metrics(self) -> dict[str, Any]:
        """Requests by kind, bytes in/out, retries and throttles counted by this backend."""
        return self._metrics.snapshot()

    def reset_metrics(self) -> None:
        """Zero the counters."""
        self._metrics.reset()
