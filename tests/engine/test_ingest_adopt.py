"""Ingest jobs of routed files, adopted as segments (issue 43, docs/design/adoption.md): a real embedded cluster (the
production roles over the in-process transport), a file store, files staged as the Spark sink stages them (one file
per shard, ``SSIJ`` v2)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.engine import Cluster
from shardstore.engine.coordinator.ingest import stage_table, write_job
from shardstore.engine.coordinator.ingest_adopt import ADOPTED_PREFIX, runs_covered
from shardstore.engine.coordinator.ingest_job import (
    AdoptedRuns,
    IngestJob,
    decode_adopted,
    decode_done,
    decode_job,
    done_key,
    encode_adopted,
    encode_job,
)
from shardstore.engine.coordinator.routing import split_by_shard
from shardstore.engine.errors import IngestRejected
from shardstore.errors import InvalidError

MAPPINGS = {"properties": {"n": {"type": "long"}, "tag": {"type": "keyword"}}}


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=3, recovery_delay=0.05)
    try:
        c.create_index("docs", shards=2, replicas=1, mappings=MAPPINGS)
        c.wait_for_health("green", timeout=30)
        yield c
    finally:
        c.close()


def _rows(lo: int, hi: int, tag: str, ids: str = "d") -> pa.Table:
    return pa.table({"_id": pa.array([f"{ids}{i}" for i in range(lo, hi)], pa.string()),
                     "n": pa.array(range(lo, hi), pa.int64()), "tag": pa.array([tag] * (hi - lo), pa.string())})


def _stage_routed(c: Cluster, job: str, table: pa.Table, *, shard_of=None, mode: str = "append") -> str:
    """One staged file per shard, its rows in table order (as each Spark task writes them)."""
    prefix = c.ingest_prefix("docs", job)
    files = []
    for shard, rows in sorted(split_by_shard(table, c.index_meta("docs").shards).items()):
        f = stage_table(c.store, prefix, f"part-{shard}", rows)
        files.append(replace(f, shard=shard if shard_of is None else shard_of(shard)))
    write_job(c.store, prefix, IngestJob(job, "docs", c.index_meta("docs").uuid, mode, tuple(files)))
    return prefix


def _docs(c: Cluster) -> dict[str, tuple]:
    c.refresh("docs")
    return {r["_id"]: (r["n"], r["tag"]) for r in c.scan("docs", columns=["_id", "n", "tag"]).to_pylist()}


def test_a_routed_job_is_adopted_once_beside_client_writes(cluster: Cluster) -> None:
    assert not cluster.bulk("docs", [{"_id": f"d{i}", "n": -1, "tag": "client"} for i in range(50)]).errors
    prefix = _stage_routed(cluster, "adopt-1", _rows(25, 400, "spark"))
    out = cluster.ingest("docs", "adopt-1")
    out.pop("seconds")
    assert out == {"job": "adopt-1", "rows": 375, "applied": 375, "deleted": 0, "replayed": False, "path": "adopt"}
    assert cluster.count("docs") == 400
    assert cluster.get("docs", "d10")["_source"] == {"n": -1, "tag": "client"}  # not in the job
    updated, new = cluster.get("docs", "d30"), cluster.get("docs", "d399")
    assert (updated["_version"], updated["_source"]) == (2, {"n": 30, "tag": "spark"})  # re-applied: an update
    assert (new["_version"], new["_source"]) == (1, {"n": 399, "tag": "spark"})  # adopted: a rebuilt source
    # the files stay for the collector (a translog replay of the runs reads them), with one adopted marker
    markers = [b.key for b in cluster.store.list(prefix + ADOPTED_PREFIX)]
    assert len(markers) == 1 and len(list(cluster.store.list(prefix + "files/"))) == 2
    runs = decode_adopted(cluster.store.get(markers[0]), markers[0])
    assert sorted(s for s, _a, _b in runs.runs) == [0, 1] and sum(b - a + 1 for _s, a, b in runs.runs) == 375
    assert decode_done(cluster.store.get(done_key(prefix)), "done").runs == runs.runs  # done names them too
    # committed again: nothing adopted a second time
    again = cluster.ingest("docs", "adopt-1")
    assert again["replayed"] and cluster.get("docs", "d30")["_version"] == 2
    assert cluster.get("docs", "d399")["_version"] == 1
    # client writes go on, on top of adopted rows
    assert not cluster.bulk("docs", [{"_id": "d399", "n": 0, "tag": "client"}]).errors
    assert cluster.get("docs", "d399")["_version"] == 2 and cluster.count("docs") == 400


def test_every_copy_holds_the_adopted_rows_after_a_failover(cluster: Cluster) -> None:
    _stage_routed(cluster, "adopt-2", _rows(0, 300, "spark"))
    assert cluster.ingest("docs", "adopt-2")["path"] == "adopt"
    before = _docs(cluster)
    versions = {i: cluster.get("docs", i)["_version"] for i in ("d0", "d7", "d299")}
    stamped = [r.info.stamp for s in (0, 1) for r, _live in cluster.primary_copy("docs", s).directory
               .searchable_segments() if r.info.stamp is not None]
    assert len(stamped) == 2  # adopted as they are, one stamped segment per shard
    for shard in (0, 1, 0):  # the second failover of shard 0 promotes the copy peer recovery rebuilt
        old = cluster.index_meta("docs").routing[shard].primary
        cluster.kill_node(old)
        assert cluster.index_meta("docs").routing[shard].primary not in (None, old)
        assert _docs(cluster) == before
        assert {i: cluster.get("docs", i)["_version"] for i in versions} == versions
        cluster.start_node(old)
        cluster.wait_for_health("green", timeout=60)
    assert _docs(cluster) == before


def test_a_job_whose_columns_are_not_adoptable_takes_the_row_path(cluster: Cluster) -> None:
    table = _rows(0, 60, "rows").append_column("color", pa.array(["red"] * 60))  # a field the index does not map
    prefix = _stage_routed(cluster, "rows-1", table)
    out = cluster.ingest("docs", "rows-1")
    assert out["path"] == "rows" and out["applied"] == 60
    assert cluster.get("docs", "d5")["_source"] == {"n": 5, "tag": "rows", "color": "red"}
    assert not list(cluster.store.list(prefix + "files/"))  # the row path deletes them at once
    assert not list(cluster.store.list(prefix + ADOPTED_PREFIX))


def test_a_misrouted_file_or_a_bad_id_is_refused_and_nothing_is_applied(cluster: Cluster) -> None:
    prefix = _stage_routed(cluster, "wrong", _rows(0, 80, "x"), shard_of=lambda s: 1 - s)
    with pytest.raises(IngestRejected, match="routes to shard"):
        cluster.ingest("docs", "wrong")
    assert not cluster.store.exists(done_key(prefix)) and cluster.count("docs") == 0
    # one misrouted row among thousands is found too (every id is routed)
    from shardstore.engine.coordinator.routing import shard_ids

    many = _rows(0, 5000, "m")
    shards = shard_ids(many.column("_id"), 2).to_pylist()
    zeros = many.filter(pa.array([s == 0 for s in shards]))
    one = many.filter(pa.array([s == 1 for s in shards])).slice(0, 1)
    prefix = cluster.ingest_prefix("docs", "one-off")
    f = replace(stage_table(cluster.store, prefix, "p", pa.concat_tables([zeros, one])), shard=0)
    write_job(cluster.store, prefix, IngestJob("one-off", "docs", cluster.index_meta("docs").uuid, "append", (f,)))
    with pytest.raises(IngestRejected, match=rf"row {zeros.num_rows}: id .* routes to shard 1, not the file's shard 0"):
        cluster.ingest("docs", "one-off")
    bad = _rows(0, 3, "x").set_column(0, "_id", pa.array(["a", "", "c"]))
    _stage_routed(cluster, "empty-id", bad, shard_of=lambda s: 0)
    with pytest.raises(IngestRejected, match="an _id is 1-512 bytes"):
        cluster.ingest("docs", "empty-id")
    assert cluster.count("docs") == 0


def test_files_checked_at_once_name_the_first_bad_file_of_the_job(cluster: Cluster) -> None:
    """Six files checked CHECK_THREADS at a time; the third and the sixth are bad (one misrouted, one with an empty
    id): the error names the third, whichever check ends first, and nothing is applied."""
    from shardstore.engine.coordinator.routing import shard_ids

    rows = _rows(0, 600, "p")
    shards = shard_ids(rows.column("_id"), 2).to_pylist()
    prefix = cluster.ingest_prefix("docs", "six")
    files = []
    for k in range(6):
        part = rows.slice(k * 100, 100)
        own = [shards[k * 100 + i] for i in range(100)]
        shard = 0
        part = part.filter(pa.array([s == shard for s in own]))
        if k == 2:  # misrouted: one row of shard 1 in a file of shard 0
            part = pa.concat_tables([part, rows.filter(pa.array([s == 1 for s in shards])).slice(0, 1)])
        if k == 5:
            part = part.set_column(0, "_id", pa.array([""] + part.column("_id").to_pylist()[1:]))
        files.append(replace(stage_table(cluster.store, prefix, f"f{k}", part), shard=shard))
    write_job(cluster.store, prefix, IngestJob("six", "docs", cluster.index_meta("docs").uuid, "append", tuple(files)))
    with pytest.raises(IngestRejected, match="routes to shard 1") as info:
        cluster.ingest("docs", "six")
    assert files[2].key in str(info.value)
    assert not cluster.store.exists(done_key(prefix)) and cluster.count("docs") == 0


def test_overwrite_by_adoption_replaces_the_documents(cluster: Cluster) -> None:
    assert not cluster.bulk("docs", [{"_id": f"old{i}", "n": i, "tag": "o"} for i in range(40)]).errors
    _stage_routed(cluster, "ow", _rows(0, 30, "new"), mode="overwrite")
    out = cluster.ingest("docs", "ow")
    assert (out["path"], out["applied"], out["deleted"]) == ("adopt", 30, 40)
    assert sorted(_docs(cluster)) == sorted(f"d{i}" for i in range(30))


def test_the_routed_job_record_and_the_adopted_marker_round_trip() -> None:
    from shardstore.engine.coordinator.ingest_job import StagedFile

    routed = IngestJob("j", "docs", "u", "append", (StagedFile("k0", 1, 2, 3, 0), StagedFile("k1", 4, 5, 6, 1)))
    raw = encode_job(routed)
    assert raw[4:6] == (2).to_bytes(2, "little") and decode_job(raw, "k") == routed and routed.routed
    plain = replace(routed, files=tuple(replace(f, shard=None) for f in routed.files))
    assert encode_job(plain)[4:6] == (1).to_bytes(2, "little") and decode_job(encode_job(plain), "k") == plain
    with pytest.raises(InvalidError, match="some files name a shard"):
        encode_job(replace(routed, files=(routed.files[0], plain.files[1])))
    runs = AdoptedRuns("j", ((0, 10, 19), (1, 5, 9), (0, 30, 31)))
    assert decode_adopted(encode_adopted(runs), "m") == runs and runs.last_by_shard() == {0: 31, 1: 9}


@pytest.mark.parametrize("checkpoints, last, covered", [
    ([], 5, False), ([9], 5, False), ([9, 4], 5, False), ([9, 5], 5, True), ([5, 9, 1], 5, True),
    ([None, 9], 5, False), ([9, None], 5, False), ([4, 9], 5, False),
])
@pytest.mark.parametrize("copies, copies_cover", [
    ([7, 5], True), ([5], True), ([7, 4], False), ([None, 9], False), ([], False),
])
def test_runs_are_covered_only_below_the_newest_fallback_commits_and_every_copys(checkpoints, last, covered, copies,
                                                                                 copies_cover) -> None:
    assert runs_covered(checkpoints, last, copies) is (covered and copies_cover)
    assert runs_covered(checkpoints, last) is False  # copies not known: kept


def test_the_collector_deletes_an_adopted_jobs_files_once_remote_commits_cover_them(cluster: Cluster) -> None:
    from shardstore.engine.coordinator.routing import shard_id
    from shardstore.engine.manager.ingest_gc import IngestCollector

    prefix = _stage_routed(cluster, "gc-1", _rows(0, 100, "spark"))
    assert cluster.ingest("docs", "gc-1")["path"] == "adopt"
    cluster.flush("docs")  # as the job's own flush after its release does, on a thread of its own
    manager = cluster.manager()
    assert manager is not None
    gc = IngestCollector(cluster.store, shard_address=manager._shard_address, copy_commits=manager._copy_commits,
                         clock=lambda: 0.0)
    assert gc.collect(cluster.cluster_uuid) == 0  # one commit covers the runs: a restore falling back replays them
    assert len(list(cluster.store.list(prefix + "files/"))) == 2
    marker = next(iter(cluster.store.list(prefix + ADOPTED_PREFIX))).key
    cluster.store.delete([marker])  # a lost marker: done names the runs too, the files stay
    assert gc.collect(cluster.cluster_uuid) == 0 and len(list(cluster.store.list(prefix + "files/"))) == 2
    one_each = [next(f"x{i}" for i in range(100) if shard_id(f"x{i}", 2) == s) for s in (0, 1)]
    assert not cluster.bulk("docs", [{"_id": i, "n": 1, "tag": "t"} for i in one_each]).errors
    cluster.flush("docs")  # the second commit above the runs on every shard
    gc.collect(cluster.cluster_uuid)  # both files go (the manager's own collector may take them first); records stay
    assert not list(cluster.store.list(prefix + "files/")) and not list(cluster.store.list(prefix + ADOPTED_PREFIX))
    assert cluster.store.exists(prefix + "done") and cluster.count("docs") == 102


def test_searches_see_an_adopted_job_all_at_once(cluster: Cluster, monkeypatch) -> None:
    """Each adopted segment is published behind the job's held views: a count between two files' adoptions (and a
    refresh meanwhile) sees none of the job, the count after the release all of it."""
    from shardstore.engine.coordinator.role import Coordinator

    assert not cluster.bulk("docs", [{"_id": f"c{i}", "n": i, "tag": "client"} for i in range(20)]).errors
    real, seen = Coordinator.adopt_file, []

    def adopt_file(self, meta, shard, file, request_id):  # noqa: ANN001, ANN202 - the wrapped method
        out = real(self, meta, shard, file, request_id)
        cluster.refresh("docs")
        seen.append(cluster.count("docs"))
        return out

    monkeypatch.setattr(Coordinator, "adopt_file", adopt_file)
    _stage_routed(cluster, "seen", _rows(0, 200, "spark"))
    assert cluster.ingest("docs", "seen")["path"] == "adopt"
    assert seen == [20, 20] and cluster.count("docs") == 220


def test_a_commit_stopped_by_another_commits_done_leaves_a_marker_for_the_runs_it_took(cluster: Cluster,
                                                                                      monkeypatch) -> None:
    """Two commits of one job at once: the one that finds ``done`` between its files has adopted runs all the same
    (seq#s in every translog), so it writes its marker before it answers the other's outcome: the collector keeps
    the files for those runs too."""
    from shardstore.engine.coordinator.ingest_job import IngestDone, encode_done
    from shardstore.engine.coordinator.role import Coordinator
    from shardstore.engine.coordinator.routing import shard_ids

    rows = _rows(0, 400, "x")
    zeros = rows.filter(pa.array([s == 0 for s in shard_ids(rows.column("_id"), 2).to_pylist()]))
    prefix = cluster.ingest_prefix("docs", "raced")
    files = tuple(replace(stage_table(cluster.store, prefix, f"p{k}", part), shard=0)
                  for k, part in enumerate((zeros.slice(0, 50), zeros.slice(50))))
    write_job(cluster.store, prefix, IngestJob("raced", "docs", cluster.index_meta("docs").uuid, "append", files))
    real = Coordinator.adopt_file
    other = IngestDone("raced", zeros.num_rows, zeros.num_rows, 0)

    def adopt_file(self, meta, shard, file, request_id):  # noqa: ANN001, ANN202 - the wrapped method
        out = real(self, meta, shard, file, request_id)
        cluster.store.put(done_key(prefix), encode_done(other), if_absent=True)  # the other commit finished
        return out

    monkeypatch.setattr(Coordinator, "adopt_file", adopt_file)
    out = cluster.ingest("docs", "raced")
    assert out["replayed"] and out["applied"] == zeros.num_rows
    markers = [b.key for b in cluster.store.list(prefix + ADOPTED_PREFIX)]
    assert len(markers) == 1
    (run,) = decode_adopted(cluster.store.get(markers[0]), markers[0]).runs
    assert run[0] == 0 and run[2] - run[1] + 1 == 50  # the one file this commit adopted before it stopped
