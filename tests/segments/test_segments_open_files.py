"""Segment files held open are bounded per process, not per shard (issue 30): past the bound the least recently
used reader lets go of its file, and reopens it when read again.  The engine case runs in a child process whose
real ``RLIMIT_NOFILE`` is lowered (no mock)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from shardstore.segments.open_files import OpenSegmentFiles, segment_file_limit


class _Reader:
    def __init__(self) -> None:
        self.dropped = 0

    def _drop_file(self) -> None:
        self.dropped += 1


def test_the_least_recently_used_readers_drop_their_files_past_the_limit() -> None:
    reg = OpenSegmentFiles(3)
    readers = [_Reader() for _ in range(5)]
    for r in readers[:3]:
        reg.used(r)
    reg.used(readers[0])  # used again: now the most recent
    reg.used(readers[3])  # over the limit: readers[1] is the least recently used
    assert [r.dropped for r in readers] == [0, 1, 0, 0, 0] and len(reg) == 3
    reg.closed(readers[2])  # let go by itself: no longer counted
    reg.used(readers[4])
    assert [r.dropped for r in readers] == [0, 1, 0, 0, 0] and len(reg) == 3
    reg.used(readers[1])  # reopened: counts again, the least recent (readers[0]) drops
    assert [r.dropped for r in readers] == [1, 1, 0, 0, 0] and reg.dropped == 2


def test_concurrent_use_never_holds_more_than_the_limit() -> None:
    reg = OpenSegmentFiles(8)
    readers = [_Reader() for _ in range(64)]

    def worker(k: int) -> None:
        for i in range(2000):
            reg.used(readers[(i * 7 + k) % 64])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reg) <= 8 and reg.dropped > 0


def test_the_limit_is_a_quarter_of_the_open_file_limit() -> None:
    code = "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400)); " \
           "from shardstore.segments.open_files import segment_file_limit; print(segment_file_limit())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "100"
    assert 32 <= segment_file_limit() <= 4096


_CHILD = textwrap.dedent('''
    import gc, json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
    from shardstore.engine import Cluster
    from shardstore.segments.open_files import open_segment_files
    d = sys.argv[1]
    c = Cluster(store=f"file://{d}/remote?create=true", data_dir=f"{d}/data", nodes=1)
    c.create_index("i", shards=150, replicas=0)
    docs = [{"_id": f"a{k}", "v": k} for k in range(3000)]
    assert not c.bulk("i", docs).errors
    c.flush("i")
    assert not c.bulk("i", [{"_id": f"a{k}", "v": -k} for k in range(3000)]).errors
    c.refresh("i")
    assert c.scan("i", columns=["_id", "v"]).num_rows == 3000  # reads every segment's file
    def target(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            return ""
    gc.collect()  # a dropped file still held in a reference cycle (pyarrow's) closes at the next collection
    parquet = [p for p in map(target, os.listdir("/proc/self/fd")) if p.endswith(".parquet")]
    c.refresh("i")
    got = [c.get("i", f"a{k}") for k in range(0, 3000, 97)]
    out = {"limit": open_segment_files().limit, "dropped": open_segment_files().dropped, "parquet_fds": len(parquet),
           "count": c.count("i"), "wrong": [g for k, g in zip(range(0, 3000, 97), got) if g is None or g["_source"]["v"] != -k]}
    c.close()
    print(json.dumps(out))
''')


def test_a_node_with_more_read_segments_than_the_bound_holds_at_most_the_bound(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["limit"] == 128
    assert out["dropped"] > 0  # 150 shards' segments were read: some let go of their files
    # the bound, plus files a read still in flight keeps (the row-cache warmer reads in the background);
    # without the bound all 150 stay open
    assert out["parquet_fds"] <= 128 + 4, out
    assert out["count"] == 3000 and out["wrong"] == []  # and every one still reads
