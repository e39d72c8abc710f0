"""The Spark sink reaches a secured cluster (issue 43): TLS from the sink's options, the cluster secret from the
driver's environment, never from an option (Spark shows options in its plans).  Real node processes behind TLS;
the sink's own functions (no Spark session needed for what this checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.errors import InvalidError
from shardstore.net.security import TransportAuthError
from shardstore.spark.live_sink import LiveClusterUnreachable, client_for, find_live, sink_security
from shardstore.testing.node_processes import ProcessCluster
from shardstore.testing.partition_campaign import wait_until
from tests.net.certs import make_pki

SECRET = "sp4rk-s1nk-s3cr3t"


def test_the_sink_reaches_a_tls_cluster_with_the_drivers_secret(tmp_path: Path, monkeypatch) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca)]
    procs = ProcessCluster(str(tmp_path / "nodes"), f"file://{tmp_path / 'store'}?create=true", 3,
                           extra_args=tls, env={"SHARDSTORE_NODE_SECRET": SECRET})
    try:
        store = open_store(f"file://{tmp_path / 'store'}")
        hosts = ",".join(h.address for h in procs.nodes.values())
        monkeypatch.setenv("SHARDSTORE_NODE_SECRET", SECRET)
        options = {"hosts": hosts, "tlsCa": str(pki.ca)}
        with client_for(find_live(options, store), store.location, options) as client:
            client.wait_for_health("green", timeout=60)
            # green with no index holds before every node joined: wait for the three (a join is then published)
            wait_until(lambda: client.health().data_nodes >= 3, 60, "three data nodes joined")
        # without the hosts option the sink finds the nodes in the cluster state and probes them with the same TLS;
        # the state naming the last joiner is uploaded after its publication commits
        want = set(hosts.split(","))
        wait_until(lambda: set(find_live({"tlsCa": str(pki.ca)}, store) or ()) == want, 30,
                   "the published cluster state naming all three nodes")
        # no secret: refused by the nodes, never fenced; without TLS the probe cannot talk to them either
        monkeypatch.delenv("SHARDSTORE_NODE_SECRET")
        with pytest.raises(TransportAuthError, match="missing cluster secret"):
            with client_for(find_live(options, store), store.location, options) as client:
                client.health()
        with pytest.raises(LiveClusterUnreachable):
            find_live({}, store)
        with pytest.raises(InvalidError, match="never an option"):
            sink_security({"clusterSecret": SECRET})
    finally:
        procs.close()
