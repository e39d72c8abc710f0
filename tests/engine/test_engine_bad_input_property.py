"""Property: any document, id, field name or index name, however hostile, either gets a clean per-item
error with nothing applied anywhere, or round-trips exactly through get, scan, flush and restore (issue 15).

Hypothesis drives one real cluster (two nodes, one replica per shard, local-filesystem store) with
bulks of arbitrary JSON-like documents: lone surrogates, bytes, sets, NaN and infinities, integers
beyond 64 bits, arrays, deep and wide objects, dotted and clashing field names, metadata names,
ids of every type and length.  A model of what was acknowledged is kept; every answer is checked
against it at once (get), and at the end the primaries, the replicas, a flush and a restore from
the store alone must all hold exactly the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstore.cluster_state.model import IndexMetadata
from shardstore.engine import Cluster
from shardstore.engine.coordinator.validation import MAX_INDEX_NAME_BYTES, check_index_name
from shardstore.engine.errors import InvalidIndexName
from shardstore.segments.mapping import json_default
from tests.engine.test_engine_bad_input import _snapshot

_HOSTILE_CHARS = st.one_of(st.characters(codec="utf-8"), st.sampled_from(["\ud800", "\udfff", "\x00", "\n", ".", "\\"]))
_TEXT = st.text(_HOSTILE_CHARS, max_size=8)
_NAMES = st.one_of(st.sampled_from(["a", "b", "n", "a.b", "a.c", "o", "o.x", "x.y.z", "_id", "_source", "", "a..b",
                                    ".a", "a.", "é", "x y"]), _TEXT)
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 65), max_value=2 ** 65),
    st.floats(allow_nan=True, allow_infinity=True), _TEXT, st.binary(max_size=4),
    st.sets(st.integers(0, 3), max_size=2),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.dictionaries(_NAMES, inner, max_size=3),
                                                         st.lists(inner, max_size=2)), max_leaves=6)
_IDS = st.one_of(st.sampled_from([f"id{i}" for i in range(8)]), _TEXT, st.text(min_size=500, max_size=520),
                 st.integers(), st.none())


@st.composite
def _docs(draw: st.DrawFn) -> dict[Any, Any]:
    doc: dict[Any, Any] = draw(st.dictionaries(_NAMES, _VALUES, max_size=4))
    if draw(st.integers(0, 9)):  # mostly with an id, sometimes without
        doc["_id"] = draw(_IDS)
    return doc


def _expected_source(doc: dict[str, Any]) -> Any:
    """What an acknowledged document's _source must read back as: the document without _id, as JSON."""
    return json.loads(json.dumps({k: v for k, v in doc.items() if k != "_id"}, default=json_default))


def _all_sources(cluster: Cluster) -> dict[str, Any]:
    """Every live doc by id from every copy (they must agree), and a scan whose typed columns line up."""
    out = _snapshot(cluster, "docs")
    assert cluster.scan("docs").num_rows == len(out)  # one mapping per index: the shards' columns concatenate
    return out


def test_hostile_documents_are_refused_cleanly_or_round_trip_exactly(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'remote'}"
    cluster = Cluster(store=store, data_dir=str(tmp_path / "a"), nodes=2, recovery_delay=0.05)
    model: dict[str, Any] = {}
    seen = {"acked": 0, "rejected": 0}
    try:
        cluster.create_index("docs", shards=2, replicas=1)

        @settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(st.lists(_docs(), min_size=1, max_size=4))
        def bulk(docs: list[dict[Any, Any]]) -> None:
            result = cluster.bulk("docs", docs)
            rows = result.items.to_pylist()
            assert [r["item"] for r in rows] == list(range(len(docs)))  # one row per item, in bulk order
            errors = [r["error"] for r in rows if r["error"] is not None]
            for e in errors:
                assert e.startswith("DocumentRejected: document "), e  # typed, per item, naming the item
                assert "this item was not applied" in e
            acked_ids = list(result.acknowledged)
            assert len(acked_ids) + len(errors) == len(docs)
            for doc, row in zip(docs, rows):  # in bulk order: the last acknowledged write of an id wins
                if row["error"] is None:
                    assert row["_id"] == doc["_id"] and row["seq_no"] is not None
                    model[doc["_id"]] = _expected_source(doc)
            for doc_id in set(acked_ids):
                got = cluster.get("docs", doc_id)
                assert got is not None and got["_source"] == model[doc_id]
            for doc, row in zip(docs, rows):
                doc_id = doc.get("_id")
                if row["error"] is not None and isinstance(doc_id, str) and doc_id not in acked_ids:
                    try:
                        size = len(doc_id.encode("utf-8"))
                    except UnicodeEncodeError:
                        continue
                    if 0 < size <= 512:
                        got = cluster.get("docs", doc_id)  # a rejected item changed nothing
                        assert (got["_source"] if got else None) == model.get(doc_id)
            seen["acked"] += len(acked_ids)
            seen["rejected"] += len(errors)

        bulk()
        assert seen["acked"] > 20 and seen["rejected"] > 20, seen  # both outcomes were exercised
        assert _all_sources(cluster) == model
        cluster.flush("docs")
        assert _all_sources(cluster) == model
    finally:
        cluster.close()
    restored = Cluster.restore(store=store, data_dir=str(tmp_path / "b"), nodes=2, recovery_delay=0.05)
    try:
        assert _all_sources(restored) == model
    finally:
        restored.close()


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(_HOSTILE_CHARS, max_size=12), st.text(min_size=250, max_size=300), st.integers(), st.none()))
def test_an_index_name_is_refused_with_its_rule_or_is_one_the_cluster_state_takes(name: Any) -> None:
    try:
        checked = check_index_name(name)
    except InvalidIndexName as exc:
        assert "invalid index name" in str(exc) and exc.rule in str(exc)
        return
    assert checked == name and name == name.lower() and name not in (".", "..") and name[0] not in "-_+"
    assert len(name.encode("utf-8")) <= MAX_INDEX_NAME_BYTES
    assert not set(name) & set('\\/*?"<>|,#: ') and name.isprintable()
    IndexMetadata(name=name, uuid="u" * 22)  # the cluster state accepts every name the door lets through
