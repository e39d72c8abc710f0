"""shardstore.core.arrays: one Array out of a column without copying a single chunk."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shardstore.core.arrays import may_hold_byte, one_array, validate_full


def test_a_single_chunk_is_taken_as_it_is_and_several_are_joined() -> None:
    base = pa.array(["a", "b", "c", "d"])
    sliced = pa.chunked_array([base.slice(1, 2)])
    got = one_array(sliced)
    assert got.to_pylist() == ["b", "c"] and got.offset == 1
    assert got.buffers()[2].address == base.buffers()[2].address  # no copy
    assert one_array(pa.chunked_array([base, base.slice(2)])).to_pylist() == ["a", "b", "c", "d", "c", "d"]
    assert one_array(pa.chunked_array([], pa.int64())).to_pylist() == []
    assert one_array(base) is base


def test_full_validation_takes_ascii_strings_at_once_and_still_refuses_what_arrow_refuses() -> None:
    good = pa.table({"s": ["ab", None, "c"], "l": pa.array(["x", "y", "z"], pa.large_string()),
                     "u": ["é", "ü", "ß"], "i": [1, 2, 3]})
    validate_full(good)
    validate_full(pa.chunked_array([good.column("s").chunk(0).slice(1), pa.array([], pa.string())]))
    bad_utf8 = pa.array([b"ok", b"\xff"], pa.binary()).view(pa.string())
    with pytest.raises(pa.ArrowInvalid, match="UTF8"):
        validate_full(pa.table({"ok": ["a", "b"], "bad": bad_utf8}))
    with pytest.raises(pa.ArrowInvalid, match="UTF8"):
        validate_full(pa.array([b"a", b"\xc3"], pa.binary()).view(pa.string()).slice(1))  # a slice
    # offsets that go backwards (bytes all ASCII): the fast path declines, Arrow's check names it
    backwards = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(np.array([0, 2, 1], np.int32).tobytes()),
                                                        pa.py_buffer(b"ab")])
    with pytest.raises(pa.ArrowInvalid, match="ffset"):
        validate_full(backwards)
    with pytest.raises(pa.ArrowInvalid, match="larger than"):  # offsets past the bytes (refused where it is built)
        validate_full(pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, 9], np.int32).tobytes()),
                                                              pa.py_buffer(b"ab")]))


def test_may_hold_byte_is_false_only_when_no_value_holds_the_byte() -> None:
    dash = ord("-")
    assert not may_hold_byte(pa.array(["ab", None, "cd"]), dash)
    assert may_hold_byte(pa.array(["ab", "2024-01-02"]), dash)
    assert may_hold_byte(pa.chunked_array([pa.array([b"ab"], pa.large_binary()), pa.array([b"x-"], pa.large_binary())]), dash)
    assert not may_hold_byte(pa.array(["a-b", "cd", "ef"]).slice(1), dash)  # the slice's own bytes only
    assert may_hold_byte(pa.array(["a", "b-", "c"]).slice(1, 1), dash)
    assert not may_hold_byte(pa.chunked_array([], pa.string()), dash)
    assert may_hold_byte(pa.array([1, 2]), dash)  # not strings: no claim
