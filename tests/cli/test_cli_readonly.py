"""Read-only opens and the command line's error paths (issue 15, item 7).

Read-only commands and opens create nothing and fail on a missing root; unusable roots
(a regular file, ``/proc/self``, a NUL byte, ``..``) are typed errors; a URL is
percent-decoded once; every CLI error is one line; a closed pipe ends the command quietly.
"""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from shardstore import cli
from shardstore.blobstores import AccessDenied, ConfigError, open_backend, open_store
from shardstore.blobstores.options import parse_url
from shardstore.cli import main
from shardstore.errors import InvalidError

HAS_PROC_SELF = os.path.isdir("/proc/self/fd")


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` (hidden ones included), relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real command in a child process (``python -m shardstore``)."""
    return subprocess.run([sys.executable, "-m", "shardstore", *argv], capture_output=True, text=True,
                          cwd=cwd, check=False, timeout=120)


def _assert_one_line_error(stderr: str, *fragments: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("shardstore: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr


# -- read-only opens ---------------------------------------------------------------------


def test_read_only_open_of_a_missing_root_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(ConfigError, match="root directory does not exist") as info:
        open_store(f"file://{missing}", read_only=True)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, InvalidError)
    with pytest.raises(ConfigError, match="root directory does not exist"):
        open_store(f"file://{missing}?read_only=true&create=true")  # read-only wins over create
    assert _tree(tmp_path) == []


def test_read_only_open_of_an_existing_root_reads_and_refuses_writes(tmp_path: Path) -> None:
    open_store(f"file://{tmp_path}").put("a/b", b"1")
    before = _tree(tmp_path)
    store = open_store(f"file://{tmp_path}", read_only=True)
    assert store.get("a/b") == b"1" and [i.key for i in store.list()] == ["a/b"]
    for write in (lambda: store.put("c", b"2"), lambda: store.put("c", b"2", if_absent=True),
                  lambda: store.delete(["a/b"])):
        with pytest.raises(AccessDenied, match="read-only"):
            write()
    backend = open_backend(f"file://{tmp_path}", read_only=True)  # the plugin refuses by itself too
    with pytest.raises(AccessDenied, match="read-only"):
        backend.put("c", b"2")
    clone = pickle.loads(pickle.dumps(store))
    with pytest.raises(AccessDenied, match="read-only"):
        clone.put("c", b"2")
    assert _tree(tmp_path) == before


def test_read_only_empty_root_gets_no_temp_dir(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}", read_only=True)
    assert list(store.list()) == []
    assert _tree(tmp_path) == []


def test_read_only_is_accepted_by_every_backend() -> None:
    store = open_store("memory://ro-space/p", read_only=True)
    assert list(store.list()) == []
    with pytest.raises(AccessDenied, match="read-only"):
        store.put("k", b"v")


# -- unusable roots and URLs ---------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_a_root_that_is_a_regular_file_is_a_config_error(tmp_path: Path, read_only: bool) -> None:
    f = tmp_path / "afile"
    f.write_bytes(b"x")
    with pytest.raises(ConfigError, match="is not a directory"):
        open_store(f"file://{f}", read_only=read_only)
    with pytest.raises(ConfigError, match="not a directory"):
        open_store(f"file://{f}/below", read_only=read_only)
    assert _tree(tmp_path) == ["afile"] and f.read_bytes() == b"x"


@pytest.mark.skipif(not HAS_PROC_SELF, reason="needs Linux /proc")
def test_proc_self_is_not_a_usable_root() -> None:
    with pytest.raises(ConfigError, match="cannot create"):
        open_store("file:///proc/self")


@pytest.mark.parametrize("url", [
    "file:///tmp/shardstore-nul%00x",
    "/tmp/shardstore-nul%00x",
    "file:///tmp/shardstore-ctl%0Ax",
    "s3://bucket%00x/prefix",
    "memory://space/a%00b",
])
def test_a_nul_or_control_character_in_a_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="control character"):
        open_store(url)
    assert not os.path.exists("/tmp/shardstore-nul")


def test_percent_2520_in_a_file_url_decodes_once(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/x%2520y")
    store.put("k", b"v")
    assert _tree(tmp_path) == ["x%20y", "x%20y/.shardstore-tmp", "x%20y/k"]
    assert store.location == f"file://{tmp_path}/x%20y"
    assert pickle.loads(pickle.dumps(store)).get("k") == b"v"
    special = open_store(f"file://{tmp_path}/q%3Fr%23s")  # '?' and '#' in the path, not query or fragment
    special.put("k", b"v")
    assert (tmp_path / "q?r#s" / "k").read_bytes() == b"v"


@pytest.mark.parametrize("url", ["s3://b/x%2520y", "memory://b%2520c/x%2520y/z%2Fw", "file:///a/%C3%A9%2520"])
def test_a_parsed_url_round_trips_through_its_canonical_form(url: str) -> None:
    parsed = parse_url(url)
    again = parse_url(parsed.url)
    assert (again.scheme, again.bucket, again.prefix) == (parsed.scheme, parsed.bucket, parsed.prefix)
    assert "%20" in parsed.prefix


@pytest.mark.parametrize("root", ["{t}/a/../b", "{t}/a/./b", "{t}/a//b", "{t}/a/%2E%2E/b"])
@pytest.mark.parametrize("form", ["file://{r}", "{r}"])
def test_a_file_root_must_be_a_normalized_path(tmp_path: Path, root: str, form: str) -> None:
    (tmp_path / "a").mkdir()
    url = form.format(r=root.format(t=tmp_path))
    with pytest.raises(ConfigError, match="normalized"):
        open_store(url)
    assert _tree(tmp_path) == ["a"]


# -- the command line ------------------------------------------------------------------


def test_cluster_state_show_on_a_missing_root_fails_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    out = _run("cluster-state", "show", f"file://{missing}", cwd=tmp_path)
    assert out.returncode == 1, out
    assert out.stdout == ""
    _assert_one_line_error(out.stderr, "root directory does not exist", str(missing))
    assert _tree(tmp_path) == []


def test_cluster_state_show_on_an_empty_root_creates_nothing(tmp_path: Path, capsys) -> None:
    assert main(["cluster-state", "show", f"file://{tmp_path}"]) == 1  # no cluster state: not a store (issue 32)
    _assert_one_line_error(capsys.readouterr().err, "no shardstore cluster state", "no blob at all")
    assert _tree(tmp_path) == []


def test_store_check_does_not_create_a_missing_root(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing"
    assert main(["store", "check", f"file://{missing}"]) == 1
    _assert_one_line_error(capsys.readouterr().err, "root directory does not exist", "create=true")
    assert _tree(tmp_path) == []
    assert main(["store", "check", f"file://{missing}", "-o", "create=true"]) == 0  # asked for explicitly
    assert "7/7 checks passed" in capsys.readouterr().out
    assert missing.is_dir()


@pytest.mark.parametrize("command", [["cluster-state", "show"], ["store", "check"]])
def test_unusable_roots_are_one_line_errors(tmp_path: Path, command: list[str]) -> None:
    f = tmp_path / "afile"
    f.write_bytes(b"x")
    cases = [
        (f"file://{f}", "not a directory"),
        (f"file://{tmp_path}/nul%00x", "control character"),
        (f"file://{tmp_path}/a/../b", "normalized"),
        ("nope://bucket/x", "installed schemes"),
    ]
    if HAS_PROC_SELF and command == ["store", "check"]:
        cases.append(("file:///proc/self", "cannot create"))
    for url, fragment in cases:
        out = _run(*command, url, cwd=tmp_path)
        assert out.returncode == 1, (url, out)
        _assert_one_line_error(out.stderr, fragment)
    assert _tree(tmp_path) == ["afile"] and f.read_bytes() == b"x"


@pytest.mark.skipif(not HAS_PROC_SELF, reason="needs Linux /proc")
def test_cluster_state_show_of_proc_self_creates_nothing_and_never_tracebacks(tmp_path: Path) -> None:
    out = _run("cluster-state", "show", "file:///proc/self", cwd=tmp_path)
    assert "Traceback" not in out.stderr
    assert not os.path.exists("/proc/self/.shardstore-tmp")


def test_a_bad_option_pair_is_a_one_line_error(tmp_path: Path) -> None:
    out = _run("store", "check", f"file://{tmp_path}", "-o", "novalue", cwd=tmp_path)
    assert out.returncode == 2  # a malformed argument: a usage error
    _assert_one_line_error(out.stderr, "name=value")
    assert _tree(tmp_path) == []


def test_os_errors_and_multi_line_messages_print_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "I/O error\nsecond line", "/some/path")

    monkeypatch.setattr(cli, "_open_store", boom)
    assert main(["cluster-state", "show", "file:///x"]) == 1
    _assert_one_line_error(capsys.readouterr().err, "I/O error second line", "/some/path")

    def invalid(*args: object, **kwargs: object) -> None:
        err = ConfigError("first\nsecond", location="file:///x")
        err.add_note("a note")
        raise err

    monkeypatch.setattr(cli, "_open_store", invalid)
    assert main(["store", "check", "file:///x"]) == 1
    _assert_one_line_error(capsys.readouterr().err, "first second", "a note")


@pytest.mark.parametrize("argv", [["plugins"], ["store", "check", "{t}"]])
def test_a_closed_pipe_ends_quietly_with_status_141(tmp_path: Path, argv: list[str]) -> None:
    """``shardstore ... | head -1``: no BrokenPipeError traceback, exit 141 (128 + SIGPIPE)."""
    argv = [a.format(t=f"file://{tmp_path}") for a in argv]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away before the first line: every write gets EPIPE
    try:
        out = subprocess.run([sys.executable, "-m", "shardstore", *argv], cwd=tmp_path, stdout=write_end,
                             stderr=subprocess.PIPE, text=True, check=False, timeout=120)
    finally:
        os.close(write_end)
    assert out.returncode == 141, out.stderr
    assert out.stderr == ""
    if argv[0] == "store":  # the self-test's scratch blobs were still cleaned up
        assert [p for p in _tree(tmp_path) if not p.startswith(".shardstore-tmp")] == []
