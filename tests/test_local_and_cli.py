"""Local-filesystem specifics (atomic publication, reserved temp dir) and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shardstore.blobstores import AccessDenied, FaultyStore, InvalidKey, open_backend, open_store
from shardstore.blobstores.selfcheck import run_checks
from shardstore.cli import main


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
