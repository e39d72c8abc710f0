"""The node-level translog's records (translog/node_format.py): round trips, damage, versions, keys."""

from __future__ import annotations

import struct

import pytest

from shardstore.errors import UnsupportedFormatVersion
from shardstore.translog.errors import TranslogCorruptedError
from shardstore.translog.node_format import (
    FORMAT_VERSION,
    RoundIndex,
    Section,
    data_key,
    decode_index,
    index_from_data,
    index_key,
    parse_round,
    stream_prefix,
    trailer,
)
from shardstore.translog.records import crc32c


def _index() -> RoundIndex:
    prefix = stream_prefix("cluster", "s1")
    return RoundIndex(prefix, 7, "node-1", (
        Section("idx", 0, 3, 2, 0, 100, 0xDEADBEEF, 0, 9, 10, -2),
        Section("idx", 1, 5, 1, 100, 50, 0x1234, 4, 4, 1, -2),
        Section("other", 0, 9, 3, 150, 10, 0x9, 20, 29, 10, 25),
    ))


def test_index_round_trip_and_every_flipped_bit_is_named_corruption() -> None:
    idx = _index()
    raw = idx.encode()
    assert raw[:4] == b"SSNR"
    assert decode_index(raw, "k") == idx
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x04
        with pytest.raises(TranslogCorruptedError) as exc:
            decode_index(bytes(bad), "the/key")
        assert "the/key" in str(exc.value)
    for cut in (0, 5, len(raw) - 1):
        with pytest.raises(TranslogCorruptedError, match="the/key"):
            decode_index(raw[:cut], "the/key")


def test_a_newer_intact_index_is_refused_as_unsupported() -> None:
    raw = bytearray(_index().encode())
    struct.pack_into("<H", raw, 4, FORMAT_VERSION + 1)
    struct.pack_into("<I", raw, len(raw) - 4, crc32c(bytes(raw[:-4])))
    with pytest.raises(UnsupportedFormatVersion):
        decode_index(bytes(raw), "k")


def test_the_data_blob_trailer_gives_the_index_back() -> None:
    idx = _index()
    blob = b"x" * 160 + trailer(idx.encode())
    assert index_from_data(blob, "d") == idx
    with pytest.raises(TranslogCorruptedError, match="d"):
        index_from_data(blob[:-1], "d")
    with pytest.raises(TranslogCorruptedError, match="d"):
        index_from_data(b"abc", "d")


def test_sections_of_one_shard_become_ranged_generations() -> None:
    idx = _index()
    got = idx.for_shard("idx", 1)
    assert len(got) == 1
    assert (got[0].blob_key, got[0].offset, got[0].size, got[0].generation) == (idx.data_key, 100, 50, 5)
    assert idx.for_shard("idx", 2) == []


def test_round_keys_sort_newest_first_and_parse() -> None:
    prefix = stream_prefix("c", "s")
    rounds = [0, 1, 2, 10, 2**40]
    assert [parse_round(k) for k in sorted(data_key(prefix, r) for r in rounds)] == sorted(rounds, reverse=True)
    assert [parse_round(k) for k in sorted(index_key(prefix, r) for r in rounds)] == sorted(rounds, reverse=True)
    with pytest.raises(ValueError):
        parse_round("c/node_translog/s/data/123.ntl")
    with pytest.raises(ValueError):
        stream_prefix("c", "a/b")
