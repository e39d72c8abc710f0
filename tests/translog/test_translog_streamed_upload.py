"""Sealed generations stream to the store (issue 46): a round's data blob is read from the local files a chunk at a
time (translog/chained.py), never joined in memory, and reads back exactly."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

from shardstore.blobstores import open_store
from shardstore.translog.chained import ChainedReader, FileRegion, file_crc32c
from shardstore.translog.local import LocalTranslog
from shardstore.translog.node_translog import NodeTranslog
from shardstore.translog.operations import index_batch, stamp
from shardstore.translog.records import crc32c
from shardstore.translog.remote import RemoteTranslog

CLUSTER = "c-uuid"


def test_the_chained_reader_is_the_concatenation_however_it_is_read(tmp_path: Path) -> None:
    rng = random.Random(46)
    for trial in range(30):
        parts, expected = [], b""
        for k in range(rng.randint(0, 6)):
            blob = rng.randbytes(rng.choice([0, 1, 7, 100, 5000]))
            if rng.random() < 0.5:
                path = tmp_path / f"f{trial}-{k}"
                path.write_bytes(blob + rng.randbytes(rng.randint(0, 9)))  # the region is a prefix of its file
                parts.append(FileRegion(str(path), len(blob)))
            else:
                parts.append(blob)
            expected += blob
        reader = ChainedReader(parts)
        assert reader.size == len(expected)
        got = b""
        while chunk := reader.read(rng.randint(1, 3000)):
            got += chunk
        assert got == expected
        if expected:  # seekable: a retried upload reads it again from the start, or from anywhere
            at = rng.randrange(len(expected))
            reader.seek(at)
            assert reader.read() == expected[at:]
        reader.close()
    path = tmp_path / "crc"
    path.write_bytes(b"abc" * 1000)
    assert file_crc32c(str(path), 3000) == crc32c(b"abc" * 1000) and file_crc32c(str(path), 3) == crc32c(b"abc")
    with pytest.raises(OSError):
        file_crc32c(str(path), 3001)


def test_a_large_sealed_generation_is_uploaded_with_bounded_memory(tmp_path: Path) -> None:
    """A 64 MB sealed generation (request durability: the round reads it back from its file) is uploaded holding a
    chunk at a time: Python's peak allocation during the round stays far below the generation's size."""
    store = open_store(f"file://{tmp_path / 'store'}")
    node = NodeTranslog(store, CLUSTER, node="n1")
    local = LocalTranslog(str(tmp_path / "tl"), primary_term=1, durability="request")
    handle = node.open_shard(local, f"{CLUSTER}/1/idx/0/translog", "idx", 0)
    try:
        rng = random.Random(7)
        first, positions = 0, []
        with node.staging():  # every append in one round: one sealed generation of ~64 MB (incompressible)
            for _ in range(18):
                n = 60  # 3.6 MB a batch: below the size a plain frame is compressed from
                bodies = [b'{"v":"' + rng.randbytes(30_000).hex().encode() + b'"}' for _ in range(n)]
                positions.append(handle.append(stamp(index_batch([f"d{first + i}" for i in range(n)], bodies),
                                                     first, 1)))
                first += n
            del bodies
        size = sum(p.stat().st_size for p in (tmp_path / "tl").glob("*.tlog"))
        assert size > 60_000_000, size
        tracemalloc.start()
        tracemalloc.reset_peak()
        handle.wait_uploaded(positions[-1])
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 32_000_000, peak  # a chunk, a frame and the store's copy buffer, not the 64 MB generation
        got = sum(b.num_rows for b in RemoteTranslog.read_operations(store, f"{CLUSTER}/1/idx/0/translog", 0))
        assert got == first
    finally:
        handle.close()
        node.close()
        local.close()
