"""Purge rules: properties over simulated translog histories with primary-term changes.

A history is simulated op by op: primaries append ops in generations, a promotion
bumps the term, rolls a generation and re-issues seq#s above the global checkpoint
(trimming the older terms' ops above it, seed 004), and the primary of the moment may
upload a remote segment commit (its resolved state up to its local checkpoint).  The
strongest property replays the commit plus the *retained* generations and demands
exactly the state of the full history: nothing a reader needs was purged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.errors import InvalidError
from shardstore.translog.purge import (
    GenerationInfo,
    InvalidGenerations,
    local_deletable,
    min_retained_generation,
    remote_deletable,
)

# -- the simulated history ---------------------------------------------------------------


@dataclass
class Commit:
    term: int
    local_checkpoint: int
    state: dict[int, int]  # seq# -> term of the op the commit holds


@dataclass
class History:
    gens: list[GenerationInfo]
    ops: dict[int, list[tuple[int, int]]]  # generation -> [(seq#, term)]
    trims: list[tuple[int, int]]  # (new term, global checkpoint it re-issued above)
    commits: list[Commit]
    global_checkpoint: int
    current_generation: int = field(default=0)


def resolve(ops: list[tuple[int, int]], trims: list[tuple[int, int]]) -> dict[int, int]:
    """seq# -> winning term: trimmed ops dropped, then the highest term wins."""
    out: dict[int, int] = {}
    for s, t in ops:
        if any(t < t2 and s > r for t2, r in trims):
            continue
        if out.get(s, -1) < t:
            out[s] = t
    return out


@st.composite
def histories(draw: st.DrawFn) -> History:
    term = draw(st.integers(0, 3))
    gen = draw(st.integers(0, 5))
    nxt = 0  # next seq# the current primary issues
    gcp = -1
    gens: list[GenerationInfo] = []
    ops: dict[int, list[tuple[int, int]]] = {}
    cur: list[tuple[int, int]] = []
    cur_term = term
    trims: list[tuple[int, int]] = []
    commits: list[Commit] = []

    def roll(new_term: int) -> None:
        nonlocal gen, cur, cur_term
        seqs = [s for s, _ in cur]
        gens.append(
            GenerationInfo(gen, cur_term, min(seqs), max(seqs), len(cur))
            if cur
            else GenerationInfo.empty(gen, cur_term)
        )
        ops[gen] = cur
        gen += draw(st.integers(1, 2))  # numbering may skip (earlier deletions)
        cur, cur_term = [], new_term

    events = draw(st.lists(st.sampled_from(["ops", "ops", "roll", "promote", "commit", "commit", "gcp"]), max_size=25))
    for ev in events:
        if ev == "ops":
            k = draw(st.integers(1, 6))
            batch = [(s, term) for s in range(nxt, nxt + k)]
            if draw(st.booleans()):  # a replay or retry may write an op twice
                batch.append(batch[0])
            cur.extend(batch)
            nxt += k
        elif ev == "roll":
            roll(term)
        elif ev == "gcp":
            gcp = draw(st.integers(gcp, nxt - 1))
        elif ev == "promote":
            # The new primary's global checkpoint is >= every earlier one; it re-issues above it.
            gcp = draw(st.integers(gcp, nxt - 1))
            term += draw(st.integers(1, 2))
            trims.append((term, gcp))
            roll(term)
            nxt = gcp + 1
        elif ev == "commit":
            # A primary's local checkpoint is >= the gcp; often it has caught up with all it issued.
            cp = nxt - 1 if draw(st.booleans()) else draw(st.integers(gcp, nxt - 1))
            everything = [o for g in ops.values() for o in g] + cur
            state = {s: t for s, t in resolve(everything, trims).items() if s <= cp}
            commits.append(Commit(term, cp, state))
    roll(term)  # the last generation is the current one
    current = gens[-1].generation
    return History(gens, ops, trims, commits, gcp, current)


@st.composite
def free_generations(draw: st.DrawFn) -> tuple[list[GenerationInfo], int]:
    """Arbitrary consistent generation lists (not from a simulation), and a current generation."""
    n = draw(st.integers(0, 12))
    numbers = sorted(draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
    terms = sorted(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    gens = []
    for g, t in zip(numbers, terms):
        if draw(st.integers(0, 4)) == 0:
            gens.append(GenerationInfo.empty(g, t))
        else:
            lo = draw(st.integers(0, 60))
            hi = draw(st.integers(lo, lo + 20))
            gens.append(GenerationInfo(g, t, lo, hi, draw(st.integers(1, 30))))
    current = draw(st.integers(numbers[-1] if numbers else 0, (numbers[-1] if numbers else 0) + 2))
    return gens, current


def _oracle(gens: list[GenerationInfo], current: int, needed: object) -> set[int]:
    """The spec, one generation at a time: delete in order until one must stay."""
    out: set[int] = set()
    for g in sorted(gens, key=lambda g: g.generation):
        if g.generation >= current or needed(g):  # type: ignore[operator]
            break
        out.add(g.generation)
    return out


def _assert_suffix(gens: list[GenerationInfo], deleted: set[int], current: int) -> None:
    kept = [g.generation for g in gens if g.generation not in deleted]
    assert current not in deleted
    assert all(d < k for d in deleted for k in kept)  # retained = a suffix in generation order
    assert deleted <= {g.generation for g in gens}


# -- remote -----------------------------------------------------------------------------


def _remote(gens: list[GenerationInfo], cp: int | None, term: int | None, current: int) -> set[int]:
    return remote_deletable(
        gens, remote_commit_local_checkpoint=cp, remote_commit_primary_term=term, current_generation=current
    )


def _local(gens: list[GenerationInfo], current: int, lcp: int, ret: int, upl: int | None = None) -> set[int]:
    return local_deletable(
        gens,
        current_generation=current,
        last_commit_local_checkpoint=lcp,
        retention_seq_no=ret,
        min_unuploaded_generation=upl,
    )


@settings(max_examples=400, deadline=None)
@given(histories(), st.data())
def test_remote_purge_then_replay_loses_nothing_across_terms(h: History, data: st.DataObject) -> None:
    if not h.commits:
        return
    c = data.draw(st.sampled_from(h.commits))
    deleted = remote_deletable(
        h.gens,
        remote_commit_local_checkpoint=c.local_checkpoint,
        remote_commit_primary_term=c.term,
        current_generation=h.current_generation,
    )
    everything = [o for g in h.gens for o in h.ops[g.generation]]
    kept_ops = [o for g in h.gens if g.generation not in deleted for o in h.ops[g.generation]]
    expected = resolve(everything, h.trims)
    recovered = resolve(list(c.state.items()) + kept_ops, h.trims)
    assert recovered == expected


@settings(max_examples=400, deadline=None)
@given(histories(), st.data())
def test_remote_properties(h: History, data: st.DataObject) -> None:
    top = max([g.max_seq_no for g in h.gens] + [0])
    cp = data.draw(st.integers(-1, top + 2))
    term = data.draw(st.integers(0, 8))
    deleted = _remote(h.gens, cp, term, h.current_generation)
    by_no = {g.generation: g for g in h.gens}
    for d in deleted:
        g = by_no[d]
        assert g.is_empty or (g.max_seq_no <= cp and g.primary_term <= term)
        # (a) no op above the commit's checkpoint, nor of a newer term than the commit's, is purged
        assert all(s <= cp and t <= term for s, t in h.ops[d])
    _assert_suffix(h.gens, deleted, h.current_generation)  # (c), (d)
    needed = lambda g: not g.is_empty and (g.max_seq_no > cp or g.primary_term > term)  # noqa: E731
    assert deleted == _oracle(h.gens, h.current_generation, needed)
    # (b) no remote commit: nothing, not even empty generations
    assert _remote(h.gens, None, None, h.current_generation) == set()
    assert _remote(h.gens, None, term, h.current_generation) == set()
    # (f) monotonic: a later commit (checkpoint and term no lower) never un-deletes
    cp2 = data.draw(st.integers(cp, top + 3))
    term2 = data.draw(st.integers(term, 9))
    assert deleted <= _remote(h.gens, cp2, term2, h.current_generation)
    assert min_retained_generation(
        h.gens, current_generation=h.current_generation, covered_seq_no=cp, covered_primary_term=term
    ) == min([h.current_generation, *(g.generation for g in h.gens if g.generation not in deleted)])


@settings(max_examples=300, deadline=None)
@given(free_generations(), st.integers(-1, 90), st.integers(0, 5), st.integers(0, 10), st.integers(0, 3))
def test_remote_properties_on_arbitrary_generations(
    gc: tuple[list[GenerationInfo], int], cp: int, term: int, dcp: int, dterm: int
) -> None:
    gens, current = gc
    deleted = _remote(gens, cp, term, current)
    by_no = {g.generation: g for g in gens}
    assert all(by_no[d].is_empty or (by_no[d].max_seq_no <= cp and by_no[d].primary_term <= term) for d in deleted)
    _assert_suffix(gens, deleted, current)
    assert deleted <= _remote(gens, cp + dcp, term + dterm, current
    )
    assert deleted <= _remote(gens, cp, term, current + 1
    )


def test_a_commit_of_an_older_term_does_not_cover_re_issued_seq_nos() -> None:
    # Term 1 writes 0..9 and uploads a remote commit at checkpoint 9.  The term-2 primary
    # (global checkpoint 4) re-issues 5..7.  Those ops are <= 9 but not in the term-1 commit.
    gens = [GenerationInfo(1, 1, 0, 9, 10), GenerationInfo(2, 2, 5, 7, 3), GenerationInfo.empty(3, 2)]
    assert _remote(gens, 9, 1, 3) == {1}
    # A naive rule (checkpoint only) would delete generation 2 and lose 5..7 of term 2:
    naive = _oracle(gens, 3, lambda g: not g.is_empty and g.max_seq_no > 9)
    assert naive == {1, 2}
    recovered = resolve([(s, 1) for s in range(10)], [(2, 4)])
    assert recovered == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}  # 5..7 gone under the naive rule
    # A term-2 commit at 7 frees nothing: generation 1 still holds (trimmed) ops 8, 9 above
    # it, and the raw max seq# counts.  A term-2 commit at 9 frees both.
    assert _remote(gens, 7, 2, 3) == set()
    assert _remote(gens, 9, 2, 3) == {1, 2}


def test_a_trimmed_older_generation_with_ops_above_the_commit_stays() -> None:
    # Term 1 wrote 0..20, trimmed above 12 by term 2; the commit covers 15 only.
    gens = [GenerationInfo(4, 1, 0, 20, 21), GenerationInfo(5, 2, 13, 30, 18), GenerationInfo.empty(6, 2)]
    assert _remote(gens, 15, 2, 6) == set()
    assert _remote(gens, 20, 2, 6) == {4}


# -- local ------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.one_of(histories().map(lambda h: (h.gens, h.current_generation)), free_generations()), st.data())
def test_local_properties(gc: tuple[list[GenerationInfo], int], data: st.DataObject) -> None:
    gens, current = gc
    top = max([g.max_seq_no for g in gens] + [0])
    lcp = data.draw(st.integers(-1, top + 2))
    ret = data.draw(st.integers(-1, top + 2))
    upl = data.draw(st.none() | st.integers(0, current + 2))
    deleted = _local(gens, current, lcp, ret, upl)
    bound = min(lcp, ret)
    by_no = {g.generation: g for g in gens}
    # (e) no op above min(commit checkpoint, retention) is deleted
    assert all(by_no[d].is_empty or by_no[d].max_seq_no <= bound for d in deleted)
    _assert_suffix(gens, deleted, current)  # (c), (d)
    if upl is not None:
        assert all(d < upl for d in deleted)  # not yet uploaded: kept
    floor = current if upl is None else min(current, upl)
    assert deleted == _oracle(gens, floor, lambda g: not g.is_empty and g.max_seq_no > bound)
    # (f) monotonic in every argument
    lcp2 = data.draw(st.integers(lcp, top + 3))
    ret2 = data.draw(st.integers(ret, top + 3))
    upl2 = None if upl is None else data.draw(st.none() | st.integers(upl, current + 3))
    assert deleted <= _local(gens, current, lcp2, ret2, upl2)


def test_local_examples_and_empty_generations() -> None:
    gens = [
        GenerationInfo.empty(1, 1),
        GenerationInfo(2, 1, 0, 9, 10),
        GenerationInfo.empty(3, 1),
        GenerationInfo(4, 1, 10, 19, 10),
        GenerationInfo.empty(5, 2),
        GenerationInfo(6, 2, 20, 29, 10),
    ]
    assert _local(gens, 6, -1, 100) == {1}  # empty, below a kept one
    assert _local(gens, 6, 9, 100) == {1, 2, 3}
    assert _local(gens, 6, 19, 15) == {1, 2, 3}  # retention holds 4
    assert _local(gens, 6, 19, 19) == {1, 2, 3, 4, 5}
    assert _local(gens, 6, 99, 99) == {1, 2, 3, 4, 5}  # not 6
    assert _local(gens, 6, 99, 99, 4) == {1, 2, 3}
    # Retained stays contiguous: a covered generation above a needed one is kept.
    gens2 = [GenerationInfo(1, 1, 0, 50, 51), GenerationInfo(2, 1, 0, 5, 6), GenerationInfo.empty(3, 1)]
    assert local_deletable(gens2, current_generation=3, last_commit_local_checkpoint=10, retention_seq_no=10) == set()
    assert local_deletable([], current_generation=0, last_commit_local_checkpoint=5, retention_seq_no=5) == set()


# -- inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: GenerationInfo(1, 1, 5, 4, 2),
        lambda: GenerationInfo(1, 1, -1, 4, 2),
        lambda: GenerationInfo(1, 1, 0, 4, 0),
        lambda: GenerationInfo(-1, 1, 0, 4, 5),
        lambda: GenerationInfo(1, -1, 0, 4, 5),
        lambda: GenerationInfo(1, 1, 0, 4, -5),
        lambda: GenerationInfo(1, 1, 0, 4.0, 5),
    ],
)
def test_inconsistent_generation_info_is_refused(make: object) -> None:
    with pytest.raises(InvalidGenerations):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("gens", "current", "cp", "term"),
    [
        ([GenerationInfo(1, 1, 0, 1, 2), GenerationInfo(1, 1, 2, 3, 2)], 2, 5, 1),  # listed twice
        ([GenerationInfo(1, 2, 0, 1, 2), GenerationInfo(2, 1, 2, 3, 2)], 2, 5, 2),  # term went down
        ([GenerationInfo(3, 1, 0, 1, 2)], 2, 5, 1),  # newer than current
        ([GenerationInfo(1, 1, 0, 1, 2)], 2, -2, 1),  # bad checkpoint
        ([GenerationInfo(1, 1, 0, 1, 2)], 2, 5, None),  # a commit without its term
        ([GenerationInfo(1, 1, 0, 1, 2)], -1, 5, 1),  # bad current generation
    ],
)
def test_inconsistent_remote_inputs_are_refused(
    gens: list[GenerationInfo], current: int, cp: int, term: int | None
) -> None:
    with pytest.raises(InvalidGenerations) as info:
        _remote(gens, cp, term, current)
    assert isinstance(info.value, InvalidError)


def test_inconsistent_local_inputs_are_refused() -> None:
    with pytest.raises(InvalidGenerations):
        _local([GenerationInfo(1, 1, 0, 1, 2)], 1, -2, 0)
    with pytest.raises(InvalidGenerations):
        local_deletable(
            [GenerationInfo(1, 2, 0, 1, 2), GenerationInfo(2, 1, 0, 1, 2)],
            current_generation=2,
            last_commit_local_checkpoint=5,
            retention_seq_no=5,
        )
    with pytest.raises(InvalidGenerations):  # even with no commit, the listing is checked
        remote_deletable([GenerationInfo(1, 1, 0, 1, 2)] * 2, remote_commit_local_checkpoint=None,
                         remote_commit_primary_term=None, current_generation=1)
