"""Running out of file descriptors is a typed, retryable error naming the limit, never a raw OSError, and it
fails no shard copy (issue 30).  Each case runs in a child process whose real ``RLIMIT_NOFILE`` is lowered."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = textwrap.dedent('''
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from shardstore.engine import Cluster
    from shardstore.errors import TooManyOpenFiles
    from shardstore.testing.descriptors import free_descriptors, use_up_descriptors
    out = {}
    d = sys.argv[1]
    c = Cluster(store=f"file://{d}/remote?create=true", data_dir=f"{d}/data", nodes=1)
    try:
        c.create_index("big", shards=300, replicas=0)
        out["big"] = "created"
    except Exception as exc:
        out["big"] = [type(exc).__name__, isinstance(exc, TooManyOpenFiles), exc.retryable, str(exc)]
    out["indices_after"] = sorted(c.indices)
    c.create_index("small", shards=1, replicas=0)
    out["small_bulk_errors"] = c.bulk("small", [{"_id": str(k), "v": k} for k in range(10)]).errors
    # use up the descriptors, then flush: the local commit cannot open its files
    hog = use_up_descriptors()
    try:
        c.flush("small")
        out["flush"] = "ok"
    except Exception as exc:
        out["flush"] = [type(exc).__name__, isinstance(exc, TooManyOpenFiles)]
    free_descriptors(hog)
    c.flush("small")  # the copy was not failed: it flushes once descriptors are free
    c.refresh("small")
    out["small_count"] = c.count("small")
    c.close()
    print(json.dumps(out))
''')


def test_an_index_too_big_for_the_open_file_limit_is_refused_whole_and_a_full_table_fails_no_copy(
        tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    name, typed, retryable, message = out["big"]
    assert (name, typed, retryable) == ("TooManyOpenFiles", True, True)
    assert "may open 256" in message and "ulimit -n" in message and "\n" not in message
    assert out["indices_after"] == []  # nothing of it was created
    assert out["small_bulk_errors"] is False
    assert out["flush"][1] is True, out["flush"]  # typed, not a LocalDiskError that fails the copy for good
    assert out["small_count"] == 10
