"""A translog holds its current generation file open only while in use (issue 30): the descriptors a node needs
do not grow with its idle shards, and running out of them at a reopen is a typed, retryable error that fails
nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from shardstore.translog.local import LocalTranslog, generation_file
from shardstore.translog.operations import index_batch, stamp


def ops(first: int, n: int = 5):
    return stamp(index_batch([f"d{first + i}" for i in range(n)], [b'{"v":1}'] * n), first, 1)


def open_paths() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return out


def test_an_idle_log_holds_no_descriptor_and_an_active_one_holds_one(tmp_path: Path) -> None:
    synced = LocalTranslog(str(tmp_path / "req"), primary_term=1)  # request durability: every append syncs
    remote = LocalTranslog(str(tmp_path / "rem"), primary_term=1, durability="remote")
    try:
        current = lambda tl: os.path.join(tl.directory, generation_file(tl.generation))  # noqa: E731
        assert current(synced) not in open_paths() and current(remote) not in open_paths()  # opened: idle
        synced.add(ops(0))
        assert current(synced) not in open_paths()  # the sync covered every append: released
        remote.add(ops(0))
        assert current(remote) in open_paths()  # appended, not rolled yet: held
        remote.roll_generation()
        assert current(remote) not in open_paths()  # the new generation holds only its header
        assert all(generation_file(g) not in " ".join(open_paths()) for g in (1, 2))
        remote.add(ops(5))
        remote.sync()
        assert current(remote) not in open_paths()
    finally:
        synced.close()
        remote.close()
    with LocalTranslog(str(tmp_path / "rem"), primary_term=1) as reopened:
        assert [s for b in reopened.read_operations(0) for s in b.column("seq_no").to_pylist()] == list(range(10))


_CHILD = textwrap.dedent('''
    import json, os, sys
    from shardstore.errors import TooManyOpenFiles
    from shardstore.testing.descriptors import free_descriptors, use_up_descriptors
    from shardstore.translog.local import LocalTranslog
    from shardstore.translog.operations import index_batch, stamp
    def ops(first, n=5):
        return stamp(index_batch([f"d{first + i}" for i in range(n)], [b'{"v":1}'] * n), first, 1)
    tl = LocalTranslog(sys.argv[1], primary_term=1)
    tl.add(ops(0))
    out = {}
    hog = use_up_descriptors()
    try:
        tl.add(ops(5))
        out["full"] = "appended"
    except Exception as exc:
        out["full"] = [type(exc).__name__, isinstance(exc, TooManyOpenFiles), exc.retryable, str(exc)]
    free_descriptors(hog)
    tl.add(ops(5))  # not failed for good: the same operations go in once descriptors are free
    tl.close()
    with LocalTranslog(sys.argv[1], primary_term=1) as again:
        out["seq_nos"] = [s for b in again.read_operations(0) for s in b.column("seq_no").to_pylist()]
    print(json.dumps(out))
''')


def test_out_of_descriptors_at_a_reopen_is_typed_retryable_and_fails_nothing(tmp_path: Path) -> None:
    """Runs in a child process that really uses up its descriptors (no mock)."""
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "tl")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    name, typed, retryable, message = out["full"]
    assert (name, typed, retryable) == ("TooManyOpenFiles", True, True), out
    assert "ulimit -n" in message and "\n" not in message
    assert out["seq_nos"] == list(range(10))


def test_leaving_remote_durability_makes_everything_logged_durable(tmp_path: Path, monkeypatch) -> None:
    """A primary demoted from the node translog goes back to ``request`` durability: what it logged and rolled
    without an fsync (``remote``) is made durable before the log promises durability again (the calls are
    counted and passed through to the real disk)."""
    from shardstore import fileio

    calls: list[str] = []
    real_fsync, real_syncfs = fileio.fsync, fileio.sync_filesystem
    monkeypatch.setattr(fileio, "fsync", lambda fd, path: (calls.append(f"fsync {os.path.basename(path)}"),
                                                           real_fsync(fd, path))[1])
    monkeypatch.setattr(fileio, "sync_filesystem", lambda path, files=(): (calls.append("syncfs"),
                                                                           real_syncfs(path, files))[1])
    with LocalTranslog(str(tmp_path / "tl"), primary_term=1, durability="remote") as tl:
        calls.clear()  # opening it synced its first generation
        tl.add(ops(0))
        tl.roll_generation()  # a roll no round synced (its round failed, say)
        tl.add(ops(5))
        assert calls == []  # remote durability: nothing fsynced yet
        tl.set_durability("request")
        assert "syncfs" in calls  # the unsynced roll's files
        assert f"fsync {generation_file(tl.generation)}" in calls  # the current generation's appends
        calls.clear()
        tl.add(ops(10))
        assert f"fsync {generation_file(tl.generation)}" in calls  # request durability again: each append
