"""A full buffer refreshed beside the writes (issue 44): ``ShardDirectory.seal`` then ``write_sealed``.

Between the two, writes go into a new buffer while the sealed one stays visible to version lookups
and realtime gets; ``write_sealed`` publishes its segments and marks the older copies deleted at
one moment under the lock.  These tests run the two steps by hand on one thread, with writes in
between, and check every answer against an oracle of the newest operation per id.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.segments.directory import ShardDirectory
from shardstore.translog.operations import OpType, index_batch, stamp, unstamped_batch


def _index(ids: list[str], first: int, value: int) -> pa.RecordBatch:
    return stamp(index_batch(ids, [json.dumps({"v": value}).encode()] * len(ids)), first, 1)


def _delete(ids: list[str], first: int) -> pa.RecordBatch:
    return stamp(unstamped_batch([OpType.DELETE] * len(ids), ids, [None] * len(ids), [None] * len(ids)), first, 1)


def _live_ids(shard: ShardDirectory) -> list[str]:
    return [r["_id"] for b in shard.scan(columns=["_id"]) for r in b.to_pylist()]


def _seq_of(shard: ShardDirectory, ids: list[str]) -> list[int | None]:
    return shard.current_versions(pa.array(ids, pa.string())).column("_seq_no").to_pylist()


def test_a_sealed_buffer_stays_visible_until_its_segments_are_installed(tmp_path: Path) -> None:
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index([f"k{i}" for i in range(100)], 0, 1))
        sealed = shard.seal()
        assert sealed is not None and not shard._buffer
        shard.apply(_index([f"k{i}" for i in range(10)], 100, 2))  # updates of sealed ids, into the new buffer
        shard.apply(_delete(["k50"], 110))
        assert _seq_of(shard, ["k0", "k20", "k50", "nope"]) == [100, 20, None, None]
        assert shard.get("k20")["v"] == 1 and shard.get("k5")["v"] == 2
        assert shard.count() == 0  # nothing searchable before the install
        result = shard.write_sealed(sealed)
        assert result.indexed == 100 and result.deleted == 0
        assert sorted(_live_ids(shard)) == sorted(f"k{i}" for i in range(100))  # the sealed copies, once each
        assert _seq_of(shard, ["k0", "k20", "k50"]) == [100, 20, None]  # the new buffer still decides its ids
        shard.refresh()
        assert sorted(_live_ids(shard)) == sorted(f"k{i}" for i in range(100) if i != 50)
        assert shard.get("k3")["v"] == 2 and shard.get("k50") is None


def test_a_stale_winner_written_beside_dies_in_its_own_segment(tmp_path: Path) -> None:
    """A replica may buffer an operation older than a refreshed copy (out of order): the sealed write keeps it in
    the file (staleness is known only under the lock) and deletes it there, so the newer copy alone is live."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["x"], 10, 2))
        shard.refresh()
        shard.apply(_index(["x", "y"], 5, 1))  # x at seq# 5: older than the refreshed seq# 10
        sealed = shard.seal()
        assert sealed is not None
        result = shard.write_sealed(sealed)
        assert (result.indexed, result.stale) == (1, 1)
        assert sorted(_live_ids(shard)) == ["x", "y"]
        assert shard.get("x")["_seq_no"] == 10 and shard.get("x")["v"] == 2
        shard.flush(local_checkpoint=10, primary_term=1)  # the dead row's live docs are committed
    with ShardDirectory(str(tmp_path / "d")) as reopened:
        assert sorted(_live_ids(reopened)) == ["x", "y"] and reopened.get("x")["_seq_no"] == 10


def test_stale_winners_die_in_their_own_rows_when_the_buffer_is_not_in_id_order(tmp_path: Path) -> None:
    """The sealed write keeps the buffer's order in its file, while staleness is found per winner in id order: each
    stale row is deleted where it was written, not at its id's rank (a buffer in reverse id order, every third id
    stale)."""
    ids = [f"k{i:02d}" for i in range(30)][::-1]
    stale = {doc_id for doc_id in ids if int(doc_id[1:]) % 3 == 0}
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(stamp(index_batch(sorted(stale), [json.dumps({"v": 2}).encode()] * len(stale)), 100, 1))
        shard.refresh()  # the newer copies (seq# 100 and up)
        shard.apply(_index(ids, 0, 1))  # older operations, seq# 0-29, in reverse id order
        sealed = shard.seal()
        assert sealed is not None
        result = shard.write_sealed(sealed)
        assert (result.indexed, result.stale) == (30 - len(stale), len(stale))
        assert sorted(_live_ids(shard)) == sorted(ids)  # each id once
        for doc_id in ids:
            assert shard.get(doc_id)["v"] == (2 if doc_id in stale else 1), doc_id


def test_a_failed_sealed_write_goes_back_in_front_of_the_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no real disk produces on demand (a mock, said so here): the sealed write fails; nothing is published,
    the sealed operations stay visible, and the next refresh writes them with the newer ones, the newest winning."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["a", "b", "c"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["b"], 3, 2))
        write = ShardDirectory._write_segments
        monkeypatch.setattr(ShardDirectory, "_write_segments", lambda self, *a: (_ for _ in ()).throw(OSError("full")))
        with pytest.raises(OSError, match="full"):
            shard.write_sealed(sealed)
        monkeypatch.setattr(ShardDirectory, "_write_segments", write)
        assert shard._sealed_failed and shard.count() == 0
        assert [p for p in (tmp_path / "d").iterdir() if p.suffix == ".parquet"] == []
        assert _seq_of(shard, ["a", "b"]) == [0, 3] and shard.get("c")["v"] == 1
        shard.refresh()
        assert sorted(_live_ids(shard)) == ["a", "b", "c"] and shard.get("b")["v"] == 2
        assert shard._sealed is None


def test_a_merge_or_a_refresh_waits_for_the_sealed_write(tmp_path: Path) -> None:
    """Nothing else changes the segments while a sealed write runs: a refresh asked meanwhile (here on another
    thread) installs nothing until the sealed segments are installed, then installs the rest."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["a", "b"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["a"], 2, 2))
        done = threading.Event()
        t = threading.Thread(target=lambda: (shard.refresh(), done.set()))
        t.start()
        assert not done.wait(0.3), "a refresh ran while a sealed write was pending"
        shard.write_sealed(sealed)
        t.join(10)
        assert done.is_set()
        assert sorted(_live_ids(shard)) == ["a", "b"] and shard.get("a")["v"] == 2


def _refresh_on_a_thread(shard: ShardDirectory) -> tuple[threading.Thread, threading.Event, list]:
    """Start ``shard.refresh()`` on a thread; (thread, set once it waits for the sealed write, [its result, or the
    exception it raised])."""
    waiting, out = threading.Event(), []
    settle = shard._settle_sealed

    def spy() -> None:
        waiting.set()  # the lock is released inside the wait that follows: another thread's next step waits for it
        settle()

    def refresh() -> None:
        try:
            out.append(shard.refresh())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    shard._settle_sealed = spy  # type: ignore[method-assign]
    t = threading.Thread(target=refresh)
    t.start()
    return t, waiting, out


def _parquet_files(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.suffix == ".parquet"}


def test_a_refresh_writes_beside_a_sealed_write_and_installs_after_it(tmp_path: Path) -> None:
    """A flush's refresh while a sealed buffer is written does not wait before writing: its segments are written
    first (here: while the sealed write has not started), installed right after the sealed ones, and the updates it
    holds mark the sealed copies deleted."""
    written: list[int] = []
    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        real = shard._write_segments
        shard._write_segments = lambda docs, rows, *a: (written.append(len(rows)), real(docs, rows, *a))[1]  # type: ignore
        shard.apply(_index([f"k{i}" for i in range(100)], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index([f"k{i}" for i in range(0, 100, 10)] + [f"n{i}" for i in range(20)], 100, 2))
        t, waiting, out = _refresh_on_a_thread(shard)
        assert waiting.wait(10)
        assert written == [30]  # the refresh's rows are written before the sealed ones
        assert shard.count() == 0
        shard.write_sealed(sealed)
        t.join(10)
        assert written == [30, 100] and out and out[0].indexed == 30 and out[0].deleted == 10
        assert sorted(_live_ids(shard)) == sorted([f"k{i}" for i in range(100)] + [f"n{i}" for i in range(20)])
        assert shard.get("k10")["v"] == 2 and shard.get("k11")["v"] == 1
        assert len(_parquet_files(tmp_path / "d")) == 2 and shard._sealed is None and not shard._buffer


def test_a_refresh_beside_starts_over_when_its_buffer_changed_during_the_wait(tmp_path: Path) -> None:
    """A writer buffers an operation while the refresh waits for the sealed write: what the refresh wrote is removed
    and it refreshes the usual way, the newer operation included."""
    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        shard.apply(_index(["a", "b"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["c"], 2, 2))
        t, waiting, out = _refresh_on_a_thread(shard)
        assert waiting.wait(10)
        with shard._lock:  # taken once the refresh waits
            shard.apply(_index(["c", "d"], 3, 3))
            shard.write_sealed(sealed)
        t.join(10)
        assert out and out[0].indexed == 2
        assert sorted(_live_ids(shard)) == ["a", "b", "c", "d"] and shard.get("c")["v"] == 3
        assert len(_parquet_files(tmp_path / "d")) == 2  # the sealed segment and the refresh's second try


def test_a_refresh_beside_starts_over_when_the_sealed_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no real disk produces on demand (a mock): the sealed write fails while the refresh waits; its
    operations come back in front of the buffer, the refresh's files are removed and it writes everything."""
    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        shard.apply(_index(["a", "b"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["b", "c"], 2, 2))
        t, waiting, out = _refresh_on_a_thread(shard)
        assert waiting.wait(10)
        monkeypatch.setattr(ShardDirectory, "_write_segments", lambda self, *a: (_ for _ in ()).throw(OSError("full")))
        with pytest.raises(OSError, match="full"):
            shard.write_sealed(sealed)
        monkeypatch.undo()
        t.join(10)
        assert out and out[0].indexed == 3
        assert sorted(_live_ids(shard)) == ["a", "b", "c"] and shard.get("b")["v"] == 2
        assert len(_parquet_files(tmp_path / "d")) == 1 and shard._sealed is None


def test_a_refresh_beside_starts_over_when_the_sealed_buffer_leaves_tombstones(tmp_path: Path) -> None:
    """The sealed buffer's winning delete becomes a tombstone at its install, which the refresh's plan did not
    read: it refreshes again, and the older index operation it holds on that id (a replica's, out of order) stays
    dead."""
    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        shard.apply(_delete(["x"], 10))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["x", "y"], 5, 1))  # x at seq# 5: older than the sealed delete
        t, waiting, out = _refresh_on_a_thread(shard)
        assert waiting.wait(10)
        shard.write_sealed(sealed)
        t.join(10)
        assert out and (out[0].indexed, out[0].stale) == (1, 1)
        assert _live_ids(shard) == ["y"] and shard.get("x") is None
        assert len(_parquet_files(tmp_path / "d")) == 1


_STEP = st.one_of(
    st.tuples(st.just("index"), st.lists(st.integers(0, 7), min_size=1, max_size=5)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("seal"), st.none()),
    st.tuples(st.just("write"), st.none()),
    st.tuples(st.just("refresh"), st.none()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=14), hinted=st.booleans())
def test_seals_and_writes_interleaved_with_writes_match_the_newest_operation_per_id(tmp_path_factory, steps,
                                                                                    hinted) -> None:
    """Any interleaving of writes, seals, sealed writes and refreshes: version lookups and realtime gets always give
    the newest operation per id, and after a last refresh every id's newest index operation is live once.
    ``hinted``: each write carries, as a primary's does, which of its ids its version lookup found new to the shard
    (the refresh then looks for older copies of the others only); a wrong hint leaves a second live copy."""
    path = tmp_path_factory.mktemp("beside")
    newest: dict[str, tuple[int, int | None]] = {}  # id -> (seq#, value or None for a delete)
    seq = 0
    with ShardDirectory(str(path), warm=False) as shard:
        sealed = None
        for kind, arg in steps:
            if kind == "index":
                ids = [f"k{i}" for i in arg]
                new = None
                if hinted:
                    seen = shard.current_versions(pa.array(ids, pa.string()), seen=True).column("_seen")
                    new = ~seen.to_numpy(zero_copy_only=False)
                shard.apply(_index(ids, seq, seq), new_ids=new)
                for k, doc_id in enumerate(ids):
                    newest[doc_id] = (seq + k, seq)
                seq += len(ids)
            elif kind == "delete":
                ids = [f"k{i}" for i in arg]
                shard.apply(_delete(ids, seq))
                for k, doc_id in enumerate(ids):
                    newest[doc_id] = (seq + k, None)
                seq += len(ids)
            elif kind == "seal" and sealed is None:
                sealed = shard.seal()
            elif kind == "write" and sealed is not None:
                shard.write_sealed(sealed)
                sealed = None
            elif kind == "refresh" and sealed is None:
                shard.refresh()
            elif kind == "refresh":  # beside the sealed write: the refresh writes, then waits for it to install
                t, waiting, _out = _refresh_on_a_thread(shard)
                assert waiting.wait(10)
                shard.write_sealed(sealed)
                t.join(10)
                assert not t.is_alive()
                del shard._settle_sealed  # the spy goes: the class's method again
                sealed = None
            every = [f"k{i}" for i in range(8)]
            expect = [newest[i][0] if i in newest and newest[i][1] is not None else None for i in every]
            assert _seq_of(shard, every) == expect, steps
            for doc_id in every:
                got = shard.get(doc_id)
                want = newest.get(doc_id, (None, None))[1]
                assert (None if got is None else got["v"]) == want, (doc_id, steps)
        if sealed is not None:
            shard.write_sealed(sealed)
        shard.refresh()
        live = _live_ids(shard)
        assert sorted(live) == sorted(i for i, (_s, v) in newest.items() if v is not None), (steps, hinted)


def test_an_id_deleted_in_the_buffer_is_not_new_while_a_sealed_copy_waits(tmp_path: Path) -> None:
    """The case the ``_seen`` hint must not get wrong: x is indexed in the sealed buffer and deleted in the buffer
    after it, so its version lookup answers "absent"; a new write of x is still not new to the shard (the sealed
    copy becomes a segment copy), and the refresh must find that copy and mark it deleted."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["x", "y"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_delete(["x"], 2))
        found = shard.current_versions(pa.array(["x", "z"], pa.string()), seen=True)
        assert found.column("_seq_no").to_pylist() == [None, None]  # x deleted, z never written: both absent
        assert found.column("_seen").to_pylist() == [True, False]  # but x has copies, z none
        new = ~found.column("_seen").to_numpy(zero_copy_only=False)
        shard.apply(_index(["x", "z"], 3, 2), new_ids=new)
        shard.write_sealed(sealed)  # x@0 is now a live segment copy
        shard.refresh()
        assert sorted(_live_ids(shard)) == ["x", "y", "z"]  # one copy each: x@0 was found and marked deleted
        assert shard.get("x")["v"] == 2


def test_a_refresh_looks_up_only_the_ids_not_new_to_the_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint's gain (issue 44): of a bulk's winners, only those whose ids the writer found somewhere are looked
    for in the segments."""
    asked: list[int] = []
    with ShardDirectory(str(tmp_path / "d")) as shard:
        real = shard._find  # a spy on the directory's finder, which every segment lookup takes
        monkeypatch.setattr(shard, "_find", lambda readers, ids: (asked.append(len(ids)), real(readers, ids))[1])
        shard.apply(_index([f"old{i}" for i in range(50)], 0, 1))
        shard.refresh()
        ids = [f"old{i}" for i in range(5)] + [f"new{i}" for i in range(45)]
        new = ~shard.current_versions(pa.array(ids, pa.string()), seen=True).column("_seen").to_numpy(
            zero_copy_only=False)
        assert int(new.sum()) == 45
        shard.apply(_index(ids, 50, 2), new_ids=new)
        result = shard.refresh()
        assert asked[-1] == 5 and result.deleted == 5
        assert len(_live_ids(shard)) == 95 and shard.get("old3")["v"] == 2


@pytest.mark.parametrize(("held_share", "pending", "ready"), [
    (0.0, False, False), (0.2, False, False), (0.25, False, True), (0.6, False, True), (1.0, False, True),
    (0.25, True, False), (0.6, True, False), (1.0, True, True),
])
def test_a_buffer_is_ready_to_seal_when_full_or_at_its_early_share_with_nothing_pending(
        tmp_path: Path, held_share: float, pending: bool, ready: bool) -> None:
    """``ready_to_seal`` (issue 44): a quarter of the budget seals when no sealed buffer is being written, so the
    refreshes keep pace with a steady stream; while one is written only a full buffer seals (and waits: back-pressure)."""
    budget = 1000
    with ShardDirectory(str(tmp_path / "d"), index_buffer_bytes=budget) as shard:
        sealed = None
        if pending:
            shard.apply(_index(["p"], 0, 1))
            sealed = shard.seal()
            assert sealed is not None
        shard._buffer.doc_bytes = int(budget * held_share)  # the bytes the buffer counts (Arrow sizes vary by build)
        assert shard.ready_to_seal is ready
        assert shard.buffer_full is (held_share >= 1.0)
        if sealed is not None:
            shard.write_sealed(sealed)  # installed: nothing is being written any more
            assert shard.ready_to_seal is (held_share >= 0.25)


def test_seen_marks_every_kind_of_copy_and_only_those(tmp_path: Path) -> None:
    """``current_versions(seen=True)``: an id is seen when a live segment copy, the sealed buffer or the buffer holds
    it (a buffered delete included), and only then; each source alone, all in one lookup."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["seg", "gone"], 0, 1))
        shard.apply(_delete(["gone"], 2))
        shard.refresh()  # seg: a live segment copy; gone: none live
        shard.apply(_index(["sealed"], 3, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["buffered"], 4, 1))
        shard.apply(_delete(["deleted"], 5))
        ids = ["never", "seg", "sealed", "buffered", "deleted", "gone"]
        for order in (ids, ids[::-1]):
            found = shard.current_versions(pa.array(order, pa.string()), seen=True)
            seen = dict(zip(order, found.column("_seen").to_pylist()))
            assert seen == {"never": False, "seg": True, "sealed": True, "buffered": True, "deleted": True,
                            "gone": False}, order
        shard.write_sealed(sealed)


@pytest.mark.parametrize("n", [3, 200])  # a few ids: the dict, one call per id; many: the columnar lookup
def test_seen_from_the_buffer_alone(tmp_path: Path, n: int) -> None:
    """No segment yet: the buffer's version map answers ``_seen`` itself (deletes included)."""
    with ShardDirectory(str(tmp_path / "d")) as shard:
        shard.apply(_index(["a"], 0, 1))
        shard.apply(_delete(["b"], 1))
        ids = (["a", "b", "c"] + [f"x{i}" for i in range(n)])[:max(n, 3)]
        found = shard.current_versions(pa.array(ids, pa.string()), seen=True)
        assert found.column("_seen").to_pylist() == [True, True] + [False] * (len(ids) - 2)
        assert found.column("_seq_no").to_pylist()[:3] == [0, None, None]
    with ShardDirectory(str(tmp_path / "e")) as empty:
        assert empty.current_versions(pa.array(["a"], pa.string()), seen=True).column("_seen").to_pylist() == [False]


def test_a_refresh_beside_whose_lookup_fails_leaves_no_file_and_loses_nothing(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault no real disk produces on demand (a mock): the older copies' lookup fails once the sealed segments are
    installed; the refresh raises, its files are gone, its operations stay buffered and the next refresh writes them."""
    from shardstore.segments import directory as directory_module

    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        shard.apply(_index(["a", "b"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["b", "c"], 2, 2))
        real = directory_module.older_copies
        calls: list[int] = []

        def failing(*args, **kw):
            calls.append(1)
            if len(calls) == 2:  # the sealed write's lookup is the first, the refresh's the second
                raise OSError("read error")
            return real(*args, **kw)

        monkeypatch.setattr(directory_module, "older_copies", failing)
        t, waiting, out = _refresh_on_a_thread(shard)
        assert waiting.wait(10)
        shard.write_sealed(sealed)
        t.join(10)
        assert [str(e) for e in out] == ["read error"] and isinstance(out[0], OSError)
        assert len(_parquet_files(tmp_path / "d")) == 1  # the sealed segment only
        assert _seq_of(shard, ["b", "c"]) == [2, 3]
        del shard._settle_sealed
        shard.refresh()
        assert sorted(_live_ids(shard)) == ["a", "b", "c"] and shard.get("b")["v"] == 2
