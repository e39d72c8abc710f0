"""A cluster reopened on its own data directories, any number of times (issue 29's repro)."""

from __future__ import annotations

from pathlib import Path

from shardstore.engine import Cluster


def test_a_cluster_reopens_on_its_data_dir_three_times(tmp_path: Path) -> None:
    store, data = f"file://{tmp_path / 'store'}", str(tmp_path / "data")
    c = Cluster(store=store, data_dir=data, nodes=3)
    c.create_index("i", shards=3, replicas=1)
    assert not c.bulk("i", [{"_id": str(k), "v": k} for k in range(100)]).errors
    c.close()
    for round_ in range(3):
        c = Cluster(store=store, data_dir=data, nodes=3)
        try:
            c.refresh("i")
            assert c.count("i") == 100 + round_, round_
            # the reopened cluster takes writes (a new term each time) and keeps them for the next reopen
            assert not c.bulk("i", [{"_id": f"r{round_}", "v": round_}]).errors
            assert c.get("i", f"r{round_}")["_source"] == {"v": round_}
            c.wait_for_health("green", timeout=60)
        finally:
            c.close()
    c = Cluster(store=store, data_dir=data, nodes=3)
    try:
        c.refresh("i")
        assert c.count("i") == 103
    finally:
        c.close()
