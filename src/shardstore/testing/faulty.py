"""A fault-injecting wrapper: fail, delay or "crash" chosen operations by rule.

Used by tests of retries, failover and corruption, for faults no real service produces
on demand.  A rule matches an operation name and a key pattern (fnmatch), may skip its
first ``after`` matches, fires at most ``times`` times, each time with a seeded
probability, and then:

- ``fail``: raises ``error`` without calling the inner store;
- ``delay``: sleeps ``delay`` seconds, then calls the inner store;
- ``crash_before``: raises before the operation reaches the store (nothing lands);
- ``crash_after``: performs the operation, then raises as if the reply was lost
  (the write landed; the caller cannot know);
- ``stale_list`` (``list`` only): answers with the listing as it was ``lag`` mutations
  ago: the keys of the last ``lag`` puts under the prefix are missing and the keys of
  the last ``lag`` deletes are still there (a GET of such a ghost is a NotFound), as an
  eventually consistent listing (S3 before 2020, some S3-compatible gateways) does.

Crashes raise :class:`SimulatedCrash`, a TransientError, so a retrying wrapper above
will retry them, which is exactly the ambiguous-retry case conditional puts must handle.
"""

from __future__ import annotations

import collections
import fnmatch
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, Protocol, TypeVar

from shardstore.blobstores.base import BlobInfo, BlobStore
from shardstore.blobstores.errors import BlobStoreError, ConfigError, TransientError

T = TypeVar("T")
Action = Literal["fail", "delay", "crash_before", "crash_after", "stale_list"]
ACTIONS = ("fail", "delay", "crash_before", "crash_after", "stale_list")
#: how many recent puts and deletes a FaultyStore remembers for stale listings
RECENT = 64
OPS = ("put", "put_stream", "get", "get_range", "open_read", "stat", "exists", "list", "delete")


class SimulatedCrash(TransientError):
    """Raised by FaultyStore in place of a lost request or reply."""


@dataclass
class FaultRule:
    """Which operations to disturb and how (see the module docstring)."""

    op: str | tuple[str, ...] = "*"
    key: str = "*"
    action: Action = "fail"
    error: type[BlobStoreError] | BlobStoreError = TransientError
    times: int | None = 1
    after: int = 0
    probability: float = 1.0
    delay: float = 0.0
    lag: int = 1
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        ops = (self.op,) if isinstance(self.op, str) else tuple(self.op)
        unknown = [o for o in ops if o != "*" and o not in OPS]
        if unknown:
            raise ConfigError(f"FaultRule: unknown operation(s) {unknown}; known: {', '.join(OPS)}")
        if self.action not in ACTIONS:
            raise ConfigError(f"FaultRule: unknown action {self.action!r}; known: {', '.join(ACTIONS)}")
        if self.action == "stale_list" and ops != ("list",):
            raise ConfigError("FaultRule: a stale_list rule applies to op='list' only")
        self._ops = ops

    def matches(self, op: str, key: str) -> bool:
        """True when the rule covers this operation and key."""
        return ("*" in self._ops or op in self._ops) and fnmatch.fnmatchcase(key, self.key)


class CountedRule(Protocol):
    """What :func:`pick_rule` needs of a rule: how often it may fire, after how many matches, and its counters."""

    times: int | None
    after: int
    seen: int
    fired: int


R = TypeVar("R", bound=CountedRule)


def pick_rule(rules: Iterable[R], matches: Callable[[R], bool], rng: random.Random | None = None) -> R | None:
    """The first rule that matches and fires now (``after`` matches skipped, at most ``times`` firings, its
    ``probability`` drawn from ``rng``); its counters updated.  The caller holds the lock over ``rules``."""
    for rule in rules:
        if not matches(rule) or (rule.times is not None and rule.fired >= rule.times):
            continue
        rule.seen += 1
        if rule.seen <= rule.after:
            continue
        probability = getattr(rule, "probability", 1.0)
        if probability < 1.0 and rng is not None and rng.random() >= probability:
            continue
        rule.fired += 1
        return rule
    return None


class FaultyStore(BlobStore):
    """Wraps a store and injects the faults its rules describe."""

    def __init__(self, inner: BlobStore, rules: Iterable[FaultRule] = (), *, seed: int = 0) -> None:
        self.inner = inner
        self.scheme = inner.scheme
        self.keeps_writer_tokens = inner.keeps_writer_tokens
        self.rules: list[FaultRule] = list(rules)
        self.seed = seed
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.fired_total = 0  # faults injected so far, across cleared rules
        #: the latest mutations, newest last: ("put", info) or ("delete", info) (stale listings)
        self._recent: collections.deque[tuple[str, BlobInfo]] = collections.deque(maxlen=RECENT)
        self._sizes: dict[str, BlobInfo] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (FaultyStore, (self.inner, self.rules), {"seed": self.seed})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self._rng = random.Random(self.seed)
        self.fired_total = 0
        self._recent = collections.deque(maxlen=RECENT)
        self._sizes = {}

    @property
    def location(self) -> str:
        """The inner store's location."""
        return self.inner.location

    def inject(self, **rule: Any) -> FaultRule:
        """Add a rule (keyword arguments of FaultRule) and return it."""
        r = FaultRule(**rule)
        with self._lock:
            self.rules.append(r)
        return r

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self.rules.clear()

    def _pick(self, op: str, key: str) -> FaultRule | None:
        with self._lock:
            rule = pick_rule(self.rules, lambda r: r.matches(op, key), self._rng)
            self.fired_total += rule is not None
            return rule

    def _raise(self, rule: FaultRule, op: str, key: str, crash: str | None = None) -> None:
        if crash is not None:
            raise SimulatedCrash(f"injected {crash} during {op}", location=self.location, key=key)
        err = rule.error
        if isinstance(err, BaseException):
            raise err
        raise err(f"injected fault during {op}", location=self.location, key=key)

    def _run(self, op: str, key: str, call: Callable[[], T]) -> T:
        rule = self._pick(op, key)
        if rule is None:
            return call()
        return self._apply(rule, op, key, call)

    def _apply(self, rule: FaultRule, op: str, key: str, call: Callable[[], T]) -> T:
        if rule.action == "delay":
            time.sleep(rule.delay)
            return call()
        if rule.action == "crash_after":
            call()
            self._raise(rule, op, key, "lost reply (the operation landed)")
        if rule.action == "crash_before":
            self._raise(rule, op, key, "lost request (nothing landed)")
        if rule.action == "stale_list":
            return call()  # list() itself applies the lag
        self._raise(rule, op, key)
        raise AssertionError("unreachable")

    def _landed(self, kind: str, info: BlobInfo) -> BlobInfo:
        with self._lock:
            self._recent.append((kind, info))
            if kind == "put":
                self._sizes[info.key] = info
        return info

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Put, unless a rule interferes."""
        return self._run("put", key, lambda: self._landed(
            "put", self.inner.put(key, data, if_absent=if_absent, token=token)))

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Streamed put, unless a rule interferes."""
        return self._run("put_stream", key, lambda: self._landed(
            "put", self.inner.put_stream(key, readable, if_absent=if_absent, token=token)))

    def get(self, key: str) -> bytes:
        """Get, unless a rule interferes."""
        return self._run("get", key, lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Ranged get, unless a rule interferes."""
        return self._run("get_range", key, lambda: self.inner.get_range(key, start, length))

    def open_read(self, key: str) -> BinaryIO:
        """Open, unless a rule interferes."""
        return self._run("open_read", key, lambda: self.inner.open_read(key))

    def stat(self, key: str) -> BlobInfo:
        """Stat, unless a rule interferes."""
        return self._run("stat", key, lambda: self.inner.stat(key))

    def exists(self, key: str) -> bool:
        """Exists, unless a rule interferes."""
        return self._run("exists", key, lambda: self.inner.exists(key))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """List; a rule on "list" matches the prefix and fires before the first page."""
        rule = self._pick("list", prefix)
        if rule is None or rule.action == "stale_list":
            listing = self.inner.list(prefix, start_after=start_after)
            return listing if rule is None else self._stale(listing, prefix, start_after, rule.lag)
        return self._apply(rule, "list", prefix, lambda: self.inner.list(prefix, start_after=start_after))

    def _stale(self, listing: Iterator[BlobInfo], prefix: str, start_after: str | None,
               lag: int) -> Iterator[BlobInfo]:
        """``listing`` as it was ``lag`` mutations under ``prefix`` ago (see the module docstring)."""
        with self._lock:
            recent = [(k, i) for k, i in self._recent if i.key.startswith(prefix)][-lag:]
        hidden = {i.key for k, i in recent if k == "put"}
        out = {i.key: i for i in listing if i.key not in hidden}
        for kind, info in recent:
            if kind == "delete" and (start_after is None or info.key > start_after):
                out.setdefault(info.key, info)  # a ghost, unless put again since
        return iter(sorted(out.values(), key=lambda i: i.key))

    def delete(self, keys: Iterable[str]) -> None:
        """Delete; a rule matches if it covers any of the keys."""
        keys = list(keys)
        hit = next((k for k in keys if self._would_match("delete", k)), keys[0] if keys else "")

        def call() -> None:
            self.inner.delete(keys)
            with self._lock:
                for k in keys:
                    info = self._sizes.pop(k, None) or BlobInfo(k, 0)
                    self._recent.append(("delete", info))

        self._run("delete", hit, call)

    def _would_match(self, op: str, key: str) -> bool:
        with self._lock:
            return any(r.matches(op, key) for r in self.rules)

    def metrics(self) -> dict[str, Any]:
        """The inner store's counters plus the number of injected faults."""
        out = self.inner.metrics()
        with self._lock:
            out["injected_faults"] = sum(r.fired for r in self.rules)
        return out

    def reset_metrics(self) -> None:
        """Zero the inner store's counters."""
        self.inner.reset_metrics()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
