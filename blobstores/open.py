"""``open_store``: from a URL and options to a ready, retrying store."""

from __future__ import annotations

from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import UnknownOption
from shardstore.blobstores.options import Option, coerce_options, parse_url
from shardstore.blobstores.registry import plugin_class
from shardstore.blobstores.retrying import RetryingStore, RetryPolicy

_DEFAULT = RetryPolicy()

#: Options handled here rather than by the backend.
WRAPPER_OPTIONS = {
    "retry_attempts": Option("retry_attempts", int, _DEFAULT.attempts, "attempts per call, the first included"),
    "retry_deadline": Option("retry_deadline", float, _DEFAULT.deadline, "seconds a call may spend retrying"),
    "retry_base_delay": Option("retry_base_delay", float, _DEFAULT.base_delay, "first backoff cap, seconds"),
    "retry_max_delay": Option("retry_max_delay", float, _DEFAULT.max_delay, "largest backoff cap, seconds"),
    "writer_id": Option("writer_id", str, None, "tags conditional puts (default: host-pid-random)"),
}


def open_backend(url: str, **options: Any) -> BlobStore:
    """Open the plugin store for ``url`` without the retrying wrapper (options as open_store)."""
    parsed = parse_url(url)
    merged: dict[str, Any] = {**parsed.query, **options}
    return plugin_class(parsed.scheme)(parsed.location, **merged)


def open_store(url: str, **options: Any) -> BlobStore:
    """Open ``scheme://bucket/prefix`` through its plugin, wrapped with retries.

    Options come from the URL query and keyword arguments (keywords win); the retry
    options ``retry_attempts``, ``retry_deadline``, ``retry_base_delay``,
    ``retry_max_delay`` and ``writer_id`` are taken here, the rest go to the backend.
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
    )
    try:
        backend = plugin_class(parsed.scheme)(parsed.location, **merged)
    except UnknownOption as exc:
        raise UnknownOption(exc.name, sorted([*exc.known, *WRAPPER_OPTIONS]), location=parsed.location) from None
    return RetryingStore(backend, policy, writer_id=wrap["writer_id"])
