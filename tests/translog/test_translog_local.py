"""The local translog: durability, group commit, rolling, recovery, trims, crashes."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.translog.errors import InvalidOperation, StaleTerm, TranslogCorruptedError
from shardstore.translog.local import LocalTranslog, generation_file
from shardstore.translog.operations import index_batch, stamp


def ops(first: int, n: int, term: int = 1, tag: str = "") -> pa.RecordBatch:
    """n index operations with seq#s first.. and one term."""
    ids = [f"d{first + i}" for i in range(n)]
    return stamp(index_batch(ids, [f'{{"v":"{tag}{first + i}"}}'.encode() for i in range(n)]), first, term)


def seqs(log: LocalTranslog, start: int = 0) -> list[int]:
    return [s for b in log.read_operations(start) for s in b.column("seq_no").to_pylist()]


def test_append_sync_and_reopen(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(ops(0, 100))
        log.add(ops(100, 50))
        assert log.persisted_checkpoint == 149
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert seqs(log) == list(range(150))
        assert log.persisted_checkpoint == 149
        assert seqs(log, 120) == list(range(120, 150))


def test_a_bad_batch_writes_nothing(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=2) as log:
        log.add(ops(0, 10, term=2))
        size = os.path.getsize(tmp_path / generation_file(1))
        with pytest.raises(InvalidOperation):
            log.add(ops(10, 5, term=1))  # a lower term
        assert os.path.getsize(tmp_path / generation_file(1)) == size
        assert seqs(log) == list(range(10))


def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), time.sleep(0.002), real(fd))[-1])
    log = LocalTranslog(str(tmp_path), primary_term=1)
    counter = iter(range(0, 10**9, 10))
    lock = threading.Lock()

    def work() -> None:
        for _ in range(25):
            with lock:
                first = next(counter)
            log.add(ops(first, 10))

    threads = [threading.Thread(target=work) for _ in range(8)]
    calls.clear()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appends = 8 * 25
    # Each sync is one fsync of the file plus one of the checkpoint file and its directory.
    assert len(calls) < 3 * appends * 0.8, f"{len(calls)} fsyncs for {appends} appends: no sharing"
    assert log.persisted_checkpoint == appends * 10 - 1
    log.close()


def test_async_durability_syncs_in_the_background(tmp_path: Path) -> None:
    log = LocalTranslog(str(tmp_path), primary_term=1, durability="async", sync_interval=0.05)
    log.add(ops(0, 5))
    deadline = time.monotonic() + 5
    while log.persisted_checkpoint < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.persisted_checkpoint == 4
    log.close()


def test_generations_roll_on_size_and_term(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1, generation_bytes=4096) as log:
        for i in range(10):
            log.add(ops(i * 20, 20))
        assert log.generation > 2
        before = log.generation
        log.add(ops(200, 5, term=2))  # a new term starts a generation
        assert log.generation == before + 1 and log.primary_term == 2
        gens = log.generations()
        assert [g.primary_term for g in gens][-1] == 2
        assert all(g.primary_term == 1 for g in gens[:-1])
    with LocalTranslog(str(tmp_path), primary_term=2) as log:
        assert seqs(log) == list(range(205))
    with pytest.raises(StaleTerm):
        LocalTranslog(str(tmp_path), primary_term=1)


def test_highest_term_wins_and_trim_drops_stale_ops(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(ops(0, 10, term=1, tag="old"))  # 0..9 from the old primary
        log.add(ops(5, 3, term=2, tag="new"))  # the new primary re-issues 5..7
        out = pa.Table.from_batches(list(log.read_operations(0)))
        assert out.column("seq_no").to_pylist() == list(range(10))
        terms = dict(zip(out.column("seq_no").to_pylist(), out.column("primary_term").to_pylist()))
        assert [terms[s] for s in range(10)] == [1] * 5 + [2] * 3 + [1] * 2
        log.trim_operations_above(7, term=2)  # ops of term < 2 above 7 are gone
        assert seqs(log) == list(range(8))
    with LocalTranslog(str(tmp_path), primary_term=2) as log:  # the trim is durable
        assert seqs(log) == list(range(8))


def test_torn_tail_is_cut_and_damage_is_named(tmp_path: Path) -> None:
    log = LocalTranslog(str(tmp_path), primary_term=1)
    log.add(ops(0, 10))
    log.close()
    path = tmp_path / generation_file(1)
    good = path.read_bytes()
    with open(path, "ab") as f:  # a frame written but never covered by the checkpoint, torn
        f.write(b"FR\x00\x01garbage")
    with LocalTranslog(str(tmp_path), primary_term=1) as log2:
        assert seqs(log2) == list(range(10))
    assert path.read_bytes() == good  # cut back to the checkpoint
    damaged = bytearray(good)
    damaged[len(good) - 20] ^= 0x40  # inside the checkpointed range
    path.write_bytes(bytes(damaged))
    with pytest.raises(TranslogCorruptedError, match=generation_file(1)):
        LocalTranslog(str(tmp_path), primary_term=1)


def test_delete_generations_keeps_a_suffix(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1, generation_bytes=2048) as log:
        for i in range(8):
            log.add(ops(i * 10, 10))
        gens = [g.generation for g in log.generations()]
        log.delete_generations({gens[0], gens[1]})
        assert [g.generation for g in log.generations()] == gens[2:]
        assert not (tmp_path / generation_file(gens[0])).exists()
        low = log.generations()[0].min_seq_no
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert seqs(log)[0] == low


def _first_ack(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The writer's first ACK line; fails (never hangs) if the writer dies or stays silent."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
    if not line.startswith("ACK"):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the writer acknowledged nothing (exit {proc.returncode}): {err[-2000:] if err else ''}")
    return line


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_operation(tmp_path: Path) -> None:
    """A writer subprocess (4 threads, group commit) is SIGKILLed at random points, 5 times."""
    rng = random.Random(7)
    acked: set[int] = set()
    script = Path(__file__).with_name("translog_writer.py")
    for round_ in range(5):
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "4", "50"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first_line = _first_ack(proc)  # the writer is up and acking
        time.sleep(rng.random() * 0.8)  # then die at a random point of the append/sync cycle
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        lines = [ln.split() for ln in (first_line + out).splitlines() if ln.startswith("ACK")]
        assert lines, f"round {round_}: the writer acknowledged nothing"
        for _, first, last in lines:
            acked.update(range(int(first), int(last) + 1))
        with LocalTranslog(str(tmp_path), primary_term=1) as log:
            got = seqs(log)
        assert len(got) == len(set(got)), "an operation came back twice"
        missing = acked - set(got)
        assert not missing, f"round {round_}: {len(missing)} acknowledged ops lost, e.g. {sorted(missing)[:5]}"


def test_purge_follows_the_commit_and_the_retention(tmp_path: Path) -> None:
    with LocalTranslog(str(tmp_path), primary_term=1, generation_bytes=2048) as log:
        for i in range(10):
            log.add(ops(i * 10, 10))
        gens = log.generations()
        # Nothing is covered by a commit yet: nothing goes.
        assert log.purge(last_commit_local_checkpoint=-1, retention_seq_no=99) == set()
        # A commit up to 49, but replicas still need everything above 19: only gens <= 19 go.
        gone = log.purge(last_commit_local_checkpoint=49, retention_seq_no=19)
        assert gone and all(g.max_seq_no <= 19 for g in gens if g.generation in gone)
        assert seqs(log)[0] <= 20  # every op above the retention point is still readable
        assert set(range(20, 100)) <= set(seqs(log))
        assert log.generation not in gone


@pytest.mark.slow
def test_sigkill_during_uploads_loses_no_acknowledged_operation(tmp_path: Path) -> None:
    """A RemoteTranslog writer is SIGKILLed mid-upload; a reader with only the store finds every ack."""
    from shardstore.blobstores import open_store
    from shardstore.translog.remote import RemoteTranslog

    rng = random.Random(11)
    store_url = f"file://{tmp_path / 'store'}"
    prefix = "cluster/1/index/0/translog"
    script = Path(__file__).with_name("translog_writer.py")
    acked: set[int] = set()
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "local"), "3", "20", store_url, prefix],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        first_line = _first_ack(proc)
        time.sleep(rng.random() * 0.8)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        for line in (first_line + out).splitlines():
            if line.startswith("ACK"):
                _, first, last = line.split()
                acked.update(range(int(first), int(last) + 1))
        assert acked, f"round {round_}: nothing acknowledged"
        got = [s for b in RemoteTranslog.read_operations(open_store(store_url), prefix, 0)
               for s in b.column("seq_no").to_pylist()]
        assert len(got) == len(set(got)), "an operation came back twice"
        missing = acked - set(got)
        assert not missing, f"round {round_}: {len(missing)} acknowledged ops missing from the store"


def test_a_roll_interrupted_by_a_crash_is_cleaned_up(tmp_path: Path) -> None:
    """A crash after the next generation's file was created, before translog.ckp named it."""
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        log.add(ops(0, 5))
        current = log.generation
    (tmp_path / generation_file(current + 1)).write_bytes(b"SSTL-partial-header")
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert log.generation == current
        log.roll_generation()  # must not trip over the orphan
        log.add(ops(5, 5))
        assert seqs(log) == list(range(10))


def test_a_format_version_1_translog_opens_reads_and_rolls(tmp_path: Path) -> None:
    """A log written in format version 1 (zlib CRC32, one IPC stream per frame) still opens.

    Its operations read back, and new appends go to a new version 2 generation: the
    version 1 file is sealed as it is, never appended to.
    """
    import struct
    import uuid
    import zlib

    from shardstore.translog.checkpoint import read_checkpoint
    from shardstore.translog.frames import FORMAT_VERSION, scan

    tl_uuid = uuid.uuid4()
    head = struct.pack("<4sHH16sqq", b"SSTL", 1, 0, tl_uuid.bytes, 1, 1)
    data = head + struct.pack("<I", zlib.crc32(head))
    for first in (0, 5):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, ops(first, 5).schema) as w:
            w.write_batch(ops(first, 5))
        payload = sink.getvalue().to_pybytes()
        fields = struct.pack("<2sIIqq", b"FR", len(payload), 5, first, first + 4)
        data += fields + struct.pack("<I", zlib.crc32(payload, zlib.crc32(fields))) + payload
    (tmp_path / generation_file(1)).write_bytes(data)
    ckp = struct.pack("<4sHqqqqqqqq16sq", b"SSCK", 1, 1, len(data), 10, 0, 9, -1, 1, -2, tl_uuid.bytes, 1)
    (tmp_path / "translog.ckp").write_bytes(ckp + struct.pack("<I", zlib.crc32(ckp)))

    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert seqs(log) == list(range(10)) and log.persisted_checkpoint == 9
        assert log.generation == 2  # rolled: the version 1 file stays as it was
        log.add(ops(10, 5))
    assert (tmp_path / generation_file(1)).read_bytes() == data
    with LocalTranslog(str(tmp_path), primary_term=1) as log:
        assert seqs(log) == list(range(15))
    cp = read_checkpoint(tmp_path)
    assert scan(tmp_path / generation_file(2), cp.offset).header.version == FORMAT_VERSION


def test_remote_durability_hands_the_round_what_was_appended_as_pieces(tmp_path: Path) -> None:
    """Under ``remote`` durability the log keeps what no round landed yet and hands it out as pieces: the first
    one is the file's bytes exactly; a later one is the header plus the frames since; each reads back as a
    generation; a roll's remainder comes as the sealed generation's last piece; landed bytes are let go; and
    a log that left ``remote`` durability hands out nothing (the round rolls and reads files then)."""
    from shardstore.translog.frames import HEADER_SIZE, iter_frames

    def seq_nos(data: bytes) -> list[int]:
        return [s for f in iter_frames(data, HEADER_SIZE, None, "piece", decode=True)
                for s in f.batch().column("seq_no").to_pylist()]

    tl = LocalTranslog(str(tmp_path), primary_term=1, durability="remote")
    try:
        tl.add(ops(0, 3))
        tl.add(ops(3, 2))
        (first,), through = tl.pieces(1, 0)
        with open(tmp_path / generation_file(1), "rb") as f:
            assert first.data == f.read()  # the whole generation so far, as written
        assert (first.generation, first.num_ops, first.min_seq_no, first.max_seq_no) == (1, 5, 0, 4)
        assert through == (1, first.end) and seq_nos(first.data) == [0, 1, 2, 3, 4]
        assert tl.pieces(*through) == ([], through)  # nothing new
        tl.release_images(through)
        tl.add(ops(5, 2))
        (second,), through2 = tl.pieces(*through)
        assert (second.start, second.num_ops) == (first.end, 2) and seq_nos(second.data) == [5, 6]
        assert second.data.startswith(first.data[:HEADER_SIZE])  # the generation's header first: self-contained
        sealed = tl.roll_generation()
        tl.add(ops(7, 1))
        pieces, through3 = tl.pieces(*through2)  # generation 1 has nothing past through2; generation 2 does
        assert [(p.generation, seq_nos(p.data)) for p in pieces] == [(2, [7])]
        assert through3 == (2, pieces[0].end) and sealed.generation == 1
        tl.release_images(through3)
        assert tl.pieces(*through2) is None  # what a round landed is no longer held: the caller reads the files
        tl.set_durability("request")
        tl.add(ops(8, 1))
        assert tl.pieces(*through3) is None
        assert tl.tracker.persisted_checkpoint == 8
    finally:
        tl.close()


def test_a_roll_counts_every_appended_seq_no_durable_in_any_order(tmp_path: Path) -> None:
    """A stamped batch counts as a range, any other batch (out of order, a gap) seq# by seq#."""
    tl = LocalTranslog(str(tmp_path), primary_term=1, durability="remote")
    try:
        tl.add(ops(0, 4))  # 0..3: a range
        shuffled = ops(4, 4)
        tl.add(shuffled.take(pa.array([2, 0, 3, 1])))  # 4..7 out of order
        tl.add(ops(9, 2))  # 9..10: a gap at 8
        assert tl.tracker.persisted_checkpoint == -1  # nothing durable before the round's roll
        tl.roll_generation()
        assert tl.tracker.persisted_checkpoint == 7
        tl.add(ops(8, 1))
        tl.roll_generation()
        assert tl.tracker.persisted_checkpoint == 10
    finally:
        tl.close()
