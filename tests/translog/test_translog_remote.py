"""The remote translog: uploads, request durability, replay without a disk, corruption, purge."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.blobstores import open_backend
from shardstore.errors import UnsupportedFormatVersion
from shardstore.testing import FaultRule, FaultyStore
from shardstore.translog.errors import TranslogCorruptedError, TranslogError, TranslogUnavailable
from shardstore.translog.local import LocalTranslog
from shardstore.translog.operations import index_batch, stamp
from shardstore.translog.remote import RemoteTranslog
from shardstore.translog.remote_metadata import (
    RemoteGeneration,
    RemoteTranslogMetadata,
    decode_metadata,
    encode_metadata,
    metadata_key,
    parse_metadata_key,
)

REMOTE = pytest.mark.parametrize("backend", ["memory", "file", "s3"], indirect=True)
PREFIX = "c-uuid/1/i-uuid/0/translog"


def ops(first: int, n: int, term: int = 1, tag: str = "") -> pa.RecordBatch:
    ids = [f"d{first + i}" for i in range(n)]
    return stamp(index_batch(ids, [f'{{"v":"{tag}{first + i}"}}'.encode() for i in range(n)]), first, term)


def rows(batches) -> list[tuple[int, int, str]]:
    out = []
    for b in batches:
        out += zip(b.column("seq_no").to_pylist(), b.column("primary_term").to_pylist(), b.column("source").to_pylist())
    return [(s, t, bytes(src).decode() if src is not None else "") for s, t, src in out]


def seqs(batches) -> list[int]:
    return [s for b in batches for s in b.column("seq_no").to_pylist()]


def metadata_keys(store, prefix: str = PREFIX) -> list[str]:
    return [b.key for b in store.list(f"{prefix}/metadata/")]


def puts(store) -> int:
    return store.metrics()["requests"]["put"]


# --------------------------------------------------------------------------- metadata codec and keys


def _md() -> RemoteTranslogMetadata:
    e = RemoteGeneration(3, 2, "p/data/2/3__x.tlog", 123, 0xDEADBEEF, 0, 9, 10, -2)
    return RemoteTranslogMetadata(2, 3, uuid.uuid4(), 0, 9, 5, 3, (e,))


def test_metadata_round_trip_and_damage() -> None:
    md = _md()
    raw = encode_metadata(md)
    assert raw[:4] == b"SSRM"
    assert decode_metadata(raw, "k") == md
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x10
        with pytest.raises(TranslogCorruptedError) as exc:
            decode_metadata(bytes(bad), "the/key")
        assert "the/key" in str(exc.value)
    with pytest.raises(TranslogCorruptedError, match="the/key"):
        decode_metadata(raw[:-1], "the/key")


def test_metadata_newer_version_is_refused() -> None:
    import struct

    import google_crc32c

    from shardstore.translog.remote_metadata import FORMAT_VERSION

    raw = bytearray(encode_metadata(_md()))
    struct.pack_into("<H", raw, 4, FORMAT_VERSION + 1)
    body = bytes(raw[:-4])
    raw = body + struct.pack("<I", google_crc32c.value(body))
    with pytest.raises(UnsupportedFormatVersion):
        decode_metadata(raw, "k")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)), min_size=1, max_size=20))
def test_metadata_key_newest_sorts_first(pairs: list[tuple[int, int]]) -> None:
    keys = sorted(metadata_key(t, g, "w") for t, g in pairs)
    assert parse_metadata_key(keys[0])[:2] == max(pairs)
    assert [parse_metadata_key(k)[:2] for k in keys] == sorted(pairs, reverse=True)


# --------------------------------------------------------------------------- uploads and replay


@REMOTE
def test_upload_round_trip_and_empty_disk_reader(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        local.add(ops(0, 50))
        store.reset_metrics()
        md = remote.upload()
        assert puts(store) == 2  # one data blob, one metadata blob
        assert [e.generation for e in md.entries] == [1]
        assert md.max_seq_no == 49
        local.add(ops(50, 25))
        store.reset_metrics()
        md = remote.upload()
        assert puts(store) == 2
        assert [e.generation for e in md.entries] == [1, 2]
        store.reset_metrics()
        assert remote.upload() == md  # nothing new: no PUT
        assert puts(store) == 0
    local.close()
    # a new node: empty disk, only the store
    reader = store_factory(prefix=store_factory.last_prefix)
    got = rows(RemoteTranslog.read_operations(reader, PREFIX, 0))
    assert [s for s, _, _ in got] == list(range(75))
    assert seqs(RemoteTranslog.read_operations(reader, PREFIX, 10, 19)) == list(range(10, 20))
    assert list(RemoteTranslog.read_operations(reader, "other/prefix", 0)) == []


@REMOTE
def test_several_sealed_generations_upload_each(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1, generation_bytes=1)  # roll after every add
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        for i in range(4):
            local.add(ops(i * 5, 5))
        store.reset_metrics()
        md = remote.upload()
        assert [e.generation for e in md.entries] == [1, 2, 3, 4]
        assert puts(store) == 4 + 1  # one per pending generation, one metadata
    local.close()
    assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(20))


@REMOTE
def test_add_acknowledges_only_after_metadata_landed(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.05) as remote:
        assert metadata_keys(store) == []
        gen, _ = remote.add(ops(0, 10))
        keys = metadata_keys(store)
        assert keys, "add returned before any metadata blob existed"
        md = decode_metadata(store.get(keys[0]), keys[0])
        assert md.generation >= gen and md.max_seq_no == 9
        # everything acknowledged is readable from the store alone
        assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(10))
    local.close()


@REMOTE
def test_concurrent_adders_share_uploads(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    n_threads, per_thread, bulk = 8, 5, 10
    counter = iter(range(0, 10**9, bulk))
    lock = threading.Lock()
    acked: list[int] = []
    errors: list[BaseException] = []

    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.1) as remote:
        store.reset_metrics()
        uploads_before = remote.uploads

        def work() -> None:
            try:
                for _ in range(per_thread):
                    with lock:
                        first = next(counter)
                        batch = ops(first, bulk)
                    remote.add(batch)
                    with lock:
                        acked.extend(range(first, first + bulk))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        uploads = remote.uploads - uploads_before
        n_puts = puts(store)
    local.close()
    total_adds = n_threads * per_thread
    assert uploads < total_adds / 2, f"{uploads} uploads for {total_adds} adds: not shared"
    assert n_puts <= 2 * uploads, f"{n_puts} PUTs for {uploads} uploads"
    assert sorted(seqs(RemoteTranslog.read_operations(store, PREFIX, 0))) == sorted(acked)
    print(f"\n[{store_factory.backend}] {total_adds} adds -> {uploads} uploads, {n_puts} PUTs")


@REMOTE
def test_failing_store_raises_unavailable_and_acknowledges_nothing(store_factory, tmp_path: Path) -> None:
    store_factory()  # pick a root
    prefix = store_factory.last_prefix
    inner = open_backend(store_factory.url(prefix), **store_factory.options())
    faulty = FaultyStore(inner, [FaultRule(op=("put", "put_stream"), times=None)])
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, faulty, PREFIX, buffer_interval=0.01, upload_timeout=1.0) as remote:
        started = time.monotonic()
        with pytest.raises(TranslogUnavailable, match="NOT acknowledged"):
            remote.add(ops(0, 5))
        assert time.monotonic() - started < 3.0
        assert remote.uploaded_through < local.generation
        assert metadata_keys(inner) == []
    local.close()
    assert list(RemoteTranslog.read_operations(inner, PREFIX, 0)) == []
    inner.close()


@REMOTE
def test_corrupt_data_blob_names_the_key(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        local.add(ops(0, 20))
        md = remote.upload()
    local.close()
    key = md.entries[0].blob_key
    good = store.get(key)
    # same size, one flipped bit
    store.delete([key])
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    store.put(key, bytes(flipped))
    with pytest.raises(TranslogCorruptedError) as exc:
        list(RemoteTranslog.read_operations(store, PREFIX, 0))
    assert key in str(exc.value)
    # different bytes, different size
    store.delete([key])
    store.put(key, good[:-7])
    with pytest.raises(TranslogCorruptedError, match=key):
        list(RemoteTranslog.read_operations(store, PREFIX, 0))
    # a corrupt metadata blob is named too
    store.delete([key])
    store.put(key, good)
    mkey = metadata_keys(store)[0]
    raw = bytearray(store.get(mkey))
    raw[10] ^= 0x40
    store.delete([mkey])
    store.put(mkey, bytes(raw))
    with pytest.raises(TranslogCorruptedError, match=mkey):
        list(RemoteTranslog.read_operations(store, PREFIX, 0))


@REMOTE
def test_terms_and_trims_resolve_like_the_local_log(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        remote.add(ops(0, 10, term=1, tag="a"))
        remote.trim_operations_above(4, 2)  # promotion: term-1 ops above 4 are dropped
        remote.add(ops(5, 3, term=2, tag="b"))  # term 2 re-issues 5..7
        remote.add(ops(3, 1, term=2, tag="c"))  # and overrides 3
        expected = rows(local.read_operations(0))
    local.close()
    got = rows(RemoteTranslog.read_operations(store, PREFIX, 0))
    assert got == expected
    assert [s for s, _, _ in got] == list(range(8))
    assert got[3] == (3, 2, '{"v":"c3"}')
    assert got[5][1] == 2


@REMOTE
def test_restart_resumes_from_the_latest_metadata(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    d = str(tmp_path / "tl")
    local = LocalTranslog(d, primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        remote.add(ops(0, 10))
        first = remote.uploaded_generations
    local.close()
    local = LocalTranslog(d, primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        assert remote.uploaded_generations == first
        store.reset_metrics()
        remote.add(ops(10, 10))
        assert puts(store) == 2  # nothing re-uploaded
        assert [e.generation for e in remote.uploaded_generations][: len(first)] == [e.generation for e in first]
    local.close()
    assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(20))


# --------------------------------------------------------------------------- purge


@REMOTE
def test_purge_keeps_ops_above_the_remote_commit(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01, keep_metadata=3) as remote:
        for i in range(6):
            remote.add(ops(i * 10, 10))  # generations of 10 ops each
        gens = remote.uploaded_generations
        assert len(gens) == 6
        doomed = remote.purge(remote_commit_local_checkpoint=34, remote_commit_primary_term=1)
        assert doomed == {gens[0].generation, gens[1].generation, gens[2].generation}
        for e in gens:
            assert store.exists(e.blob_key) == (e.generation not in doomed)
        assert len(metadata_keys(store)) <= 3
        got = seqs(RemoteTranslog.read_operations(store, PREFIX, 0))
        assert got == list(range(30, 60))  # everything above 34 (and the rest of its generation) kept
        # a commit of a lower term covers nothing of term 2
        remote.add(ops(60, 5, term=2))
        assert remote.purge(remote_commit_local_checkpoint=100, remote_commit_primary_term=1) == {
            e.generation for e in gens[3:]
        }
        assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(60, 65))
    local.close()


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 1)), min_size=1, max_size=6),
    checkpoint=st.integers(-1, 40),
    commit_term_bump=st.integers(0, 2),
)
def test_purge_never_drops_ops_above_the_commit(tmp_path_factory, sizes, checkpoint, commit_term_bump) -> None:
    from shardstore.blobstores import open_store

    tmp = tmp_path_factory.mktemp("p")
    space = f"purge-{uuid.uuid4().hex[:8]}"
    store = open_store(f"memory://{space}/r")
    local = LocalTranslog(str(tmp / "tl"), primary_term=1)
    term, seq = 1, 0
    written: dict[int, int] = {}
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.0) as remote:
        for n, bump in sizes:
            term += bump
            remote.add(ops(seq, n, term=term))
            for s in range(seq, seq + n):
                written[s] = term
            seq += n
        commit_term = 1 + commit_term_bump
        remote.purge(checkpoint, commit_term)
        left = {s: t for b in RemoteTranslog.read_operations(store, PREFIX, 0)
                for s, t in zip(b.column("seq_no").to_pylist(), b.column("primary_term").to_pylist())}
    local.close()
    store.close()
    from shardstore.plugins.memory import MemoryStore

    MemoryStore.drop(space)
    for s, t in written.items():
        if s > checkpoint or t > commit_term:
            assert left.get(s) == t, f"op {s} (term {t}) purged by a commit at {checkpoint} term {commit_term}"


@pytest.mark.parametrize("backend", ["memory"], indirect=True)
def test_refuses_a_prefix_whose_newest_metadata_it_cannot_sort_ahead_of(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    a = LocalTranslog(str(tmp_path / "a"), primary_term=1)
    with RemoteTranslog(a, store, PREFIX, buffer_interval=0.01) as remote:
        remote.add(ops(0, 3))
    a.close()
    b = LocalTranslog(str(tmp_path / "b"), primary_term=1)  # another translog, same term, generation 1
    with pytest.raises(TranslogError, match="would not sort ahead"):
        RemoteTranslog(b, store, PREFIX)
    b.close()
    c = LocalTranslog(str(tmp_path / "c"), primary_term=2)  # a newer term sorts first: allowed
    with RemoteTranslog(c, store, PREFIX, buffer_interval=0.01) as remote:
        remote.add(ops(0, 2, term=2))
    c.close()
    assert [t for b in RemoteTranslog.read_operations(store, PREFIX, 0) for t in b.column("primary_term").to_pylist()] == [2, 2]


@REMOTE
def test_a_promoted_replica_uploads_the_older_terms_it_holds(store_factory, tmp_path: Path) -> None:
    """After promotion, the new term's prefix alone holds everything a restore needs."""
    store = store_factory()
    old_prefix, new_prefix = "c-uuid/1/i-uuid/0/translog", "c-uuid/2/i-uuid/0/translog"
    # The old primary uploaded 0..9 under term 1; the replica had received only 0..6.
    primary = LocalTranslog(str(tmp_path / "primary"), primary_term=1)
    with RemoteTranslog(primary, store, old_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(0, 10, term=1, tag="p"))
    primary.close()
    replica = LocalTranslog(str(tmp_path / "replica"), primary_term=1)
    replica.add(ops(0, 7, term=1, tag="p"))
    # Promotion: term 2, stale term-1 ops above the new primary's max are trimmed, then new writes.
    replica.roll_generation(2)
    replica.trim_operations_above(6, 2)
    with RemoteTranslog(replica, store, new_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(7, 3, term=2, tag="n"))
    replica.close()
    got = rows(RemoteTranslog.read_operations(store, new_prefix, 0))
    assert [s for s, _, _ in got] == list(range(10))
    assert [t for _, t, _ in got] == [1] * 7 + [2] * 3  # term-1 ops from the new prefix, no stale 7..9
    assert all(src.startswith('{"v":"n') for _, t, src in got if t == 2)


@REMOTE
def test_read_operations_across_term_prefixes(store_factory, tmp_path: Path) -> None:
    """A primary that never held the older ops: a restore reads the new term's prefix plus the older one."""
    store = store_factory()
    old_prefix, new_prefix = "c-uuid/1/i-uuid/0/translog", "c-uuid/2/i-uuid/0/translog"
    old = LocalTranslog(str(tmp_path / "old"), primary_term=1)
    with RemoteTranslog(old, store, old_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(0, 10, term=1, tag="o"))
    old.close()
    # The new primary (fresh disk, term 2) re-issues 7..9 and goes on to 12.
    new = LocalTranslog(str(tmp_path / "new"), primary_term=2)
    with RemoteTranslog(new, store, new_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(7, 6, term=2, tag="n"))
    new.close()
    alone = rows(RemoteTranslog.read_operations(store, new_prefix, 0))
    assert [s for s, _, _ in alone] == list(range(7, 13))
    got = rows(RemoteTranslog.read_operations(store, [new_prefix, old_prefix], 0))
    assert [s for s, _, _ in got] == list(range(13))
    assert [t for _, t, _ in got] == [1] * 7 + [2] * 6  # the highest term wins per seq#
    assert all(src.startswith('{"v":"n') for _, t, src in got if t == 2)
    assert seqs(RemoteTranslog.read_operations(store, [new_prefix, old_prefix], 5, 8)) == [5, 6, 7, 8]


class _PurgeBeforeFirstDataGet:
    """A real store whose first data-blob GET is preceded by a purge the primary runs meanwhile.

    A test double for a race no real store produces on demand: the reader has listed the
    metadata, then the primary purges a generation before the reader fetches its data.
    """

    def __init__(self, store, purge) -> None:
        self._store, self._purge = store, purge

    def get(self, key: str) -> bytes:
        if "/data/" in key and self._purge is not None:
            purge, self._purge = self._purge, None
            purge()
        return self._store.get(key)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


@REMOTE
def test_a_reader_racing_a_purge_retries_with_the_new_metadata(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.01) as remote:
        for i in range(3):
            remote.add(ops(i * 10, 10))
        first = remote.uploaded_generations[0]
        racing = _PurgeBeforeFirstDataGet(store, lambda: remote.purge(9, 1))
        # the reader listed metadata naming 0..29; generation 0..9 is purged before its GET
        got = seqs(RemoteTranslog.read_operations(racing, PREFIX, 0))
        assert not store.exists(first.blob_key)
        assert got == list(range(10, 30))  # what the newest metadata holds: no error, nothing above the commit lost
        # a blob that is gone although the newest metadata still names it is corruption, named
        victim = remote.uploaded_generations[-1].blob_key
        store.delete([victim])
        with pytest.raises(TranslogCorruptedError, match=victim.replace(".", r"\.")):
            list(RemoteTranslog.read_operations(store, PREFIX, 0))
    local.close()


@REMOTE
def test_purge_older_term_is_all_or_nothing(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    old_prefix, new_prefix = "c-uuid/1/i-uuid/0/translog", "c-uuid/2/i-uuid/0/translog"
    old = LocalTranslog(str(tmp_path / "old"), primary_term=1)
    with RemoteTranslog(old, store, old_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(0, 5, term=1))
        remote.add(ops(5, 5, term=1))
    old.close()
    new = LocalTranslog(str(tmp_path / "new"), primary_term=2)
    with RemoteTranslog(new, store, new_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(10, 3, term=2))
        assert remote.purge_older_term(old_prefix, 6, 2) == []  # 7..9 not covered: keep everything
        assert seqs(RemoteTranslog.read_operations(store, [new_prefix, old_prefix], 0)) == list(range(13))
        with pytest.raises(TranslogError, match="use purge"):
            remote.purge_older_term(new_prefix, 100, 2)
        deleted = remote.purge_older_term(old_prefix, 9, 2)
        assert len(deleted) >= 3 and all(k.startswith(old_prefix) for k in deleted)
        assert list(store.list(old_prefix + "/")) == []
        assert seqs(RemoteTranslog.read_operations(store, [new_prefix, old_prefix], 0)) == [10, 11, 12]
    new.close()


@REMOTE
def test_a_new_primarys_trim_voids_older_term_ops_in_older_prefixes(store_factory, tmp_path: Path) -> None:
    """Ops only the old primary had (above the new primary's max) never come back through the old prefix."""
    store = store_factory()
    old_prefix, new_prefix = "c-uuid/1/i-uuid/0/translog", "c-uuid/2/i-uuid/0/translog"
    old = LocalTranslog(str(tmp_path / "old"), primary_term=1)
    with RemoteTranslog(old, store, old_prefix, buffer_interval=0.01) as remote:
        remote.add(ops(0, 10, term=1, tag="o"))  # 0..9; the promoted replica had only 0..5
    old.close()
    new = LocalTranslog(str(tmp_path / "new"), primary_term=2)
    with RemoteTranslog(new, store, new_prefix, buffer_interval=0.01) as remote:
        remote.trim_operations_above(5, 2)
        remote.add(ops(6, 2, term=2, tag="n"))  # re-issues 6, 7; 8 and 9 of term 1 are void
    new.close()
    got = rows(RemoteTranslog.read_operations(store, [new_prefix, old_prefix], 0))
    assert [(s, t) for s, t, _ in got] == [(s, 1) for s in range(6)] + [(6, 2), (7, 2)]


@pytest.mark.parametrize("after", range(8))
def test_a_failed_local_fsync_anywhere_fails_the_log_for_good_and_fast(tmp_path: Path, after: int) -> None:
    """An fsync failing in the append's sync or in the uploader's roll: the waiting append gets LocalDiskError at
    once (before: the uploader retried the failed roll until upload_timeout, then TranslogUnavailable, and the
    copy stayed in service; found by the fault simulator, seed 5000).  DiskFaults stands in for a disk that
    fails one chosen fsync on demand."""
    from shardstore.errors import LocalDiskError
    from shardstore.testing.disk import DiskFaults

    store = open_backend(f"memory://fsync-{after}-{uuid.uuid4().hex[:6]}")
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with DiskFaults() as faults, RemoteTranslog(local, store, PREFIX, buffer_interval=0.01,
                                                upload_timeout=20) as remote:
        faults.inject(op="fsync", path=f"{tmp_path}/tl/*", action="eio", after=after)
        t0 = time.monotonic()
        outcomes = []
        for n in range(3):
            try:
                remote.add(ops(n * 10, 10))
                outcomes.append("ok")
            except LocalDiskError as exc:
                outcomes.append("failed")
                assert "local" in str(exc) and "fsync" in str(exc) or "roll" in str(exc)
        assert faults.fired_total == 1
        assert "failed" in outcomes and outcomes[outcomes.index("failed"):] == ["failed"] * (3 - outcomes.index("failed"))
        assert time.monotonic() - t0 < 10, "a failed local log must not wait for the upload timeout"
    local.close()


def test_group_commit_shares_uploads_without_a_fixed_wait(tmp_path: Path) -> None:
    """Issue 16: no linger by default.  A lone writer gets one upload (2 PUTs) per append, nothing
    batched behind a timer; concurrent writers share uploads because appends arriving while one
    upload is in flight (here each PUT takes 30 ms) all go in the next one."""
    from shardstore.plugins.memory import MemoryStore

    store = FaultyStore(MemoryStore(f"memory://group-{uuid.uuid4().hex}"),
                        [FaultRule(op=("put",), action="delay", delay=0.03, times=None)])
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX) as remote:
        assert remote.buffer_interval == 0.0
        before = remote.uploads
        for i in range(5):  # one writer, one append at a time
            remote.add(ops(i * 10, 10))
        assert remote.uploads - before == 5  # one upload each: none waited for company
        counter = iter(range(1000, 10**9, 10))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(5):
                    with lock:
                        batch = ops(next(counter), 10)
                    remote.add(batch)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        before = remote.uploads
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        shared = remote.uploads - before
        assert shared < 40 / 2, f"{shared} uploads for 40 concurrent appends: not shared"
    local.close()
    assert len(seqs(RemoteTranslog.read_operations(store, PREFIX, 0))) == 50 + 400


def test_a_wait_nothing_can_cover_does_not_spin_the_uploader(tmp_path: Path) -> None:
    """Review of issue 16: with no linger, a wait on a generation holding no operation made the uploader
    loop at full CPU (uploads that covered nothing, back to back).  CPU time of the process is measured
    over the wait: a spinning thread would burn about the whole wall time."""
    from shardstore.plugins.memory import MemoryStore

    store = MemoryStore(f"memory://spin-{uuid.uuid4().hex}")
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX) as remote:
        remote.add(ops(0, 5))
        cpu0, wall0 = time.process_time(), time.monotonic()
        with pytest.raises(TranslogUnavailable):
            remote.wait_uploaded(local.generation, timeout=1.0)  # the current, empty generation
        time.sleep(0.5)  # the uploader, still asked for it, must idle too
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
        assert cpu < wall / 3, f"{cpu:.2f}s of CPU in {wall:.2f}s: the uploader spins"
        remote.add(ops(5, 5))  # and it still uploads what comes next
    local.close()
    assert len(seqs(RemoteTranslog.read_operations(store, PREFIX, 0))) == 10


def test_a_purge_writes_one_metadata_deletes_in_one_request_and_lists_only_the_first_time(tmp_path: Path) -> None:
    """Issue 30: each flush's purge seals, drops and deletes with 1 metadata PUT and 1 DELETE; the metadata
    beyond ``keep_metadata`` is found without a LIST once the instance knows its prefix (and an earlier
    process's metadata blobs are found by the first purge's one LIST)."""
    from shardstore.blobstores import open_store

    store = open_store(f"memory://purge-{uuid.uuid4().hex[:8]}/r")
    first = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(first, store, PREFIX, buffer_interval=0.0, keep_metadata=2) as remote:
        for i in range(4):
            remote.add(ops(i * 10, 10))  # 4 metadata blobs, one per upload, no purge yet
    first.close()
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.0, keep_metadata=2) as remote:
        lists = []
        for i in range(4, 10):
            remote.add(ops(i * 10, 10))
            local.roll_generation()  # what a flush does before it purges
            before = dict(store.metrics()["requests"])
            remote.purge(remote_commit_local_checkpoint=i * 10 - 1, remote_commit_primary_term=1)
            after = store.metrics()["requests"]
            delta = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
            assert delta.get("put", 0) <= 1 and delta.get("delete", 0) <= 1, delta
            lists.append(delta.get("list", 0))
            assert len(metadata_keys(store)) <= 3  # the newest 2, and the one the next purge drops
        assert lists[0] == 1 and sum(lists[1:]) == 0, lists  # one LIST, by the first purge of this process
        assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(90, 100))  # above 89
    local.close()


def test_the_uploader_thread_ends_when_idle_and_the_next_append_starts_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: upload threads grow with the shards being written, not with the shards a node holds."""
    import shardstore.translog.remote as remote_module
    from shardstore.blobstores import open_store

    monkeypatch.setattr(remote_module, "UPLOADER_IDLE_SECONDS", 0.2)
    store = open_store(f"memory://idle-{uuid.uuid4().hex[:8]}/r")
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1)
    with RemoteTranslog(local, store, PREFIX, buffer_interval=0.0) as remote:
        assert remote._thread is None  # nothing appended: no thread
        remote.add(ops(0, 5))
        first = remote._thread
        assert first is not None and first.is_alive()
        first.join(5)
        assert not first.is_alive() and remote._thread is None  # idle: ended
        remote.add(ops(5, 5))  # a new append starts another and is uploaded
        assert seqs(RemoteTranslog.read_operations(store, PREFIX, 0)) == list(range(10))
    local.close()
