"""The claim log's pure rules (segments/claim_rule.py): who is fenced, when a claim counts, what is collected."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.core.records import RecordCorrupted
from shardstore.segments.claim_rule import (
    ACCEPT_WINDOW,
    KEEP_CLAIMS,
    Claim,
    accepted,
    claim_name,
    decode_claim,
    encode_claim,
    fence_verdict,
    parse_claim_epoch,
)


def test_claim_keys_sort_newest_first_and_records_round_trip() -> None:
    epochs = [1, 2, 10, 99, 1000]
    assert [parse_claim_epoch(f"c/claims/{n}") for n in sorted(claim_name(e) for e in epochs)] == [1000, 99, 10, 2, 1]
    assert parse_claim_epoch("c/claims/not-a-claim") is None
    claim = Claim(7, "idx", 3, 4)
    raw = encode_claim(claim, "writer")
    assert decode_claim(raw, 7, "k") == claim
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x08
        with pytest.raises(RecordCorrupted, match="the/key"):
            decode_claim(bytes(bad), 7, "the/key")


def _model(claims: list[Claim], idx: str, shard: int, term: int, verified: int) -> tuple[int | None, bool]:
    """What a primary must conclude, written the obvious way."""
    newer = [c.term for c in claims if c.epoch > verified and (c.index_uuid, c.shard) == (idx, shard) and c.term > term]
    fenced = max(newer) if newer else None
    gap = bool(claims) and min(c.epoch for c in claims) > verified + 1
    unreadable = any(c.index_uuid is None and c.epoch > verified for c in claims)
    return fenced, (gap or unreadable) and fenced is None


def test_fence_verdict_exhaustively_on_small_logs() -> None:
    shards = [("a", 0), ("a", 1), ("b", 0), (None, -1)]
    checked = 0
    for n in range(0, 4):
        for lo in (1, 2, 5):
            epochs = list(range(lo, lo + n))
            for owners in itertools.product(range(len(shards)), repeat=n):
                for terms in itertools.product((1, 2, 3), repeat=n):
                    claims = [Claim(e, *shards[o], t) for e, o, t in zip(epochs, owners, terms, strict=True)]
                    for verified in range(0, lo + n + 1):
                        for term in (1, 2, 3):
                            v = fence_verdict(claims, "a", 0, term, verified)
                            assert (v.fenced_by, v.check_markers) == _model(claims, "a", 0, term, verified)
                            assert v.verified_epoch == max([verified, *(c.epoch for c in claims)])
                            checked += 1
    assert checked > 10_000


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.sampled_from(["a", "b", None]), st.integers(0, 3), st.integers(1, 9)),
                max_size=40, unique_by=lambda t: t[0]),
       st.integers(0, 520), st.integers(1, 9))
def test_fence_verdict_matches_the_model(raw, verified: int, term: int) -> None:
    claims = [Claim(*r) for r in raw]
    v = fence_verdict(claims, "a", 1, term, verified)
    assert (v.fenced_by, v.check_markers) == _model(claims, "a", 1, term, verified)


def test_a_claim_far_below_the_newest_does_not_count() -> None:
    assert accepted(100, 100)
    assert accepted(100 - ACCEPT_WINDOW, 100)
    assert not accepted(99 - ACCEPT_WINDOW, 100)


def test_a_node_that_verified_past_an_epoch_never_misses_an_accepted_claim_there() -> None:
    """The argument of docs/design/translog.md: an accepted claim's slot was never collected while a node
    verified past it.  Collection keeps KEEP_CLAIMS newest; a slot is free only once newest >= slot + KEEP_CLAIMS,
    and a claim landing there is accepted only if slot >= newest - ACCEPT_WINDOW: impossible together."""
    for slot in range(1, 50):
        for newest in range(slot, slot + 2 * KEEP_CLAIMS):
            freed = newest - slot >= KEEP_CLAIMS
            assert not (freed and accepted(slot, newest))


