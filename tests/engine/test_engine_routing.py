"""Document routing: Elasticsearch's Murmur3 routing, scalar and vectorised over Arrow."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.engine.coordinator.routing import murmur3_hash, murmur3_hashes, shard_id, shard_ids, split_by_shard
from shardstore.engine.errors import InvalidRequest
from shardstore.errors import InvalidError

# Elasticsearch's Murmur3HashFunctionTests.testKnownValues (org.elasticsearch.cluster.routing),
# as Java ints written in hex: Murmur3HashFunction.hash(String).
ES_KNOWN = {
    "hell": 0x5A0CB7C3,
    "hello": 0xD7C31989,
    "hello w": 0x22AB2984,
    "hello wo": 0xDF0CA123,
    "hello wor": 0xE7744D61,
    "The quick brown fox jumps over the lazy dog": 0xE07DB09C,
    "The quick brown fox jumps over the lazy cog": 0x4E63D2AD,
}


def _java_int(u32: int) -> int:
    return u32 - (1 << 32) if u32 & 0x80000000 else u32


def _reference_hash(s: str) -> int:
    """An independent transliteration of Lucene's StringHelper.murmurhash3_x86_32 over Java chars."""
    chars: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            chars += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            chars.append(cp)
    data = bytearray()
    for c in chars:
        data += bytes((c & 0xFF, c >> 8))
    m = 0xFFFFFFFF
    c1, c2, h1 = 0xCC9E2D51, 0x1B873593, 0
    rounded = len(data) & ~3
    for i in range(0, rounded, 4):
        k1 = int.from_bytes(data[i:i + 4], "little")
        k1 = (k1 * c1) & m
        k1 = ((k1 << 15) | (k1 >> 17)) & m
        k1 = (k1 * c2) & m
        h1 ^= k1
        h1 = ((h1 << 13) | (h1 >> 19)) & m
        h1 = (h1 * 5 + 0xE6546B64) & m
    k1 = 0
    tail = len(data) & 3
    if tail == 3:
        k1 = data[rounded + 2] << 16
    if tail >= 2:
        k1 |= data[rounded + 1] << 8
    if tail >= 1:
        k1 |= data[rounded]
        k1 = (k1 * c1) & m
        k1 = ((k1 << 15) | (k1 >> 17)) & m
        k1 = (k1 * c2) & m
        h1 ^= k1
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & m
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & m
    h1 ^= h1 >> 16
    return _java_int(h1)


def _floor_mod(x: int, n: int) -> int:
    """Java's Math.floorMod, spelled out (not Python's %)."""
    r = x - int(x / n) * n  # truncated remainder, as Java's %
    return r + n if r != 0 and (r < 0) != (n < 0) else r


@pytest.mark.parametrize("text", sorted(ES_KNOWN))
def test_hash_matches_elasticsearch_known_values(text: str) -> None:
    assert murmur3_hash(text) == _java_int(ES_KNOWN[text])
    assert murmur3_hashes(pa.array([text])).to_pylist() == [_java_int(ES_KNOWN[text])]


def test_the_reference_implementation_agrees_with_elasticsearch() -> None:
    for text, expected in ES_KNOWN.items():
        assert _reference_hash(text) == _java_int(expected)


@pytest.mark.parametrize(
    "text", ["", "a", "ab", "abc", "é", "日本語", "\U0001F600", "x\U0001F600yz", "ﬀ" * 9, "doc-42", str(uuid.UUID(int=7))])
def test_hash_matches_an_independent_computation(text: str) -> None:
    assert murmur3_hash(text) == _reference_hash(text)


def test_a_lone_surrogate_hashes_as_one_java_char() -> None:
    assert murmur3_hash("a\ud800") == _reference_hash("a\ud800")


def test_shard_is_floor_mod_of_the_signed_hash() -> None:
    h = murmur3_hash("hello")
    assert h < 0  # 0xd7c31989 is negative as a Java int: floorMod, not Java's %, decides the shard
    for n in (1, 2, 3, 5, 7, 16, 30):
        assert shard_id("hello", n) == _floor_mod(h, n)
        assert 0 <= shard_id("hello", n) < n
    for text in ES_KNOWN:
        assert shard_id(text, 5) == _floor_mod(_java_int(ES_KNOWN[text]), 5)


def test_routing_num_shards_as_elasticsearch_index_routing() -> None:
    # shard = floorMod(hash, routing_num_shards) / (routing_num_shards / num_shards)
    for text in list(ES_KNOWN) + [f"id{i}" for i in range(200)]:
        h = _reference_hash(text)
        assert shard_id(text, 2, routing_num_shards=8) == _floor_mod(h, 8) // 4
        assert shard_id(text, 3, routing_num_shards=3) == shard_id(text, 3)
    ids = pa.array([f"id{i}" for i in range(200)])
    assert shard_ids(ids, 2, routing_num_shards=8).to_pylist() == [
        shard_id(f"id{i}", 2, routing_num_shards=8) for i in range(200)]


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3", None, True])
def test_a_bad_shard_count_is_invalid(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="number of shards"):
        shard_id("x", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        shard_ids(pa.array(["x"]), bad)  # type: ignore[arg-type]


def test_bad_routing_num_shards_is_invalid() -> None:
    with pytest.raises(InvalidRequest, match="multiple"):
        shard_id("x", 3, routing_num_shards=4)
    with pytest.raises(InvalidRequest, match="multiple"):
        shard_id("x", 4, routing_num_shards=2)


def test_null_and_non_string_ids_are_invalid() -> None:
    with pytest.raises(InvalidRequest, match="document 1 has a null id"):
        shard_ids(pa.array(["a", None, "b"]), 3)
    with pytest.raises(InvalidRequest, match="must be strings"):
        shard_ids(pa.array([1, 2]), 3)
    with pytest.raises(InvalidRequest, match="must be a string"):
        shard_id(b"abc", 3)  # type: ignore[arg-type]


def test_ids_spread_evenly_over_shards() -> None:
    n, shards = 70_000, 7
    counts = [0] * shards
    for s in shard_ids(pa.array([f"doc-{i}" for i in range(n)]), shards).to_pylist():
        counts[s] += 1
    expected = n / shards
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 22.5, counts  # p ~ 0.001 for 6 degrees of freedom
    uuids = pa.array([str(uuid.UUID(int=random.Random(1).getrandbits(128) + i)) for i in range(20_000)])
    counts = [0] * 4
    for s in shard_ids(uuids, 4).to_pylist():
        counts[s] += 1
    assert min(counts) > 4_500, counts


def test_vectorised_equals_scalar_on_mixed_text() -> None:
    rng = random.Random(3)
    alphabet = "abcXYZ019-_éßñ日本語ﬀ\u0301\U0001F600\U00010348"
    ids = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(3_000)]
    expected_h = [murmur3_hash(i) for i in ids]
    assert murmur3_hashes(pa.array(ids)).to_pylist() == expected_h
    for n in (1, 3, 8):
        assert shard_ids(pa.array(ids), n).to_pylist() == [shard_id(i, n) for i in ids]
    assert shard_ids(pa.array(ids), 8).type == pa.int32()


def test_vectorised_handles_slices_chunks_and_string_types() -> None:
    ids = [f"id-{i}" for i in range(50)] + ["é", "日本", "\U0001F600"] + [f"z{i}" for i in range(50)]
    expected = [shard_id(i, 5) for i in ids]
    arr = pa.array(ids)
    assert shard_ids(arr.slice(10, 60), 5).to_pylist() == expected[10:70]
    assert shard_ids(arr.slice(51, 3), 5).to_pylist() == expected[51:54]
    assert shard_ids(pa.chunked_array([ids[:20], ids[20:]]), 5).to_pylist() == expected
    assert shard_ids(pa.chunked_array([ids]), 5).to_pylist() == expected
    assert shard_ids(pa.array(ids, pa.large_string()), 5).to_pylist() == expected
    assert shard_ids(pa.array(ids, pa.string_view()), 5).to_pylist() == expected
    assert shard_ids(pa.array(ids).dictionary_encode(), 5).to_pylist() == expected
    assert shard_ids(pa.array([], pa.string()), 5).to_pylist() == []
    assert shard_ids(pa.array(["", ""]), 5).to_pylist() == [0, 0]  # hash of no bytes is 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30), max_size=30),
       st.integers(min_value=1, max_value=64))
def test_vectorised_equals_scalar_property(ids: list[str], n: int) -> None:
    assert shard_ids(pa.array(ids, pa.string()), n).to_pylist() == [shard_id(i, n) for i in ids]
    assert all(murmur3_hash(i) == _reference_hash(i) for i in ids[:5])


def test_split_by_shard_keeps_every_row_once_in_order() -> None:
    ids = [f"doc-{i}" for i in range(500)] + ["é-1", "日本-2"]
    table = pa.table({"_id": ids, "n": list(range(len(ids)))})
    parts = split_by_shard(table, 4)
    assert set(parts) <= set(range(4))
    seen = []
    for shard, part in parts.items():
        assert part.schema == table.schema
        assert part.num_rows > 0
        assert all(shard_id(i, 4) == shard for i in part.column("_id").to_pylist())
        ns = part.column("n").to_pylist()
        assert ns == sorted(ns)  # order kept within a shard
        seen += ns
    assert sorted(seen) == list(range(len(ids)))


def test_split_by_shard_picks_the_id_column() -> None:
    batch = pa.record_batch({"id": ["a", "b", "c"], "v": [1, 2, 3]})  # translog operations name it "id"
    parts = split_by_shard(batch, 2)
    assert sum(p.num_rows for p in parts.values()) == 3
    assert all(isinstance(p, pa.Table) for p in parts.values())
    both = pa.table({"_id": ["a"], "id": ["b"]})
    with pytest.raises(InvalidRequest, match="both"):
        split_by_shard(both, 2)
    assert split_by_shard(both, 1, id_column="id")[0].num_rows == 1
    with pytest.raises(InvalidRequest, match="no column 'key'"):
        split_by_shard(both, 2, id_column="key")
    with pytest.raises(InvalidRequest, match="neither"):
        split_by_shard(pa.table({"x": [1]}), 2)


def test_split_by_shard_of_an_empty_table_is_empty() -> None:
    assert split_by_shard(pa.table({"_id": pa.array([], pa.string())}), 3) == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=60))
def test_a_bulk_split_by_shard_keeps_every_row_once_in_bulk_order(shard_of_row: list[int]) -> None:
    """The coordinator's split (one stable sort by shard, zero-copy slices): each part holds exactly its shard's
    rows, in bulk order, with their bulk positions and parsed fields alongside."""
    from shardstore.engine.coordinator.documents import _split_by_shard

    n = len(shard_of_row)
    ops = pa.RecordBatch.from_pydict({"id": [f"d{i}" for i in range(n)]})
    fields = pa.table({"f": list(range(n))})
    parts = _split_by_shard(pa.array(shard_of_row, pa.int64()), ops, pa.array(range(n), pa.int64()), fields)
    assert [p[0] for p in parts] == sorted(set(shard_of_row))
    for s, sub, positions, sub_fields in parts:
        want = [i for i, x in enumerate(shard_of_row) if x == s]
        assert positions.to_pylist() == want
        assert sub.column("id").to_pylist() == [f"d{i}" for i in want]
        assert sub_fields.column("f").to_pylist() == want


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.text(max_size=30), max_size=40))
def test_routing_an_array_equals_routing_each_id(ids: list[str]) -> None:
    assert murmur3_hashes(pa.array(ids, pa.string())).to_pylist() == [murmur3_hash(i) for i in ids]
    assert shard_ids(pa.array(ids, pa.string()), 7).to_pylist() == [shard_id(i, 7) for i in ids]
