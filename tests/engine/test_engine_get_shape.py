"""``get`` has one documented shape, Elasticsearch's, on stored and synthetic indices alike (issue 32).

It used to return every field twice, at the top level and inside ``_source``, a date as a
string in one place and a ``datetime`` in the other.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from shardstore.engine import Cluster

KEYS = {"_index", "_id", "_version", "_seq_no", "_primary_term", "_source"}


def test_get_returns_the_metadata_and_the_source_once(tmp_path: Path) -> None:
    doc = {"_id": "f1", "carrier": "UA", "dep_delay": 12, "time_hour": "2013-01-15T13:00:00.000Z"}
    with closing(Cluster(store=f"file://{tmp_path}/store", data_dir=f"{tmp_path}/nodes", nodes=1)) as c:
        for name, source in (("stored", "stored"), ("synth", "synthetic")):
            c.create_index(name, shards=1, replicas=0, source=source)
            c.bulk(name, [doc])
        got = {name: c.get(name, "f1") for name in ("stored", "synth")}
        for when in ("buffered", "refreshed"):
            for name, g in got.items():
                assert set(g) == KEYS, (name, when, sorted(g))
                assert g["_index"] == name and g["_id"] == "f1" and g["_version"] == 1 and g["_seq_no"] == 0
                assert g["_primary_term"] >= 1
            assert got["stored"]["_source"] == {k: v for k, v in doc.items() if k != "_id"}
            assert got["synth"]["_source"]["carrier"] == "UA" and got["synth"]["_source"]["dep_delay"] == 12
            assert isinstance(got["synth"]["_source"]["time_hour"], str)  # a date is a string, as it was sent
            c.refresh("stored"), c.refresh("synth")
            got = {name: c.get(name, "f1") for name in ("stored", "synth")}
        assert c.get("stored", "nope") is None
