"""Seed 000's latest-cluster-UUID algorithm: the race, trimming, refusals, and property tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.cluster_state.errors import ClusterUUIDCycle, MultipleClusterUUIDs
from shardstore.cluster_state.purge import uuids_to_wipe
from shardstore.cluster_state.uuids import UuidInfo, latest_cluster_uuid, uuid_chain


def info(prev: str | None, committed: bool = True, fp: str = "x") -> UuidInfo:
    return UuidInfo(prev, committed, fp)


def test_empty_and_uncommitted_only_give_none() -> None:
    assert latest_cluster_uuid({}) is None
    assert latest_cluster_uuid({"u1": info(None, committed=False)}) is None


def test_single_chain_picks_the_newest() -> None:
    infos = {"u1": info(None, fp="a"), "u2": info("u1", fp="b"), "u3": info("u2", fp="c"), "u4": info("u3", fp="d")}
    assert latest_cluster_uuid(infos) == "u4"
    assert uuid_chain(infos, "u4") == ["u4", "u3", "u2", "u1"]
    assert uuids_to_wipe(infos, "u4") == ["u1", "u2", "u3"]


def test_uncommitted_uuids_are_discarded() -> None:
    # u3 never committed (crashed bootstrap): u2 stays the head and u3 is not wiped
    infos = {"u1": info(None, fp="a"), "u2": info("u1", fp="b"), "u3": info("u2", committed=False, fp="c")}
    assert latest_cluster_uuid(infos) == "u2"
    assert "u3" not in uuids_to_wipe(infos, "u2")


def test_seed_race_trims_the_uuid_that_equals_its_predecessor() -> None:
    # n4 restored UUID2 from UUID1 and stalled; n7 made UUID3 from UUID1 and changed metadata
    infos = {"UUID1": info(None, fp="s1"), "UUID2": info("UUID1", fp="s1"), "UUID3": info("UUID1", fp="s3")}
    assert latest_cluster_uuid(infos) == "UUID3"
    infos["UUID2"], infos["UUID3"] = info("UUID1", fp="s2"), info("UUID1", fp="s1")
    assert latest_cluster_uuid(infos) == "UUID2"


def test_seed_race_with_both_changed_is_refused_listing_the_heads() -> None:
    infos = {"UUID1": info(None, fp="s1"), "UUID2": info("UUID1", fp="s2"), "UUID3": info("UUID1", fp="s3")}
    with pytest.raises(MultipleClusterUUIDs) as e:
        latest_cluster_uuid(infos)
    assert e.value.heads == ("UUID2", "UUID3")
    assert "UUID2" in str(e.value) and "cluster-state show" in str(e.value)


def test_race_where_neither_changed_falls_back_to_their_common_predecessor() -> None:
    infos = {"UUID1": info(None, fp="s1"), "UUID2": info("UUID1", fp="s1"), "UUID3": info("UUID1", fp="s1")}
    assert latest_cluster_uuid(infos) == "UUID1"


def test_two_unrelated_roots_are_refused() -> None:
    with pytest.raises(MultipleClusterUUIDs):
        latest_cluster_uuid({"a": info(None, fp="1"), "b": info(None, fp="2")})


def test_previous_uuid_that_was_purged_ends_the_chain() -> None:
    assert latest_cluster_uuid({"u5": info("u4-gone", fp="a"), "u6": info("u5", fp="b")}) == "u6"


def test_cycle_is_refused() -> None:
    with pytest.raises(ClusterUUIDCycle):
        latest_cluster_uuid({"a": info("b"), "b": info("a")})


# -- properties ------------------------------------------------------------------------------------


@st.composite
def histories(draw):
    """A chain of restores, each new UUID naming the previous head; some restores never changed metadata."""
    n = draw(st.integers(1, 8))
    infos = {"u0": info(None, fp="f0")}
    for i in range(1, n):
        same = draw(st.booleans())
        infos[f"u{i}"] = info(f"u{i - 1}", fp=infos[f"u{i - 1}"].fingerprint if same else f"f{i}")
    crashed = draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
    return n, infos, crashed


@settings(max_examples=200, deadline=None)
@given(histories())
def test_property_linear_history_picks_its_last_uuid(h) -> None:
    n, infos, _ = h
    assert latest_cluster_uuid(infos) == f"u{n - 1}"
    assert uuid_chain(infos, f"u{n - 1}") == [f"u{i}" for i in reversed(range(n))]


@settings(max_examples=200, deadline=None)
@given(histories(), st.booleans())
def test_property_an_uncommitted_straggler_never_wins(h, changed) -> None:
    n, infos, _ = h
    straggler = dict(infos)
    straggler["late"] = info(f"u{n - 2}" if n > 1 else None, committed=False, fp="zz" if changed else "f0")
    assert latest_cluster_uuid(straggler) == f"u{n - 1}"


@settings(max_examples=200, deadline=None)
@given(histories(), st.booleans())
def test_property_seed_race_result_is_a_trimmed_head_or_refusal(h, straggler_changed) -> None:
    n, infos, _ = h
    head = f"u{n - 1}"
    raced = dict(infos)
    # a second UUID restored from the same predecessor as the head
    pred = infos[head].previous
    raced["late"] = info(pred, fp=("late-change" if straggler_changed else
                                   (infos[pred].fingerprint if pred else "f0")))
    head_same = pred is not None and infos[head].fingerprint == infos[pred].fingerprint
    try:
        got = latest_cluster_uuid(raced)
    except MultipleClusterUUIDs as e:
        # refused only when both changed something (or both are unrelated roots)
        assert set(e.heads) >= {"late"} and (straggler_changed or pred is None)
        assert not head_same or pred is None
        return
    if pred is None:
        pytest.fail("two roots must be refused")
    assert got in raced
    if not straggler_changed and not head_same:
        assert got == head
    if straggler_changed and head_same:
        assert got == "late"


def test_wipes_go_oldest_first_so_an_interrupted_wipe_keeps_one_head() -> None:
    """Found by the engine's fault simulator (seed 20): wiping in name order deleted a link in the
    middle of the chain first, and a restore racing the purge saw two heads (MultipleClusterUUIDs)."""
    infos = {"y1": info(None, fp="a"), "b2": info("y1", fp="b"), "z3": info("b2", fp="c"), "a4": info("z3", fp="d")}
    order = uuids_to_wipe(infos, "a4")
    assert order == ["y1", "b2", "z3"]
    for k in range(len(order) + 1):  # the wipe stopped after k UUIDs: still one valid head
        left = {u: i for u, i in infos.items() if u not in order[:k]}
        assert latest_cluster_uuid(left) == "a4"


def test_a_view_read_during_a_purge_is_read_again_before_refusing() -> None:
    """A view spanning a purge's wipe (U1 read before it, U2 after its manifests went) shows two heads the
    store never held; the next read settles on the one head.  Two equal views with two heads still refuse."""
    from shardstore.cluster_state.uuids import latest_of_settled_view

    torn = {"u1": info(None, fp="a"), "u2": info("u1", committed=False), "u3": info("u2", fp="c")}
    settled = {"u3": info("u2", fp="c")}
    views = iter([torn, settled])
    infos, head = latest_of_settled_view(lambda: next(views), pause=0)
    assert (infos, head) == (settled, "u3")
    forked = {"u1": info(None, fp="a"), "u2": info("u1", fp="b"), "u3": info("u1", fp="c")}
    calls = []
    with pytest.raises(MultipleClusterUUIDs):
        latest_of_settled_view(lambda: calls.append(1) or dict(forked), pause=0)
    assert len(calls) == 2  # refused once two reads agreed
    changing = iter([{**forked, "x": info(None, committed=False, fp=str(i))} for i in range(10)])
    with pytest.raises(MultipleClusterUUIDs):  # a view that keeps changing: refused after the bounded reads
        latest_of_settled_view(lambda: next(changing), pause=0, reads=3)


def test_a_purge_never_deletes_a_manifest_newer_than_the_ones_it_keeps() -> None:
    """A manifest published after the purge listed the manifests (or hidden from that LIST) is not "older":
    deleting it could remove the newest committed state."""
    from shardstore.cluster_state.manifest import manifest_key, parse_manifest_key
    from shardstore.cluster_state.purge import plan_purge

    keys = [manifest_key("u", term, version, True) for term, version in [(1, 1), (1, 2), (2, 3), (2, 4), (3, 5)]]
    kept = [parse_manifest_key(keys[2])]  # the purge listed up to (2, 3) and keeps it
    doomed = plan_purge(keys, kept, referenced=set())
    assert doomed == sorted(keys[:2])  # (2, 4) and (3, 5) came later: kept
