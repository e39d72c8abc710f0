"""Cluster-state model, entity and manifest codecs: round trips, refusals, naming order, chunking (pure)."""

from __future__ import annotations

import struct

import google_crc32c
import pytest

from shardstore.cluster_state import entities as E
from shardstore.cluster_state.errors import ClusterStateCorrupt
from shardstore.cluster_state.manifest import (
    CHUNK_TARGET,
    ChunkRef,
    Manifest,
    ManifestDiff,
    chunk_count,
    chunk_of,
    decode_manifest,
    encode_manifest,
    manifest_key,
    newest_first,
    parse_manifest_key,
)
from shardstore.cluster_state.model import ClusterState, IndexMetadata, VotingConfig
from shardstore.core.path_strategy import HashedPrefixPathStrategy
from shardstore.core.records import encode_record
from shardstore.errors import InvalidError, UnsupportedFormatVersion


def sample_state() -> ClusterState:
    s = ClusterState.initial(["n1", "n2", "n3"], cluster_uuid="cu1").successor(3)
    s = s.create_index("logs", shards=2, replicas=1, settings={"refresh_interval": "1s"},
                       mappings={"properties": {"msg": {"type": "text"}}},
                       path_strategy=HashedPrefixPathStrategy(bits=6))
    s = s.update_index("logs", lambda im: im.with_primary_term(1, 4).with_in_sync(0, {"a1", "a0"}))
    s = s.with_settings(persistent={"cluster.routing.allocation.enable": "all"}, transient={"x": 1})
    s = s.with_template("t1", {"index_patterns": ["logs-*"]}).with_custom("repositories", {"r": {"type": "fs"}})
    s = s.with_routing("logs", {"0": ["n1", "n2"], "1": ["n2", "n3"]})
    return s.with_nodes({"n1": {"roles": ["cluster_manager"]}}).with_blocks({"global": []})


def test_index_metadata_builders_bump_version_and_guard_terms() -> None:
    im = IndexMetadata.create("a", shards=3)
    assert im.primary_terms == (1, 1, 1) and im.in_sync == ((), (), ()) and im.index_version == 1
    im2 = im.with_primary_term(2, 5)
    assert im2.primary_terms == (1, 1, 5) and im2.index_version == 2 and im.primary_terms == (1, 1, 1)
    with pytest.raises(InvalidError, match="only grow"):
        im2.with_primary_term(2, 4)
    with pytest.raises(InvalidError, match="shards 0..2"):
        im.with_in_sync(3, {"x"})
    with pytest.raises(InvalidError, match="primary terms"):
        IndexMetadata("a", "u", shards=2, primary_terms=(1,))
    assert isinstance(im.strategy().to_dict(), dict)


def test_state_round_trips_and_fingerprint_ignores_identity() -> None:
    s = sample_state()
    assert ClusterState.from_dict(s.to_dict()) == s
    moved = ClusterState.from_dict({**s.to_dict(), "cluster_uuid": "other", "term": 9, "version": 40})
    assert moved.metadata_fingerprint() == s.metadata_fingerprint()
    changed = s.update_index("logs", lambda im: im.with_replicas(2))
    assert changed.metadata_fingerprint() != s.metadata_fingerprint()
    assert s.with_nodes({}).metadata_fingerprint() == s.metadata_fingerprint()  # ephemeral part
    with pytest.raises(InvalidError, match="already exists"):
        s.create_index("logs")
    with pytest.raises(InvalidError, match="unknown indices"):
        ClusterState("c", routing={"nope": {}})
    assert VotingConfig(("a", "b", "c")).has_quorum({"a", "c"}) and not VotingConfig(("a", "b", "c")).has_quorum({"a"})


@pytest.mark.parametrize("kind", E.CLUSTER_KINDS)
def test_cluster_entities_round_trip(kind: str) -> None:
    s = sample_state()
    data = E.encode_entity(kind, E.cluster_entity_value(s, kind))
    assert data[:4] == E.MAGIC[kind]
    fields: dict = {}
    E.apply_cluster_entity(fields, kind, E.decode_entity(kind, data, "k", E.blob_checksum(data)))
    rebuilt = ClusterState(cluster_uuid="cu1", **fields)
    assert E.cluster_entity_value(rebuilt, kind) == E.cluster_entity_value(s, kind)


def test_index_and_routing_entities_round_trip() -> None:
    s = sample_state()
    data = E.encode_entity("index", E.index_entity_value(s, "index", "logs"))
    assert E.decode_index(E.decode_entity("index", data, "k")) == s.indices["logs"]
    data = E.encode_entity("routing", E.index_entity_value(s, "routing", "logs"))
    assert E.decode_entity("routing", data, "k")["table"] == s.routing["logs"]


def test_newer_entity_version_is_refused_and_flipped_bits_caught() -> None:
    newer = encode_record(E.MAGIC["index"], E.FORMAT_VERSION["index"] + 1, {"v": {}})
    with pytest.raises(UnsupportedFormatVersion, match="upgrade shardstore"):
        E.decode_entity("index", newer, "cu/cluster-state/index/x")
    good = E.encode_entity("settings", {"a": 1})
    bad = bytearray(good)
    bad[14] ^= 0x01
    with pytest.raises(ClusterStateCorrupt, match="CRC32C"):
        E.decode_entity("settings", bytes(bad), "k")
    with pytest.raises(ClusterStateCorrupt, match="does not match the referenced"):
        E.decode_entity("settings", good, "k", checksum=E.blob_checksum(good) ^ 1)
    with pytest.raises(ClusterStateCorrupt, match="magic"):
        E.decode_entity("templates", good, "k")


def test_entity_keys_are_unique_and_name_their_state() -> None:
    a = E.entity_key("cu", "index", "iuuid", 3, 17)
    b = E.entity_key("cu", "index", "iuuid", 3, 17)
    assert a != b and a.startswith("cu/cluster-state/index/iuuid__3__17__")
    assert E.key_term_version(a) == (3, 17)
    assert E.key_term_version("cu/cluster-state/index/whatever") is None
    with pytest.raises(InvalidError):
        E.entity_key("cu", "manifest", "x", 1, 1)


def test_diff_states_finds_only_what_changed() -> None:
    s = sample_state()
    assert E.diff_states(None, s).cluster == E.CLUSTER_KINDS
    s2 = s.update_index("logs", lambda im: im.with_primary_term(0, 2)).create_index("new")
    d = E.diff_states(s, s2)
    assert (d.cluster, d.indices, d.routing, d.removed) == ((), ("logs", "new"), (), ())
    d = E.diff_states(s2, s2.without_index("logs").with_settings(transient={}))
    assert d.cluster == ("transient",) and d.removed == ("logs",) and d.indices == ()
    assert E.diff_states(s, s).empty


def test_manifest_names_sort_newest_first_committed_before_published() -> None:
    cells = [(1, 1, False), (1, 2, False), (1, 2, True), (2, 1, False), (2, 1, True), (10, 3, True), (2, 10, False)]
    keys = [manifest_key("cu", t, v, c) for t, v, c in cells]
    listed = sorted(keys)  # what a LIST returns
    parsed = [parse_manifest_key(k) for k in listed]
    assert [(p.term, p.version, p.committed) for p in parsed] == [
        (10, 3, True), (2, 10, False), (2, 1, True), (2, 1, False), (1, 2, True), (1, 2, False), (1, 1, False)]
    assert newest_first(reversed(parsed)) == parsed
    assert parsed[0].cluster_uuid == "cu" and parsed[0].codec == 1
    assert parse_manifest_key("cu/cluster-state/index/x") is None


def _manifest(**kw) -> Manifest:
    base = dict(cluster_uuid="cu", previous_cluster_uuid="old", cluster_uuid_committed=True, committed=False,
                term=2, version=7, state_uuid="s7", fingerprint="ab" * 32,
                cluster={"settings": E.EntityRef("settings", "settings", "cu/cluster-state/settings/x", 1, 5, 10)},
                chunk_count=2, index_count=3, chunks={1: ChunkRef(1, "cu/cluster-state/chunk/c", 9, 99, 3)},
                diff=ManifestDiff("s6", ("settings",), ("a",), (), ("b",), (1,)))
    base.update(kw)
    m = Manifest(**base)
    return Manifest(**{**base, "key": m.name})


def test_manifest_round_trip_committed_twin_and_refusals() -> None:
    m = _manifest()
    back = decode_manifest(encode_manifest(m), m.key)
    assert back == m and back.key == m.key
    c = m.as_committed()
    assert c.committed and c.key.endswith("__C__1") and c.refs() == m.refs()
    # the body must agree with the name
    with pytest.raises(ClusterStateCorrupt, match="unlike its name"):
        decode_manifest(encode_manifest(m), c.key)
    newer = encode_record(E.MAGIC["manifest"], 2, m.to_dict())
    with pytest.raises(UnsupportedFormatVersion):
        decode_manifest(newer, m.key)
    with pytest.raises(UnsupportedFormatVersion):
        decode_manifest(encode_manifest(m), m.key[:-1] + "2")
    torn = encode_manifest(m)[:-3]
    with pytest.raises(ClusterStateCorrupt, match="truncated"):
        decode_manifest(torn, m.key)


def test_chunk_count_grows_by_doubling_with_hysteresis() -> None:
    assert chunk_count(1, 0) == 1 and chunk_count(1, CHUNK_TARGET) == 1
    assert chunk_count(1, CHUNK_TARGET + 1) == 2
    assert chunk_count(1, 10_000) == 64
    assert chunk_count(64, 9_000) == 64  # no churn on small shrinkage
    assert chunk_count(64, 3_000) == 32 and chunk_count(64, 1_000) == 8
    # the chunk of an index depends only on its UUID and n (CRC32C, pinned)
    assert chunk_of("abc", 64) == google_crc32c.value(b"abc") % 64
    assert struct.calcsize("<I") == 4


def test_reference_checksum_tells_two_intact_blobs_apart() -> None:
    a, b = E.encode_entity("settings", {"a": 1}), E.encode_entity("settings", {"a": 2})
    assert E.blob_checksum(a) != E.blob_checksum(b)
    assert E.decode_entity("settings", a, "k", E.blob_checksum(a)) == {"a": 1}
    with pytest.raises(ClusterStateCorrupt, match="does not match the referenced"):
        E.decode_entity("settings", b, "k", E.blob_checksum(a))  # an intact blob swapped in
