"""The dead-stream collection rule (translog/stream_gc.py), exhaustively over small worlds (issue 46)."""

from __future__ import annotations

import itertools

import pytest

from shardstore.translog.node_format import new_stream_id, stream_owner
from shardstore.translog.stream_gc import (
    RoundView,
    SectionView,
    ShardRetention,
    covered,
    dead_streams,
    doomed_rounds,
    round_deletable,
    shards_of,
)

SEQ = range(-1, 4)  # -1: no operation
TERMS = range(1, 4)
COMMITS = [(cp, t) for cp in range(-1, 4) for t in TERMS]


def _sections() -> list[SectionView]:
    return [SectionView("i", 0, term, hi, 0 if hi < 0 else 1, 0) for term in TERMS for hi in SEQ]


def _commit_lists(n: int) -> list[tuple[tuple[int, int], ...]]:
    return [c for k in range(n + 1) for c in itertools.product(COMMITS, repeat=k)]


@pytest.mark.parametrize("fallback", [1, 2, 3])
def test_a_covered_section_is_in_every_commit_a_restore_may_fall_back_to(fallback: int) -> None:
    """Sound and complete against the model: a restore from any of the ``fallback`` best commits, replaying the
    translog above it, finds every operation of a collected section inside that commit."""
    for section in _sections():
        for commits in _commit_lists(3):
            in_commit = [section.max_seq_no <= cp and section.primary_term <= term for cp, term in commits[:fallback]]
            expected = section.num_ops == 0 or (len(commits) >= fallback and all(in_commit))
            assert covered(section, commits, fallback) is expected, (section, commits, fallback)


def test_fewer_commits_than_the_fallback_cover_no_operation() -> None:
    for section in _sections():
        for commits in _commit_lists(1):
            if section.num_ops:
                assert not covered(section, commits, 2)


def test_coverage_only_grows_as_better_commits_arrive() -> None:
    """A new commit at least as far (checkpoint and term) as the best one never uncovers a section."""
    for section in _sections():
        for commits in _commit_lists(2):
            if not covered(section, commits, 2):
                continue
            for new in COMMITS:
                if not commits or (new[0] >= commits[0][0] and new[1] >= commits[0][1]):
                    assert covered(section, (new, *commits), 2), (section, commits, new)


def _round(stream: str, sections: tuple[SectionView, ...] | None, n: int = 0) -> RoundView:
    data = f"c/node_translog/{stream}/data/{n}.ntl"
    return RoundView(stream, n, (data, f"c/node_translog/{stream}/index/{n}"), data, sections)


def test_a_round_goes_only_when_every_section_is_covered_and_unnamed() -> None:
    a = SectionView("i", 0, 1, 5, 3, 0)
    b = SectionView("i", 1, 2, 9, 4, 100)
    r = _round("s", (a, b))
    good = {("i", 0): ShardRetention(((10, 2), (6, 1))), ("i", 1): ShardRetention(((12, 3), (9, 2)))}
    assert round_deletable(r, good, 2)
    # each single reason keeps the whole round
    assert not round_deletable(r, {**good, ("i", 1): ShardRetention(((12, 3), (8, 2)))}, 2)  # 9 > 8
    assert not round_deletable(r, {**good, ("i", 1): ShardRetention(((12, 3), (9, 1)))}, 2)  # term 2 > 1
    assert not round_deletable(r, {("i", 0): good[("i", 0)]}, 2)  # shard 1 unknown (no retention read)
    named = ShardRetention(good[("i", 1)].commits, frozenset({(r.data_key, 100)}))
    assert not round_deletable(r, {**good, ("i", 1): named}, 2)  # a metadata names b
    other = ShardRetention(good[("i", 1)].commits, frozenset({(r.data_key, 0), ("elsewhere", 100)}))
    assert round_deletable(r, {**good, ("i", 1): other}, 2)  # names for other shards or blobs do not matter
    assert not round_deletable(_round("s", None), good, 2)  # an unreadable index: the restore audit names it
    assert round_deletable(_round("s", ()), {}, 2)  # a round without sections holds nothing


def test_only_dead_streams_lose_rounds() -> None:
    s = SectionView("i", 0, 1, 1, 2, 0)
    keep = {("i", 0): ShardRetention(((5, 1), (5, 1)))}
    rounds = [_round(name, (s,), n) for name in ("live", "dead") for n in range(3)]
    doomed = doomed_rounds(rounds, {"dead"}, keep)
    assert [(r.stream, r.round) for r in doomed] == [("dead", 0), ("dead", 1), ("dead", 2)]
    assert shards_of(rounds, {"dead"}) == {("i", 0)} and shards_of(rounds, set()) == set()
    with pytest.raises(ValueError, match="fallback"):
        doomed_rounds(rounds, {"dead"}, keep, fallback=0)


def test_a_stream_is_dead_once_its_process_is_no_member_for_the_grace() -> None:
    owners = {"a.1": "a", "b.1": "b", "old": None}
    for live in ({"a"}, {"a", "b"}, set()):
        for first_seen in (0.0, 5.0, 10.0):
            for now in (10.0, 14.9, 15.0, 40.0):
                absent = {s: first_seen for s in owners}
                dead = dead_streams(owners, owners, live, absent, now, grace=5.0)
                for s, owner in owners.items():
                    expected = (owner is None or owner not in live) and now - first_seen >= 5.0
                    assert (s in dead) is expected, (s, live, first_seen, now)
    assert dead_streams(owners, owners, set(), {}, 10.0, grace=0.0) == set(owners)  # first seen now, no grace
    assert dead_streams(owners, owners, set(), {}, 10.0, grace=1.0) == set()


def test_a_stream_id_names_its_writer() -> None:
    sid = new_stream_id("0f3a")
    assert stream_owner(sid) == "0f3a" and stream_owner(f"c/node_translog/{sid}") == "0f3a"
    assert stream_owner(new_stream_id(None)) is None and stream_owner("c/node_translog/abc123") is None
    assert new_stream_id("0f3a") != sid
    with pytest.raises(ValueError):
        new_stream_id("a.b")
