"""Peer recoveries of one shard copy that overlap on its node (simulator seed 9535, stop 57).

A cluster manager that asked a node to recover a replica and lost the answer (it failed, or a partition cut the
reply) has its successor ask again while the first recovery still runs there.  The second used to wipe the
shard's directory under the first: the first then registered a copy whose segment files were gone, and the next
``refresh`` failed with FileNotFoundError (LocalDiskError), a stuck shard in the simulator.  Now the second is
refused while the first runs (ShardUnavailable: the manager retries later) and the first ends whole.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shardstore.engine import Cluster
from shardstore.engine.errors import ShardUnavailable
from shardstore.engine.node import data_role
from shardstore.engine.node.data_role import spec_to_wire


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=2, recovery_delay=0.05)
    try:
        c.create_index("docs", shards=1, replicas=1)
        yield c
    finally:
        c.close()


def test_a_second_recovery_of_a_copy_is_refused_while_the_first_runs(cluster: Cluster, monkeypatch) -> None:
    assert not cluster.bulk("docs", [{"_id": f"d{i}", "n": i} for i in range(200)]).errors
    cluster.flush("docs")  # segment files for the recovery to copy
    assert not cluster.bulk("docs", [{"_id": f"e{i}", "n": i} for i in range(20)]).errors
    meta = cluster.index_meta("docs")
    sr = meta.routing[0]
    replica = next(n for n in sr.copies if n != sr.primary)
    node = cluster.processes[replica].node
    key = (meta.uuid, 0)
    req = {"spec": spec_to_wire(node.copies[key].spec), "source": sr.primary}

    real = data_role._ACTIONS["recovery.chunk"]
    first_fetching, go_on = threading.Event(), threading.Event()

    def chunk(service, r):  # noqa: ANN001, ANN202 - the first recovery's first chunk waits for the second to be asked
        if not first_fetching.is_set():
            first_fetching.set()
            assert go_on.wait(30)
        return real(service, r)

    monkeypatch.setitem(data_role._ACTIONS, "recovery.chunk", chunk)
    result: list[object] = []
    first = threading.Thread(target=lambda: result.append(node._recover_replica(dict(req))))
    first.start()
    try:
        assert first_fetching.wait(30)
        with pytest.raises(ShardUnavailable, match="recovery of it is running"):
            node._recover_replica(dict(req))
    finally:
        go_on.set()
        first.join(60)
    assert result == [True]
    copy = node.copies[key]
    copy.refresh()  # every segment file the copy lists is there
    assert copy.directory.count() == 220
