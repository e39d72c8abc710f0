"""A full buffer refreshed beside the writes (issue 44): ``ShardDirectory.seal`` then ``write_sealed``.

Between the two, writes go into a new buffer while the sealed one stays visible to version lookups
and realtime gets; ``write_sealed`` publishes its segments and marks the older copies deleted at
one moment under the lock.  These tests run the two steps by hand on one thread, with writes in
between, and check every answer against an oracle of the newest operation per id.
"""

from __future__ import annotations

import json
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
    thread) waits until its segments are installed, then writes the rest."""
    import threading

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


_STEP = st.one_of(
    st.tuples(st.just("index"), st.lists(st.integers(0, 7), min_size=1, max_size=5)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("seal"), st.none()),
    st.tuples(st.just("write"), st.none()),
    st.tuples(st.just("refresh"), st.none()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=14))
def test_seals_and_writes_interleaved_with_writes_match_the_newest_operation_per_id(tmp_path_factory, steps) -> None:
    """Any interleaving of writes, seals, sealed writes and refreshes: version lookups and realtime gets always give
    the newest operation per id, and after a last refresh every id's newest index operation is live once."""
    path = tmp_path_factory.mktemp("beside")
    newest: dict[str, tuple[int, int | None]] = {}  # id -> (seq#, value or None for a delete)
    seq = 0
    with ShardDirectory(str(path), warm=False) as shard:
        sealed = None
        for kind, arg in steps:
            if kind == "index":
                ids = [f"k{i}" for i in arg]
                shard.apply(_index(ids, seq, seq))
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
        assert sorted(live) == sorted(i for i, (_s, v) in newest.items() if v is not None), steps
