"""A wrapper that retries throttled and transient failures with backoff and jitter.

One behaviour per wrapper: this one only decides *whether and when* to repeat a call.
Permanent errors (not found, conflict, invalid key, access denied) pass straight
through.  A retried conditional put resolves the ambiguous case with
:func:`shardstore.blobstores.conditional.is_own_write`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from shardstore.blobstores.base import BlobInfo, BlobStore, Metrics
from shardstore.blobstores.conditional import default_writer_id, is_own_write, new_token
from shardstore.blobstores.errors import (
    BlobAlreadyExists,
    BlobNotFound,
    ConfigError,
    Throttled,
    TransientError,
    Unreachable,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds of retrying: attempts (first try included), a deadline, backoff delays."""

    attempts: int = 8
    deadline: float = 60.0
    base_delay: float = 0.05
    max_delay: float = 5.0
    unreachable: bool = True  # retry a refused connection (a command line fails at once: nothing listens there)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"retry_attempts must be >= 1, got {self.attempts}")
        if self.deadline <= 0 or self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ConfigError(
                "retry_deadline must be > 0 and 0 <= retry_base_delay <= retry_max_delay, got "
                f"{self.deadline}, {self.base_delay}, {self.max_delay}"
            )

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Sleep before retry number ``attempt`` (1-based): full jitter, capped exponential."""
        return rng.uniform(0.0, min(self.max_delay, self.base_delay * (2 ** (attempt - 1))))

    def next_delay(self, attempt: int, elapsed: float, rng: random.Random) -> float | None:
        """The sleep before the next attempt, or None when attempts or deadline are spent."""
        if attempt >= self.attempts:
            return None
        pause = self.delay(attempt, rng)
        if elapsed + pause >= self.deadline:
            return None
        return pause


class RetryingStore(BlobStore):
    """Retries an inner store's transient failures according to a :class:`RetryPolicy`."""

    def __init__(
        self,
        inner: BlobStore,
        policy: RetryPolicy | None = None,
        *,
        writer_id: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inner = inner
        self.policy = policy or RetryPolicy()
        self.writer_id = writer_id or default_writer_id()
        self.scheme = inner.scheme
        self.keeps_writer_tokens = inner.keeps_writer_tokens
        self._sleep = sleep
        self._rng = random.Random()
        self._metrics = Metrics()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RetryingStore, (self.inner, self.policy), {"writer_id": self.writer_id})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.writer_id = state["writer_id"]

    @property
    def location(self) -> str:
        """The inner store's location."""
        return self.inner.location

    def _backoff(self, err: TransientError, attempt: int, started: float) -> None:
        """Count the failure, then sleep before the next attempt, or re-raise when spent."""
        if isinstance(err, Throttled):
            self._metrics.add("throttles")
        if isinstance(err, Unreachable) and not self.policy.unreachable:
            err.add_note("shardstore: not retried (retry_unreachable=false)")
            raise err
        pause = self.policy.next_delay(attempt, time.monotonic() - started, self._rng)
        if pause is None:
            err.add_note(
                f"shardstore: gave up after {attempt} attempt(s) in {time.monotonic() - started:.2f}s "
                f"(retry_attempts={self.policy.attempts}, retry_deadline={self.policy.deadline}s)"
            )
            raise err
        self._metrics.add("retries")
        self._sleep(pause)

    def _retry(self, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        attempt = 1
        while True:
            try:
                return fn()
            except TransientError as err:
                self._backoff(err, attempt, started)
                attempt += 1

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """Put with retries; an ambiguous conditional retry checks whether its own write landed."""
        if not if_absent:
            return self._retry(lambda: self.inner.put(key, data, token=token))
        token = token or new_token(self.writer_id)
        tried = False

        def attempt() -> BlobInfo:
            nonlocal tried
            ambiguous = tried
            tried = True
            try:
                return self.inner.put(key, data, if_absent=True, token=token)
            except BlobAlreadyExists:
                # Even a first attempt can meet its own write: HTTP clients silently re-send
                # an idempotent PUT whose reply was lost (aiohttp does), and the re-send gets 412.
                own = self._own_write(key, token, data, ambiguous)
                if own is None:
                    raise
                return own

        return self._retry(attempt)

    def put_stream(
        self, key: str, readable: BinaryIO, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Streamed put; retried only when ``readable`` can seek back to where it started."""
        try:
            origin = readable.tell() if readable.seekable() else None
        except OSError:
            origin = None
        if if_absent:
            token = token or new_token(self.writer_id)
        if origin is None:
            return self.inner.put_stream(key, readable, if_absent=if_absent, token=token)

        def attempt() -> BlobInfo:
            readable.seek(origin)
            try:
                return self.inner.put_stream(key, readable, if_absent=if_absent, token=token)
            except BlobAlreadyExists:
                own = self._own_write(key, token, None, False) if token else None
                if own is None:
                    raise
                return own

        return self._retry(attempt)

    def _own_write(self, key: str, token: str, data: bytes | None, ambiguous: bool) -> BlobInfo | None:
        """The blob at ``key`` if it is this call's own earlier write, else None.

        One plain stat inside the current attempt (no nested retry loop): a transient
        failure here fails the attempt, and a blob gone since the 412 means the put itself
        should be tried again.  Bytes are compared only after an ambiguous failure, on a
        backend that keeps no writer token.
        """
        if not ambiguous and not self.keeps_writer_tokens:
            return None  # the only possible answer without a token is "conflict"
        try:
            existing = self.inner.stat(key)
        except BlobNotFound:
            raise TransientError(
                "the blob that refused the conditional put is gone again; retrying the put",
                location=self.location, key=key,
            ) from None
        if is_own_write(existing, token, data if ambiguous else None, lambda: self.inner.get(key)):
            return existing
        return None

    def get(self, key: str) -> bytes:
        """Get with retries."""
        return self._retry(lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Ranged get with retries."""
        return self._retry(lambda: self.inner.get_range(key, start, length))

    def open_read(self, key: str) -> BinaryIO:
        """Open with retries (reads on the returned stream are not retried)."""
        return self._retry(lambda: self.inner.open_read(key))

    def stat(self, key: str) -> BlobInfo:
        """Stat with retries."""
        return self._retry(lambda: self.inner.stat(key))

    def exists(self, key: str) -> bool:
        """Exists with retries."""
        return self._retry(lambda: self.inner.exists(key))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """List; a page that fails is retried by resuming after the last key yielded."""
        last = start_after
        started, attempt = time.monotonic(), 1
        while True:
            try:
                for info in self.inner.list(prefix, start_after=last):
                    last = info.key
                    started, attempt = time.monotonic(), 1  # progress: a fresh budget
                    yield info
                return
            except TransientError as err:
                self._backoff(err, attempt, started)
                attempt += 1

    def delete(self, keys: Iterable[str]) -> None:
        """Delete with retries (deleting is idempotent)."""
        keys = list(keys)
        self._retry(lambda: self.inner.delete(keys))

    def metrics(self) -> dict[str, Any]:
        """The inner store's counters plus the retries and throttles seen here."""
        out = self.inner.metrics()
        mine = self._metrics.snapshot()
        out["retries"] += mine["retries"]
        out["throttles"] += mine["throttles"]
        return out

    def reset_metrics(self) -> None:
        """Zero this wrapper's and the inner store's counters."""
        self._metrics.reset()
        self.inner.reset_metrics()

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
