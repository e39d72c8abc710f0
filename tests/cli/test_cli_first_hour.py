"""The command line as a newcomer meets it (issue 32), run through the installed ``shardstore`` console script.

Each case is an answer that used to surprise: an option listed twice, ``--keep -1`` accepted,
a directory that is no store reported as fine, a refused connection retried for 25 s, a page
of azure-identity output before our error, help text with reST markup, usage errors that
disagreed with the README.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("shardstore")


def _run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console script the package installs, in a child process."""
    assert SCRIPT.exists(), f"the console script {SCRIPT} is not installed"
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, cwd=cwd, check=False, timeout=120,
                          env=env)


def _one_line(out: subprocess.CompletedProcess[str], status: int, *fragments: str) -> str:
    assert out.returncode == status, out
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardstore: error: "), out.stderr
    for fragment in fragments:
        assert fragment in lines[0], out.stderr
    return lines[0]


def test_an_unknown_option_lists_each_accepted_option_once_and_names_the_close_one(tmp_path: Path) -> None:
    line = _one_line(_run("store", "check", f"file://{tmp_path}", "-o", "creat=true", cwd=tmp_path), 1,
                     "unknown option 'creat'", "did you mean 'create'?")
    accepted = line.split("this store accepts: ")[1].split(", ")
    assert len(accepted) == len(set(accepted)) and "read_only" in accepted


@pytest.mark.parametrize("keep", ["0", "-1", "x"])
def test_keep_below_one_is_a_usage_error(tmp_path: Path, keep: str) -> None:
    out = _run("cluster-state", "show", f"file://{tmp_path}", "--keep", keep, cwd=tmp_path)
    _one_line(out, 2, "--keep", "shardstore cluster-state show --help")
    assert out.stdout == ""


@pytest.mark.parametrize("kind", ["a node's data directory", "memory"])
def test_a_store_without_cluster_state_is_not_reported_as_fine(tmp_path: Path, kind: str) -> None:
    if kind == "memory":
        url = "memory://x"
    else:
        (tmp_path / "node-1" / "0").mkdir(parents=True)
        (tmp_path / "node-1" / "0" / "translog-1.tlog").write_bytes(b"x")
        url = f"file://{tmp_path}"
    out = _run("cluster-state", "show", url, cwd=tmp_path)
    _one_line(out, 1, "no shardstore cluster state", "not a shardstore store")
    assert out.stdout == ""


def test_an_empty_url_says_so(tmp_path: Path) -> None:
    _one_line(_run("cluster-state", "show", "", cwd=tmp_path), 1, "the store URL is empty")


@pytest.mark.parametrize("command", ["store", "cluster-state"])
def test_a_command_without_its_subcommand_prints_its_own_help(tmp_path: Path, command: str) -> None:
    out = _run(command, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"usage: shardstore {command} ") and "plugins" not in out.stderr


def test_a_missing_argument_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _one_line(_run("store", "check", cwd=tmp_path), 2, "url", "see shardstore store check --help")


def test_help_has_no_markup(tmp_path: Path) -> None:
    for argv in (["--help"], ["cluster-state", "show", "--help"], ["store", "check", "--help"]):
        out = _run(*argv, cwd=tmp_path)
        assert out.returncode == 0 and "``" not in out.stdout and out.stdout.startswith("usage: shardstore")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the socket is: nothing listens there any more


def test_a_refused_connection_fails_at_once_as_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    out = _run("cluster-state", "show", "s3://bucket/p", "-o", f"endpoint_url=http://127.0.0.1:{_closed_port()}",
               cwd=tmp_path, env=env)
    _one_line(out, 1, "connection refused", "not retried (retry_unreachable=false)")


def test_azure_without_a_credential_is_one_line_naming_how_to_give_one(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AZURE_CLIENT_ID": "", "IDENTITY_ENDPOINT": "",
           "MSI_ENDPOINT": ""}
    out = _run("cluster-state", "show", "az://container/p", "-o", "account_name=acct", cwd=tmp_path, env=env)
    _one_line(out, 1, "no usable Azure credential for account 'acct'", "account_key", "sas_token")
    assert "DefaultAzureCredential" not in out.stderr and "aka.ms" not in out.stderr


def test_the_sdk_loggers_are_quiet_only_while_a_command_runs(tmp_path: Path) -> None:
    # main() may run inside another program (this suite): the levels it lowers come back afterwards
    import logging

    from shardstore.cli import main

    botocore = logging.getLogger("botocore")
    botocore.setLevel(logging.DEBUG)
    try:
        assert main(["cluster-state", "show", f"file://{tmp_path}"]) == 1
        assert botocore.level == logging.DEBUG
    finally:
        botocore.setLevel(logging.NOTSET)


def test_store_check_on_an_endpoint_that_refuses_connections_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on (bound, not listening: connections are refused)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        t0 = time.monotonic()
        out = _run("store", "check", "s3://bucket/prefix", "-o", f"endpoint_url=http://127.0.0.1:{port}",
                   "-o", "key=test", "-o", "secret=test", cwd=tmp_path)
        took = time.monotonic() - t0
    line = _one_line(out, 1, "nothing answers", f"127.0.0.1:{port}")
    assert len(line) < 500 and took <= 5.0
    assert len(out.stdout.splitlines()) <= 1  # at most the "checking ..." line: 2 lines in all


def test_store_check_without_credentials_is_one_error_line(tmp_path: Path) -> None:
    """No credentials anywhere in the SDK's chain: one line naming it, not a FAIL row per check (issue 45)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    t0 = time.monotonic()
    out = _run("store", "check", "s3://bucket/prefix", "-o", "endpoint_url=http://127.0.0.1:1", cwd=tmp_path, env=env)
    line = _one_line(out, 1, "access denied", "credentials")
    assert len(line) < 500 and time.monotonic() - t0 <= 5.0
    assert len(out.stdout.splitlines()) <= 1


def test_a_node_without_its_required_settings_names_them_all_at_once(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SHARDSTORE_NODE_")}
    _one_line(_run("node", cwd=tmp_path, env=env), 2, "--name and --data-dir and --store", "shardstore node --help")
    _one_line(_run("node", "--name", "n1", cwd=tmp_path, env=env), 2, "--data-dir and --store")
