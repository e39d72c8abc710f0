"""``open_store``: from a URL and options to a ready, retrying store."""

from __future__ import annotations

from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import UnknownOption
from shardstore.blobstores.options import Option, StoreURL, coerce_options, parse_url
from shardstore.blobstores.readonly import ReadOnlyStore
from shardstore.blobstores.registry import plugin_class
from shardstore.blobstores.retrying import RetryingStore, RetryPolicy

_DEFAULT = RetryPolicy()

#: Options handled here rather than by the backend.
WRAPPER_OPTIONS = {
    "retry_attempts": Option("retry_attempts", int, _DEFAULT.attempts, "attempts per call, the first included"),
    "retry_deadline": Option("retry_deadline", float, _DEFAULT.deadline, "seconds a call may spend retrying"),
    "retry_base_delay": Option("retry_base_delay", float, _DEFAULT.base_delay, "first backoff cap, seconds"),
    "retry_max_delay": Option("retry_max_delay", float, _DEFAULT.max_delay, "largest backoff cap, seconds"),
    "retry_unreachable": Option("retry_unreachable", bool, _DEFAULT.unreachable,
                                "retry a refused connection (nothing listening at the endpoint)"),
    "writer_id": Option("writer_id", str, None, "tags conditional puts (default: host-pid-random)"),
    "read_only": Option("read_only", bool, False, "refuse writes and create nothing (not even a missing root)"),
}


def _backend(parsed: StoreURL, options: dict[str, Any], read_only: bool) -> BlobStore:
    """The plugin store; ``read_only`` goes to a plugin that declares it (one that could create things)."""
    cls = plugin_class(parsed.scheme)
    if read_only and "read_only" in getattr(cls, "OPTIONS", {}):
        options = {**options, "read_only": True}
    # parsed.url, not parsed.location: the plugin parses it again, so it must still be percent-encoded
    return cls(parsed.url, **options)


def open_backend(url: str, **options: Any) -> BlobStore:
    """Open the plugin store for ``url`` without the retrying wrapper (options as open_store)."""
    parsed = parse_url(url)
    merged: dict[str, Any] = {**parsed.query, **options}
    return _backend(parsed, merged, read_only=False)


def open_store(url: str, **options: Any) -> BlobStore:
    """Open ``scheme://bucket/prefix`` through its plugin, wrapped with retries.

    Options come from the URL query and keyword arguments (keywords win); the retry
    options ``retry_attempts``, ``retry_deadline``, ``retry_base_delay``,
    ``retry_max_delay``, ``writer_id`` and ``read_only`` are taken here, the rest go to
    the backend.  ``read_only=True`` refuses every write (AccessDenied) and creates
    nothing: the local store then needs its root to exist (ConfigError naming it).
    Credentials not given as options come from each SDK's own chain (environment,
    profiles, instance metadata); shardstore persists none.
    """
    parsed = parse_url(url)
    merged: dict[str, Any] = {**parsed.query, **options}
    mine = {k: merged.pop(k) for k in list(merged) if k in WRAPPER_OPTIONS}
    wrap = coerce_options(WRAPPER_OPTIONS, mine, location=parsed.location)
    policy = RetryPolicy(
        attempts=wrap["retry_attempts"],
        deadline=wrap["retry_deadline"],
        base_delay=wrap["retry_base_delay"],
        max_delay=wrap["retry_max_delay"],
        unreachable=wrap["retry_unreachable"],
    )
    try:
        backend = _backend(parsed, merged, wrap["read_only"])
    except UnknownOption as exc:
        raise UnknownOption(exc.name, sorted({*exc.known, *WRAPPER_OPTIONS}), location=parsed.location) from None
    store = RetryingStore(backend, policy, writer_id=wrap["writer_id"])
    return ReadOnlyStore(store) if wrap["read_only"] else store
