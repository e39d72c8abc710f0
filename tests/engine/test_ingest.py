"""Ingest jobs (issue 43): a live cluster adopts staged Parquet files through its one write path, once per job id.

A real embedded cluster (the production roles over the in-process transport) and a file store;
the staged files are written as the Spark sink writes them (``stage_table`` + ``write_job``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from shardstore.core.records import RecordCorrupted, crc32c
from shardstore.engine import Cluster
from shardstore.engine.coordinator.ingest import StagedFileCorrupt, stage_table, write_job
from shardstore.engine.coordinator.ingest_job import (
    IngestDone,
    IngestJob,
    StagedFile,
    check_job_id,
    decode_done,
    decode_job,
    done_key,
    encode_done,
    encode_job,
    job_prefix,
)
from shardstore.engine.errors import IngestJobNotFound, IngestRejected
from shardstore.errors import InvalidError, UnsupportedFormatVersion


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=2, recovery_delay=0.05)
    try:
        c.create_index("docs", shards=2, replicas=1)
        yield c
    finally:
        c.close()


def _stage(c: Cluster, job: str, tables: list[pa.Table], mode: str = "append", index: str = "docs") -> str:
    prefix = c.ingest_prefix(index, job)
    assert prefix == job_prefix(c.cluster_uuid, c.index_meta(index).uuid, job)
    files = tuple(stage_table(c.store, prefix, f"part-{i}", t) for i, t in enumerate(tables))
    write_job(c.store, prefix, IngestJob(job, index, c.index_meta(index).uuid, mode, files))
    return prefix


def _rows(lo: int, hi: int, tag: str) -> pa.Table:
    return pa.table({"_id": [f"d{i}" for i in range(lo, hi)], "n": list(range(lo, hi)),
                     "tag": [tag] * (hi - lo)})


def test_a_job_is_applied_once_beside_client_writes(cluster: Cluster) -> None:
    assert not cluster.bulk("docs", [{"_id": f"d{i}", "n": -1, "tag": "client"} for i in range(0, 50)]).errors
    prefix = _stage(cluster, "job-1", [_rows(25, 150, "spark"), _rows(150, 300, "spark")])
    out = cluster.ingest("docs", "job-1")
    seconds = out.pop("seconds")
    assert out == {"job": "job-1", "rows": 275, "applied": 275, "deleted": 0, "replayed": False,
                   "path": "rows"}
    assert list(seconds) == ["check", "hold", "apply", "release", "total"]
    assert 0 <= sum(seconds.values()) - seconds["total"] <= seconds["total"]  # the phases fit in the call
    cluster.refresh("docs")
    assert cluster.count("docs") == 300
    assert cluster.get("docs", "d10")["_source"] == {"n": -1, "tag": "client"}  # not in the job: untouched
    doc = cluster.get("docs", "d30")
    assert doc["_source"] == {"n": 30, "tag": "spark"} and doc["_version"] == 2  # an update of the client's
    assert cluster.get("docs", "d299")["_version"] == 1
    # the staged files are gone; the records stay
    assert not list(cluster.store.list(prefix + "files/"))
    # committed again (a driver that lost the answer): nothing applied a second time
    again = cluster.ingest("docs", "job-1")
    assert again["replayed"] and again["applied"] == 275
    assert cluster.get("docs", "d30")["_version"] == 2
    # and the cluster serves client writes as before
    assert not cluster.bulk("docs", [{"_id": "d30", "n": 0}]).errors


def test_overwrite_replaces_the_documents(cluster: Cluster) -> None:
    assert not cluster.bulk("docs", [{"_id": f"old{i}", "n": i} for i in range(40)] + [{"_id": "d1", "n": 0}]).errors
    _stage(cluster, "ow", [_rows(0, 20, "new")], mode="overwrite")
    out = cluster.ingest("docs", "ow")
    assert out["applied"] == 20 and out["deleted"] == 40
    cluster.refresh("docs")
    ids = sorted(cluster.scan("docs", columns=["_id"]).column("_id").to_pylist())
    assert ids == sorted(f"d{i}" for i in range(20))


def test_a_corrupt_staged_file_names_its_key_and_the_job_is_not_done(cluster: Cluster) -> None:
    prefix = _stage(cluster, "bad", [_rows(0, 10, "x")])
    job = decode_job(cluster.store.get(prefix + "job"), "job")
    key = job.files[0].key
    data = bytearray(cluster.store.get(key))
    data[len(data) // 2] ^= 0xFF
    cluster.store.delete([key])
    cluster.store.put(key, bytes(data))
    with pytest.raises(StagedFileCorrupt, match=key):
        cluster.ingest("docs", "bad")
    assert not cluster.store.exists(done_key(prefix))
    cluster.refresh("docs")
    assert cluster.count("docs") == 0


def test_a_staged_file_gone_from_the_store_is_named(cluster: Cluster) -> None:
    prefix = _stage(cluster, "gone", [_rows(0, 10, "x")])
    key = decode_job(cluster.store.get(prefix + "job"), "job").files[0].key
    cluster.store.delete([key])
    with pytest.raises(StagedFileCorrupt, match=f"{key} .10 rows. is gone"):
        cluster.ingest("docs", "gone")
    assert not cluster.store.exists(done_key(prefix))


def test_a_second_commit_running_at_once_answers_the_first_ones_outcome(cluster: Cluster) -> None:
    """Two commits of one job at once (a retry after a lost answer while the first coordinator still applies): the
    first to finish deletes the staged files; the other, reading them, answers that outcome instead of failing."""
    from shardstore.engine.coordinator.ingest import run_ingest

    prefix = _stage(cluster, "twice", [_rows(0, 50, "x")])

    class Racing:  # the store as the second coordinator sees it: the first commit finishes under its first read
        def __init__(self, store):
            self.store, self.raced = store, False

        def __getattr__(self, name):
            return getattr(self.store, name)

        def get(self, key):
            if "/files/" in key and not self.raced:
                self.raced = True
                assert cluster.ingest("docs", "twice")["replayed"] is False  # the other commit: done, files gone
            return self.store.get(key)

    documents = next(iter(cluster.processes.values())).coordinator.documents
    out = run_ingest(documents, Racing(cluster.store), "docs", prefix, scan_ids=lambda _i: pa.array([], pa.string()))
    assert out["replayed"] and out["applied"] == 50
    cluster.refresh("docs")
    assert cluster.count("docs") == 50


def test_rows_the_index_refuses_stop_the_job(cluster: Cluster) -> None:
    assert not cluster.bulk("docs", [{"_id": "a", "n": 1}]).errors  # n is a long now
    bad = pa.table({"_id": ["b", "c"], "n": ["not a number", "x"]})
    _stage(cluster, "rej", [bad])
    with pytest.raises(IngestRejected, match="2 row"):
        cluster.ingest("docs", "rej")


def test_bad_requests_name_what_is_wrong(cluster: Cluster) -> None:
    with pytest.raises(IngestJobNotFound, match="nothing was applied"):
        cluster.ingest("docs", "never")
    with pytest.raises(InvalidError, match="job id"):
        cluster.ingest("docs", "../up")
    cluster.create_index("other", shards=1, replicas=0)
    prefix = _stage(cluster, "j2", [_rows(0, 2, "x")], index="other")
    with pytest.raises(IngestJobNotFound):  # a job of another index is not this index's
        cluster.ingest("docs", "j2")
    with pytest.raises(InvalidError, match="job id"):
        check_job_id("")
    # a job id names one job: the first record stands (a replayed stream batch applies its first attempt's files)
    job = decode_job(cluster.store.get(prefix + "job"), "job")
    assert write_job(cluster.store, prefix, replace(job, mode="overwrite")) == job


def test_the_records_round_trip_and_refuse_damage() -> None:
    job = IngestJob("j", "docs", "u" * 32, "append", (StagedFile("k/files/a.parquet", 10, 7, 3),))
    assert decode_job(encode_job(job), "where") == job
    done = IngestDone("j", 3, 3, 0)
    assert decode_done(encode_done(done), "where") == done
    raw = bytearray(encode_job(job))
    raw[14] ^= 1
    with pytest.raises(RecordCorrupted, match="where"):
        decode_job(bytes(raw), "where")
    newer = bytearray(encode_done(done))
    newer[4:6] = (9).to_bytes(2, "little")
    # the CRC over the changed header, so only the version is wrong
    newer[-4:] = crc32c(bytes(newer[:-4])).to_bytes(4, "little")
    with pytest.raises(UnsupportedFormatVersion):
        decode_done(bytes(newer), "where")
    with pytest.raises(InvalidError, match="mode"):
        encode_job(replace(job, mode="upsert"))


def test_files_applied_at_once_keep_each_files_order_and_raise_the_real_failure(cluster: Cluster, monkeypatch) -> None:
    """Two files at a time (FILES_AT_ONCE): an id written twice in one file ends as its later row; a file the
    index refuses, beside files that apply, raises IngestRejected (never the stop the other files saw)."""
    from shardstore.engine.coordinator import ingest

    monkeypatch.setattr(ingest, "SLICE_ROWS", 4)  # several slices per file: the stop lands between them
    twice = pa.table({"_id": [f"t{i % 6}" for i in range(12)], "n": list(range(12)), "tag": ["x"] * 12})
    _stage(cluster, "order", [twice, _rows(0, 40, "a"), _rows(40, 80, "b")])
    assert cluster.ingest("docs", "order")["applied"] == 92
    assert {i: cluster.get("docs", f"t{i}")["_source"]["n"] for i in range(6)} == {i: i + 6 for i in range(6)}

    assert not cluster.bulk("docs", [{"_id": "a", "n": 1}]).errors
    bad = pa.table({"_id": ["b1", "b2"], "n": ["not a number", "x"]})
    _stage(cluster, "mixed", [_rows(100, 140, "c"), bad, _rows(140, 180, "d")])
    with pytest.raises(IngestRejected, match="2 row"):
        cluster.ingest("docs", "mixed")


def _counting_slices(monkeypatch, cluster: Cluster, seen: list[int], *, fail_at: int | None = None) -> None:
    """Before each slice of a job: a client refresh, then a count (what a reader polling beside the job sees);
    ``fail_at``: that slice (1-based) is not acknowledged once (IngestIncomplete, as a shard unavailable)."""
    from shardstore.engine.coordinator import ingest
    from shardstore.engine.errors import IngestIncomplete

    monkeypatch.setattr(ingest, "SLICE_ROWS", 10)
    monkeypatch.setattr(ingest, "FILES_AT_ONCE", 1)
    real = ingest._check
    slices = [0]

    def check(result, job, where):  # noqa: ANN001, ANN202 - the wrapped private helper
        slices[0] += 1
        if fail_at is not None and slices[0] == fail_at:
            raise IngestIncomplete(job, where, 1, "ShardUnavailable: planted")
        out = real(result, job, where)
        cluster.refresh("docs")
        seen.append(cluster.count("docs"))
        return out

    monkeypatch.setattr(ingest, "_check", check)


def test_searches_see_a_job_all_at_once_however_often_they_refresh_meanwhile(cluster: Cluster, monkeypatch) -> None:
    """Docs/design/ingest.md, "Atomic visibility": a reader refreshing and counting after every slice of a job
    sees the count before the job until it is done, then every row of it (updates included) in one step."""
    assert not cluster.bulk("docs", [{"_id": f"d{i}", "n": -1, "tag": "client"} for i in range(30)]).errors
    cluster.refresh("docs")
    seen: list[int] = []
    _counting_slices(monkeypatch, cluster, seen)
    _stage(cluster, "atomic", [_rows(20, 60, "spark"), _rows(60, 100, "spark")])
    assert cluster.ingest("docs", "atomic")["applied"] == 80
    assert len(seen) == 8 and set(seen) == {30}  # the 8 slices: nothing of the job searchable
    assert cluster.count("docs") == 100  # then all of it, without a refresh
    assert {d["tag"] for d in cluster.scan("docs", columns=["tag"]).to_pylist()} == {"client", "spark"}
    assert cluster.get("docs", "d25")["_source"]["tag"] == "spark"


def test_a_count_between_two_shards_flips_sees_the_job_all_at_once(cluster: Cluster, monkeypatch) -> None:
    """Issue 43, "every row of the job becomes visible at once": a job's release flips shard 0's view, then a
    reader counts before shard 1's flip (the CI failure of stop 55: a count of 100 + 10,052 of 20,000 rows).  The
    count sees shard 0 show the job shard 1 hides, and reads again: all of the job, never part of it.  Before,
    it answered the client's rows plus shard 0's half of the job."""
    import threading

    from shardstore.engine.node import data_role

    assert not cluster.bulk("docs", [{"_id": f"c{i}", "n": -1, "tag": "client"} for i in range(30)]).errors
    cluster.refresh("docs")
    real = data_role._ACTIONS["shard.release_view"]
    shard0_flipped, counted = threading.Event(), threading.Event()
    seen: list[int] = []

    def release(node, req):  # noqa: ANN001, ANN202 - the node action, shard 1's first release late
        if req["shard"] == 1 and not counted.is_set():
            counted.set()
            assert shard0_flipped.wait(10)
            seen.append(cluster.count("docs"))  # a reader between the two flips
        out = real(node, req)
        if req["shard"] == 0:
            shard0_flipped.set()
        return out

    monkeypatch.setitem(data_role._ACTIONS, "shard.release_view", release)
    _stage(cluster, "between", [_rows(100, 300, "spark")])
    assert cluster.ingest("docs", "between")["applied"] == 200
    assert seen == [230], seen
    assert cluster.count("docs") == 230


def test_a_count_during_the_releases_waits_for_the_last_flip_without_releasing_itself(cluster: Cluster,
                                                                                      monkeypatch) -> None:
    """The path a count takes while a release is under way: shard 1's releases come 0.1 s after shard 0's flip
    (within HELP_AFTER); a reader counting meanwhile, on its own thread, reads again until both flipped, and
    sends no release of its own."""
    import threading

    from shardstore.engine.coordinator import view_reads
    from shardstore.engine.node import data_role

    assert view_reads.HELP_AFTER > 0.1
    assert not cluster.bulk("docs", [{"_id": f"c{i}", "n": -1, "tag": "client"} for i in range(30)]).errors
    cluster.refresh("docs")
    real = data_role._ACTIONS["shard.release_view"]
    calls: list[int] = []
    seen: list[int] = []
    reader: list[threading.Thread] = []

    def release(node, req):  # noqa: ANN001, ANN202 - the node action: shard 1 late, a reader started between
        calls.append(req["shard"])
        if req["shard"] == 1:
            time.sleep(0.1)
        out = real(node, req)
        if req["shard"] == 0 and not reader:
            reader.append(threading.Thread(target=lambda: seen.append(cluster.count("docs"))))
            reader[0].start()
        return out

    monkeypatch.setitem(data_role._ACTIONS, "shard.release_view", release)
    _stage(cluster, "late", [_rows(100, 300, "spark")])
    assert cluster.ingest("docs", "late")["applied"] == 200
    reader[0].join(30)
    assert seen == [230], seen
    assert sorted(calls) == [0, 0, 1, 1], calls  # each copy released once: by the job's coordinator alone


def test_a_job_released_between_another_jobs_holds_shows_on_every_shard_while_that_job_applies(
        cluster: Cluster, monkeypatch) -> None:
    """Two jobs on one index (the gap stop 56 left): job "second" holds shard 0 before the release of job "first"
    reaches it, and shard 1 after shard 1 flipped for "first".  Shard 0 then hid "first" until "second" ended while
    shard 1 showed it: a count during "second" saw 30 + shard 1's part of "first", and reads answered it at once.
    Now "second" waits for "first"'s release and advances shard 0 before its first row: a count during "second"
    sees all of "first" and nothing of "second"."""
    import threading

    from shardstore.engine.node import data_role

    assert not cluster.bulk("docs", [{"_id": f"c{i}", "n": -1, "tag": "client"} for i in range(30)]).errors
    cluster.refresh("docs")
    real = dict(data_role._ACTIONS)
    shard1_released, second_held0 = threading.Event(), threading.Event()
    released1: list[str] = []
    held0: list[str] = []
    second: list[dict] = []
    runner: list[threading.Thread] = []
    counted: list[int] = []
    once = threading.Lock()

    def release(node, req):  # noqa: ANN001, ANN202 - "first": shard 1's copies first, then shard 0's after "second" held
        if req["job"] == "first" and req["shard"] == 0:
            if not runner:
                assert shard1_released.wait(10)
                runner.append(threading.Thread(target=lambda: second.append(cluster.ingest("docs", "second"))))
                runner[0].start()
            assert second_held0.wait(10)
        out = real["shard.release_view"](node, req)
        if req["job"] == "first" and req["shard"] == 1:
            released1.append(node)
            if len(released1) == 2:
                shard1_released.set()
        return out

    second_holds: list[int] = []

    def hold(node, req):  # noqa: ANN001, ANN202
        out = real["shard.hold_view"](node, req)
        if req["job"] == "second":
            second_holds.append(req["shard"])
        if req["job"] == "second" and req["shard"] == 0:
            held0.append(node)
            if len(held0) == 2:
                second_held0.set()
        return out

    def bulk(name: str):  # noqa: ANN202 - the first slice of "second" reaching a primary: a reader counts first
        def action(node, req):  # noqa: ANN001, ANN202
            with once:
                if runner and not counted:
                    counted.append(cluster.count("docs"))
            return real[name](node, req)
        return action

    monkeypatch.setitem(data_role._ACTIONS, "shard.release_view", release)
    monkeypatch.setitem(data_role._ACTIONS, "shard.hold_view", hold)
    for name in ("shard.bulk", "shard.bulk_many"):
        monkeypatch.setitem(data_role._ACTIONS, name, bulk(name))
    _stage(cluster, "first", [_rows(100, 300, "first")])
    _stage(cluster, "second", [pa.table({"_id": [f"s{i}" for i in range(100)], "n": list(range(100)),
                                         "tag": ["second"] * 100})])
    assert cluster.ingest("docs", "first")["applied"] == 200
    runner[0].join(60)
    assert second and second[0]["applied"] == 100
    assert counted == [230], counted  # all of "first", none of "second"
    assert sorted(second_holds) == [0, 0, 0, 0, 1, 1, 1, 1]  # every copy held, then held again after the advance
    assert cluster.count("docs") == 330


def test_a_job_the_index_refuses_applies_nothing(cluster: Cluster) -> None:
    """The files are checked before any row is applied: the first file's good rows are not applied either."""
    assert not cluster.bulk("docs", [{"_id": "a", "n": 1}]).errors  # n is a long now
    bad = pa.table({"_id": ["b", "c"], "n": ["not a number", "x"], "tag": ["t", "t"]})
    prefix = _stage(cluster, "refused", [_rows(0, 50, "good"), bad])
    with pytest.raises(IngestRejected, match="refused.*2 row"):
        cluster.ingest("docs", "refused")
    cluster.refresh("docs")
    assert cluster.count("docs") == 1 and cluster.get("docs", "d0") is None  # not even realtime
    assert not cluster.store.exists(done_key(prefix))


def test_a_client_mapping_a_jobs_new_field_otherwise_meanwhile_is_refused_not_the_job(cluster: Cluster,
                                                                                       monkeypatch) -> None:
    """The fields a job's rows add are committed to the index mapping once its files are checked, before its hold:
    a client that maps one of them another way after the check is refused, and the job applies every row. Before,
    the client's field won and the job stopped mid-way with IngestRejected, held until its lease ran out."""
    from shardstore.engine.coordinator import ingest

    enter = ingest._Renewal.__enter__
    client: list[object] = []

    def client_writes_first(self):  # between the check and the first row: a client maps "score" as a keyword
        client.append(cluster.bulk("docs", [{"_id": "z", "score": "high"}]))
        return enter(self)

    monkeypatch.setattr(ingest._Renewal, "__enter__", client_writes_first)
    rows = pa.table({"_id": [f"s{i}" for i in range(20)], "score": list(range(20))})
    _stage(cluster, "scored", [rows])
    assert cluster.ingest("docs", "scored")["applied"] == 20
    (refused,) = client
    assert refused.errors and "score" in refused.items.column("error")[0].as_py()
    cluster.refresh("docs")
    assert cluster.count("docs") == 20 and cluster.get("docs", "s7")["_source"] == {"score": 7}
    assert cluster.index_meta("docs").mappings["properties"]["score"]["type"] == "long"


def test_a_job_cut_short_stays_unseen_until_committed_again(cluster: Cluster, monkeypatch) -> None:
    """A slice not acknowledged (IngestIncomplete): the views stay held (no release after a failure), so the
    rows applied so far stay unseen; the job committed again shows all of it at once."""
    from shardstore.engine.errors import IngestIncomplete

    seen: list[int] = []
    _counting_slices(monkeypatch, cluster, seen, fail_at=3)
    _stage(cluster, "cut", [_rows(0, 50, "spark")])
    with pytest.raises(IngestIncomplete, match="planted"):
        cluster.ingest("docs", "cut")
    cluster.refresh("docs")
    assert cluster.count("docs") == 0 and cluster.get("docs", "d0") is not None  # applied, acknowledged, unseen
    assert cluster.ingest("docs", "cut")["applied"] == 50
    assert set(seen) == {0} and cluster.count("docs") == 50


def test_a_hold_lapses_after_its_lease(cluster: Cluster, monkeypatch, caplog) -> None:
    """A job cut short and never committed again: once its lease runs out, what it applied is searchable."""
    from shardstore.engine.coordinator import ingest
    from shardstore.engine.errors import IngestIncomplete

    _counting_slices(monkeypatch, cluster, [], fail_at=3)
    monkeypatch.setattr(ingest, "HOLD_LEASE", 0.5)
    _stage(cluster, "lapse", [_rows(0, 50, "spark")])
    with pytest.raises(IngestIncomplete):
        cluster.ingest("docs", "lapse")
    assert cluster.count("docs") == 0
    time.sleep(0.6)
    with caplog.at_level("WARNING", logger="shardstore.segments.directory"):
        assert cluster.count("docs") == 20  # the two slices acknowledged before the planted failure
    assert "ingest job(s) lapse lapsed" in caplog.text


def test_a_failover_during_a_job_keeps_the_view(tmp_path: Path, monkeypatch) -> None:
    """Every copy holds its view before the job's first row, so the replica promoted when the primary's node dies
    mid-job answers from the view the job started from; the job committed again (as the sink does after
    IngestIncomplete or a lost answer) shows all of it at once."""
    from shardstore.engine.coordinator import ingest
    from shardstore.errors import UnavailableError

    c = Cluster(store=f"file://{tmp_path / 'remote'}", data_dir=str(tmp_path / "nodes"), nodes=3, recovery_delay=0.05)
    try:
        c.create_index("docs", shards=1, replicas=1)
        c.wait_for_health("green", timeout=30)
        assert not c.bulk("docs", [{"_id": f"c{i}", "n": i, "tag": "client"} for i in range(30)]).errors
        sr = c.index_meta("docs").routing[0]
        primary, spare = sr.primary, next(n for n in c.live_nodes() if n not in sr.copies)
        client = c.client(names=[spare])  # the coordinator outlives the primary
        monkeypatch.setattr(ingest, "SLICE_ROWS", 10)
        real, slices, seen = ingest._check, [0], []

        def check(result, job, where):  # noqa: ANN001, ANN202 - the wrapped private helper
            out = real(result, job, where)
            slices[0] += 1
            if slices[0] == 2:
                c.kill(primary)
            client.refresh("docs")
            seen.append(client.count("docs"))
            return out

        monkeypatch.setattr(ingest, "_check", check)
        _stage(c, "failover", [_rows(0, 60, "spark")])
        for _attempt in range(5):
            try:
                out = client.ingest("docs", "failover")
                break
            except UnavailableError:
                seen.append(client.count("docs"))
        assert out["applied"] == 60 and c.index_meta("docs").routing[0].primary != primary
        assert seen and set(seen) == {30}, seen
        assert client.count("docs") == 90
    finally:
        c.close()
