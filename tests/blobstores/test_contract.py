"""The blob-store contract, one suite run on every backend: memory, file, s3, oci, gcs, azure.

The cloud backends run against real emulators (see conftest.py); throttling and lost
replies on them come from a real HTTP proxy (``shardstore.testing.fault_proxy``) that
sends each service's own error responses.  Tests that use ``FaultyStore`` (an in-process
wrapper that fakes errors) say why no real component can produce that fault.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shardstore.blobstores import (
    BlobAlreadyExists,
    BlobInfo,
    BlobNotFound,
    BlobStore,
    ConfigError,
    InvalidKey,
    InvalidRange,
    RetryingStore,
    RetryPolicy,
    Throttled,
    TransientError,
    open_store,
)
from shardstore.testing import FaultyStore
from tests.conftest import CLOUD, StoreFactory, make_factory

cloud_only = pytest.mark.parametrize("backend", CLOUD, indirect=True)

FAST_RETRY = RetryPolicy(attempts=5, deadline=30.0, base_delay=0.001, max_delay=0.01)
FAST_RETRY_OPTIONS = {"retry_attempts": 5, "retry_base_delay": 0.001, "retry_max_delay": 0.01}

MiB = 1024 * 1024


# -- helpers --------------------------------------------------------------------------------


def keys_of(infos: Any) -> list[str]:
    return [i.key for i in infos]


def read_and_close(stream: Any) -> bytes:
    with stream:
        return stream.read()


def expect(cls: type[BaseException], call: Callable[[], Any], what: str) -> Any:
    """Call; return the ``cls`` error raised, or fail saying what happened instead."""
    try:
        result = call()
    except cls as exc:
        return exc
    except BaseException as exc:  # reported with the operation that raised it
        pytest.fail(f"{what}: expected {cls.__name__}, got {type(exc).__name__}: {exc}")
    pytest.fail(f"{what}: expected {cls.__name__}, but it returned {result!r:.200}")


def assert_names(err: BaseException, store: BlobStore, key: str) -> None:
    text = str(err)
    assert key in text, f"the error does not name the key {key!r}: {text!r}"
    assert store.location in text, f"the error does not name the location {store.location!r}: {text!r}"


# -- round trips -----------------------------------------------------------------------------


def test_round_trip_empty_and_small(store_factory: StoreFactory) -> None:
    store = store_factory()
    cases = {
        "empty": b"",
        "small/one.txt": b"hello, shardstore",
        "bin/all-bytes": bytes(range(256)) * 3,
        "unicode/é日本/x": "é".encode() * 100,
    }
    for key, data in cases.items():
        info = store.put(key, data)
        assert isinstance(info, BlobInfo)
        assert (info.key, info.size) == (key, len(data))
        assert store.get(key) == data
        st = store.stat(key)
        assert (st.key, st.size) == (key, len(data))
        assert store.exists(key)
        with store.open_read(key) as f:
            assert f.read() == data
    # put_stream of small data, from a non-seekable-looking source as well.
    info = store.put_stream("stream/small", io.BytesIO(b"streamed bytes"))
    assert info.size == len(b"streamed bytes")
    assert store.get("stream/small") == b"streamed bytes"
    info = store.put_stream("stream/empty", io.BytesIO(b""))
    assert info.size == 0
    assert store.get("stream/empty") == b""
    assert store.stat("stream/empty").size == 0
    # Ranges on the empty blob.
    assert store.get_range("empty", 0, 10) == b""
    assert store.get_range("empty", 0, 0) == b""


@pytest.fixture(scope="session")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """A 64 MiB (+ an odd tail) file of random bytes, with its size and sha256."""
    path = tmp_path_factory.mktemp("big") / "blob.bin"
    size = 64 * MiB + 1234
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(4 * MiB, left))
            digest.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return path, size, digest.hexdigest()


@pytest.mark.slow
def test_big_blob_streamed_round_trip(store_factory: StoreFactory, big_file: tuple[Path, int, str]) -> None:
    path, size, sha = big_file
    store = store_factory()
    key = "big/blob.bin"
    store.reset_metrics()
    with open(path, "rb") as f:
        info = store.put_stream(key, f)
    assert info.size == size
    assert store.metrics()["bytes_out"] == size
    st = store.stat(key)
    assert st.size == size
    digest = hashlib.sha256()
    read = 0
    with store.open_read(key) as r:
        while True:
            chunk = r.read(4 * MiB)
            if not chunk:
                break
            digest.update(chunk)
            read += len(chunk)
    assert read == size
    assert digest.hexdigest() == sha, "the 64 MiB blob read back differs from what was written"
    assert store.metrics()["bytes_in"] >= size
    # A range across the tail of the big blob: short at the end.
    with open(path, "rb") as f:
        f.seek(size - 100)
        tail = f.read()
    assert store.get_range(key, size - 100, 1000) == tail
    store.delete([key])
    assert not store.exists(key)


# -- ranges -----------------------------------------------------------------------------------


def test_get_range_edges(store_factory: StoreFactory) -> None:
    store = store_factory()
    data = bytes(i % 251 for i in range(1000))
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 0, 1000) == data
    assert store.get_range("r", 0, 10**9) == data
    assert store.get_range("r", 500, 17) == data[500:517]
    assert store.get_range("r", 999, 1) == data[999:]
    assert store.get_range("r", 999, 10) == data[999:]  # short at the end
    assert store.get_range("r", 995, 10) == data[995:]
    assert store.get_range("r", 1000, 10) == b""  # starts exactly at the end
    assert store.get_range("r", 5000, 10) == b""  # past the end
    assert store.get_range("r", 10, 0) == b""  # zero length
    assert store.get_range("r", 1000, 0) == b""
    before = store.metrics()
    for start, length in [(-1, 10), (0, -1), (-5, -5)]:
        with pytest.raises(InvalidRange) as ei:
            store.get_range("r", start, length)
        assert "r" in str(ei.value) and store.location in str(ei.value)
    assert store.metrics() == before, "an invalid range was sent to the service"
    with pytest.raises(BlobNotFound):
        store.get_range("missing", 0, 10)


# -- listing ----------------------------------------------------------------------------------

TRICKY = ["a-b", "a.b", "a/b", "a/c/d", "a0", "a~", "ab", "B", "b", "é", "日本/x", "z/y/x/w"]
N_LISTED = 1200
PLAIN = [f"k/{i:05d}" for i in range(N_LISTED - len(TRICKY))]
SIBLING_SUFFIXES = ("-sib", "0", "sib")


def blob_for(key: str) -> bytes:
    return key.encode() * 2


class Listing:
    """A store holding N_LISTED keys, with sibling roots holding a few keys each."""

    def __init__(self, factory: StoreFactory) -> None:
        self.factory = factory
        self.prefix = factory.new_prefix()
        self.store = factory(self.prefix)
        self.keys = sorted(PLAIN + TRICKY)
        self.siblings = {s: factory(self.prefix + s) for s in SIBLING_SUFFIXES}
        self.sibling_keys = ["k/00001", "zz-sibling"]
        for sib in self.siblings.values():
            for key in self.sibling_keys:
                sib.put(key, b"sibling " + key.encode())
        self.populated = False
        self.populate()

    def populate(self) -> None:
        if self.populated:
            return
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: self.store.put(k, blob_for(k)), self.keys))
        self.populated = True


@pytest.fixture(scope="module")
def listing(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    factory = make_factory(backend, request, tmp_path_factory.mktemp(f"listing-{backend}"))
    try:
        yield Listing(factory)
    finally:
        factory.close()


def test_list_all_in_lexicographic_order(listing: Listing) -> None:
    listing.populate()
    infos = list(listing.store.list())
    got = keys_of(infos)
    assert len(got) == N_LISTED, f"expected {N_LISTED} keys, got {len(got)} (a sibling root leaking in?)"
    assert got == listing.keys, "keys are not listed in exact lexicographic (code point / UTF-8 byte) order"
    # The tricky neighbours of '/' in their exact order.
    assert [k for k in got if k.startswith("a")] == ["a-b", "a.b", "a/b", "a/c/d", "a0", "ab", "a~"]
    for info in infos:
        assert info.size == len(blob_for(info.key)), info
        assert not info.key.startswith(listing.prefix), f"key {info.key!r} is not relative to the root"


def test_list_prefixes(listing: Listing) -> None:
    listing.populate()
    store = listing.store
    assert keys_of(store.list("a/")) == ["a/b", "a/c/d"]
    assert keys_of(store.list("a")) == ["a-b", "a.b", "a/b", "a/c/d", "a0", "ab", "a~"]
    assert keys_of(store.list("a/c")) == ["a/c/d"]
    assert keys_of(store.list("k/0001")) == [f"k/0001{i}" for i in range(10)]
    assert keys_of(store.list("é")) == ["é"]
    assert keys_of(store.list("日本/")) == ["日本/x"]
    assert keys_of(store.list("z/y/")) == ["z/y/x/w"]
    assert keys_of(store.list("B")) == ["B"]
    assert list(store.list("nothing-here/")) == []
    assert list(store.list("k/99")) == []
    assert len(list(store.list("k/"))) == len(PLAIN)


def test_list_start_after(listing: Listing) -> None:
    listing.populate()
    store, keys = listing.store, listing.keys
    assert keys_of(store.list(start_after="k/00500")) == [k for k in keys if k > "k/00500"]
    assert keys_of(store.list("k/", start_after="k/01000")) == [k for k in PLAIN if k > "k/01000"]
    # start_after between existing keys, and before / after the prefix's range.
    assert keys_of(store.list("a", start_after="a.c")) == ["a/b", "a/c/d", "a0", "ab", "a~"]
    assert keys_of(store.list("a/", start_after="a")) == ["a/b", "a/c/d"]
    assert keys_of(store.list("k/", start_after="B")) == PLAIN
    assert list(store.list("a/", start_after="a/z")) == []
    assert list(store.list(start_after=keys[-1])) == []
    # Resuming from every page boundary gives the rest, in order.
    assert keys_of(store.list(start_after=keys[999])) == keys[1000:]


def test_list_requests_per_page(listing: Listing) -> None:
    """Listing 1,200 keys takes 2 pages where a page holds at most 1,000 keys."""
    listing.populate()
    backend = listing.factory.backend
    # Pages of 1,000 everywhere (S3 and GCS cap a page there; azure and memory are set to it);
    # the local store walks the tree in one pass, counted as one request.
    expected = {"memory": 2, "s3": 2, "oci": 2, "gcs": 2, "azure": 2, "file": 1}
    if listing.factory.is_cloud:
        proxy = listing.factory.proxy()
        store = listing.factory(listing.prefix, via=proxy)
    else:
        proxy, store = None, listing.store
    store.reset_metrics()
    assert len(list(store.list())) == N_LISTED
    m = store.metrics()
    lists = m["requests"]["list"]
    assert lists == expected[backend], f"{backend}: {lists} list requests for {N_LISTED} keys"
    assert sum(m["requests"].values()) == lists, m
    if proxy is not None:
        assert proxy.total_requests == lists, (
            f"{backend}: metrics count {lists} list requests, the service saw {proxy.requests}"
        )
    # An empty listing still asks once.
    store.reset_metrics()
    assert list(store.list("nothing-here/")) == []
    assert store.metrics()["requests"]["list"] == 1


def test_list_sees_nothing_outside_its_root(listing: Listing) -> None:
    listing.populate()
    got = keys_of(listing.store.list())
    assert "zz-sibling" not in got
    assert got.count("k/00001") == 1
    for suffix, sib in listing.siblings.items():
        assert keys_of(sib.list()) == listing.sibling_keys, f"sibling root {listing.prefix + suffix!r}"
        assert keys_of(sib.list("k/")) == ["k/00001"]
        assert sib.get("k/00001") == b"sibling k/00001"
    assert listing.store.get("k/00001") == blob_for("k/00001")
    assert not listing.store.exists("zz-sibling")


def test_delete_batched_over_1000_keys_and_missing_ignored(listing: Listing) -> None:
    """Runs after the listing tests of its backend (it empties the shared store)."""
    listing.populate()
    factory = listing.factory
    backend = factory.backend
    missing = ["missing/1", "k/99999", "zzz-not-there"]
    if factory.is_cloud:
        proxy = factory.proxy()
        store = factory(listing.prefix, via=proxy)
    else:
        proxy, store = None, listing.store
    store.reset_metrics()
    store.delete(listing.keys + missing)
    listing.populated = False
    m = store.metrics()
    deletes = m["requests"]["delete"]
    # S3's DeleteObjects takes at most 1,000 keys; memory pages the same way.  GCS batch
    # requests and Azure Blob Batch are not served by the emulators: one DELETE per key
    # there (the proxy check below confirms the service saw exactly that many).
    n = len(listing.keys) + len(missing)
    expected = {"memory": 2, "s3": 2, "oci": 2, "file": 1, "gcs": n, "azure": n}
    assert deletes == expected[backend], f"{backend}: {deletes} delete requests for {n} keys"
    if proxy is not None:
        assert proxy.total_requests == sum(m["requests"].values()), (
            f"{backend}: metrics {m['requests']} but the service saw {proxy.requests}"
        )
    assert list(listing.store.list()) == []
    for key in ("a/b", "k/00000", "é"):
        assert not listing.store.exists(key)
    # The siblings were not touched.
    for sib in listing.siblings.values():
        assert keys_of(sib.list()) == listing.sibling_keys
    # Deleting only missing keys, and nothing at all, is fine.
    store.delete(missing)
    store.delete([])


# -- missing keys and invalid keys -------------------------------------------------------------


def test_missing_keys_raise_blob_not_found(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put("dir/inside", b"x")  # "dir" is a prefix, not a blob
    for key in ("nope", "dir", "deep/er/nope"):
        for name, call in [
            ("get", lambda k: store.get(k)),
            ("stat", lambda k: store.stat(k)),
            ("get_range", lambda k: store.get_range(k, 0, 10)),
            ("open_read", lambda k: store.open_read(k)),
        ]:
            err = expect(BlobNotFound, lambda: call(key), f"{name}({key!r})")
            assert err.key == key, f"{name}({key!r})"
            assert_names(err, store, key)
            assert isinstance(err, LookupError)
        assert store.exists(key) is False, f"exists({key!r})"
    assert store.exists("dir/inside") is True


BAD_KEYS = [
    "",
    ".",
    "..",
    "../escape",
    "a/../b",
    "a/./b",
    "/absolute",
    "a//b",
    "trailing/",
    "back\\slash",
    "nul\x00byte",
    "new\nline",
    "tab\tkey",
    "del\x7f",
    "x" * 1025,
]


def test_invalid_keys_rejected_before_any_request(store_factory: StoreFactory) -> None:
    proxy = store_factory.proxy() if store_factory.is_cloud else None
    store = store_factory(via=proxy) if proxy else store_factory()
    store.put("good", b"g")
    store.reset_metrics()
    seen = proxy.total_requests if proxy else 0
    for bad in BAD_KEYS:
        for name, call in [
            ("put", lambda k: store.put(k, b"x")),
            ("put if_absent", lambda k: store.put(k, b"x", if_absent=True)),
            ("put_stream", lambda k: store.put_stream(k, io.BytesIO(b"x"))),
            ("get", lambda k: store.get(k)),
            ("get_range", lambda k: store.get_range(k, 0, 1)),
            ("open_read", lambda k: store.open_read(k)),
            ("stat", lambda k: store.stat(k)),
            ("exists", lambda k: store.exists(k)),
            ("delete", lambda k: store.delete(["good", k])),
        ]:
            err = expect(InvalidKey, lambda: call(bad), f"{name}({bad!r})")
            assert store.location in str(err), f"{name}({bad!r}): {err}"
    for prefix in ["/", "/abs", "../x", "a//", "a\\b"]:
        with pytest.raises(InvalidKey):
            list(store.list(prefix))
    m = store.metrics()
    assert sum(m["requests"].values()) == 0, f"invalid keys reached the service: {m}"
    assert (m["bytes_in"], m["bytes_out"], m["retries"]) == (0, 0, 0), m
    if proxy is not None:
        assert proxy.total_requests == seen, f"requests reached the service: {proxy.log[-5:]}"
    assert store.get("good") == b"g", "a delete with an invalid key deleted the valid one"


# -- writes: conditional create, overwrite, version tags ---------------------------------------


def test_conditional_create_race(store_factory: StoreFactory) -> None:
    shared = store_factory()
    prefix = store_factory.last_prefix
    own = [store_factory(prefix) for _ in range(8)]  # one store per writer, as separate processes
    for rnd in range(5):
        key = f"race/{rnd}"
        stores = [shared] * 8 if rnd < 3 else own
        barrier = threading.Barrier(8)
        results: list[Any] = [None] * 8

        def racer(i: int) -> None:
            data = f"writer {i} round {rnd} ".encode() * (i + 1)
            barrier.wait()
            try:
                results[i] = ("won", stores[i].put(key, data, if_absent=True), data)
            except BaseException as exc:  # recorded, checked below
                results[i] = ("lost", exc, data)

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        winners = [r for r in results if r[0] == "won"]
        losers = [r for r in results if r[0] == "lost"]
        assert len(winners) == 1, f"round {rnd}: {len(winners)} writers won the conditional create"
        for _, exc, _ in losers:
            assert isinstance(exc, BlobAlreadyExists), f"round {rnd}: a loser got {exc!r}"
            assert_names(exc, shared, key)
        _, info, data = winners[0]
        assert info.size == len(data)
        assert shared.get(key) == data, f"round {rnd}: the stored bytes are not the winner's"
        assert shared.stat(key).size == len(data)


def test_overwrite_changes_size_and_version_tag(store_factory: StoreFactory) -> None:
    store = store_factory()
    first = store.put("v", b"one", if_absent=True)
    s1 = store.stat("v")
    assert s1.etag_or_generation, "stat gives no etag/generation"
    assert first.etag_or_generation == s1.etag_or_generation
    with pytest.raises(BlobAlreadyExists):
        store.put("v", b"other", if_absent=True)
    assert store.get("v") == b"one"
    second = store.put("v", b"second")  # no if_absent: overwrites
    s2 = store.stat("v")
    assert store.get("v") == b"second"
    assert s2.size == 6 and s2.etag_or_generation != s1.etag_or_generation
    assert second.etag_or_generation == s2.etag_or_generation
    store.put("v", b"third!")  # same size, other bytes
    s3 = store.stat("v")
    assert s3.size == 6 and s3.etag_or_generation not in (s1.etag_or_generation, s2.etag_or_generation)
    assert store.get("v") == b"third!"
    streamed = store.put_stream("v", io.BytesIO(b"fourth, streamed"))
    s4 = store.stat("v")
    assert s4.size == len(b"fourth, streamed") and s4.etag_or_generation != s3.etag_or_generation
    assert streamed.etag_or_generation == s4.etag_or_generation
    with pytest.raises(BlobAlreadyExists):
        store.put_stream("v", io.BytesIO(b"nope"), if_absent=True)
    assert store.get("v") == b"fourth, streamed"


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_count_real_requests_and_bytes(store_factory: StoreFactory) -> None:
    proxy = store_factory.proxy() if store_factory.is_cloud else None
    store = store_factory(via=proxy) if proxy else store_factory()
    sizes = [0, 1, 100, 4096, 70_000]
    store.reset_metrics()
    if proxy:
        proxy.reset_counts()

    def check(expect_requests: dict[str, int], **expect: int) -> None:
        m = store.metrics()
        got = {k: v for k, v in m["requests"].items() if v}
        assert got == expect_requests, f"requests: {got}, expected {expect_requests}"
        for name, value in expect.items():
            assert m[name] == value, f"{name}: {m[name]}, expected {value}"
        if proxy:
            assert proxy.total_requests == sum(got.values()), (
                f"metrics count {got}; the service saw {proxy.requests}: {proxy.log}"
            )

    for i, n in enumerate(sizes):
        store.put(f"m/{i}", bytes([i]) * n)
    check({"put": 5}, bytes_out=sum(sizes), bytes_in=0)
    for i, n in enumerate(sizes):
        assert len(store.get(f"m/{i}")) == n
    # Azure's SDK opens every download with a ranged GET; an empty blob answers it 416 and
    # the SDK asks again without a range: two real requests, and the metrics say so.
    g = 6 if store_factory.backend == "azure" else 5
    check({"put": 5, "get": g}, bytes_out=sum(sizes), bytes_in=sum(sizes))
    assert store.get_range("m/4", 10, 300) == bytes([4]) * 300
    check({"put": 5, "get": g + 1}, bytes_in=sum(sizes) + 300)
    assert store.stat("m/3").size == 4096
    assert store.exists("m/2") and not store.exists("m/none")
    check({"put": 5, "get": g + 1, "head": 3})
    assert len(list(store.list("m/"))) == 5
    check({"put": 5, "get": g + 1, "head": 3, "list": 1})
    store.put("m/new", b"abc", if_absent=True)
    check({"put": 6, "get": g + 1, "head": 3, "list": 1}, bytes_out=sum(sizes) + 3)
    m = store.metrics()
    assert (m["retries"], m["throttles"]) == (0, 0)
    store.reset_metrics()
    m = store.metrics()
    assert sum(m["requests"].values()) == 0 and m["bytes_in"] == m["bytes_out"] == 0


# -- retries ------------------------------------------------------------------------------------


def test_retries_of_injected_faults_on_every_backend(store_factory: StoreFactory) -> None:
    """RetryingStore over FaultyStore over the backend, for all six backends.

    FaultyStore (in-process, fake errors) because memory and file have no service that
    could throttle, and this checks the composition uniformly; the cloud backends also
    get real HTTP throttling in test_retries_of_real_http_throttling.
    """
    faulty = FaultyStore(store_factory(raw=True))
    store = RetryingStore(faulty, FAST_RETRY)
    store.put("f/a", b"payload")
    ops: list[tuple[str, Callable[[], Any], Any]] = [
        ("put", lambda: store.put("f/b", b"bee").size, 3),
        ("get", lambda: store.get("f/a"), b"payload"),
        ("get_range", lambda: store.get_range("f/a", 1, 3), b"ayl"),
        ("stat", lambda: store.stat("f/a").size, 7),
        ("open_read", lambda: read_and_close(store.open_read("f/a")), b"payload"),
        ("list", lambda: keys_of(store.list("f/")), ["f/a", "f/b"]),
        ("delete", lambda: store.delete(["f/b"]), None),
    ]
    for op, call, expected in ops:
        before = store.metrics()
        faulty.inject(op=op, action="fail", error=Throttled, times=2)
        assert call() == expected, op
        after = store.metrics()
        assert after["retries"] - before["retries"] == 2, op
        assert after["throttles"] - before["throttles"] == 2, op
    assert not faulty.inner.exists("f/b")
    # A transient error that is not throttling: retried, not counted as a throttle.
    before = store.metrics()
    faulty.inject(op="get", action="fail", error=TransientError, times=1)
    assert store.get("f/a") == b"payload"
    after = store.metrics()
    assert (after["retries"] - before["retries"], after["throttles"] - before["throttles"]) == (1, 0)
    # More failures than attempts: the last Throttled is raised, with a note.
    faulty.inject(op="get", action="fail", error=Throttled, times=10)
    with pytest.raises(Throttled) as ei:
        store.get("f/a")
    assert any("gave up after 5 attempt" in n for n in getattr(ei.value, "__notes__", []))
    assert_names(ei.value, store, "f/a")
    faulty.clear()
    # Permanent errors are not retried.
    before = store.metrics()
    with pytest.raises(BlobNotFound):
        store.get("f/none")
    assert store.metrics()["retries"] == before["retries"]


def _list_path(flavor: str) -> str:
    return {"s3": r"list-type=2", "oci": r"list-type=2", "gcs": r"/o\?", "azure": r"comp=list"}[flavor]


@cloud_only
def test_retries_of_real_http_throttling(store_factory: StoreFactory) -> None:
    """The proxy answers with the service's own 503 SlowDown / 429 / 503 ServerBusy."""
    proxy = store_factory.proxy()
    store = store_factory(via=proxy, **FAST_RETRY_OPTIONS)
    prefix = store_factory.last_prefix
    kind = store_factory.backend

    def throttled_call(n: int, call: Callable[[], Any], method: str | None = None, path: str | None = None) -> Any:
        before, sent = store.metrics(), sum(proxy.throttled.values())
        proxy.throttle(n, method=method, path=path)
        result = call()
        after = store.metrics()
        assert proxy.pending() == 0, "the throttles were never requested"
        assert sum(proxy.throttled.values()) - sent == n
        assert after["retries"] - before["retries"] == n, f"retries: {after['retries'] - before['retries']}, expected {n}"
        assert after["throttles"] - before["throttles"] == n, (
            f"throttles: {after['throttles'] - before['throttles']}, expected {n} "
            "(did the SDK retry by itself, or was the reply not translated to Throttled?)"
        )
        return result

    # A GCS upload names the object in its body, not its URL: match any upload there.
    upload = r"/upload/" if kind == "gcs" else None
    assert throttled_call(2, lambda: store.put("thr-a", b"alpha").size, path=upload or "thr-a") == 5
    assert throttled_call(2, lambda: store.get("thr-a"), path="thr-a") == b"alpha"
    assert throttled_call(1, lambda: store.get_range("thr-a", 1, 2), path="thr-a") == b"lp"
    assert throttled_call(2, lambda: store.stat("thr-a").size, path="thr-a") == 5
    assert throttled_call(1, lambda: store.put("thr-c", b"cond", if_absent=True).size, path=upload or "thr-c") == 4
    assert throttled_call(2, lambda: keys_of(store.list()), method="GET", path=_list_path(kind)) == ["thr-a", "thr-c"]
    # Delete: S3 sends POST ?delete (keys in the body); others name the key or batch.
    delete_path = {"s3": r"\?delete", "oci": r"\?delete", "gcs": r"thr-c|batch", "azure": r"thr-c|comp=batch"}[kind]
    throttled_call(1, lambda: store.delete(["thr-c"]), path=delete_path)
    assert not store.exists("thr-c")

    # With a single attempt the Throttled error surfaces, naming location and key.
    once = store_factory(prefix, via=proxy, retry_attempts=1)
    for name, call, path in [
        ("get", lambda: once.get("thr-a"), "thr-a"),
        ("stat", lambda: once.stat("thr-a"), "thr-a"),
        ("put", lambda: once.put("thr-a", b"again"), upload or "thr-a"),
    ]:
        sent = sum(proxy.throttled.values())
        proxy.throttle(1, path=path)
        with pytest.raises(Throttled) as ei:
            call()
        assert sum(proxy.throttled.values()) - sent == 1, name
        assert ei.value.key == "thr-a", name
        assert_names(ei.value, once, "thr-a")
        assert ei.value.retryable
        assert once.metrics()["throttles"] >= 1
    assert store.get("thr-a") == b"alpha", "a throttled put changed the blob"


# -- the ambiguous conditional put -------------------------------------------------------------


def test_ambiguous_conditional_put_retry(store_factory: StoreFactory) -> None:
    """A conditional put whose reply is lost is retried; its own landed write counts as success.

    FaultyStore's crash_after (the write lands, then the reply is "lost") because neither
    memory nor file can lose a reply; the cloud backends also get the real thing, a
    dropped HTTP reply, in test_ambiguous_conditional_put_over_http.
    """
    backend = store_factory.backend
    raw = store_factory(raw=True)
    prefix = store_factory.last_prefix
    faulty = FaultyStore(raw)
    store = RetryingStore(faulty, FAST_RETRY)

    faulty.inject(op="put", action="crash_after", times=1)
    info = store.put("amb/own", b"my bytes", if_absent=True)
    assert info.size == len(b"my bytes")
    assert raw.get("amb/own") == b"my bytes"
    assert store.metrics()["retries"] == 1
    assert faulty.metrics()["injected_faults"] == 1

    # Another writer's blob (same size, other bytes) is a real conflict, ambiguity or not.
    other = store_factory(prefix, raw=True)
    other.put("amb/theirs", b"THEIR bytes", if_absent=True, token="someone-else/1")
    faulty.inject(op="put", action="crash_before", times=1)
    with pytest.raises(BlobAlreadyExists) as ei:
        store.put("amb/theirs", b"our  bytes!", if_absent=True)
    assert_names(ei.value, store, "amb/theirs")
    assert raw.get("amb/theirs") == b"THEIR bytes"

    # Same bytes written by another writer: told apart by the stored writer token where
    # the service keeps metadata; the local filesystem compares bytes (documented).
    other.put("amb/same", b"identical", if_absent=True, token="someone-else/2")
    faulty.inject(op="put", action="crash_before", times=1)
    if backend == "file":
        assert store.put("amb/same", b"identical", if_absent=True).size == 9
    else:
        with pytest.raises(BlobAlreadyExists):
            store.put("amb/same", b"identical", if_absent=True)

    # A streamed conditional put whose reply is lost: the token recognises it; without
    # metadata (file) a consumed stream cannot be compared, so it is a conflict.
    faulty.inject(op="put_stream", action="crash_after", times=1)
    if backend == "file":
        with pytest.raises(BlobAlreadyExists):
            store.put_stream("amb/stream", io.BytesIO(b"streamed"), if_absent=True)
    else:
        assert store.put_stream("amb/stream", io.BytesIO(b"streamed"), if_absent=True).size == 8
    assert raw.get("amb/stream") == b"streamed"


@cloud_only
def test_ambiguous_conditional_put_over_http(store_factory: StoreFactory) -> None:
    """The proxy forwards the conditional put (it lands) and drops the reply."""
    proxy = store_factory.proxy()
    store = store_factory(via=proxy, **FAST_RETRY_OPTIONS)
    upload = r"/upload/" if store_factory.backend == "gcs" else None  # GCS: the name is in the body
    proxy.drop_reply(1, path=upload or "amb-own")
    info = store.put("amb-own", b"my bytes", if_absent=True)
    assert sum(proxy.dropped.values()) == 1, proxy.log
    assert info.size == 8
    assert store.get("amb-own") == b"my bytes"
    assert any(status < 0 for _, _, status in proxy.log), "the dropped request never reached the service"
    # Somebody else's blob: the dropped reply was a 412; the retry must still conflict.
    store_factory(store_factory.last_prefix, raw=True).put("amb-theirs", b"theirs", if_absent=True, token="x/1")
    proxy.drop_reply(1, path=upload or "amb-theirs")
    with pytest.raises(BlobAlreadyExists):
        store.put("amb-theirs", b"ours!!", if_absent=True)
    assert store.get("amb-theirs") == b"theirs"


# -- secrets and pickling -----------------------------------------------------------------------

SECRET_KEY_ID = "AKIAXSHARDSTORELEAK01"
SECRET = "SsLeakCheck0Secret/xyzzy+plugh42QQ"
GCS_TOKEN = "ya29.shardstore-leak-check-TOKEN-0123456789"


def _secret_options(factory: StoreFactory, via: Any) -> tuple[dict[str, Any], list[str]]:
    """Options with a distinctive secret for this backend, and the strings that must not leak."""
    from shardstore.testing.emulators import AZURITE_KEY

    opts = factory.options(via)
    kind = factory.backend
    if kind in ("s3", "oci"):
        opts.update(key=SECRET_KEY_ID, secret=SECRET)
        return opts, [SECRET, SECRET[:16]]
    if kind == "gcs":
        opts.update(token=GCS_TOKEN)
        return opts, [GCS_TOKEN, GCS_TOKEN[5:25]]
    # Azure: the account key in the connection string (Azurite's, but distinctive).
    return opts, [AZURITE_KEY, AZURITE_KEY[:20]]


@cloud_only
def test_secrets_never_leak(
    store_factory: StoreFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gcsfs would ask Google for a raw token's expiry; the emulator accepts any token.
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")
    caplog.set_level(logging.DEBUG)
    proxy = store_factory.proxy()
    opts, secrets = _secret_options(store_factory, proxy)
    prefix = store_factory.new_prefix()
    url = store_factory.url(prefix)
    store = open_store(url, **opts, retry_attempts=1)
    texts = [repr(store), str(store), store.location]

    store.put("s/a", b"secret test")
    assert store.get("s/a") == b"secret test"
    assert [i.key for i in store.list("s/")] == ["s/a"]
    errors: list[BaseException] = []
    for call in [
        lambda: store.get("s/missing"),
        lambda: store.stat("s/missing"),
        lambda: store.put("s/a", b"x", if_absent=True),
        lambda: store.get("../escape"),
        lambda: open_store(url, **opts, not_an_option=1),
    ]:
        with pytest.raises(Exception) as ei:
            call()
        errors.append(ei.value)
    proxy.throttle(1, method="GET", path="s/a|s%2Fa")
    with pytest.raises(Throttled) as ei:
        store.get("s/a")
    errors.append(ei.value)
    assert isinstance(errors[0], BlobNotFound) and isinstance(errors[2], BlobAlreadyExists)
    assert isinstance(errors[3], InvalidKey) and isinstance(errors[4], ConfigError)
    for err in errors:
        texts.append(str(err))
        texts.append("".join(traceback.format_exception(err)))  # causes, contexts, notes

    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("s/a") == b"secret test"
    texts += [repr(clone), str(clone), repr(getattr(clone, "inner", clone))]
    texts.append(caplog.text)
    texts += [r.getMessage() for r in caplog.records]
    assert caplog.records, "nothing was logged at DEBUG: the log check would be vacuous"
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"a secret leaked into: {text[:3000]}"


def test_pickle_round_trip(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put("p/x", b"pickled")
    blob = pickle.dumps(store)
    assert len(blob) < 4096, f"a pickled store takes {len(blob)} bytes"
    clone = pickle.loads(blob)
    assert clone.location == store.location
    assert clone.get("p/x") == b"pickled"
    clone.put("p/y", b"from the clone", if_absent=True)
    assert store.get("p/y") == b"from the clone"
    assert keys_of(clone.list("p/")) == ["p/x", "p/y"]
    # The bare backend pickles too, also after it has made requests (live clients).
    raw = store_factory(store_factory.last_prefix, raw=True)
    assert raw.get("p/x") == b"pickled"
    raw_blob = pickle.dumps(raw)
    assert len(raw_blob) < 4096
    assert pickle.loads(raw_blob).get("p/y") == b"from the clone"
    assert pickle.loads(raw_blob).metrics()["requests"]["get"] == 0
