"""Node processes behind TLS and a cluster secret (issue 29): real certificates, real processes.

The certificates are generated for each run (tests/net/certs.py); the nodes get the secret from
``SHARDSTORE_NODE_SECRET`` (never a flag, which ``ps`` would show).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardstore.engine.errors import NoNodeReachable
from shardstore.net.security import Security, TransportAuthError
from shardstore.testing.node_processes import ProcessCluster
from shardstore.transport import NodeDisconnected
from tests.net.certs import make_pki

SECRET = "s3cr3t-0f-th1s-clust3r"
WRONG = "n0t-the-s3cr3t"


@pytest.fixture
def secured(tmp_path: Path):
    pki = make_pki(tmp_path / "pki")
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca)]
    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3,
                           extra_args=tls, env={"SHARDSTORE_NODE_SECRET": SECRET})
    try:
        yield procs, pki
    finally:
        procs.close()


def test_a_tls_cluster_with_a_secret_serves_its_clients_and_refuses_everyone_else(secured) -> None:
    procs, pki = secured
    client = procs.client(security=Security(tls_ca=str(pki.ca), secret=SECRET))
    client.wait_for_health("green", timeout=60)
    client.create_index("i", shards=2, replicas=1)
    client.wait_for_health("green", timeout=60)
    assert not client.bulk("i", [{"_id": str(k), "v": k} for k in range(50)]).errors
    client.refresh("i")
    assert client.count("i") == 50

    # connect() itself fails fast with the cause (its probe is refused); a client made without the probe is
    # refused at its first call, nothing applied
    with pytest.raises(TransportAuthError, match="wrong cluster secret") as refused:
        procs.client(security=Security(tls_ca=str(pki.ca), secret=WRONG))
    assert WRONG not in str(refused.value) and SECRET not in str(refused.value)
    intruder = procs.client(security=Security(tls_ca=str(pki.ca), secret=WRONG), connect_timeout=None)
    with pytest.raises(TransportAuthError, match="wrong cluster secret") as refused:
        intruder.bulk("i", [{"_id": "intruder", "v": 1}])
    assert WRONG not in str(refused.value) and SECRET not in str(refused.value)
    no_secret = procs.client(security=Security(tls_ca=str(pki.ca)), connect_timeout=None)
    with pytest.raises(TransportAuthError, match="missing cluster secret"):
        no_secret.get("i", "1")
    with pytest.raises(NoNodeReachable, match="no node answered"):  # no TLS at all: every handshake fails
        procs.client()
    plaintext = procs.client(connect_timeout=None)
    with pytest.raises(NodeDisconnected) as cut:
        plaintext.count("i")
    assert cut.value.delivered is False

    client.refresh("i")
    assert client.count("i") == 50 and client.get("i", "intruder") is None  # nothing applied
    logs = procs.logs()
    assert "wrong cluster secret" in logs and "missing cluster secret" in logs
    assert SECRET not in logs and WRONG not in logs


def test_a_node_refuses_to_listen_beyond_loopback_without_tls_and_credentials(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shardstore", "node", "--name", "n1", "--data-dir",
                           str(tmp_path / "n1"), "--store", f"file://{tmp_path / 'store'}?create=true",
                           "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("shardstore: error: "), proc.stderr
    assert "0.0.0.0" in lines[0] and "TLS" in lines[0], lines[0]
    assert not (tmp_path / "n1").exists() and not (tmp_path / "store").exists()  # refused before making anything


def test_a_node_creates_a_missing_store_root_only_when_asked(tmp_path: Path) -> None:
    missing = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-m", "shardstore", "node", "--name", "n1", "--data-dir",
                           str(tmp_path / "n1"), "--store", f"file://{missing}", "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist (pass create=true" in lines[0] and "-o create=true" in lines[0] and str(missing) in lines[0], proc.stderr
    assert not missing.exists() and not (tmp_path / "n1").exists()  # nothing made: not the root, not the data dir
