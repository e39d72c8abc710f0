"""A shard copy adopting a staged file (issue 43, docs/design/adoption.md steps 2-3): one ADOPTED operation per row in
the translog, the same file adopted by each replica, and by every replay (restart, restore from the store, failover).

Every copy must end exactly as a copy that indexed the same rows as one bulk in file order: the oracle below is a
second shard copy doing that through ``primary_apply``."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstore.core.ops import OpType
from shardstore.core.records import crc32c
from shardstore.engine.shard.adopted_ops import AdoptedFile, AdoptedFileLost, adopted_batch, split_runs
from shardstore.engine.shard.shard_copy import ShardCopy, ShardSpec
from shardstore.segments.errors import MappingConflict
from shardstore.translog.operations import index_batch

REMOTE = pytest.mark.parametrize("backend", ["file", "s3"], indirect=True)
FILE = pytest.mark.parametrize("backend", ["file"], indirect=True)
MAPPING = {"v": {"type": "long"}, "s": {"type": "keyword"}}


def _rows(ids: list[str], tag: str) -> pa.Table:
    return pa.table({"_id": pa.array(ids, pa.string()), "v": pa.array(range(len(ids)), pa.int64()),
                     "s": pa.array([f"{tag}{i}" for i in range(len(ids))], pa.string())})


def _stage(store, key: str, table: pa.Table) -> AdoptedFile:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=7)  # several row groups: rows keep file order
    data = buf.getvalue()
    store.put(key, data)
    return AdoptedFile(key, len(data), crc32c(data), table.num_rows)


def _bulk(table: pa.Table) -> pa.RecordBatch:
    d = table.to_pydict()
    return index_batch(d["_id"], [json.dumps({"v": v, "s": s}).encode() for v, s in zip(d["v"], d["s"])])


def _state(copy: ShardCopy) -> dict[str, tuple]:
    """Every live document: (seq#, term, version, v, s), through a refresh and a scan."""
    copy.directory.refresh()
    out = {}
    for b in copy.directory.scan(columns=["_id", "_seq_no", "_primary_term", "_version", "v", "s"]):
        for row in b.to_pylist():
            out[row["_id"]] = (row["_seq_no"], row["_primary_term"], row["_version"], row["v"], row["s"])
    return out


def _spec(name: str) -> ShardSpec:
    return ShardSpec("cluster-adopt", name, 0, mapping=MAPPING, buffer_interval=0.0)


def _history() -> tuple[pa.Table, pa.Table, pa.Table]:
    """Rows before, the staged file (updates, new ids, one id twice), rows after (an update of an adopted row)."""
    before = _rows([f"a{i}" for i in range(40)], "b")
    staged = _rows([f"a{i}" for i in range(0, 40, 4)] + [f"n{i}" for i in range(30)] + ["n3", "a1"], "f")
    after = _rows(["n5", "a2", "z1"], "z")
    return before, staged, after


def _adopted(store, tmp_path: Path, name: str, job: str, *, flush: bool) -> tuple[ShardCopy, AdoptedFile, pa.Table,
                                                                                 pa.RecordBatch]:
    """A primary of index ``name`` holding :func:`_history`'s rows before (flushed if ``flush``), then the staged
    file of ``job`` adopted and settled: (the copy, the file, its rows, the stamped run)."""
    before, staged, _after = _history()
    file = _stage(store, f"ingest/{job}/files/part-0.parquet", staged)
    primary = ShardCopy(_spec(name), str(tmp_path / "p"), store, primary_term=1, primary=True)
    primary.primary_apply(_bulk(before))
    if flush:
        primary.flush()
    stamped, pending = primary.adopt(file)
    primary.settle(pending)
    return primary, file, staged, stamped


@REMOTE
def test_a_primary_and_its_replica_adopt_as_a_bulk_would_and_every_replay_agrees(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    before, staged, after = _history()
    file = _stage(store, "ingest/job-1/files/part-0.parquet", staged)
    spec, oracle_spec = _spec("idx"), _spec("oracle")
    primary = ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    replica = ShardCopy(spec, str(tmp_path / "r"), store, primary_term=1, primary=False)
    oracle = ShardCopy(oracle_spec, str(tmp_path / "o"), None, primary_term=1, primary=True)

    def write(batch: pa.RecordBatch) -> None:
        stamped = primary.primary_apply(batch)
        replica.replica_apply(stamped, 1, primary.global_checkpoint)
        oracle.primary_apply(batch)

    write(_bulk(before))
    primary.flush()
    stamped, pending = primary.adopt(file)
    primary.settle(pending)
    assert stamped.num_rows == staged.num_rows and stamped.column("op_type").to_pylist() == [3] * staged.num_rows
    assert stamped.column("seq_no").to_pylist() == list(range(40, 40 + staged.num_rows))
    assert stamped.column("reason")[0].as_py().startswith("adopted/1 40 ") and stamped.column("reason").null_count \
        == staged.num_rows - 1
    replica.replica_apply(stamped, 1, primary.global_checkpoint)
    oracle.primary_apply(_bulk(staged))
    write(_bulk(after))
    want = _state(oracle)
    assert want["a0"][2] == 2 and want["n3"][2] == 2 and want["n0"][2] == 1  # the oracle: updates, a repeat, a new id
    assert _state(primary) == want
    assert _state(replica) == want
    assert primary.local_checkpoint == replica.local_checkpoint == oracle.local_checkpoint

    # the translog holds the run as the primary logged it, whole, from its head
    runs = [p for b in primary.translog.read_operations(0) for p in split_runs(b, "test")
            if not isinstance(p, pa.RecordBatch)]
    assert [(r.file, r.seq_no_base, r.primary_term) for r in runs] == [(file, 40, 1)]
    assert runs[0].ops.column("version").to_pylist() == stamped.column("version").to_pylist()

    # a restart replays the local translog above the last commit: the file is fetched and adopted again
    primary.close()
    primary = ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    assert _state(primary) == want
    # every disk lost: the newest remote commit (before the adoption) plus the remote translog
    primary.close()
    restored = ShardCopy.recover_from_remote(spec, str(tmp_path / "fresh"), store, primary_term=2)
    assert _state(restored) == want
    restored.close()
    # the replica promoted: it adopted the file itself, and writes on
    replica.promote(3)
    more = _rows(["n7", "q1"], "m")
    replica.primary_apply(_bulk(more))
    oracle.primary_apply(_bulk(more))
    got, want = _state(replica), _state(oracle)
    assert {k: v[2:] for k, v in got.items()} == {k: v[2:] for k, v in want.items()}  # terms differ after promotion
    replica.close()
    oracle.close()
    assert not [n for n in os.listdir(tmp_path / "r") if n.startswith("adopting-")]


@FILE
def test_a_replay_whose_file_is_gone_names_the_blob_and_its_seq_nos(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    spec = _spec("gone")
    primary, file, staged, _stamped = _adopted(store, tmp_path, "gone", "job-2", flush=True)
    primary.close()
    data = store.get(file.key)
    store.delete([file.key])
    last = 40 + staged.num_rows - 1
    with pytest.raises(AdoptedFileLost, match=rf"{file.key} \(seq# 40-{last}\): gone from the store"):
        ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    store.put(file.key, b"x" * file.size)  # the same size, other bytes
    with pytest.raises(AdoptedFileLost, match="CRC32C"):
        ShardCopy.recover_from_remote(spec, str(tmp_path / "fresh"), store, primary_term=2)
    store.delete([file.key])
    store.put(file.key, data)  # back: the failed opens kept no lock of the copy, it opens now
    again = ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    assert again.local_checkpoint == last and again.directory.get("n0") is not None
    again.close()


@FILE
def test_a_refused_adoption_takes_no_seq_no_and_changes_nothing(store_factory, tmp_path: Path) -> None:
    store = store_factory()
    before, _staged, _after = _history()
    spec = _spec("refused")
    primary = ShardCopy(spec, str(tmp_path / "p"), store, primary_term=1, primary=True)
    primary.primary_apply(_bulk(before))
    unmapped = _stage(store, "ingest/job-3/files/bad.parquet", _rows(["x1", "x2"], "u").append_column(
        "extra", pa.array([1.5, 2.5])))
    state = _state(primary)
    with pytest.raises(MappingConflict, match="extra"):
        primary.adopt(unmapped)
    with pytest.raises(AdoptedFileLost, match="gone from the store"):
        primary.adopt(AdoptedFile("ingest/job-3/files/none.parquet", 10, 1, 2))
    wrong = _stage(store, "ingest/job-3/files/rows.parquet", _rows(["y1"], "w"))
    with pytest.raises(ValueError, match="1 rows, its run says 5"):
        primary.adopt(AdoptedFile(wrong.key, wrong.size, wrong.crc32c, 5))
    assert primary.max_seq_no == 39 and _state(primary) == state
    stamped = primary.primary_apply(_bulk(_rows(["k"], "k")))
    assert stamped.column("seq_no").to_pylist() == [40]  # no gap: the refusals took no seq#
    assert not [n for n in os.listdir(tmp_path / "p") if n.startswith("adopting-")]
    primary.close()


@FILE
def test_replica_versions_follow_the_primary_where_histories_differ(store_factory, tmp_path: Path) -> None:
    """A replica applies the primary's versions, not its own guesses: here it never saw the ids the primary did
    (a copy rebuilt from a commit that merged them away stands for it), and still ends with the primary's
    versions."""
    store = store_factory()
    _before, staged, _after = _history()
    file = _stage(store, "ingest/job-4/files/part-0.parquet", staged)
    primary = ShardCopy(_spec("diff"), str(tmp_path / "p"), store, primary_term=1, primary=True)
    primary.primary_apply(_bulk(_rows([f"a{i}" for i in range(40)], "b")))
    stamped, pending = primary.adopt(file)
    primary.settle(pending)
    blank = ShardCopy(_spec("diff"), str(tmp_path / "blank"), store, primary_term=1, primary=False)
    blank.tracker.advance_max_seq_no(39)
    blank.tracker.mark_processed(pa.array(np.arange(40), pa.int64()))
    blank.replica_apply(stamped, 1, -1)
    want = {k: v[2] for k, v in _state(primary).items() if k in set(staged.column("_id").to_pylist())}
    got = {k: v[2] for k, v in _state(blank).items()}
    assert got == want and got["a0"] == 2
    primary.close()
    blank.close()


def test_adopted_operations_need_a_version_and_carry_no_source(tmp_path: Path) -> None:
    from shardstore.translog.errors import InvalidOperation
    from shardstore.translog.local import LocalTranslog
    from shardstore.translog.operations import SCHEMA

    def batch(version, source) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([{"seq_no": 0, "primary_term": 1, "op_type": int(OpType.ADOPTED), "id": "a",
                                            "version": version, "source": source, "reason": None}], schema=SCHEMA)

    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        with pytest.raises(InvalidOperation, match="adopted operation without a version"):
            log.add(batch(None, None))
        with pytest.raises(InvalidOperation, match="adopted operation with a source"):
            log.add(batch(1, b"{}"))
        log.add(batch(1, None))
        assert [b.num_rows for b in log.read_operations(0)] == [1]


@FILE
def test_the_changes_feed_reads_adopted_rows_from_their_file(store_factory, tmp_path: Path) -> None:
    """A reader of the remote translog (the changes feed; Spark's translog tail uses the same helper) reports each
    adopted row as the index operation it stands for: its id, seq#, version and a source rebuilt from the file."""
    from shardstore.spark.changes import shard_operations

    store = store_factory()
    spec = _spec("changes")
    primary, file, staged, stamped = _adopted(store, tmp_path, "changes", "job-5", flush=False)
    got = shard_operations(store, spec.address, 0, 40, order=("v", "s")).to_pylist()
    assert [r["_seq_no"] for r in got] == list(range(40, 40 + staged.num_rows))
    assert {r["op_type"] for r in got} == {"index"}
    assert [r["_id"] for r in got] == staged.column("_id").to_pylist()
    assert [r["_version"] for r in got] == stamped.column("version").to_pylist()
    assert [json.loads(r["_source"]) for r in got] == [{"v": v, "s": s} for v, s in
                                                       zip(staged.column("v").to_pylist(), staged.column("s").to_pylist())]
    # bounds that cut the run: its rows from the file all the same (the head found below the first one asked)
    cut = shard_operations(store, spec.address, 0, 45, 50, order=("v", "s")).to_pylist()
    assert [(r["_seq_no"], r["_id"], r["_version"]) for r in cut] == [(g["_seq_no"], g["_id"], g["_version"])
                                                                      for g in got[5:11]]
    store.delete([file.key])
    with pytest.raises(AdoptedFileLost, match="gone from the store"):
        shard_operations(store, spec.address, 0, 40)
    # once a commit holds the run, its rows come from the segments when the file is gone
    primary.flush()
    again = shard_operations(store, spec.address, 0, 40, order=("v", "s")).to_pylist()
    by_seq = {r["_seq_no"]: (r["_id"], r["_version"], r["_source"]) for r in got}
    assert all(by_seq[r["_seq_no"]] == (r["_id"], r["_version"], r["_source"]) for r in again)  # live rows, as logged
    assert {r["_id"] for r in again} == set(staged.column("_id").to_pylist())
    primary.close()


@FILE
def test_a_bulk_load_that_folds_the_translog_tail_keeps_adopted_rows(store_factory, tmp_path: Path) -> None:
    """The Spark store writer (a bulk load that fences the cluster) commits the translog above the newest commit as
    its first commit: an adopted run there becomes its file's rows, never dropped as an unknown operation."""
    from shardstore.segments.reader import open_commit
    from shardstore.segments.remote_store import latest_commit
    from shardstore.spark.writer import fold_tail
    from shardstore.translog.remote import RemoteTranslog

    store = store_factory()
    spec = _spec("fold")
    primary, _file, _staged, _stamped = _adopted(store, tmp_path, "fold", "job-6", flush=True)
    want = _state(primary)
    primary.close()
    base = latest_commit(store, spec.address)
    tail = list(RemoteTranslog.read_operations(store, [spec.address.translog_prefix(1)], base.commit.local_checkpoint + 1))
    fold_tail(store, spec.address, 5, "bulk-load", base, tail, MAPPING)
    got = {}
    for b in open_commit(store, spec.address).scan(columns=["_id", "_seq_no", "_version", "v", "s"]):
        for r in b.to_pylist():
            got[r["_id"]] = (r["_seq_no"], r["_version"], r["v"], r["s"])
    assert got == {k: (s, ver, a, b) for k, (s, _t, ver, a, b) in want.items()}


def test_applying_adopted_operations_as_operations_is_refused() -> None:
    from shardstore.segments.errors import SegmentError
    from shardstore.segments.index_buffer import split_ops

    run = adopted_batch(AdoptedFile("k", 1, 2, 2), 0, 1, pa.array(["a", "b"]), np.ones(2))
    with pytest.raises(SegmentError, match="adopted with their file"):
        split_ops(pa.Table.from_batches([run]))
