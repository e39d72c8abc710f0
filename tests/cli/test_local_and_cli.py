"""Local-filesystem specifics (atomic publication, reserved temp dir) and the command line."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardstore.blobstores import (
    AccessDenied,
    BlobNotFound,
    BlobStoreError,
    ConfigError,
    InvalidKey,
    TransientError,
    open_backend,
    open_store,
)
from shardstore.blobstores.selfcheck import run_checks
from shardstore.cli import main
from shardstore.plugins import local as local_plugin
from shardstore.testing import FaultyStore


def test_readers_never_see_a_partial_blob(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}", fsync=False)
    big = [bytes([i]) * (4 << 20) for i in range(1, 4)]
    store.put("blob", big[0])
    stop = threading.Event()
    seen: set[bytes] = set()

    def read() -> None:
        while not stop.is_set():
            data = store.get("blob")
            seen.add(data[:1] + data[-1:] + len(data).to_bytes(8, "big"))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for _ in range(10):
        for b in big:
            store.put("blob", b)
    stop.set()
    for t in readers:
        t.join()
    whole = {b[:1] + b[-1:] + len(b).to_bytes(8, "big") for b in big}
    assert seen and seen <= whole  # every read was one whole version


def test_temp_dir_is_reserved_and_hidden(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put("a", b"1")
    assert (tmp_path / ".shardstore-tmp").is_dir()
    assert [i.key for i in store.list()] == ["a"]
    with pytest.raises(InvalidKey, match="reserved"):
        store.put(".shardstore-tmp/x", b"1")
    assert os.listdir(tmp_path / ".shardstore-tmp") == []  # no temp file left behind


def test_key_and_prefix_collision_is_a_clear_error(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put("a/b", b"1")
    with pytest.raises(InvalidKey, match="prefix of other keys"):
        store.put("a", b"2")
    with pytest.raises(InvalidKey, match="prefix of other keys"):
        store.put("a", b"2", if_absent=True)
    store.put("c", b"1")
    with pytest.raises(InvalidKey, match="parent of this key is itself a blob"):
        store.put("c/d", b"2")
    assert store.get("a/b") == b"1" and store.get("c") == b"1"


def test_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put("x/y/z", b"1")
    store.delete(["x/y/z", "x/missing"])
    assert not (tmp_path / "x").exists()
    assert tmp_path.exists()


def test_missing_root_without_create(tmp_path: Path) -> None:
    from shardstore.blobstores import ConfigError

    with pytest.raises(ConfigError, match="root directory does not exist"):
        open_store(f"file://{tmp_path}/nope?create=false")


def _escape_setup(tmp_path: Path) -> tuple[Path, Path]:
    """root/ with link -> outside/ (holding 'secret'), flink -> outside/secret, a/b/up -> outside/."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"s3cret")
    (root / "link").symlink_to(outside)
    (root / "flink").symlink_to(outside / "secret")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "up").symlink_to(outside)
    return root, outside


@pytest.mark.parametrize("proc_fd", [True, False], ids=["proc-fd", "realpath"])
def test_symlinks_out_of_the_root_are_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proc_fd: bool
) -> None:
    if not proc_fd:  # the portable check (no /proc/self/fd)
        monkeypatch.setattr(local_plugin, "_PROC_FD", "")
    root, outside = _escape_setup(tmp_path)
    store = open_store(f"file://{root}", fsync=False)
    for key in ("link/pwned", "a/b/up/pwned", "link/secret", "link/new/deep/x"):
        for put in (lambda: store.put(key, b"x"), lambda: store.put(key, b"x", if_absent=True),
                    lambda: store.put_stream(key, io.BytesIO(b"x"))):
            with pytest.raises(InvalidKey, match="outside the store root through a symlink"):
                put()
    for key in ("link/secret", "flink", "a/b/up/secret"):
        for read in (lambda: store.get(key), lambda: store.get_range(key, 0, 2), lambda: store.stat(key),
                     lambda: store.open_read(key)):
            with pytest.raises(InvalidKey, match="outside the store root"):
                read()
    with pytest.raises(InvalidKey, match="outside the store root"):
        store.delete(["link/secret"])
    with pytest.raises(InvalidKey, match="outside the store root"):
        list(store.list("link/"))
    with pytest.raises(InvalidKey, match="outside the store root"):
        list(store.list("a/b/up/s"))
    store.put("mine", b"1")
    assert [i.key for i in store.list()] == ["mine"]  # neither flink nor link/secret
    assert sorted(os.listdir(outside)) == ["secret"] and (outside / "secret").read_bytes() == b"s3cret"
    assert os.listdir(root / ".shardstore-tmp") == []


@pytest.mark.parametrize("proc_fd", [True, False], ids=["proc-fd", "realpath"])
def test_symlinks_inside_the_root_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proc_fd: bool) -> None:
    if not proc_fd:
        monkeypatch.setattr(local_plugin, "_PROC_FD", "")
    store = open_store(f"file://{tmp_path}", fsync=False)
    store.put("real/blob", b"12345")
    (tmp_path / "alias").symlink_to(tmp_path / "real" / "blob")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    assert store.get("alias") == b"12345" and store.stat("alias").size == 5
    assert store.get_range("dirlink/blob", 1, 2) == b"23"
    store.put("dirlink/new", b"n")
    assert (tmp_path / "real" / "new").read_bytes() == b"n"
    # Files linked inside the root are listed (with the target's size); linked directories are not walked.
    assert [(i.key, i.size) for i in store.list()] == [("alias", 5), ("real/blob", 5), ("real/new", 1)]
    store.delete(["alias"])
    assert not (tmp_path / "alias").exists() and store.get("real/blob") == b"12345"


def test_a_symlinked_temp_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / ".shardstore-tmp").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symlink"):
        open_store(f"file://{tmp_path}/root")


class _Broken(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer: object) -> int:
        raise ConnectionResetError(errno.ECONNRESET, "source went away")


class _Buggy(_Broken):
    def readinto(self, buffer: object) -> int:
        raise ZeroDivisionError("a bug in the source")


def test_a_failed_write_leaves_no_temp_file(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}", fsync=False, retry_attempts=1)
    with pytest.raises(BlobStoreError):
        store.put_stream("k", _Broken())
    with pytest.raises(ZeroDivisionError):  # not an OSError: propagates as is, still cleaned up
        store.put_stream("k", _Buggy())
    assert os.listdir(tmp_path / ".shardstore-tmp") == []
    assert [i.key for i in store.list()] == []


def test_disk_full_is_not_retried_and_leaks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"file://{tmp_path}", fsync=True, retry_base_delay=0.001)
    calls = []

    def full(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(BlobStoreError, match="no space left") as info:
        store.put("k", b"x" * 4096)
    assert not isinstance(info.value, TransientError) and not info.value.retryable
    assert len(calls) == 1  # one attempt, not one per retry
    assert os.listdir(tmp_path / ".shardstore-tmp") == []


def test_listing_the_temp_dir_is_refused(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put(".shardstore-tmpx", b"1")  # only the exact first part is reserved
    (tmp_path / ".shardstore-tmp" / "inflight").write_bytes(b"partial")
    for prefix in (".shardstore-tmp/", ".shardstore-tmp/in"):
        with pytest.raises(InvalidKey, match="reserved"):
            list(store.list(prefix))
    assert [i.key for i in store.list(".shardstore-tmp")] == [".shardstore-tmpx"]


def test_a_directory_is_not_a_blob(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    store.put("d/x", b"1")
    for read in (lambda: store.get_range("d", 0, 0), lambda: store.get_range("d", 0, 5), lambda: store.get("d"),
                 lambda: store.stat("d"), lambda: store.open_read("d")):
        with pytest.raises(BlobNotFound):
            read()
    assert store.get_range("d/x", 0, 0) == b""


def test_stale_temp_files_are_swept_on_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_dir = tmp_path / ".shardstore-tmp"
    tmp_dir.mkdir()
    for name in ("old", "fresh"):
        (tmp_dir / name).write_bytes(b"partial")
    (tmp_dir / "olddir").mkdir()
    hours_ago = os.path.getmtime(tmp_dir / "old") - 7200
    os.utime(tmp_dir / "old", (hours_ago, hours_ago))
    os.utime(tmp_dir / "olddir", (hours_ago, hours_ago))
    open_store(f"file://{tmp_path}")
    assert sorted(os.listdir(tmp_dir)) == ["fresh", "olddir"]
    os.utime(tmp_dir / "fresh", (hours_ago, hours_ago))

    def refuse(path: str) -> None:
        raise PermissionError(errno.EACCES, "nope", path)

    monkeypatch.setattr(os, "unlink", refuse)
    open_store(f"file://{tmp_path}")  # best effort: the open still succeeds
    assert (tmp_dir / "fresh").exists()


def test_new_directories_are_fsynced_into_their_parents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"file://{tmp_path}", fsync=True)
    store.put("a/keep", b"0")
    synced: list[str] = []
    mkdirs: list[str] = []
    real_fsync, real_mkdir = os.fsync, os.mkdir

    def fsync(fd: int) -> None:
        synced.append(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path))
        real_fsync(fd)

    def mkdir(path: str, *args: object, **kwargs: object) -> None:
        mkdirs.append(os.path.relpath(path, tmp_path))
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "mkdir", mkdir)
    store.put("a/b/c/blob", b"1", if_absent=True)
    dirs = [p for p in synced if not p.startswith(".shardstore-tmp")]
    assert mkdirs == ["a/b", "a/b/c"]
    assert dirs == ["a", "a/b", "a/b/c"]  # each new directory into its parent, then the blob into its own
    synced.clear()
    mkdirs.clear()
    store.put("a/b/c/blob2", b"2")  # fast path: the parent exists
    assert mkdirs == [] and [p for p in synced if not p.startswith(".shardstore-tmp")] == ["a/b/c"]


@pytest.mark.parametrize("code", sorted({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP}))
def test_conditional_create_without_hard_links_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    store = open_store(f"file://{tmp_path}", fsync=False)

    def no_link(src: str, dst: str) -> None:
        raise OSError(code, os.strerror(code), src, None, dst)

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(ConfigError, match="does not support hard links, which conditional create needs"):
        store.put("k", b"1", if_absent=True)
    assert [i.key for i in store.list()] == [] and os.listdir(tmp_path / ".shardstore-tmp") == []
    store.put("k", b"2")  # a plain put needs no link
    assert store.get("k") == b"2"


def test_selfcheck_passes_on_a_good_store(tmp_path: Path) -> None:
    results = run_checks(open_store(f"file://{tmp_path}"))
    assert [r.name for r in results] == [
        "put/get", "range", "stat", "list", "conditional create", "overwrite", "delete"]
    assert all(r.ok for r in results), results
    assert [i.key for i in open_store(f"file://{tmp_path}").list()] == []  # cleaned up


def test_selfcheck_reports_a_broken_conditional_create(request: pytest.FixtureRequest) -> None:
    # No real service refuses only conditional puts on demand; FaultyStore stands in.
    faulty = FaultyStore(open_backend(f"memory://{request.node.name}"))
    faulty.inject(op="put", key="*/conditional", error=AccessDenied, times=None)
    results = {r.name: r for r in run_checks(faulty)}
    assert not results["conditional create"].ok
    assert "AccessDenied" in results["conditional create"].detail
    assert results["put/get"].ok and results["delete"].ok


def test_cli_version_plugins_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("shardstore ")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for scheme in ("memory", "file", "s3", "oci", "gs", "az"):
        assert f"\n{scheme} " in out
    (tmp_path / "s").mkdir()  # store check does not create a missing root (tests/cli/test_cli_readonly.py)
    assert main(["store", "check", f"file://{tmp_path}/s"]) == 0
    out = capsys.readouterr().out
    assert "7/7 checks passed" in out and "FAIL" not in out
    assert main(["store", "check", "nope://x"]) == 1
    assert "installed schemes" in capsys.readouterr().err


def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("shardstore")
    out = subprocess.run([str(exe), "store", "check", f"file://{tmp_path}"], capture_output=True, text=True,
                         cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("PASS") == 7
