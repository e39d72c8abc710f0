"""The collection of Spark ingest jobs' leftovers (engine/manager/ingest_gc.py, issue 46): the rule over every case,
and passes over a real file store with a clock of our own."""

from __future__ import annotations

import itertools
from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.engine.coordinator.ingest_job import IngestDone, encode_done
from shardstore.engine.manager.ingest_gc import IngestCollector, JobView, doomed_keys

P = "c/ingest/i/j/"


def _job(job: bool, done: bool, files: int) -> JobView:
    keys = [P + f"files/f{k}" for k in range(files)] + [P + "job"] * job + [P + "done"] * done
    return JobView(P, tuple(sorted(keys)))


def test_the_rule_over_every_case() -> None:
    for job, done, files, age in itertools.product((False, True), (False, True), (0, 2), (0.0, 10.0, 100.0)):
        view = _job(job, done, files)
        got = set(doomed_keys([view], {P: (1000.0 - age, view.keys)}, 1000.0, orphan_grace=50.0, done_retention=50.0))
        staged = set(view.staged)
        if done:  # staged files at once; the records after the retention
            records = {P + "done"} | ({P + "job"} if job else set())
            expected = staged | (records if age >= 50 else set())
        elif job:  # a commit may still apply it: everything stays
            expected = set()
        else:  # nobody will commit it: once unchanged for the grace
            expected = staged if age >= 50 else set()
        assert got == expected, (job, done, files, age, got)
    assert doomed_keys([_job(False, False, 2)], {}, 5.0, orphan_grace=1.0) == []  # first seen now: no age yet


def test_passes_keep_a_job_still_staging_and_collect_the_abandoned_and_the_old(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    now = [0.0]
    gc = IngestCollector(store, orphan_grace=60.0, done_retention=600.0, clock=lambda: now[0])
    staging, abandoned, pending, finished = (f"c/ingest/i/{j}/" for j in ("staging", "abandoned", "pending", "done"))
    store.put(staging + "files/a", b"x")
    store.put(abandoned + "files/a", b"x")
    store.put(pending + "files/a", b"x")
    store.put(pending + "job", b"j")
    store.put(finished + "files/a", b"x")
    store.put(finished + "job", b"j")
    store.put(finished + "done", encode_done(IngestDone("done", 1, 1, 0)))  # applied by its rows: no runs
    assert gc.collect("c") == 1 and not store.exists(finished + "files/a")  # a done job's files at once
    now[0] = 50.0
    store.put(staging + "files/b", b"x")  # still staging: its wait starts again
    assert gc.collect("c") == 0
    now[0] = 70.0
    assert gc.collect("c") == 1 and not store.exists(abandoned + "files/a")
    assert store.exists(staging + "files/a") and store.exists(pending + "files/a")
    now[0] = 700.0
    assert gc.collect("c") == 4  # the staging job, abandoned since 50 s; the done job's records after 600 s
    assert not store.exists(finished + "done") and not store.exists(staging + "files/b")
    assert store.exists(pending + "job") and store.exists(pending + "files/a")  # a job record without done stays


def test_an_adopted_jobs_files_stay_until_its_runs_are_covered() -> None:
    """Rule 4, over every case: with an adopted marker nothing goes until the job is done and covered; then the files
    and the markers at once, the records after the retention."""
    for job, done, files, age, covered in itertools.product((False, True), (False, True), (0, 2), (0.0, 100.0),
                                                           (False, True)):
        keys = [P + f"files/f{k}" for k in range(files)] + [P + "job"] * job + [P + "done"] * done + [P + "adopted/m1"]
        view = JobView(P, tuple(sorted(keys)))
        asked: list[str] = []

        def test(v: JobView, c: bool = covered) -> bool:
            asked.append(v.prefix)
            return c

        got = set(doomed_keys([view], {P: (1000.0 - age, view.keys)}, 1000.0, orphan_grace=50.0, done_retention=50.0,
                              covered=test))
        if done and covered:
            records = {P + "done"} | ({P + "job"} if job else set())
            expected = set(view.staged) | {P + "adopted/m1"} | (records if age >= 50 else set())
        else:  # not done (a commit may run again: its runs are in translogs), or not covered: everything stays
            expected = set()
        assert got == expected, (job, done, files, age, covered, got)
        assert asked == ([P] if done else []), asked  # the store is read only for a done job
    assert JobView(P, (P + "adopted/m1",)).index_uuid == "i"


def test_a_collector_without_shard_addresses_keeps_adopted_files(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    p = "c/ingest/i/adopted-job/"
    for k in ("files/a", "job", "done", "adopted/m"):
        store.put(p + k, b"x")
    assert IngestCollector(store, clock=lambda: 0.0).collect("c") == 0
    assert IngestCollector(store, clock=lambda: 0.0, shard_address=lambda u, s: None).collect("c") == 0
    assert store.exists(p + "files/a")
