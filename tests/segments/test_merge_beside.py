"""Merges written beside the writes (segments/merging.py): the pure row mapping against an oracle, then the
directory with writes, deletes and refreshes made while a merge is being written (run by hand between its
write and its install, on one thread, then on two real threads), every answer checked against an oracle of the
newest operation per id, before and after a reopen.  Real segment files, no mock."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardstore.segments.directory as directory_module
from shardstore.segments.directory import ShardDirectory
from shardstore.segments.merge_policy import TieredMergePolicy
from shardstore.segments.merging import carried_deletes
from shardstore.translog.operations import OpType, index_batch, stamp, unstamped_batch

# -- the row mapping ---------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4))
def test_carried_deletes_are_the_rows_live_then_and_dead_now(data, sizes) -> None:
    then = [np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool) for n in sizes]
    now = [w & np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
           for w, n in zip(then, sizes)]
    sources = [(k, r) for k, w in enumerate(then) for r in np.flatnonzero(w)]  # the merge's input rows, in order
    order = np.array(data.draw(st.permutations(range(len(sources)))), dtype=np.int64)
    want = sorted(new for new, j in enumerate(order) if not now[sources[j][0]][sources[j][1]])
    assert carried_deletes(then, now, order).tolist() == want


def test_carried_deletes_refuses_masks_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="3 live rows at the snapshot, a merge of 2"):
        carried_deletes([np.ones(3, bool)], [np.ones(3, bool)], np.arange(2))
    with pytest.raises(ValueError, match="4 rows then, 3 now"):
        carried_deletes([np.ones(4, bool)], [np.ones(3, bool)], np.arange(4))


# -- the directory -----------------------------------------------------------------------------------------------

_EAGER = TieredMergePolicy(segments_per_tier=2, max_merge_at_once=4)  # every small segment floored alike


class _Model:
    """A directory and the oracle of its newest operation per id."""

    def __init__(self, shard: ShardDirectory) -> None:
        self.shard, self.seq, self.live = shard, 0, {}

    def index(self, keys: list[int]) -> None:
        ids = [f"k{k}" for k in keys]
        self.shard.apply(stamp(index_batch(ids, [json.dumps({"v": self.seq + i}).encode() for i in range(len(ids))]),
                               self.seq, 1))
        for i, doc_id in enumerate(ids):
            self.live[doc_id] = self.seq + i
        self.seq += len(ids)

    def delete(self, keys: list[int]) -> None:
        ids = [f"k{k}" for k in keys]
        self.shard.apply(stamp(unstamped_batch([OpType.DELETE] * len(ids), ids, [None] * len(ids),
                                               [None] * len(ids)), self.seq, 1))
        for doc_id in ids:
            self.live.pop(doc_id, None)
        self.seq += len(ids)

    def step(self, kind: str, keys: list[int]) -> None:
        if kind == "index":
            self.index(keys)
        elif kind == "delete":
            self.delete(keys)
        else:
            self.shard.refresh()

    def check(self, shard: ShardDirectory | None = None) -> None:
        shard = shard or self.shard
        shard.refresh()
        rows = [(r["_id"], r["_seq_no"]) for b in shard.scan(columns=["_id", "_seq_no"]) for r in b.to_pylist()]
        assert sorted(rows) == sorted(self.live.items())  # every live id once, at its newest seq#
        ids = [f"k{k}" for k in range(24)]
        got = shard.current_versions(pa.array(ids, pa.string())).column("_seq_no").to_pylist()
        assert got == [self.live.get(i) for i in ids]
        for doc_id, seq in self.live.items():
            assert shard.get(doc_id)["v"] == seq


_KEYS = st.lists(st.integers(0, 23), min_size=1, max_size=8)
_STEP = st.tuples(st.sampled_from(["index", "index", "delete", "refresh"]), _KEYS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(_STEP, max_size=8), during=st.lists(_STEP, max_size=8),
       after=st.lists(_STEP, max_size=4))
def test_writes_made_while_a_merge_is_written_survive_its_install(tmp_path_factory, monkeypatch, before, during,
                                                                  after) -> None:
    """Updates, deletes and refreshes land between the merge's snapshot and its install (they run after its file is
    written, as another thread's would): the merged segment keeps none of the rows they deleted, and the answers
    equal the oracle's, then again after a flush and a reopen."""
    tmp = tmp_path_factory.mktemp("merge")
    with ShardDirectory(str(tmp / "d"), merge_policy=_EAGER, fsync=False, warm=False) as shard:
        model = _Model(shard)
        for kind, keys in [("index", [k, k + 12]) for k in range(8)] + before:
            model.step(kind, keys)
            shard.refresh()  # a segment per step: something to merge
        write = directory_module.write_merged
        ran = []

        def write_then_step(*args, **kwargs):
            merged = write(*args, **kwargs)
            if not ran:  # the first merge only
                ran.append(True)
                for kind, keys in during:
                    model.step(kind, keys)
            return merged

        monkeypatch.setattr(directory_module, "write_merged", write_then_step)
        shard.maybe_merge()
        monkeypatch.setattr(directory_module, "write_merged", write)
        assert ran == [True]  # a merge was written, the steps ran before its install
        for kind, keys in after:
            model.step(kind, keys)
        model.check()
        shard.flush(local_checkpoint=model.seq - 1, primary_term=1, merge=False)
    with ShardDirectory(str(tmp / "d"), fsync=False, warm=False) as reopened:
        model.check(reopened)


def test_a_merge_whose_input_went_away_installs_nothing_and_removes_its_file(tmp_path: Path, monkeypatch) -> None:
    """Another merge (force_merge, here run inside the first one's write) takes the inputs away: the first merge
    returns nothing installed, its file is gone, and the answers are unchanged."""
    with ShardDirectory(str(tmp_path / "d"), merge_policy=_EAGER, fsync=False, warm=False) as shard:
        model = _Model(shard)
        for r in range(8):
            model.index([r * 3 + i for i in range(3)])
            shard.refresh()
        write = directory_module.write_merged
        made = []

        def write_then_merge_away(inputs, directory, name, **kwargs):
            merged = write(inputs, directory, name, **kwargs)
            made.append(merged.reader.path)
            monkeypatch.setattr(directory_module, "write_merged", write)
            with shard._lock:  # as force_merge would, without its merge lock (the first merge holds it)
                shard._merge([n for n in shard._segments])
            return merged

        monkeypatch.setattr(directory_module, "write_merged", write_then_merge_away)
        assert shard.maybe_merge() == []
        assert made and not Path(made[0]).exists()
        assert len(list(shard._segments)) == 1
        model.check()


def test_a_merge_on_another_thread_loses_no_write(tmp_path: Path) -> None:
    """Two real threads: one merges whenever the policy asks while the other indexes, deletes and refreshes; the
    merges ran beside the writes (some installed) and every answer is the oracle's."""
    with ShardDirectory(str(tmp_path / "d"), merge_policy=_EAGER, fsync=False, warm=False) as shard:
        model = _Model(shard)
        stop = threading.Event()
        installed: list[str] = []
        errors: list[BaseException] = []

        def merger() -> None:
            try:
                while not stop.is_set():
                    installed.extend(shard.maybe_merge())
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        t = threading.Thread(target=merger)
        t.start()
        rng = np.random.default_rng(7)
        try:
            for r in range(300):
                keys = rng.integers(0, 24, size=int(rng.integers(1, 6))).tolist()
                model.step("delete" if r % 5 == 4 else "index", keys)
                shard.refresh()
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors
        assert installed, "no merge installed beside the writes"
        model.check()


def test_the_merged_file_survives_a_cleanup_while_its_install_waits(tmp_path: Path, monkeypatch) -> None:
    """The install waits for a refresh beside the writes with the lock released; a flush that takes the lock then
    deletes unreferenced files (simulated: the cleanup runs inside that wait).  The merged file is not one of
    them: it is installed, on disk, and read."""
    with ShardDirectory(str(tmp_path / "d"), merge_policy=_EAGER, fsync=False, warm=False) as shard:
        model = _Model(shard)
        for r in range(8):
            model.index([r * 3 + i for i in range(3)])
            shard.refresh()
        write, settle = directory_module.write_merged, ShardDirectory._settle_sealed
        state = {"written": False, "inside": False}

        def write_and_mark(*args, **kwargs):
            merged = write(*args, **kwargs)
            state["written"] = True
            return merged

        def settle_with_a_cleanup(self) -> None:
            settle(self)
            if state["written"] and not state["inside"]:  # the merge's install: another thread's cleanup now
                state["inside"] = True
                self._delete_unreferenced()

        monkeypatch.setattr(directory_module, "write_merged", write_and_mark)
        monkeypatch.setattr(ShardDirectory, "_settle_sealed", settle_with_a_cleanup)
        installed = shard.maybe_merge()
        monkeypatch.setattr(ShardDirectory, "_settle_sealed", settle)
        assert installed and state["inside"]
        for name in installed:
            assert (tmp_path / "d" / f"{name}.parquet").exists()
        model.check()


def test_a_merge_cancelled_by_a_close_writes_and_installs_nothing(tmp_path: Path) -> None:
    """``write_merged`` stops at its next check once the directory closed (MergeCancelled, no file), and a merge asked
    of a closed directory installs nothing."""
    from shardstore.segments.merging import MergeCancelled, MergeInput, write_merged

    shard = ShardDirectory(str(tmp_path / "d"), merge_policy=_EAGER, fsync=False, warm=False)
    model = _Model(shard)
    for r in range(8):
        model.index([r * 3 + i for i in range(3)])
        shard.refresh()
    inputs = [MergeInput(n, s.reader, s.live) for n, s in shard._segments.items()]
    before = sorted(p.name for p in (tmp_path / "d").iterdir())
    with pytest.raises(MergeCancelled, match="closed"):
        write_merged(inputs, str(tmp_path / "d"), "seg_cancelled", fsync=False, cancelled=lambda: True)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == before
    names = list(shard._segments)
    shard.close()
    assert shard._merge(names[:2]) is None and list(shard._segments) == names


def test_a_write_torn_by_a_kill_is_removed_when_the_directory_opens(tmp_path: Path) -> None:
    with ShardDirectory(str(tmp_path / "d"), fsync=False, warm=False) as shard:
        _Model(shard).index([1, 2])
        shard.flush(local_checkpoint=1, primary_term=1)
    torn = tmp_path / "d" / ".seg_0123456789abcdef.parquet.0a1b.tmp"
    torn.write_bytes(b"PAR1 half a file")
    with ShardDirectory(str(tmp_path / "d"), fsync=False, warm=False) as shard:
        assert not torn.exists() and shard.count() == 2
