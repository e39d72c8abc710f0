"""The refreshes beside the writes chain (issue 44): the thread that installs a sealed buffer seals the buffer that
filled meanwhile and writes it next (``ShardDirectory.seal_if_ready``, ``Refreshing``), and it brings the shard-wide
id index up to date, so neither waits for the next bulk.

Real directories on the local disk; the seals and writes are run by hand (or on a ``Refreshing`` thread) to place
each step exactly.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine.shard.staged_write import Refreshing
from shardstore.segments.directory import RefreshResult, ShardDirectory
from shardstore.translog.operations import index_batch, stamp

BUDGET = 1000  # index_buffer_bytes; a test sets the buffer's counted bytes (Arrow sizes vary by build)


def _index(ids: list[str], first: int, value: int) -> pa.RecordBatch:
    return stamp(index_batch(ids, [json.dumps({"v": value}).encode()] * len(ids)), first, 1)


def _live_ids(shard: ShardDirectory) -> list[str]:
    return sorted(r["_id"] for b in shard.scan(columns=["_id"]) for r in b.to_pylist())


@pytest.mark.parametrize(("share", "pending", "closed", "seals"), [
    (0.5, False, False, True),    # ready, nothing written beside: sealed at once
    (0.1, False, False, False),   # below the early share: left for the bulks
    (1.0, True, False, False),    # a sealed buffer is still being written: never waits for it
    (0.5, False, True, False),    # closed: nothing new is written into the directory
])
def test_seal_if_ready_seals_only_a_ready_buffer_when_nothing_is_pending(tmp_path: Path, share: float, pending: bool,
                                                                         closed: bool, seals: bool) -> None:
    shard = ShardDirectory(str(tmp_path / "d"), index_buffer_bytes=BUDGET, warm=False)
    try:
        sealed = None
        if pending:
            shard.apply(_index(["p"], 0, 1))
            sealed = shard.seal()
            assert sealed is not None
        shard.apply(_index(["a", "b"], 1, 1))
        shard._buffer.doc_bytes = int(BUDGET * share)
        if closed:
            shard._closed = True
        got = shard.seal_if_ready()
        assert (got is not None) is seals
        if got is not None:
            assert not shard._buffer and shard._sealed is got.buffer
            shard.write_sealed(got)
            assert _live_ids(shard) == ["a", "b"]
        if sealed is not None:
            shard.write_sealed(sealed)
    finally:
        shard._closed = False
        shard.close()


def test_seal_if_ready_leaves_the_buffer_a_refresh_beside_planned_from(tmp_path: Path) -> None:
    """Between a sealed buffer's install and the wake-up of the flush's refresh that wrote the buffer beside it, the
    installing thread must not seal that buffer: the refresh would throw away what it wrote and wait for a write
    nobody started.  The lock is held across the install here so the refresh cannot wake up in between."""
    with ShardDirectory(str(tmp_path / "d"), index_buffer_bytes=BUDGET, warm=False) as shard:
        shard.apply(_index([f"k{i}" for i in range(50)], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index([f"n{i}" for i in range(20)], 50, 2))
        shard._buffer.doc_bytes = BUDGET  # full: ready to seal, were it not planned from
        waiting, out = threading.Event(), []
        settle = shard._settle_sealed

        def spy() -> None:
            waiting.set()
            settle()

        shard._settle_sealed = spy  # type: ignore[method-assign]
        t = threading.Thread(target=lambda: out.append(shard.refresh()), daemon=True)
        t.start()
        assert waiting.wait(10)
        with shard._lock:
            shard.write_sealed(sealed)
            chained = shard.seal_if_ready()
        if chained is not None:  # (the bug) the refresh would wait for it forever: write it so the test ends
            shard.write_sealed(chained)
        t.join(10)
        assert chained is None
        assert out and out[0].indexed == 20  # its own segment, written beside, kept
        assert _live_ids(shard) == sorted([f"k{i}" for i in range(50)] + [f"n{i}" for i in range(20)])


def test_a_refresh_beside_writes_the_buffer_that_filled_meanwhile(tmp_path: Path) -> None:
    """A ``Refreshing`` thread that installed its buffer takes the one that filled while it wrote (ready to seal,
    not full: no bulk sealed it) and writes it next, on a thread of its own, with no further call."""
    with ShardDirectory(str(tmp_path / "d"), index_buffer_bytes=BUDGET, warm=False) as shard:
        shard.apply(_index([f"a{i}" for i in range(30)], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index([f"b{i}" for i in range(40)], 30, 1))
        shard._buffer.doc_bytes = BUDGET // 2
        done: list[tuple[RefreshResult | None, BaseException | None]] = []
        both = threading.Event()

        def on_done(result: RefreshResult | None, error: BaseException | None) -> None:
            done.append((result, error))
            if len(done) == 2:
                both.set()

        Refreshing(shard, sealed, 0, on_done, shard.seal_if_ready)
        assert both.wait(10), done
        assert sorted(r.indexed for r, e in done if r is not None) == [30, 40] and all(e is None for _, e in done)
        assert not shard._buffer and shard._sealed is None
        assert _live_ids(shard) == sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(40)])


def test_a_refresh_beside_stops_when_the_buffer_is_not_ready(tmp_path: Path) -> None:
    """Below the early share the buffer stays for the bulks (and the flush): one write, one callback."""
    with ShardDirectory(str(tmp_path / "d"), index_buffer_bytes=BUDGET, warm=False) as shard:
        shard.apply(_index(["a"], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.apply(_index(["b"], 1, 1))
        shard._buffer.doc_bytes = BUDGET // 10
        done = threading.Event()
        calls: list[RefreshResult | None] = []
        Refreshing(shard, sealed, 0, lambda r, e: (calls.append(r), done.set()), shard.seal_if_ready)
        assert done.wait(10)
        shard.close()  # waits for any write beside; a second one would have sealed "b"
        assert len(calls) == 1 and shard._buffer and shard._buffer.docs


def test_a_sealed_write_brings_the_shard_id_index_up_to_date(tmp_path: Path) -> None:
    """The thread that installed a sealed buffer's segments adds them to the shard-wide id index, so the next
    bulk's version lookup merges nothing first; a failure there is left for that lookup (the write stands)."""
    with ShardDirectory(str(tmp_path / "d"), warm=False) as shard:
        shard.apply(_index([f"k{i}" for i in range(100)], 0, 1))
        sealed = shard.seal()
        assert sealed is not None
        shard.write_sealed(sealed)
        readers = [s.reader for s in shard._segments.values()]
        assert readers and all(id(r) in shard._id_index._number_of for r in readers)
        assert shard._id_index.levels >= 1

        shard.apply(_index([f"m{i}" for i in range(100)], 100, 1))
        sealed = shard.seal()
        assert sealed is not None

        real = shard._id_index.sync

        def broken(readers: list) -> None:  # fails only where the writing thread syncs ahead of any lookup
            if sys._getframe(1).f_code.co_name == "_index_ahead":
                raise OSError("the id index cannot be read")
            real(readers)

        shard._id_index.sync = broken  # type: ignore[method-assign]
        result = shard.write_sealed(sealed)
        assert result.indexed == 100 and len(_live_ids(shard)) == 200
        assert shard.current_versions(pa.array([f"m{i}" for i in range(100)])).column("_seq_no").to_pylist() \
            == list(range(100, 200))  # the lookup synced the index itself
