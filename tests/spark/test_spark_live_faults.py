"""Faults while Spark writes into a live cluster (issue 43): a killed streaming driver, a killed node.

Real parts only: three ``shardstore node`` processes over a file store, a Spark driver of its own
(SIGKILLed mid-stream, then restarted from its checkpoint) and the shared test session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shardstore.blobstores import open_store
from shardstore.engine.client import Client
from shardstore.engine.coordinator.ingest import read_done
from shardstore.spark.live_sink import stream_id
from shardstore.testing.node_processes import ProcessCluster

REPO = Path(__file__).resolve().parents[2]

#: the streaming driver (run as a script): the ``spark`` fixture's session, a file stream into the live cluster
DRIVER = '''
import sys

from pyspark.sql import SparkSession

from shardstore.spark import configure, register


def main(url, index, hosts, incoming, checkpoint, mode):
    builder = (SparkSession.builder.master("local[2]").appName("shardstore-stream-driver")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "4"))
    spark = configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    assert register(spark), "the shardstore bridge jar did not load"
    writer = (spark.readStream.schema("_id string, n long").option("maxFilesPerTrigger", 1).json(incoming)
              .writeStream.format("shardstore").option("store", url).option("index", index)
              .option("hosts", hosts).option("checkpointLocation", checkpoint))
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr, flush=True)
        sys.exit(3)
    spark.stop()
    print("finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
'''

FILES, ROWS = 6, 2_000


def _driver_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p)}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and its JVM (the process group it leads) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _count(client: Client, index: str) -> int:
    client.refresh(index)
    return client.count(index)


def test_a_killed_streaming_driver_restarts_from_its_checkpoint_exactly_once(tmp_path: Path) -> None:
    """A streaming driver SIGKILLed mid-stream, restarted from its checkpoint: every row applied exactly once.

    Each micro-batch is ingest job ``<stream>-<batch id>`` (spark/live_sink.py, ``write_batch``).
    Wherever the kill lands, no document is written twice, so every ``_version`` stays 1:

    * before the batch's job record is written: nothing of it was applied; the restarted query
      runs the batch again (Spark's offset log names the same file) and applies it once;
    * after the job record, while a coordinator applies it: the coordinator is another process and
      finishes the job, writing its ``done`` record well before the new driver (a JVM start, seconds)
      reaches the batch again; the replay finds ``done`` and applies nothing;
    * after ``done``, before Spark's commit log: the same, a replay that applies nothing.

    The kill is aimed at the middle case: right after a later batch's job record appears.  (A replay
    that overlapped the first coordinator's apply would apply the job a second time, versions 2:
    docs/design/ingest.md, "Two commits of one job running at once both do the work"; a 2,000-row
    batch is applied in well under the seconds a new driver needs to start.)
    """
    url = f"file://{tmp_path / 'store'}"
    procs = ProcessCluster(str(tmp_path / "nodes"), f"{url}?create=true", 3)
    drivers: list[subprocess.Popen] = []
    try:
        client = procs.client()
        client.create_index("stream", shards=2, replicas=1)
        incoming = tmp_path / "incoming"
        incoming.mkdir()
        for f in range(FILES):
            (incoming / f"part-{f}.json").write_text(
                "".join(f'{{"_id": "f{f}-{i}", "n": {f * ROWS + i}}}\n' for i in range(ROWS)))
        total = FILES * ROWS
        checkpoint = str(tmp_path / "checkpoint")
        hosts = ",".join(h.address for h in procs.nodes.values())
        script = tmp_path / "stream_driver.py"
        script.write_text(DRIVER)

        def start(mode: str) -> subprocess.Popen:
            out = open(tmp_path / f"driver-{len(drivers)}.log", "w")  # noqa: SIM115 - the child owns it
            proc = subprocess.Popen([sys.executable, str(script), url, "stream", hosts, str(incoming), checkpoint,
                                     mode], stdout=out, stderr=subprocess.STDOUT, env=_driver_env(),
                                    start_new_session=True)  # its own group: the kill takes its JVM too
            out.close()
            drivers.append(proc)
            return proc

        def log(n: int) -> str:
            return (tmp_path / f"driver-{n}.log").read_text()[-4000:]

        first = start("continuous")
        sid = stream_id({"checkpointLocation": checkpoint})
        jobs = tmp_path / "store"
        deadline = time.monotonic() + 300
        while True:  # batch 0 applied and a later batch's job record written: kill the driver in that batch
            assert first.poll() is None, f"the streaming driver exited on its own:\n{log(0)}"
            assert time.monotonic() < deadline, f"no second batch after 300s:\n{log(0)}"
            later = [p for p in jobs.glob(f"*/ingest/*/{sid}-*/job") if p.parent.name != f"{sid}-0"]
            if later:
                break
            time.sleep(0.01)
        _kill_group(first)
        killed = {p.parent.name: (p.parent / "done").exists() for p in later}  # the batch, and whether it was done
        at_kill = _count(client, "stream")
        assert ROWS <= at_kill < total, f"the kill did not land mid-stream: {at_kill} of {total} rows applied"

        second = start("available-now")  # the same checkpoint: the unfinished batch again, then the rest
        try:
            rc = second.wait(300)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the restarted driver did not finish in 300s:\n{log(1)}") from None
        assert rc == 0, f"the restarted driver failed (exit {rc}):\n{log(1)}"

        assert _count(client, "stream") == total
        docs = client.scan("stream", columns=["_id", "n"])
        got = dict(zip(docs.column("_id").to_pylist(), docs.column("n").to_pylist()))
        want = {f"f{f}-{i}": f * ROWS + i for f in range(FILES) for i in range(ROWS)}
        assert docs.num_rows == total and got == want
        for f in range(FILES):
            for i in range(0, ROWS, 50):
                doc = client.get("stream", f"f{f}-{i}")
                assert doc is not None and doc["_source"]["n"] == f * ROWS + i, (f, i, doc)
                assert doc["_version"] == 1, f"f{f}-{i} was written {doc['_version']} times: {doc}"

        # every batch Spark committed is a done ingest job, and together they hold each row once
        batches = sorted(int(p) for p in os.listdir(os.path.join(checkpoint, "commits")) if p.isdigit())
        assert batches == list(range(FILES)), batches  # maxFilesPerTrigger=1: one file a batch, before and after
        store = open_store(url)
        done = [read_done(store, client.ingest_prefix("stream", f"{sid}-{b}")) for b in batches]
        assert all(d is not None for d in done), ([b for b, d in zip(batches, done) if d is None], killed)
        assert [(d.rows, d.applied) for d in done] == [(ROWS, ROWS)] * FILES, (done, killed)
        # a replayed batch applies nothing
        assert client.ingest("stream", f"{sid}-{batches[0]}")["replayed"]

        # not fenced: the cluster takes a client's bulk after the restarted job
        assert not client.bulk("stream", [{"_id": "after", "n": -1}]).errors
        assert _count(client, "stream") == total + 1
        client.close()
    finally:
        for d in drivers:
            if d.poll() is None:
                _kill_group(d)
        procs.close()


def _job_records(store_dir: Path) -> list[Path]:
    """The ingest job records (``<c>/ingest/<i>/<job>/job``) in the file store at ``store_dir``."""
    return list(store_dir.glob("*/ingest/*/*/job"))


def test_a_node_killed_while_a_job_writes_commits_once_or_not_at_all(spark, tmp_path: Path) -> None:
    """The node holding shard 0's primary is SIGKILLed while a Spark append's ingest runs.

    The job either commits once (the sink retries the ingest by job id through the failover:
    every row visible once) or fails and nothing of it is visible; the sink retries for
    ``COMMIT_RETRY_SECONDS``, so committing once is what must happen.  The two remaining nodes
    keep taking client writes.
    """
    store_dir = tmp_path / "store"
    url = f"file://{store_dir}"
    procs = ProcessCluster(str(tmp_path / "nodes"), f"{url}?create=true", 3)
    try:
        client = procs.client()
        client.create_index("faults", shards=2, replicas=1)
        pre = 500
        assert not client.bulk("faults", [{"_id": f"c{i}", "n": -i} for i in range(pre)]).errors
        victim = client.primary_of("faults", 0)
        assert victim in procs.nodes, (victim, list(procs.nodes))

        rows = 100_000
        frame = spark.range(0, rows, numPartitions=2).selectExpr("concat('s', cast(id as string)) as _id", "id as n")
        outcome: dict[str, object] = {}

        def save() -> None:
            try:
                frame.write.format("shardstore").option("store", url).option("index", "faults").mode("append").save()
                outcome["committed"] = True
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        writer = threading.Thread(target=save, daemon=True)
        started = time.monotonic()
        writer.start()
        while not _job_records(store_dir):  # the job is staged and its record written: the ingest runs now
            assert writer.is_alive(), f"the save ended before its ingest was seen: {outcome}"
            assert time.monotonic() - started < 180, "no ingest job record after 180s"
            time.sleep(0.01)
        [record] = _job_records(store_dir)
        done_at_kill = (record.parent / "done").exists()
        procs.kill(victim)
        writer.join(240)
        assert not writer.is_alive(), "the save did not end within 240s of the kill"
        assert not done_at_kill, "the ingest was done before the kill: the kill did not land while it ran"

        assert victim not in procs.live() and len(procs.live()) == 2
        survivors = procs.client(procs.live())
        visible = _count(survivors, "faults")
        if "error" in outcome:  # it did not commit: then nothing of it may be visible
            assert visible == pre, f"the save failed ({outcome['error']}) yet {visible - pre} of its rows are visible"
            ids = survivors.scan("faults", columns=["_id"]).column("_id").to_pylist()
            assert not [i for i in ids if i.startswith("s")]
        assert outcome == {"committed": True}, f"expected the save to commit through the failover: {outcome}"
        assert (record.parent / "done").exists()
        assert survivors.primary_of("faults", 0) not in (None, victim)  # failed over to the replica
        assert visible == pre + rows, f"{visible} visible, expected {pre} + {rows}"
        for i in range(0, rows, 997):
            doc = survivors.get("faults", f"s{i}")
            assert doc is not None and doc["_source"] == {"n": i}, (i, doc)
        for i in range(0, pre, 50):
            assert survivors.get("faults", f"c{i}")["_source"] == {"n": -i}

        # the two remaining nodes keep taking writes: not fenced
        res = survivors.bulk("faults", [{"_id": f"after{i}", "n": i} for i in range(100)])
        assert not res.errors, res.items.column("error").to_pylist()[:3]
        assert _count(survivors, "faults") == pre + rows + 100
        survivors.close()
        client.close()
    finally:
        procs.close()
