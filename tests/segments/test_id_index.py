"""Id fingerprints (segments/id_index.py): the gathered words equal the zero-padded matrix's, for any ids."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from shardstore.segments.id_index import _fingerprints_of_matrix, fingerprints


def _random_ids(rng: random.Random, n: int, max_len: int) -> list[str]:
    alphabet = "abcXYZ019-_/é€😀"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_fingerprints_equal_the_padded_matrix_reference(seed: int) -> None:
    """Random ids of 0 to 70 characters (multi-byte ones included, so byte lengths cross every word boundary), whole,
    sliced (a non-zero offset) and chunked: the fingerprints are the reference's, and equal ids hash alike."""
    rng = random.Random(seed)
    ids = _random_ids(rng, rng.randint(1, 400), rng.choice([1, 7, 8, 9, 16, 17, 70]))
    arr = pa.array(ids + ids[:5], pa.string())
    want = _fingerprints_of_matrix(arr)
    assert np.array_equal(fingerprints(arr), want)
    lo = rng.randint(0, len(ids) - 1)
    sliced = arr.slice(lo, rng.randint(0, len(arr) - lo))
    assert np.array_equal(fingerprints(sliced), _fingerprints_of_matrix(sliced))
    assert np.array_equal(fingerprints(sliced), want[lo: lo + len(sliced)])
    chunked = pa.chunked_array([arr.slice(0, lo), arr.slice(lo)])
    assert np.array_equal(fingerprints(chunked), want)
    assert np.array_equal(want[len(ids):], want[:5])  # the repeated ids


def test_fingerprints_of_edge_cases() -> None:
    """No ids, only empty ids, exact word widths, and ids too long for the keys (refused, naming the limit)."""
    assert fingerprints(pa.array([], pa.string())).size == 0
    for ids in ([""], ["", ""], ["a" * 8], ["a" * 8, "b" * 16, ""], ["x" * 4096]):
        arr = pa.array(ids, pa.string())
        assert np.array_equal(fingerprints(arr), _fingerprints_of_matrix(arr)), ids
    # zero padding adds nothing: an id and itself plus NUL bytes collide by design (a lookup compares the ids)
    assert fingerprints(pa.array(["ab"]))[0] == fingerprints(pa.array(["ab\x00\x00"]))[0]
    with pytest.raises(ValueError, match="ids longer than 32768 bytes"):
        fingerprints(pa.array(["y" * (8 * 4096 + 1)]))


@pytest.mark.parametrize("seed", range(30))
def test_merged_and_renumbered_keys_equal_an_index_built_fresh(seed: int) -> None:
    """A refresh cuts its segments' id indexes from the buffered batches' keys (SortedKeys.merged, then renumbered
    to the rows each segment got): the same fingerprints with the same rows as fingerprinting the segment's ids
    afresh, for any split of the buffer into batches, any rows kept and any cut into segments."""
    from shardstore.segments.id_index import SortedKeys, _IdIndex

    rng = random.Random(seed)
    ids = _random_ids(rng, rng.randint(1, 300), rng.choice([3, 9, 20]))
    cuts = sorted(rng.sample(range(1, len(ids)), min(rng.randint(0, 4), len(ids) - 1)))
    batches = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]
    keys = SortedKeys.merged([SortedKeys.of(pa.array(b, pa.string())) for b in batches], [len(b) for b in batches])
    assert np.array_equal(keys.fp, np.sort(fingerprints(pa.array(ids, pa.string()))))
    assert np.array_equal(fingerprints(pa.array(ids, pa.string()))[keys.pos], keys.fp)  # each position its own
    keep = np.array(sorted(rng.sample(range(len(ids)), rng.randint(0, len(ids)))), dtype=np.int64)
    at = np.full(len(ids), -1, dtype=np.int64)
    at[keep] = np.arange(len(keep))
    parts = rng.randint(1, 3)
    for i in range(parts):
        lo, hi = len(keep) * i // parts, len(keep) * (i + 1) // parts
        seg_ids = pa.array([ids[r] for r in keep[lo:hi]], pa.string())
        cut = keys.renumbered(at, lo, hi)
        fresh = _IdIndex(seg_ids)
        built = _IdIndex(seg_ids, cut)
        assert np.array_equal(built.fp, fresh.fp)
        # rows agree as sets per fingerprint (equal fingerprints may come in any order)
        assert sorted(zip(built.fp.tolist(), built.rows.tolist())) == sorted(zip(fresh.fp.tolist(), fresh.rows.tolist()))
        q = pa.array(rng.sample(ids, min(5, len(ids))) + ["not-there"], pa.string())
        got = built.lookup(q, np.arange(len(q)))
        want = fresh.lookup(q, np.arange(len(q)))
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
