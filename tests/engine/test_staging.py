"""The columnar pass staging a node's parts of a bulk (engine/shard/staging.py) writes what the one-part path writes.

Two real clusters (file store, one node each) take the same bulks, one with the columnar pass
and one with it switched off; every item's stamp, every shard's local translog operations,
its buffered documents and its documents after a refresh and a flush must be equal.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.coordinator import bulk_parts
from shardstore.engine.errors import StalePrimary
from shardstore.engine.shard import staging

SHARDS = 16


def _bulks() -> list[list[dict[str, Any]]]:
    """New ids, an id twice in one bulk, updates of buffered ids and, after a refresh, of refreshed ones."""
    first = [{"_id": f"d{i}", "n": i, "s": "x" * (i % 7)} for i in range(300)]
    again = [{"_id": f"d{i}", "n": -i} for i in range(0, 300, 3)] + [{"_id": "d3", "n": 33}, {"_id": "new", "n": 1}]
    later = [{"_id": f"d{i}", "n": i * 10, "t": "2024-01-0{}".format(1 + i % 9)} for i in range(0, 300, 2)]
    return [first, again, later]


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch, columnar: bool, source: str) -> dict[str, Any]:
    if not columnar:
        monkeypatch.setattr(bulk_parts, "takes_columnar", lambda *a: False)
    staged: list[int] = []
    real = bulk_parts.stage_columnar

    def counting(parts: list, mapping: Any) -> list:
        staged.append(len(parts))
        return real(parts, mapping)

    monkeypatch.setattr(bulk_parts, "stage_columnar", counting)
    out: dict[str, Any] = {"items": [], "translog": {}, "buffer": {}, "docs": {}}
    with closing(Cluster(store=f"file://{tmp}/store", data_dir=f"{tmp}/data", nodes=1)) as c:
        c.create_index("i", shards=SHARDS, replicas=0, source=source)
        bulks = _bulks()
        for n, bulk in enumerate(bulks):
            result = c.bulk("i", bulk)
            assert not result.errors
            out["items"].append(result.items.select(["_id", "shard", "seq_no", "primary_term", "version"]))
            if n == 1:
                meta = c.indices["i"]
                for s in range(SHARDS):  # what the bulks buffered, before the refresh makes segments of it
                    d = c.nodes[c.primary_of("i", s)].copies[(meta.uuid, s)].directory
                    out["buffer"][s] = [(t.schema, t.to_pylist()) for t in d._buffer.docs]
                c.refresh("i")
        meta = c.indices["i"]
        for s in range(SHARDS):
            copy = c.nodes[c.primary_of("i", s)].copies[(meta.uuid, s)]
            ops = list(copy.translog.read_operations(0))
            # the schemas too: a frame with a nullable seq_no read back beside one without cannot be concatenated
            out["translog"][s] = ([b.schema for b in ops], pa.Table.from_batches(ops).to_pylist() if ops else [])
        c.flush("i")
        out["docs"] = {f"d{i}": c.get("i", f"d{i}") for i in range(0, 300, 7)} | {k: c.get("i", k) for k in ("new", "d3", "d6")}
    out["staged"] = staged
    return out


@pytest.mark.parametrize("source", ["stored", "synthetic"])
def test_the_columnar_pass_writes_what_the_one_part_path_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 source: str) -> None:
    plain = _run(tmp_path / "plain", monkeypatch, False, source)
    monkeypatch.undo()
    fast = _run(tmp_path / "fast", monkeypatch, True, source)
    assert plain["staged"] == [] and sum(fast["staged"]) >= 2 * SHARDS  # each path was the one taken
    for a, b in zip(plain["items"], fast["items"], strict=True):
        assert a.schema.equals(b.schema) and a.sort_by("_id").to_pylist() == b.sort_by("_id").to_pylist()
    assert plain["buffer"] == fast["buffer"]
    assert plain["translog"] == fast["translog"]
    assert plain["docs"] == fast["docs"]
    assert fast["docs"]["d3"]["_version"] == 3 and fast["docs"]["d6"]["_version"] == 3  # twice in bulk 2; bulk 3


def test_a_part_whose_copy_is_no_longer_primary_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one copy demoted while the bulk is on its way: its part is refused (nothing applied, no seq# taken);
    # every other part of the pass is staged and acknowledged
    with closing(Cluster(store=f"file://{tmp_path}/store", data_dir=f"{tmp_path}/data", nodes=1)) as c:
        c.create_index("i", shards=4, replicas=0)
        meta = c.indices["i"]
        node = c.nodes[c.primary_of("i", 2)]
        demoted = node.copies[(meta.uuid, 2)]
        real = staging.stage_columnar
        seen: list[int] = []

        def demoting(parts: list, mapping: Any) -> list:
            demoted.primary = False
            try:
                done = real(parts, mapping)
            finally:
                demoted.primary = True
            seen.append(len(parts))
            return done

        monkeypatch.setattr(bulk_parts, "stage_columnar", demoting)
        monkeypatch.setattr(bulk_parts, "part_failure", lambda exc: {"error": f"{type(exc).__name__}: {exc}",
                                                                     "retry": False})
        result = c.bulk("i", [{"_id": f"d{i}", "n": i} for i in range(40)])
        assert seen == [4]
        items = result.items.to_pylist()
        failed = [it for it in items if it["error"] is not None]
        assert failed and all(it["shard"] == 2 and StalePrimary.__name__ in it["error"] for it in failed)
        assert all(it["seq_no"] is not None for it in items if it["shard"] != 2)
        assert demoted.max_seq_no == -1 and demoted.directory.get(failed[0]["_id"]) is None


def test_a_pass_failing_before_any_seq_no_is_taken_leaves_every_part_to_the_one_part_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one copy's version lookup fails inside the pass (a stand-in for a read error no real part raises on demand):
    # no copy has taken a seq#, so every part goes the one-part way and is acknowledged, and no copy has a gap
    with closing(Cluster(store=f"file://{tmp_path}/store", data_dir=f"{tmp_path}/data", nodes=1)) as c:
        c.create_index("i", shards=4, replicas=0)
        meta = c.indices["i"]
        copies = [c.nodes[c.primary_of("i", s)].copies[(meta.uuid, s)] for s in range(4)]

        def failing(ids: list, arr: Any) -> list:
            raise OSError("injected: a segment read failed")

        monkeypatch.setattr(copies[1].directory, "current_version_numbers", failing)
        passes: list[list] = []
        real = bulk_parts.stage_columnar
        monkeypatch.setattr(bulk_parts, "stage_columnar", lambda parts, m: passes.append(r := real(parts, m)) or r)
        result = c.bulk("i", [{"_id": f"d{i}", "n": i} for i in range(40)])
        assert passes and all(done is None for done in passes[0])  # the pass staged nothing
        assert not result.errors
        for copy in copies:
            assert copy.local_checkpoint == copy.max_seq_no >= 0


def test_a_many_shard_bulk_through_the_coordinator_takes_the_columnar_pass(tmp_path: Path, monkeypatch) -> None:
    """The coordinator sends the parsed fields once, as the operations' ``fields`` column (no table beside them):
    the node still stages a small bulk's parts in one columnar pass (a18aead had lost it: every part alone)."""
    passes: list[int] = []
    real = bulk_parts.stage_columnar

    def spy(parts, mapping):  # noqa: ANN001, ANN202 - the wrapped function's own types
        passes.append(len(parts))
        return real(parts, mapping)

    monkeypatch.setattr(bulk_parts, "stage_columnar", spy)
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=1)
    try:
        c.create_index("x", shards=8, replicas=0)
        assert not c.bulk("x", [{"_id": f"d{i}", "n": i} for i in range(64)]).errors
        assert passes == [8]
        c.refresh("x")
        assert c.count("x") == 64 and c.get("x", "d7")["_source"] == {"n": 7}
    finally:
        c.close()
