"""Pure rules: key validation, URL parsing, option coercion (no store needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardstore.blobstores.errors import ConfigError, InvalidKey, InvalidRange
from shardstore.blobstores.keys import (
    check_range,
    join_root,
    key_problem,
    relative_to_root,
    validate_key,
    validate_prefix,
)
from shardstore.blobstores.options import Option, coerce_options, parse_url
from shardstore.errors import InvalidError

GOOD = ["a", "a/b", "a-b/c_d.e", "segments/0001__uuid", "ünïcode/ключ", "x" * 1024, "a/.hidden", "a/..b"]
BAD = {
    "": "empty",
    "/abs": "absolute",
    "a//b": "empty path part",
    "a/": "empty path part",
    "../x": "'..'",
    "a/./b": "'.'",
    "a\\b": "backslash",
    "a\nb": "control",
    "a\x00": "control",
    "a\x7f": "control",
    "y" * 1025: "longer than",
    "a?versionId=1": "'\\?' or '#'",
    "a#frag": "'\\?' or '#'",
    "a\x85b": "control",
    "ke\u0301y": "NFC",
}


@pytest.mark.parametrize("key", GOOD)
def test_good_keys_pass(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(("key", "why"), list(BAD.items()))
def test_bad_keys_name_the_problem(key: str, why: str) -> None:
    with pytest.raises(InvalidKey, match=why) as info:
        validate_key(key, location="s3://bkt/root")
    assert "s3://bkt/root" in str(info.value)
    assert isinstance(info.value, InvalidError) and not info.value.retryable


def test_non_string_key() -> None:
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_key(b"bytes")  # type: ignore[arg-type]


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8), min_size=1, max_size=5))
def test_valid_keys_never_escape_the_root(parts: list[str]) -> None:
    key = "/".join(parts)
    if key_problem(key) is None:
        # A valid key joined to a root stays under it, and round-trips.
        joined = join_root("root/p", key)
        assert joined.startswith("root/p/")
        assert relative_to_root("root/p", joined) == key
        assert ".." not in key.split("/") and not key.startswith("/")


def test_prefixes() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("a/") == "a/"
    assert validate_prefix("a/b") == "a/b"
    for bad in ("/", "//", "../", "a//"):
        with pytest.raises(InvalidKey):
            validate_prefix(bad)


def test_ranges() -> None:
    check_range(0, 0)
    for start, length in ((-1, 1), (0, -1)):
        with pytest.raises(InvalidRange, match="start >= 0"):
            check_range(start, length)


@pytest.mark.parametrize(
    ("url", "scheme", "bucket", "prefix", "location"),
    [
        ("file:///tmp/x/", "file", "", "/tmp/x", "file:///tmp/x"),
        ("/tmp/y", "file", "", "/tmp/y", "file:///tmp/y"),
        ("s3://bkt/a/b/?endpoint_url=http%3A%2F%2Fh%3A1", "s3", "bkt", "a/b", "s3://bkt/a/b"),
        ("gs://bkt", "gs", "bkt", "", "gs://bkt"),
        ("memory://name/p", "memory", "name", "p", "memory://name/p"),
    ],
)
def test_parse_url(url: str, scheme: str, bucket: str, prefix: str, location: str) -> None:
    u = parse_url(url)
    assert (u.scheme, u.bucket, u.prefix, u.location) == (scheme, bucket, prefix, location)


def test_parse_url_keeps_query_out_of_location() -> None:
    u = parse_url("s3://bkt/p?secret=hunter2&region=x")
    assert u.query == {"secret": "hunter2", "region": "x"}
    assert "hunter2" not in u.location


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "is empty"),
        ("relative/path", "not a store URL"),
        ("file://host/x", "absolute path"),
        ("s3://AKIAX:hunter2@bkt/p", "may not carry credentials"),
        ("s3://bkt/p#frag", "no #fragment"),
        ("s3://bkt/a//b", "root prefix"),
        ("s3://bkt/a/../b", "root prefix"),
    ],
)
def test_parse_url_rejects(bad: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as info:
        parse_url(bad)
    assert "hunter2" not in str(info.value)


def test_url_errors_never_repeat_the_query() -> None:
    with pytest.raises(ConfigError) as info:
        parse_url("bucket/p?secret=hunter2")
    assert "hunter2" not in str(info.value)


def test_coerce_options() -> None:
    table = {
        "n": Option("n", int, 3),
        "f": Option("f", bool, True),
        "pw": Option("pw", str, None, secret=True),
        "x": Option("x", float, 1.0),
    }
    out = coerce_options(table, {"n": "7", "f": "no", "x": "2.5"}, location="m://x")
    assert out == {"n": 7, "f": False, "pw": None, "x": 2.5}
    with pytest.raises(ConfigError, match="unknown option 'nn'.*accepts: f, n, pw, x"):
        coerce_options(table, {"nn": 1}, location="m://x")
    with pytest.raises(ConfigError, match="'f' must be true or false"):
        coerce_options(table, {"f": "maybe"}, location="m://x")
    with pytest.raises(ConfigError, match="'n' must be int, got 'seven'"):
        coerce_options(table, {"n": "seven"}, location="m://x")
