"""Pure segment policies: remote path strategies, garbage collection, tiered merges.

- path strategies: golden keys (changing them orphans existing data), validation,
  recorded round trips, hashed spread, ordering of inverted names;
- GC: a hypothesis state machine interleaving uploads (files, then commit), failovers,
  zombie primaries uploading and committing under their old term, reader locks and GC
  runs by current or stale primaries, checking after every step that no retained or
  locked commit loses a file, that the newest commit stays complete, and that nothing
  of a newer term is deleted; plus the zombie-divergent-metadata example;
- merges: invariants on random segment sets, bounded segment count while a shard
  grows, deletes reclaimed, determinism.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shardstore.blobstores.keys import key_problem
from shardstore.core.path_strategy import (
    INVERTED_WIDTH,
    MAX_INVERTIBLE,
    HashedPrefixPathStrategy,
    PathStrategy,
    PlainPathStrategy,
    invert,
    latest_term,
    parse_term_marker_key,
    term_marker_key,
    uninvert,
)
from shardstore.errors import InvalidError, UnsupportedFormatVersion
from shardstore.segments.gc import (
    GcPlan,
    RemoteCommitRef,
    RemoteFileRef,
    local_deletable,
    plan_remote_gc,
    retained_commits,
    retained_remote_commits,
    sort_commits,
)
from shardstore.segments.merge_policy import GiB, MiB, SegmentStats, TieredMergePolicy

# ======================================================================================
# path strategies
# ======================================================================================

C, I = "9f1c2a7e-cluster", "idx-uuid-1"
PLAIN = PlainPathStrategy()
HASHED = HashedPrefixPathStrategy()


def test_plain_golden() -> None:
    assert PLAIN.shard_prefix(C, 7, I, 3, "segments") == "9f1c2a7e-cluster/7/idx-uuid-1/3/segments"
    assert PLAIN.shard_prefix(C, 0, I, 0, "translog") == "9f1c2a7e-cluster/0/idx-uuid-1/0/translog"
    assert PLAIN.term_marker_prefix(C, I, 3) == "9f1c2a7e-cluster/primary_terms/idx-uuid-1/3"
    assert PLAIN.term_marker_key(C, I, 3, 5) == "9f1c2a7e-cluster/primary_terms/idx-uuid-1/3/9223372036854775802"


def test_hashed_golden() -> None:
    # Pinned: these are where existing data lives; a change here orphans it.
    s4, s8, s12 = (HashedPrefixPathStrategy(bits=b) for b in (4, 8, 12))
    assert s4.shard_prefix(C, 7, I, 3, "segments") == "c/9f1c2a7e-cluster/7/idx-uuid-1/3/segments"
    assert s8.shard_prefix(C, 7, I, 3, "segments") == "c4/9f1c2a7e-cluster/7/idx-uuid-1/3/segments"
    assert s12.shard_prefix(C, 7, I, 3, "segments") == "c4a/9f1c2a7e-cluster/7/idx-uuid-1/3/segments"
    assert s8.shard_prefix(C, 7, I, 3, "translog") == "0f/9f1c2a7e-cluster/7/idx-uuid-1/3/translog"
    assert s8.term_marker_prefix(C, I, 3) == "4b/9f1c2a7e-cluster/primary_terms/idx-uuid-1/3"
    assert HASHED == s8  # default bits = 8
    # the documented derivation
    top = int.from_bytes(hashlib.sha256(f"{C}/{I}/3/segments".encode()).digest()[:8], "big") >> 56
    assert format(top, "02x") == "c4"


def test_hashed_prefix_ignores_the_term() -> None:
    heads = {HASHED.shard_prefix(C, t, I, 3, "segments").split("/", 1)[0] for t in range(50)}
    assert len(heads) == 1
    assert HASHED.hash_prefix(C, I, 3, "segments") in heads


@pytest.mark.parametrize("strategy", [PLAIN, HASHED, HashedPrefixPathStrategy(bits=1), HashedPrefixPathStrategy(bits=32)])
@pytest.mark.parametrize(
    "args",
    [
        ("", 1, I, 0, "segments"),
        ("a/b", 1, I, 0, "segments"),
        (C, 1, "x/y", 0, "segments"),
        (C, 1, "..", 0, "segments"),
        (C, 1, ".", 0, "segments"),
        (C, 1, "a\nb", 0, "segments"),
        (C, -1, I, 0, "segments"),
        (C, 1, I, -1, "segments"),
        (C, True, I, 0, "segments"),
        (C, 1.0, I, 0, "segments"),
        (C, 2**63, I, 0, "segments"),
        (C, 1, I, 0, "metadata"),
        (C, 1, I, 0, "segments/"),
        (None, 1, I, 0, "segments"),
    ],
)
def test_shard_prefix_rejects(strategy: PathStrategy, args: tuple) -> None:
    with pytest.raises(InvalidError):
        strategy.shard_prefix(*args)


@pytest.mark.parametrize("args", [("", I, 0), (C, "a/b", 0), (C, I, -1), (C, I, "0")])
def test_term_marker_prefix_rejects(args: tuple) -> None:
    for s in (PLAIN, HASHED):
        with pytest.raises(InvalidError):
            s.term_marker_prefix(*args)


def test_record_round_trip_and_refusals() -> None:
    assert PLAIN.to_dict() == {"type": "plain", "version": 1}
    assert HASHED.to_dict() == {"type": "hashed_prefix", "version": 1, "bits": 8}
    for s in (PLAIN, HASHED, HashedPrefixPathStrategy(bits=13)):
        back = PathStrategy.from_dict(s.to_dict())
        assert back == s and type(back) is type(s)
        assert back.shard_prefix(C, 4, I, 2, "translog") == s.shard_prefix(C, 4, I, 2, "translog")
    with pytest.raises(UnsupportedFormatVersion) as e:
        PathStrategy.from_dict({"type": "plain", "version": 2})
    assert e.value.found == 2 and e.value.supported == 1
    bad = [
        {"type": "zigzag", "version": 1},
        {"version": 1},
        {"type": 3, "version": 1},
        {"type": "plain"},
        {"type": "plain", "version": 0},
        {"type": "plain", "version": "1"},
        {"type": "plain", "version": True},
        {"type": "plain", "version": 1, "bits": 8},
        {"type": "hashed_prefix", "version": 1},
        {"type": "hashed_prefix", "version": 1, "bits": 8, "salt": "x"},
        {"type": "hashed_prefix", "version": 1, "bits": 0},
        {"type": "hashed_prefix", "version": 1, "bits": 33},
        {"type": "hashed_prefix", "version": 1, "bits": "8"},
        ["type", "plain"],
    ]
    for d in bad:
        with pytest.raises(InvalidError):
            PathStrategy.from_dict(d)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        HashedPrefixPathStrategy(bits=True)


def test_hashed_spread_over_many_shards() -> None:
    s = HashedPrefixPathStrategy(bits=8)
    heads = [s.shard_prefix(C, 1, f"index-{i // 10}", i % 10, "segments").split("/", 1)[0] for i in range(1000)]
    counts = {h: heads.count(h) for h in set(heads)}
    assert len(counts) >= 240  # of 256 (expected ~251)
    assert max(counts.values()) <= 16  # expected ~4 per prefix
    assert all(len(h) == 2 for h in heads)
    small = HashedPrefixPathStrategy(bits=4)
    assert len({small.shard_prefix(C, 1, I, i, "segments").split("/", 1)[0] for i in range(1000)}) == 16


uuids = st.text(alphabet="abcdef0123456789-_", min_size=1, max_size=8)
terms = st.integers(0, MAX_INVERTIBLE)
strategies = st.one_of(st.just(PLAIN), st.integers(1, 32).map(lambda b: HashedPrefixPathStrategy(bits=b)))


@settings(max_examples=300, deadline=None)
@given(strategies, st.tuples(uuids, terms, uuids, st.integers(0, 500), st.sampled_from(["segments", "translog"])),
       st.tuples(uuids, terms, uuids, st.integers(0, 500), st.sampled_from(["segments", "translog"])))
def test_prefixes_injective_valid_and_not_nested(s: PathStrategy, a: tuple, b: tuple) -> None:
    pa, pb = s.shard_prefix(*a), s.shard_prefix(*b)
    assert key_problem(pa) is None and not pa.endswith("/")
    if a != b:
        assert pa != pb
        assert not pa.startswith(pb + "/") and not pb.startswith(pa + "/")
    ma = s.term_marker_prefix(a[0], a[2], a[3])
    assert key_problem(ma) is None
    assert not pa.startswith(ma + "/") and not ma.startswith(pa + "/") and ma != pa
    assert ma == s.term_marker_prefix(a[0], a[2], a[3])  # term-independent by construction
    if isinstance(s, HashedPrefixPathStrategy):
        head = pa.split("/", 1)[0]
        assert len(head) == (s.bits + 3) // 4 and int(head, 16) < s.prefix_count
        assert pa.split("/", 1)[1] == PLAIN.shard_prefix(*a)


@settings(max_examples=500, deadline=None)
@given(terms, terms)
def test_inverted_names_sort_newest_first(a: int, b: int) -> None:
    ia, ib = invert(a), invert(b)
    assert len(ia) == INVERTED_WIDTH and ia.isdigit()
    assert uninvert(ia) == a
    assert (a < b) == (ia > ib) and (a == b) == (ia == ib)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30, unique=True), strategies)
def test_marker_listing_yields_newest_term_first(ts: list[int], s: PathStrategy) -> None:
    prefix = s.term_marker_prefix(C, I, 0)
    keys = sorted(s.term_marker_key(C, I, 0, t) for t in ts)  # a LIST is lexicographic
    assert parse_term_marker_key(keys[0]) == max(ts)
    assert [parse_term_marker_key(k) for k in keys] == sorted(ts, reverse=True)
    assert all(k.startswith(prefix + "/") for k in keys)
    assert latest_term(reversed(keys)) == max(ts)
    assert term_marker_key(prefix, ts[0]) == s.term_marker_key(C, I, 0, ts[0])


def test_invert_edges_and_refusals() -> None:
    assert invert(0) == "9223372036854775807"
    assert invert(MAX_INVERTIBLE) == "0" * 19
    assert invert(5) == "9223372036854775802"
    for bad in (-1, 2**63, True, 1.5, "3", None):
        with pytest.raises(InvalidError):
            invert(bad)  # type: ignore[arg-type]
    for bad in ("", "123", "9" * 19, "0" * 18 + "x", "0" * 20, "٠" * 19, " " + "0" * 18, None):
        with pytest.raises(InvalidError):
            uninvert(bad)  # type: ignore[arg-type]
    assert parse_term_marker_key("0" * 19) == MAX_INVERTIBLE
    assert latest_term([]) is None
    with pytest.raises(InvalidError):
        parse_term_marker_key("a/b/segments_3")
    with pytest.raises(InvalidError):
        latest_term(["x/9223372036854775802", "x/README"])
    for bad_prefix in ("", "a/", None):
        with pytest.raises(InvalidError):
            term_marker_key(bad_prefix, 1)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=25))
def test_uninvert_accepts_exactly_inverted_names(s: str) -> None:
    ok = len(s) == 19 and all(ch in "0123456789" for ch in s) and int(s) <= MAX_INVERTIBLE
    if ok:
        assert invert(uninvert(s)) == s
    else:
        with pytest.raises(InvalidError):
            uninvert(s)


# ======================================================================================
# GC
# ======================================================================================


def commit(key: str, term: int, gen: int, *files: str) -> RemoteCommitRef:
    return RemoteCommitRef(key, term, gen, frozenset(files))


def frefs(**by_term: list[str]) -> list[RemoteFileRef]:
    return [RemoteFileRef(k, int(t[1:])) for t, ks in by_term.items() for k in ks]


def test_zombie_divergent_metadata_does_not_cost_the_latest_commit_its_files() -> None:
    """OpenSearch shipped this bug: a zombie's divergent metadata made GC drop the latest commit's files."""
    # Term 1 primary commits C1; it is deposed; the term-2 primary adopts C1's files and
    # commits C2 (reusing a, adding c).  The zombie keeps going under term 1: it uploads
    # d and commits Z with a much higher generation, naming b and d.
    commits = [
        commit("md/t1/g5", 1, 5, "t1/a", "t1/b"),
        commit("md/t2/g6", 2, 6, "t1/a", "t2/c"),
        commit("md/t1/g90", 1, 90, "t1/a", "t1/b", "t1/d"),
    ]
    files = frefs(t1=["t1/a", "t1/b", "t1/d"], t2=["t2/c"])
    plan = plan_remote_gc(commits, files, caller_term=2, keep_last=1, marker_term=2)
    assert plan == GcPlan(files=frozenset({"t1/b", "t1/d"}), commits=frozenset({"md/t1/g5", "md/t1/g90"}))
    assert not plan.files & commits[1].files  # the latest commit (term 2) stays complete
    # The zombie itself must not GC at all: it sees term 2 (its files, or its marker).
    zombie = plan_remote_gc(commits, files, caller_term=1, keep_last=1)
    assert zombie.is_empty and zombie.newer_term == 2 and "stale" in (zombie.blocked or "")
    only_marker = plan_remote_gc(commits[::2], frefs(t1=["t1/a", "t1/b", "t1/d"]), caller_term=1, keep_last=1, marker_term=2)
    assert only_marker.is_empty and only_marker.newer_term == 2
    # Ordering by generation alone would have kept Z and deleted c: not what we do.
    assert sort_commits(commits)[-1].key == "md/t2/g6"


def test_zombie_gc_without_the_marker_would_break_the_adopted_commit() -> None:
    """Why marker_term matters: before the new primary uploads, only its marker shows it exists."""
    # Term 2 was promoted and adopted C1 = {a, b}, but has uploaded nothing yet.  The
    # zombie commits Z1, Z2 under term 1 (without b) and runs GC with keep_last=1.
    commits = [commit("c1", 1, 1, "a", "b"), commit("z1", 1, 2, "a", "z"), commit("z2", 1, 3, "a", "z")]
    files = frefs(t1=["a", "b", "z"])
    unsafe = plan_remote_gc(commits, files, caller_term=1, keep_last=1)  # the marker not passed
    assert "b" in unsafe.files  # ...would delete a file of the commit term 2 adopted
    safe = plan_remote_gc(commits, files, caller_term=1, keep_last=1, marker_term=2)
    assert safe.is_empty and safe.newer_term == 2


def test_new_primary_does_not_gc_before_its_first_commit() -> None:
    commits = [commit("c1", 1, 1, "a"), commit("z", 1, 9, "a", "zz")]
    files = frefs(t1=["a", "zz", "orphan"])
    plan = plan_remote_gc(commits, files, caller_term=2, keep_last=1, marker_term=2)
    assert plan.is_empty and plan.newer_term is None and "no commit of term 2" in (plan.blocked or "")
    assert plan_remote_gc([], [], caller_term=1).is_empty


def test_gc_basic_rules() -> None:
    commits = [commit(f"c{g}", 3, g, f"f{g}", f"f{g + 1}") for g in range(1, 6)]
    files = frefs(t3=[f"f{g}" for g in range(1, 8)] + ["inflight"], t2=["old"])
    plan = plan_remote_gc(commits, files, caller_term=3, keep_last=2, locked={"c1", "ghost"}, in_flight={"inflight", "f7"})
    # retained: c4, c5 (newest two) and c1 (locked) -> files f1 f2 f4 f5 f6
    assert plan.commits == {"c2", "c3"}
    assert plan.files == {"f3", "old"}
    assert retained_remote_commits(commits, keep_last=2, locked={"c1"}) == {"c1", "c4", "c5"}
    # keep_last 0 still keeps the newest
    assert plan_remote_gc(commits, files, caller_term=3, keep_last=0).commits == {"c1", "c2", "c3", "c4"}
    # a commit of the newest term is newest, whatever the generations
    assert retained_remote_commits([commit("a", 1, 100), commit("b", 2, 1)], keep_last=1) == {"b"}


def test_older_terms_go_once_the_new_term_has_enough_commits() -> None:
    """Rule 7: after a failover the old term's copy goes at the new term's k-th commit, not after keep_last."""
    commits = [commit(f"t1g{g}", 1, g, f"t1/f{g}") for g in range(1, 4)] + [commit("t2g4", 2, 4, "t2/a")]
    files = frefs(t1=["t1/f1", "t1/f2", "t1/f3"], t2=["t2/a", "t2/b"])
    # keep_last=10 alone keeps every term-1 commit
    assert plan_remote_gc(commits, files, caller_term=2, keep_last=10).commits == set()
    # one own commit is not enough when two are asked for
    assert plan_remote_gc(commits, files, caller_term=2, keep_last=10, drop_older_terms_after=2).commits == set()
    plan = plan_remote_gc(commits, files, caller_term=2, keep_last=10, drop_older_terms_after=1, locked={"t1g2"})
    assert plan.commits == {"t1g1", "t1g3"} and plan.files == {"t1/f1", "t1/f3", "t2/b"}  # the locked one stays
    both = commits + [commit("t2g5", 2, 5, "t2/a", "t2/b")]
    assert plan_remote_gc(both, files, caller_term=2, keep_last=10, drop_older_terms_after=2).commits == {
        "t1g1", "t1g2", "t1g3"}


def test_gc_validation() -> None:
    for bad in (
        lambda: RemoteCommitRef("", 1, 1, frozenset()),
        lambda: RemoteCommitRef("k", -1, 1, frozenset()),
        lambda: RemoteCommitRef("k", 1, True, frozenset()),
        lambda: RemoteCommitRef("k", 1, 1, {"a"}),  # type: ignore[arg-type]
        lambda: RemoteCommitRef("k", 1, 1, frozenset({""})),
        lambda: RemoteFileRef("", 1),
        lambda: RemoteFileRef("f", -2),
        lambda: plan_remote_gc([], [], caller_term=-1),
        lambda: plan_remote_gc([], [], caller_term=1, keep_last=-1),
        lambda: plan_remote_gc([], [], caller_term=1, marker_term=-1),
        lambda: plan_remote_gc([], [], caller_term=1, in_flight="abc"),
        lambda: plan_remote_gc([commit("k", 1, 1), commit("k", 1, 2)], [], caller_term=1),
        lambda: plan_remote_gc([], [RemoteFileRef("f", 1), RemoteFileRef("f", 2)], caller_term=3),
        lambda: plan_remote_gc([], ["f"], caller_term=3),  # type: ignore[list-item]
        lambda: retained_commits([1, 1], 2, []),
        lambda: retained_commits([-1], 2, []),
        lambda: retained_commits([1], -1, []),
        lambda: local_deletable("abc", [], []),
    ):
        with pytest.raises(InvalidError):
            bad()


def test_local_retention() -> None:
    assert retained_commits([], 3, [1]) == frozenset()
    assert retained_commits([4, 1, 9, 7], 2, [1, 100]) == {7, 9, 1}
    assert retained_commits([4, 1, 9, 7], 0, []) == {9}
    on_disk = ["segments_7", "segments_9", "_0.seg", "_1.seg", "_2.seg", "_3.seg", "write.lock"]
    keep = [frozenset({"segments_7", "_0.seg", "_1.seg"}), frozenset({"segments_9", "_1.seg", "_2.seg"})]
    assert local_deletable(on_disk, keep, ["write.lock"]) == {"_3.seg"}
    assert local_deletable(on_disk, [], on_disk) == frozenset()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), unique=True, max_size=15), st.integers(0, 6), st.sets(st.integers(0, 60), max_size=5))
def test_retained_commits_properties(gens: list[int], keep: int, locked: set[int]) -> None:
    out = retained_commits(gens, keep, locked)
    assert out <= set(gens)
    assert locked & set(gens) <= out
    if gens:
        assert max(gens) in out
        assert len(out - locked) <= max(keep, 1)
        newest = set(sorted(gens)[-max(keep, 1):])
        assert newest <= out and out - newest <= locked  # the newest n, plus locked ones only


# -- the state machine -----------------------------------------------------------------


@dataclass
class Node:
    """A primary (current or zombie): its segment view, its uploaded-uncommitted files."""

    term: int
    gen: int
    view: set[str]
    pending: set[str] = field(default_factory=set)


def _order(c: RemoteCommitRef) -> tuple[int, int, str]:
    return (c.primary_term, c.generation, c.key)


class RemoteGcMachine(RuleBasedStateMachine):
    """Uploads, failovers, zombies, locks and GC runs on one shard's remote store."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[int, Node] = {1: Node(1, 0, set())}
        self.markers: set[int] = {1}
        self.commits: dict[str, RemoteCommitRef] = {}
        self.files: dict[str, int] = {}
        self.locks: set[str] = set()
        self.n = 0
        self.gc_runs = 0

    def _uid(self) -> int:
        self.n += 1
        return self.n

    def _node(self, data: st.DataObject) -> Node:
        return self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]

    @rule(data=st.data(), k=st.integers(1, 3))
    def upload_files(self, data: st.DataObject, k: int) -> None:
        node = self._node(data)
        for _ in range(k):
            key = PLAIN.shard_prefix(C, node.term, I, 0, "segments") + f"/_{self._uid()}.seg"
            self.files[key] = node.term
            node.pending.add(key)

    @rule(data=st.data(), step=st.integers(1, 20))
    def write_commit(self, data: st.DataObject, step: int) -> None:
        node = self._node(data)
        # A local merge may drop some of the view; every pending file joins the commit.
        dropped = data.draw(st.sets(st.sampled_from(sorted(node.view)))) if node.view else set()
        node.view = (node.view - dropped) | node.pending
        node.pending = set()
        node.gen += step  # a zombie may run far ahead in generations
        key = f"{C}/{node.term}/{I}/0/metadata/{invert(node.term)}__{invert(node.gen)}__{self._uid()}"
        self.commits[key] = RemoteCommitRef(key, node.term, node.gen, frozenset(node.view))

    @rule(data=st.data(), keep_old=st.booleans())
    def failover(self, data: st.DataObject, keep_old: bool) -> None:
        term = max(self.markers) + data.draw(st.integers(1, 2))
        self.markers.add(term)  # the marker first...
        newest = max(self.commits.values(), key=_order, default=None)  # ...then read the newest commit
        old = max(self.nodes)
        self.nodes[term] = Node(term, newest.generation if newest else 0, set(newest.files) if newest else set())
        if not keep_old:
            del self.nodes[old]  # the old primary dies; otherwise it lives on as a zombie

    @precondition(lambda self: len(self.nodes) > 1)
    @rule(data=st.data())
    def zombie_dies(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from(sorted(self.nodes)[:-1]))
        del self.nodes[victim]

    @precondition(lambda self: bool(self.commits))
    @rule(data=st.data())
    def lock(self, data: st.DataObject) -> None:
        self.locks.add(data.draw(st.sampled_from(sorted(self.commits))))

    @precondition(lambda self: bool(self.locks))
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        self.locks.discard(data.draw(st.sampled_from(sorted(self.locks))))

    @rule(data=st.data(), keep_last=st.integers(0, 3), drop_after=st.one_of(st.none(), st.integers(1, 2)))
    def gc(self, data: st.DataObject, keep_last: int, drop_after: int | None) -> None:
        node = self._node(data)
        commits = list(self.commits.values())
        plan = plan_remote_gc(
            commits,
            [RemoteFileRef(k, t) for k, t in self.files.items()],
            caller_term=node.term,
            keep_last=keep_last,
            locked=frozenset(self.locks),
            in_flight=frozenset(node.pending),
            marker_term=max(self.markers),
            drop_older_terms_after=drop_after,
        )
        newest_term = max([*self.markers, *self.files.values(), *(c.primary_term for c in commits)])
        if node.term < newest_term:
            assert plan.is_empty and plan.newer_term == newest_term  # a stale primary never GCs
        ordered = sorted(commits, key=_order)
        newest_n = ordered[-max(keep_last, 1):]
        if drop_after is not None and sum(c.primary_term == node.term for c in ordered) >= drop_after:
            newest_n = [c for c in newest_n if c.primary_term == node.term]  # rule 7: older terms go early
        retained = newest_n + [c for c in ordered if c.key in self.locks]
        for c in retained:
            assert not plan.files & c.files, "a file of a retained or locked commit was planned for deletion"
            assert c.key not in plan.commits
        assert not plan.files & node.pending
        assert all(self.files[f] <= node.term for f in plan.files)
        assert all(self.commits[k].primary_term <= node.term for k in plan.commits)
        assert plan.files <= set(self.files) and plan.commits <= set(self.commits)
        for f in plan.files:
            del self.files[f]
        for k in plan.commits:
            del self.commits[k]
        self.gc_runs += not plan.is_empty

    @invariant()
    def newest_commit_complete(self) -> None:
        if self.commits:
            newest = max(self.commits.values(), key=_order)
            missing = newest.files - set(self.files)
            assert not missing, f"the newest commit {newest.key} lost {sorted(missing)}"

    @invariant()
    def current_primary_commits_complete(self) -> None:
        # Every commit of the newest term (written by a live, non-stale primary) is complete while retained.
        top = max(self.markers)
        for c in self.commits.values():
            if c.primary_term == top:
                newest_of_top = max((x for x in self.commits.values() if x.primary_term == top), key=_order)
                assert newest_of_top.files <= set(self.files)


RemoteGcMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestRemoteGc = RemoteGcMachine.TestCase


# ======================================================================================
# merges
# ======================================================================================


def seg(name: str, size: int, docs: int = 1000, live: int | None = None) -> SegmentStats:
    return SegmentStats(name, size, docs, docs if live is None else live)


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"segments_per_tier": 1}, "segments_per_tier"),
        ({"segments_per_tier": 2.5}, "segments_per_tier"),
        ({"max_merge_at_once": 1}, "max_merge_at_once"),
        ({"max_merge_at_once": True}, "max_merge_at_once"),
        ({"floor_segment_bytes": 0}, "floor_segment_bytes"),
        ({"max_merged_segment_bytes": 0}, "max_merged_segment_bytes"),
        ({"deletes_pct_allowed": 4.9}, "deletes_pct_allowed"),
        ({"deletes_pct_allowed": 51}, "deletes_pct_allowed"),
        ({"deletes_pct_allowed": "20"}, "deletes_pct_allowed"),
    ],
)
def test_policy_validation_names_the_parameter(kwargs: dict, bad: str) -> None:
    with pytest.raises(InvalidError, match=bad):
        TieredMergePolicy(**kwargs)


def test_segment_and_input_validation() -> None:
    for bad in (
        lambda: SegmentStats("", 1, 1, 1),
        lambda: SegmentStats("a", -1, 1, 1),
        lambda: SegmentStats("a", 1, 1, 2),
        lambda: SegmentStats("a", 1, True, 1),
        lambda: TieredMergePolicy().find_merges([seg("a", 1), seg("a", 2)]),
        lambda: TieredMergePolicy().find_merges([("a", 1, 1, 1)]),  # type: ignore[list-item]
        lambda: TieredMergePolicy().find_merges([], merging="abc"),
        lambda: TieredMergePolicy().find_forced_merges([], 0),
        lambda: TieredMergePolicy().find_expunge_deletes([], pct_allowed=101),
    ):
        with pytest.raises(InvalidError):
            bad()
    s = seg("x", 1000, 10, 4)
    assert s.live_bytes == 400 and s.deleted == 6 and s.deletes_pct == 60.0
    assert seg("e", 100, 0, 0).live_bytes == 0 and seg("e", 100, 0, 0).deletes_pct == 0.0


def test_nothing_to_do_on_a_small_clean_index() -> None:
    p = TieredMergePolicy()
    assert p.find_merges([]) == []
    assert p.find_merges([seg(f"s{i}", 10 * MiB) for i in range(9)]) == []
    assert p.allowed_segment_count([]) == 10


def test_many_small_segments_merge_into_floored_groups() -> None:
    p = TieredMergePolicy()
    segs = [seg(f"s{i:02d}", 100_000) for i in range(25)]  # all below the 2 MiB floor
    merges = p.find_merges(segs)
    assert merges and all(2 <= len(m) <= 10 for m in merges)
    assert 25 - sum(len(m) - 1 for m in merges) <= p.allowed_segment_count(segs)


def test_merging_segments_are_left_alone() -> None:
    p = TieredMergePolicy()
    segs = [seg(f"s{i:02d}", 100_000) for i in range(30)]
    busy = frozenset(f"s{i:02d}" for i in range(0, 30, 2))
    merges = p.find_merges(segs, busy)
    assert merges
    assert not {n for m in merges for n in m} & busy


def test_heavy_deletion_segments_are_picked() -> None:
    p = TieredMergePolicy()
    segs = [seg(f"s{i}", 100 * MiB) for i in range(5)] + [seg("d1", 100 * MiB, 1000, 200), seg("d2", 100 * MiB, 1000, 300)]
    merges = p.find_merges(segs)
    picked = {n for m in merges for n in m}
    assert {"d1", "d2"} <= picked
    # below the allowed share of deletes (and within the count budget): nothing
    light = [seg(f"s{i}", 100 * MiB) for i in range(6)] + [seg("d", 100 * MiB, 1000, 500)]
    assert p.find_merges(light) == []


def test_too_big_segments_only_rewritten_for_deletes() -> None:
    p = TieredMergePolicy(max_merged_segment_bytes=1 * GiB)
    big = [seg(f"b{i}", 900 * MiB) for i in range(30)]
    assert p.find_merges(big) == []  # all too big: never merged for count
    heavy = big + [seg("h", 2000 * MiB, 1000, 400)]  # 800 MiB live (too big), 60% deleted
    merges = p.find_merges(heavy)
    assert merges == [("h",)]
    assert p.find_merges(big + [seg("h", 2000 * MiB, 1000, 900)]) == []  # 10% deleted: left alone
    assert p.find_merges(big + [seg("h", 9000 * MiB, 1000, 400)]) == []  # even alone over the max
    assert all(sum(next(s for s in heavy if s.name == n).live_bytes for n in m) <= 1 * GiB for m in merges)


def test_fully_deleted_segment_is_dropped() -> None:
    p = TieredMergePolicy()
    segs = [seg("a", 10 * MiB), seg("gone", 10 * MiB, 1000, 0)]
    assert p.find_merges(segs) == [("gone",)] or any("gone" in m for m in p.find_merges(segs))


segment_lists = st.lists(
    st.tuples(st.integers(0, 5 * 10**9), st.integers(0, 2000), st.integers(0, 100)),
    max_size=60,
).map(
    lambda rows: [
        SegmentStats(f"s{i:03d}", size, docs, docs * live_pct // 100) for i, (size, docs, live_pct) in enumerate(rows)
    ]
)
policies = st.builds(
    TieredMergePolicy,
    segments_per_tier=st.integers(2, 12),
    max_merge_at_once=st.integers(2, 12),
    floor_segment_bytes=st.integers(1, 10 * MiB),
    max_merged_segment_bytes=st.integers(MiB, 6 * GiB),
    deletes_pct_allowed=st.floats(5, 50),
)


def _check_merges(p: TieredMergePolicy, segs: list[SegmentStats], busy: frozenset[str], merges: list, cap: int) -> None:
    by_name = {s.name: s for s in segs}
    names = [n for m in merges for n in m]
    assert len(names) == len(set(names)), "a segment appears twice"
    assert not set(names) & busy, "a merging segment was picked"
    assert set(names) <= set(by_name)
    for m in merges:
        assert sum(by_name[n].live_bytes for n in m) <= cap
        assert len(m) >= 2 or by_name[m[0]].deleted > 0
        assert list(m) == [s.name for s in sorted((by_name[n] for n in m), key=lambda s: (-s.live_bytes, s.name))]


@settings(max_examples=300, deadline=None)
@given(policies, segment_lists, st.data())
def test_merge_invariants_and_determinism(p: TieredMergePolicy, segs: list[SegmentStats], data: st.DataObject) -> None:
    busy = frozenset(data.draw(st.sets(st.sampled_from([s.name for s in segs]))) if segs else set())
    merges = p.find_merges(segs, busy)
    _check_merges(p, segs, busy, merges, p.max_merged_segment_bytes)
    shuffled = list(segs)
    random.Random(data.draw(st.integers(0, 1000))).shuffle(shuffled)
    assert p.find_merges(shuffled, set(busy)) == merges
    assert p.find_merges(segs, busy) == merges
    expunge = p.find_expunge_deletes(segs, busy)
    _check_merges(p, segs, busy, expunge, p.max_merged_segment_bytes)
    assert p.find_expunge_deletes(shuffled, busy) == expunge
    k = data.draw(st.integers(1, 5))
    forced = p.find_forced_merges(segs, k, busy)
    _check_merges(p, segs, busy, forced, p.forced_cap(segs, k))
    assert p.find_forced_merges(shuffled, k, busy) == forced


def _apply(segs: list[SegmentStats], merges: list[tuple[str, ...]], n: int) -> list[SegmentStats]:
    by_name = {s.name: s for s in segs}
    merged = {x for m in merges for x in m}
    out = [s for s in segs if s.name not in merged]
    for j, m in enumerate(merges):
        live = sum(by_name[x].live_bytes for x in m)
        docs = sum(by_name[x].live_count for x in m)
        if docs:
            out.append(SegmentStats(f"m{n:05d}_{j}", live, docs, docs))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 10), st.integers(2, 10), st.integers(0, 2**32), st.booleans())
def test_segment_count_stays_logarithmic_while_growing(spt: int, mmao: int, seed: int, deletes: bool) -> None:
    floor = 10_000
    p = TieredMergePolicy(segments_per_tier=spt, max_merge_at_once=mmao, floor_segment_bytes=floor,
                          max_merged_segment_bytes=10**15)
    rnd = random.Random(seed)
    segs: list[SegmentStats] = []
    for step in range(300):
        for _ in range(rnd.randint(1, 3)):  # flushes of assorted sizes
            size = rnd.choice([rnd.randint(1, floor), rnd.randint(floor, 20 * floor)])
            docs = max(1, size // 100)
            segs.append(SegmentStats(f"f{step:04d}_{len(segs)}", size, docs, docs))
        if deletes and segs and rnd.random() < 0.3:
            i = rnd.randrange(len(segs))
            s = segs[i]
            segs[i] = SegmentStats(s.name, s.size_bytes, s.doc_count, rnd.randint(0, s.live_count))
        merges = p.find_merges(segs)
        _check_merges(p, segs, frozenset(), merges, p.max_merged_segment_bytes)
        budget = p.allowed_segment_count(segs)
        segs = _apply(segs, merges, step)
        total = sum(max(s.live_bytes, floor) for s in segs)
        mf = min(spt, mmao)
        bound = spt * (math.log(max(total, floor) / floor, mf) + 2)
        assert len(segs) <= bound, (step, len(segs), bound)
        assert len(segs) <= budget  # the merges bring the count within the budget they were picked for
        dels = sum(s.deleted for s in segs)
        assert dels <= sum(s.doc_count for s in segs) * p.deletes_pct_allowed / 100  # deletes reclaimed too


@settings(max_examples=200, deadline=None)
@given(policies, segment_lists, st.integers(1, 6))
def test_forced_merges_converge(p: TieredMergePolicy, segs: list[SegmentStats], k: int) -> None:
    segs = [s for s in segs if s.live_count]  # merges drop fully deleted segments
    for n in range(200):
        merges = p.find_forced_merges(segs, k)
        if not merges:
            break
        _check_merges(p, segs, frozenset(), merges, p.forced_cap(segs, k))
        segs = _apply(segs, merges, n)
    assert len(segs) <= k


def test_expunge_deletes_picks_every_heavy_segment() -> None:
    p = TieredMergePolicy(max_merge_at_once=3)
    segs = [seg(f"h{i}", 10 * MiB, 100, 50) for i in range(7)] + [seg("clean", 10 * MiB), seg("light", 10 * MiB, 100, 95)]
    merges = p.find_expunge_deletes(segs)
    assert {n for m in merges for n in m} == {f"h{i}" for i in range(7)}
    assert all(len(m) <= 3 for m in merges)
    assert p.find_expunge_deletes(segs, {"h0"}) and "h0" not in {n for m in p.find_expunge_deletes(segs, {"h0"}) for n in m}
