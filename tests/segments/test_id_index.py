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
