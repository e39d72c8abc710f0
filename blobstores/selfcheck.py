"""A short self-test of a real store: the first thing to run against a new bucket.

Runs put, get, ranged get, stat, list with ``start_after``, conditional create (the
second create must be refused and leave the first one's bytes), overwrite and delete,
under a unique scratch prefix that is removed afterwards, whatever failed.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import AccessDenied, BlobAlreadyExists, BlobNotFound, Unreachable


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    ok: bool
    millis: float
    detail: str = ""


class CheckFailed(AssertionError):
    """A check saw something other than what the contract promises."""


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def run_checks(
    store: BlobStore,
    *,
    scratch: str = "_shardstore_check",
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every check against ``store`` (``on_result`` sees each as it ends); never raises for a failed check,
    except when the first one finds the store unusable as a whole (nothing answers at its endpoint, or it refuses
    the credentials): that error is raised at once, not repeated by every later check."""
    base = f"{scratch}/{uuid.uuid4().hex}"
    payload = os.urandom(1024)
    keys = [f"{base}/a", f"{base}/b/c", f"{base}/d"]

    def put_get() -> str:
        info = store.put(keys[0], payload)
        _expect(info.size == len(payload), f"put reported size {info.size}, expected {len(payload)}")
        _expect(store.get(keys[0]) == payload, "get returned different bytes")
        return "1 KiB round trip"

    def ranges() -> str:
        _expect(store.get_range(keys[0], 0, 10) == payload[:10], "range at the start is wrong")
        _expect(store.get_range(keys[0], 1020, 10) == payload[1020:], "range over the end is wrong")
        _expect(store.get_range(keys[0], 2048, 10) == b"", "range past the end is not empty")
        return "start, tail, past the end"

    def stat() -> str:
        info = store.stat(keys[0])
        _expect(info.size == len(payload), f"stat size {info.size}")
        try:
            store.stat(f"{base}/missing")
        except BlobNotFound:
            return f"size and version {info.etag_or_generation}"
        raise CheckFailed("stat of a missing key did not raise BlobNotFound")

    def listing() -> str:
        for k in keys[1:]:
            store.put(k, b"x")
        got = [i.key for i in store.list(base + "/")]
        _expect(got == sorted(keys), f"list gave {got}")
        after = [i.key for i in store.list(base + "/", start_after=keys[0])]
        _expect(after == sorted(keys)[1:], f"list start_after gave {after}")
        return f"{len(got)} keys in order, start_after"

    def conditional() -> str:
        key = f"{base}/conditional"
        store.put(key, b"first", if_absent=True)
        try:
            store.put(key, b"second", if_absent=True)
        except BlobAlreadyExists:
            _expect(store.get(key) == b"first", "the refused create changed the blob")
            return "second create refused, first kept"
        raise CheckFailed("a second put(if_absent=True) was accepted: this store cannot fence writers")

    def overwrite() -> str:
        key = f"{base}/conditional"
        store.put(key, b"third")
        _expect(store.get(key) == b"third", "a plain put did not overwrite")
        return "plain put replaces"

    def delete() -> str:
        every = [i.key for i in store.list(base + "/")]
        store.delete(every)
        left = [i.key for i in store.list(base + "/")]
        _expect(left == [], f"{len(left)} keys left after delete")
        _expect(not store.exists(keys[0]), "a deleted key still exists")
        return f"{len(every)} keys deleted"

    checks: list[tuple[str, Callable[[], str]]] = [
        ("put/get", put_get),
        ("range", ranges),
        ("stat", stat),
        ("list", listing),
        ("conditional create", conditional),
        ("overwrite", overwrite),
        ("delete", delete),
    ]
    results = []
    try:
        for name, fn in checks:
            t0 = time.perf_counter()
            try:
                detail, ok = fn(), True
            except Exception as exc:  # a check reports failures; it does not stop the run
                if not results and isinstance(exc, Unreachable | AccessDenied):
                    base = ""  # the store as a whole, and nothing was written: every other check would fail alike
                    raise
                detail, ok = f"{type(exc).__name__}: {exc}", False
            results.append(CheckResult(name, ok, (time.perf_counter() - t0) * 1000, detail))
            if on_result is not None:
                on_result(results[-1])
    finally:
        try:
            if base:
                store.delete([i.key for i in store.list(base + "/")])
        except Exception as exc:
            results.append(CheckResult("clean-up", False, 0.0, f"{type(exc).__name__}: {exc}"))
            if on_result is not None:
                on_result(results[-1])
    return results
