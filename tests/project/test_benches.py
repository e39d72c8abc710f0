"""Smoke test of the bench runner: ``python -m benches blobstore --quick`` on memory and file.

It checks the output format (one JSON figure per line, then a blank line and a table),
not speed: every figure must carry bench, name, value, unit and params, with a positive
value.  The cloud backends are left out (they start emulators); the full run is
``python -m benches``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"bench": str, "name": str, "value": (int, float), "unit": str, "params": dict}


def _run(*args: str, tmp_path: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benches", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SHARDSTORE_BENCH_DIR": str(tmp_path)},
    )


def _quick(bench: str, tmp_path: Path, *extra: str, zero_ok: tuple[str, ...] = (),
           timeout: float = 180) -> tuple[list[dict], list[str], list[str], str]:
    """Run ``python -m benches <bench> --quick``; check the format; return (figures, table, json lines, stderr).

    Every line before the blank line is one JSON figure carrying bench, name, value,
    unit and params, with a positive value (names in ``zero_ok`` may be 0); ``--out``
    holds exactly those lines; progress goes to stderr; the table has a header, a rule
    and one row per figure (its params indented below it), within 120 columns.
    """
    out_file = tmp_path / f"{bench}.jsonl"
    proc = _run(bench, "--quick", *extra, "--out", str(out_file), tmp_path=tmp_path, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "" in lines, f"no blank line before the table:\n{proc.stdout[-2000:]}"
    cut = lines.index("")
    json_lines, table = lines[:cut], lines[cut + 1 :]
    if table and table[0].startswith("every ratio reads higher-is-better"):
        table = table[1:]  # the note above a table with ratios
    assert json_lines, "no figures printed"
    figures = []
    for line in json_lines:
        fig = json.loads(line)
        for key, kind in REQUIRED.items():
            assert key in fig, f"{key!r} missing from {line}"
            assert isinstance(fig[key], kind), f"{key!r} has the wrong type in {line}"
        assert not isinstance(fig["value"], bool)
        assert fig["bench"] == bench
        assert fig["value"] > 0 or (fig["name"] in zero_ok and fig["value"] == 0), line
        figures.append(fig)
    assert table[0].split()[:2] == ["bench", "name"]
    figure_table = table[: table.index("")] if "" in table else table  # the bench's summaries follow, if any
    summaries = table[len(figure_table):]
    assert not summaries or (summaries[0] == "" and summaries[1].startswith(f"[{bench}] ")), summaries[:2]
    rows = [row for row in figure_table[2:] if not row.startswith(" ")]  # params go on indented lines of their own
    assert len(rows) == len(figures)
    assert max(len(row) for row in figure_table) <= 120, max(figure_table, key=len)
    assert not any(row.endswith(("met", "NOT MET")) for row in rows)  # a quick run judges no target
    assert out_file.read_text().splitlines() == json_lines
    assert f"[{bench}]" in proc.stderr
    return figures, table, json_lines, proc.stderr


def test_blobstore_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    figures, table, json_lines, _err = _quick("blobstore", tmp_path, "--backends", "memory,file")

    # Both backends, both sizes, both implementations, and the ratios with their targets.
    assert {f["params"]["backend"] for f in figures} == {"memory", "file"}
    ratios = [f for f in figures if f["unit"] == "ratio"]
    assert {(f["params"]["backend"], f["params"]["size"], f["name"]) for f in ratios} >= {
        (b, s, n) for b in ("memory", "file") for s in ("4KiB", "8MiB") for n in ("put_ratio", "get_ratio")
    }
    assert all("target" in f and isinstance(f["met"], bool) for f in ratios)
    assert {f["params"].get("fsync") for f in ratios if f["params"]["backend"] == "file"} == {True, False}
    impls = {f["params"].get("impl") for f in figures}
    assert {"shardstore", "raw"} <= impls
    assert any(f["name"] == "requests_per_op" for f in figures)

    # The table shows the targets, as indicative only in a quick run.
    assert any(row.endswith("indicative (quick)") for row in table)


def test_unknown_bench_and_backend_fail_cleanly(tmp_path: Path) -> None:
    proc = _run("no-such-bench", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unknown bench" in proc.stderr
    proc = _run("blobstore", "--quick", "--backends", "floppy", "--json-only", tmp_path=tmp_path)
    assert proc.returncode == 1 and "unknown backend" in proc.stderr
    assert proc.stdout == ""


def test_translog_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    """``python -m benches translog --quick``: every cell and the group-commit figures, format only."""
    figures, table, json_lines, _err = _quick("translog", tmp_path, zero_ok=("fsyncs_per_1k_ops",))

    cells = {(b, d) for b in (1, 100, 1000) for d in ("request", "async")}
    for name in ("ops_per_s", "mb_per_s", "fsyncs_per_1k_ops"):
        got = {(f["params"]["bulk"], f["params"]["durability"], f["params"]["impl"]) for f in figures if f["name"] == name}
        assert got == {(b, d, i) for b, d in cells for i in ("translog", "raw")}, name
    ratios = [f for f in figures if f["name"] == "ops_ratio"]
    assert {(f["params"]["bulk"], f["params"]["durability"]) for f in ratios} == cells
    assert all(f["unit"] == "ratio" and f["params"]["impl"] == "translog/raw" for f in ratios)
    # Request durability: the same fsync pattern on both sides, at least one fsync per append.
    for f in figures:
        if f["name"] == "fsyncs_per_1k_ops" and f["params"]["durability"] == "request":
            assert f["value"] >= 1000 / f["params"]["bulk"], f
    # The targets sit on bulk 1,000 async: ops/s and the ratio to raw.
    targeted = {(f["name"], f["params"]["bulk"], f["params"]["durability"]) for f in figures
                if "target" in f and "bulk" in f["params"]}
    assert targeted == {("ops_per_s", 1000, "async"), ("ops_ratio", 1000, "async")}
    # the last cell: a sealed generation (64 MB quick) streamed to the store in a child process (issue 46)
    sealed = [f for f in figures if f["name"] == "sealed_upload_peak_rss_mb"]
    assert len(sealed) == 1 and sealed[0]["params"]["generation_mb"] > 60 and sealed[0]["met"] is True, sealed
    assert all(isinstance(f["met"], bool) for f in figures if "target" in f)
    names = {f["name"] for f in figures}
    assert {"group_commit_ops_per_s", "group_commit_fsyncs_per_append"} <= names


def test_translog_raw_baseline_writes_the_bytes_the_translog_writes(tmp_path: Path) -> None:
    """The raw side of the translog bench writes exactly the translog's file: preamble, then the frames."""
    from benches.translog import _documents, _Inputs, _preamble
    from shardstore.translog.frames import HEADER_SIZE, encode_frame
    from shardstore.translog.local import LocalTranslog, generation_file

    bulks = (1, 300, 7, 400)  # 300 and 400 KiB batches are written from Arrow's buffers (writev), the others buffered
    inputs = {bulk: _Inputs(_documents(50), bulk, distinct=3) for bulk in bulks}
    batches = [inputs[bulk].stamped(i) for i in range(3) for bulk in bulks]
    with LocalTranslog(str(tmp_path), primary_term=1, durability="async", fsync=False) as log:
        for b in batches:
            log.add(b)
    data = (tmp_path / generation_file(1)).read_bytes()
    preamble = _preamble()
    assert data[HEADER_SIZE : len(preamble)] == preamble[HEADER_SIZE:]  # the header differs by its UUID only
    assert data[len(preamble) :] == b"".join(encode_frame(b) for b in batches)


def test_segments_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    """``python -m benches segments --quick``: write, upload (file store), get, scan and refresh figures, format only."""
    figures, table, json_lines, _err = _quick("segments", tmp_path)

    def having(name: str) -> list[dict]:
        return [f for f in figures if f["name"] == name]

    # 1. write: both inputs, both fsync settings, both sides, and a ratio with its target each
    cells = {(i, s) for i in ("random", "sorted") for s in (False, True)}
    got = {(f["params"]["input"], f["params"]["fsync"], f["params"]["impl"]) for f in having("write_mb_per_s")}
    assert got == {(i, s, impl) for i, s in cells for impl in ("write_segment", "raw")}
    assert {(f["params"]["input"], f["params"]["fsync"]) for f in having("write_ratio")} == cells
    # 2. incremental upload on the file store: one new segment costs a few PUTs, not one per segment
    append = [f for f in having("commit_puts") if f["params"]["kind"] == "append_segment"]
    assert [f["params"]["backend"] for f in append] == ["file"]
    assert append[0]["params"]["segments"] == 101 and append[0]["params"]["new_files"] == 1
    assert any(f["params"]["kind"] == "update_1pct" for f in having("commit_bytes_uploaded"))
    # 3. scan: three cases, without and with deletions, both sides and the ratio
    for name in ("scan_rows_per_s", "scan_mb_per_s"):
        got = {(f["params"]["case"], f["params"]["deleted"], f["params"]["impl"]) for f in having(name)}
        assert got == {(c, d, i) for c in ("narrow", "wide", "filter") for d in ("none", "1pct")
                       for i in ("shardstore", "raw")}, name
    # 4. get: cold, first and warm passes, and warmed (the row-cache warmer idle; issue 16's p99 target)
    assert {f["params"]["pass"] for f in having("get_p50_ms")} == {"cold", "first", "warm", "warmed"}
    warmed = [f for f in having("get_p99_ms") if f["params"]["pass"] == "warmed"]
    assert len(warmed) == 1 and warmed[0]["target"] == "<= 5" and warmed[0]["params"]["warmer_idle"] is True
    # 5. refresh of a 1% update, cold and warm id indexes
    assert {f["params"]["index"] for f in having("refresh_update_seconds")} == {"cold", "warm"}

    targeted = {f["name"] for f in figures if "target" in f}
    assert targeted == {"write_ratio", "commit_puts", "commit_bytes_uploaded", "scan_ratio", "get_p99_ms"}
    assert all(isinstance(f["met"], bool) for f in figures if "target" in f)

    assert not list(tmp_path.glob("shardstore-bench-segments-*")), "temp files left behind"


def test_engine_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    """``python -m benches engine --quick``: ingest (file store), failover per size and restore figures, format only."""
    figures, table, json_lines, _err = _quick("engine", tmp_path)

    def having(name: str) -> list[dict]:
        return [f for f in figures if f["name"] == name]

    # 1. ingest on the file store, 1 and 2 shards; request durability costs PUTs on every bulk
    for name in ("ingest_ops_per_s", "bulk_p50_ms", "bulk_p99_ms", "puts_per_1k_ops"):
        assert {(f["params"]["backend"], f["params"]["shards"]) for f in having(name)} == {("file", 1), ("file", 2)}
    assert all(f["value"] >= 1 for f in having("puts_per_1k_ops"))
    # 2. failover per shard size, its parts, and the flatness ratio with its target
    sizes = {f["params"]["shard_docs"] for f in having("failover_seconds")}
    assert sizes == {10_000, 50_000}
    for name in ("failover_kill_seconds", "failover_promote_seconds", "replica_rebuild_seconds", "reupload_seconds",
                 "failover_first_write_seconds", "post_failover_flush_seconds", "post_failover_flush_mb"):
        assert {f["params"]["shard_docs"] for f in having(name)} == sizes, name
    # 3. restore of the biggest shard next to a raw download of the same bytes
    for name in ("restore_seconds", "raw_download_seconds", "restore_ratio"):
        assert len(having(name)) == 1, name
    restore, raw = having("restore_seconds")[0], having("raw_download_seconds")[0]
    assert restore["params"]["shard_docs"] == 50_000 + 2  # + one document written after each failover
    assert 0.9 < restore["params"]["bytes"] / raw["params"]["bytes"] < 1.1

    targeted = [f for f in figures if "target" in f]
    assert [f["name"] for f in targeted] == ["failover_ratio"]
    assert isinstance(targeted[0]["met"], bool)

    assert not list(tmp_path.glob("shardstore-bench-engine-*")), "temp files left behind"


def test_cluster_state_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    """``python -m benches cluster_state --quick``: one-index publication, follower and restore figures at 1,000 indices."""
    figures, table, json_lines, _err = _quick("cluster_state", tmp_path)

    def having(name: str) -> list[dict]:
        return [f for f in figures if f["name"] == name]

    for name in ("full_write_seconds", "one_index_puts", "one_index_bytes", "flat_manifest_bytes",
                 "follower_bytes", "follower_gets", "restore_seconds", "restore_mb"):
        assert [(f["params"]["backend"], f["params"]["indices"]) for f in having(name)] == [("memory", 1000)], name
    # one changed index: its entity, one chunk and the manifest, far below a flat manifest of every index
    assert having("one_index_puts")[0]["value"] == 5  # the index entity and its chunk, each twinned, the manifest
    assert having("follower_gets")[0]["value"] == 3
    assert having("one_index_bytes")[0]["value"] < having("flat_manifest_bytes")[0]["value"]
    targeted = [f for f in figures if "target" in f]
    assert [f["name"] for f in targeted] == ["one_index_bytes"] and targeted[0]["met"] is True
    assert not list(tmp_path.glob("shardstore-bench-cluster-state-*")), "temp files left behind"


def test_spark_quick_prints_json_figures_then_a_table(tmp_path: Path) -> None:
    """``python -m benches spark --quick``: count and group-by through the bridge, the Python source and the fast path next to native Parquet."""
    figures, _table, _json_lines, _err = _quick("spark", tmp_path)
    names = [f["name"] for f in figures]
    for query in ("count", "groupby"):
        for path in ("native", "shardstore", "python", "bridge_python", "fast"):
            assert names.count(f"{query}_{path}_seconds") == 1, (query, path)
        for path in ("shardstore", "python", "bridge_python", "fast"):
            fig = next(f for f in figures if f["name"] == f"{query}_{path}_vs_native")
            assert fig["target"] in (">= 0.6", ">= 0.9") and isinstance(fig["met"], bool)
            assert fig["params"]["rows"] == 100_000
        ceiling = next(f for f in figures if f["name"] == f"{query}_python_ceiling_vs_native")
        assert ceiling["value"] > 0 and names.count(f"{query}_python_vs_ceiling") == 1
    for name in ("null_python_sink_vs_parquet", "sink_vs_null_python_sink"):
        assert next(f for f in figures if f["name"] == name)["value"] > 0
    assert not list(tmp_path.glob("shardstore-bench-spark-*")), "temp files left behind"


def test_spark_live_quick_appends_and_streams_into_node_processes(tmp_path: Path) -> None:
    """``python -m benches spark --spark-live-only --quick``: a Spark append and a streaming query into a live index of
    three node processes while a client bulks into it; nothing failed, lost or missing (issue 43)."""
    checks = ("live_append_failed_client_writes", "live_append_lost", "live_append_missing_rows", "stream_missing_rows")
    figures, _table, _json_lines, _err = _quick("spark", tmp_path, "--spark-live-only", zero_ok=checks, timeout=420)
    named = {f["name"]: f for f in figures}
    for name in checks:
        assert named[name]["value"] == 0 and named[name]["met"] is True, named[name]
    assert named["live_append_failed_client_writes"]["params"]["client_acked"] > 0
    for name in ("live_append_idle_rows_per_s", "live_append_idle_vs_parquet", "live_append_rows_per_s",
                 "live_append_vs_parquet", "stream_sink_rows_per_s", "stream_sink_vs_parquet"):
        assert named[name]["value"] > 0
    # where the idle append's time goes: the cluster's commit (as the sink logged it) and the rest, both inside it
    idle_seconds = named["live_append_idle_rows_per_s"]["params"]["rows"] / named["live_append_idle_rows_per_s"]["value"]
    commit, rest = named["live_append_idle_commit_seconds"]["value"], named["live_append_idle_spark_seconds"]["value"]
    assert 0 < commit < idle_seconds and 0 < rest < idle_seconds, (commit, rest, idle_seconds)
    assert named["live_append_idle_vs_parquet"]["target"] == ">= 0.5"  # the speed measure: nothing beside
    assert named["live_append_vs_parquet"]["params"]["beside"] == "a client bulking"
    assert not list(tmp_path.glob("bench-spark-live-*")), "temp files left behind"


def test_chaos_quick_runs_seeds_and_prints_the_totals_line(tmp_path: Path) -> None:
    """``python -m benches chaos --quick --seeds 2``: schedules against a real cluster, totals, the summary line."""
    figures, _table, _json_lines, err = _quick("chaos", tmp_path, "--seeds", "2", "--chaos-steps", "20",
                                               zero_ok=("lost or resurrected", "wrong (foreign, duplicate, count, get, order)",
                                                        "unclean errors", "stuck shards",
                                                        "failed writes (documented errors)",
                                                        "injected faults that fired",
                                                        "restores refused naming the lost blob (after a corruption)",
                                                        "steps that stalled over 10 s (a timeout waited out)"))
    named = {f["name"]: f for f in figures}
    assert named["schedules"]["value"] == 2 and named["acknowledged writes"]["value"] > 0
    for name in ("lost or resurrected", "unclean errors", "stuck shards"):
        assert named[name]["met"] is True and named[name]["value"] == 0
    assert "2 seeded schedules: 0 lost, 0 wrong, 0 unclean errors, 0 stuck shards" in err
    assert "seed 0 (file" in err and "seed 1 (memory" in err
    assert named["injected faults that fired"]["unit"] == "faults"


def test_failover_quick_prints_the_ratio(tmp_path: Path) -> None:
    """``python -m benches failover --quick --failover-stores file``: the first failover per size and the ratio."""
    figures, _table, _json_lines, _err = _quick("failover", tmp_path, "--failover-stores", "file")
    sizes = [f["params"]["shard_docs"] for f in figures if f["name"] == "first_failover_seconds"]
    assert sizes == [2000, 20000]
    (ratio,) = [f for f in figures if f["name"] == "first_failover_ratio"]
    assert ratio["target"] == ">= 0.667"  # smallest / largest: higher is better, as every ratio


def test_ingest_quick_prints_the_commits_phases(tmp_path: Path) -> None:
    """``python -m benches ingest --quick``: an ingest job's commit into node processes, each phase, and the bulks."""
    figures, _table, _json_lines, _err = _quick("ingest", tmp_path, zero_ok=("ingest_phase_seconds",))
    phases = {f["params"]["phase"]: f["value"] for f in figures if f["name"] == "ingest_phase_seconds"}
    assert list(phases) == ["check", "hold", "apply", "release", "total"]
    assert phases["apply"] > 0 and sum(phases.values()) - phases["total"] <= phases["total"] * 1.01
    assert {f["name"] for f in figures} >= {"ingest_rows_per_s", "bulk_rows_per_s", "ingest_vs_bulk"}
    # what the commit cost the three node processes (this machine has /proc): some CPU, at most every core busy
    named = {f["name"]: f for f in figures}
    assert named["ingest_node_cpu_seconds"]["value"] > 0 and named["bulk_node_cpu_seconds"]["value"] > 0
    assert 0 < named["ingest_node_cores"]["value"] <= named["ingest_node_cores"]["params"]["cores"] * 1.05


def test_peers_quick_on_the_file_store(tmp_path: Path) -> None:
    """``python -m benches peers --quick --peers-stores file``: shardstore next to each installed peer, positive figures.

    A peer whose package is missing (the ``bench`` extra) is left out of the expectations, with a
    printed reason; the bench must then name the extra on stderr.
    """
    import importlib.util

    peers = [p for p in ("deltalake", "slatedb", "duckdb") if importlib.util.find_spec(p) is not None]
    for p in sorted({"deltalake", "slatedb", "duckdb"} - set(peers)):
        print(f"peers bench: {p} is not installed, its figures are not expected (pip install '.[bench]')")
    figures, _table, _json_lines, err = _quick("peers", tmp_path, "--peers-stores", "file",
                                               zero_ok=("requests_per_get",))

    def impls(name: str, **params: object) -> set[str]:
        return {f["params"]["impl"] for f in figures
                if f["name"] == name and all(f["params"].get(k) == v for k, v in params.items())}

    ours = {"shardstore", "shardstore-synthetic"}  # stored and synthetic source
    theirs = {"deltalake", "slatedb"} & set(peers)
    assert impls("bulk_docs_per_s", store="file") == ours | theirs
    assert impls("bulk_ratio") == {f"{o}/{p}" for o in ours for p in theirs}
    assert impls("one_go_docs_per_s") == ours | ({"deltalake"} & set(peers))
    assert impls("one_go_ratio") == ({f"{o}/deltalake" for o in ours} if "deltalake" in peers else set())
    readers = {"shardstore"} | ({"slatedb", "duckdb"} & set(peers))
    for name in ("get_p50_ms", "get_p99_ms"):
        assert impls(name) == readers, name
    assert impls("get_p50_ratio") == {f"{p}/shardstore ms" for p in readers - {"shardstore"}}
    assert impls("puts_per_bulk") == impls("requests_per_bulk") == ours
    assert impls("requests_per_get") == {"shardstore"}
    sizes = {(f["params"]["impl"], f["params"]["phase"]) for f in figures if f["name"] == "bytes_per_1k_docs"}
    expected = {(o, phase) for o in ours for phase in ("bulks", "one_go")}
    expected |= {("deltalake", "bulks"), ("deltalake", "one_go")} if "deltalake" in peers else set()
    expected |= {("slatedb", "bulks")} if "slatedb" in peers else set()
    expected |= {("duckdb", "parquet")} if "duckdb" in peers else set()
    assert sizes == expected
    assert all(f["params"]["store"] == "file" for f in figures)
    # steady state (benches/steady.py): bulks of 1k/10k/50k at 0% and 10% updates into an index holding data
    steady = {(f["params"]["impl"], f["params"]["bulk"], f["params"]["updates"]) for f in figures
              if f["name"] == "steady_docs_per_s"}
    assert steady == {(i, b, u) for i in {"shardstore"} | ({"deltalake"} & set(peers))
                      for b in (1000, 10000, 50000) for u in ("0%", "10%")}
    assert len([f for f in figures if f["name"] == "steady_ratio"]) == (6 if "deltalake" in peers else 0)
    if len(peers) < 3:
        assert "pip install '.[bench]'" in err
    assert "side by side:" in err
    assert "[peers] side by side:" in _table  # and on stdout, after the figure table
    # issue 44's figures in the side-by-side table too: a row per steady (bulk, updates), the cold scan per source
    side = _table[_table.index("[peers] side by side:"):]
    dl = "deltalake" in peers
    steady_rows = [line for line in side if line.startswith("| bulks of ") and " updates, file |" in line]
    assert [line.split(" | ")[0] for line in steady_rows] == [
        f"| bulks of {b:,} into 20,000 docs, {u} updates, file" for b in (1000, 10000, 50000) for u in ("0%", "10%")]
    assert all((" | deltalake " in line) == dl for line in steady_rows), steady_rows
    cold = [line for line in side if line.startswith("| cold scan of ")]
    assert [line.split(", ")[-1].split(" |")[0] for line in cold] == ["stored source", "synthetic source"], cold
    assert all((" | deltalake " in line) == dl for line in cold), cold
    # issue 44's own cold scan: the commit read back from the store by a new reader (benches/store_scan.py)
    assert impls("scan_store_cold_s") == ours
    assert all(f["value"] > 0 for f in figures if f["name"] == "scan_store_cold_s")
    assert impls("scan_store_cold_ratio") == ({f"{o}/deltalake" for o in ours} if dl else set())
    from_store = [line for line in side if line.startswith("| cold scan from the store ")]
    assert [line.split(", ")[-1].split(" |")[0] for line in from_store] == ["stored source", "synthetic source"]
    # issue 44's first line as worded: all rows as bulks of 50,000 into an empty index, then flush
    assert impls("one_go_bulks_docs_per_s") == ours
    assert impls("one_go_bulks_ratio") == ({f"{o}/deltalake" for o in ours} if dl else set())
    as_bulks = [line for line in side if " rows as bulks of 50,000, then flush, file" in line]
    assert [line.split(", ")[-1].split(" |")[0] for line in as_bulks] == ["stored source", "synthetic source"]
    # and the same read through a fresh disk cache (cache=True), beside it
    assert impls("scan_store_cached_s") == ours
    assert impls("scan_store_cached_ratio") == ({f"{o}/deltalake" for o in ours} if dl else set())
    via_cache = [line for line in side if line.startswith("| the same through a fresh disk cache ")]
    assert [line.split(", ")[-1].split(" |")[0] for line in via_cache] == ["stored source", "synthetic source"]
    if len(peers) < 3:
        assert any("not installed here" in line and "pip install '.[bench]'" in line for line in _table)
    assert not list(tmp_path.glob("shardstore-bench-peers-*")), "temp files left behind"


def test_cluster_quick_prints_the_figures_and_the_summary_line(tmp_path: Path) -> None:
    """``python -m benches cluster --quick``: 3 node processes against the in-process cluster, 1 SIGKILL failover."""
    import re

    figures, _table, _json_lines, err = _quick("cluster", tmp_path, "--cluster-bulks", "2", "--cluster-failovers", "1",
                                               zero_ok=("lost_acked_writes", "failover_client_errors",
                                                        "pause_failover_client_errors", "failover_applied_twice"))
    named = {(f["name"], f["params"].get("impl")): f for f in figures}
    assert {("bulk_docs_per_s", "processes"), ("bulk_docs_per_s", "inproc"), ("bulk_ratio", "processes/inproc docs/s"),
            ("get_p50_ms", "processes"), ("get_p99_ms", "processes"), ("failover_seconds", None),
            ("failover_max_seconds", None), ("lost_acked_writes", None)} <= set(named)
    assert named[("lost_acked_writes", None)]["value"] == 0 and named[("lost_acked_writes", None)]["met"] is True
    for name in ("failover_client_errors", "pause_failover_client_errors", "failover_applied_twice"):
        assert named[(name, None)]["value"] == 0, named[(name, None)]  # retried writes: no error, none twice
    summary = [line for line in err.splitlines() if line.startswith("cluster: ")]
    assert len(summary) == 1
    assert re.fullmatch(r"cluster: bulk_ratio \d+\.\d\d, get_p50_ms \d+\.\d\d, failover_s \d+\.\d\d, pause_failover_s \d+\.\d\d, lost 0", summary[0])
    assert not list(tmp_path.glob("shardstore-bench-cluster-*")), "temp files left behind"


def test_the_table_fits_120_columns_and_judges_targets_only_in_a_full_run() -> None:
    from benches.runner import Figure, _table

    figures = [Figure("peers", "bulk_docs_per_s_" + "x" * 60, 12345.678, "docs/s",
                      {f"param_{i}": "v" * 12 for i in range(12)}, ">= 1.0", False),
               Figure("cost", "threads", 38.0, "threads", {"shards": 100})]
    full, quick = _table(figures).splitlines(), _table(figures, quick=True).splitlines()
    assert max(len(line) for line in full + quick) <= 120
    assert full[2].endswith(">= 1.0 NOT MET") and quick[2].endswith(">= 1.0 indicative (quick)")
    assert all(line.startswith("    ") for line in full[3:-2])  # the first figure's params, wrapped
    assert full[-2].startswith("cost") and full[-1].strip() == "shards=100"


def test_list_and_help_give_every_bench_and_how_long_it_takes(tmp_path: Path) -> None:
    from benches.runner import BENCHES, DURATIONS

    assert set(DURATIONS) == set(BENCHES)  # a bench added without its time fails here
    listed = _run("--list", tmp_path=tmp_path)
    assert listed.returncode == 0
    rows = listed.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == list(BENCHES)
    assert all("?" not in row for row in rows)
    helped = _run("--help", tmp_path=tmp_path).stdout
    assert "How long each takes on 2 cores" in helped and "4.5 min" in helped
