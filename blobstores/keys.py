"""Pure rules for blob keys and prefixes (no I/O).

A key is relative to the store's root, made of non-empty ``/``-separated parts, none of
which is ``.`` or ``..``; it holds no backslash, no control character (C0 or C1), no
``?`` or ``#`` (which fsspec, Spark and pyarrow parse out of paths as version, query or
fragment: s3fs reads ``a?versionId=1`` as key ``a``), is in Unicode NFC (so that one name
has one spelling on every filesystem), and with the store's root prefix is at most
1,024 bytes of UTF-8 (the S3 and Azure limit).  These rules keep every store inside its
root and make keys portable between backends and tools.
"""

from __future__ import annotations

import re
import unicodedata

from shardstore.blobstores.errors import InvalidKey, InvalidRange

MAX_KEY_BYTES = 1024
#: C0 and C1 control characters, which no key, prefix or root may hold.
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def key_problem(key: object) -> str | None:
    """Return why ``key`` is not a valid blob key, or None when it is valid."""
    if not isinstance(key, str):
        return f"a key must be a str, not {type(key).__name__}"
    if not key:
        return "the key is empty"
    if CONTROL_CHARACTER.search(key):
        return "the key holds a control character"
    if "\\" in key:
        return "the key holds a backslash (keys are '/'-separated)"
    if "?" in key or "#" in key:
        return "the key holds '?' or '#', which URL-style paths treat as query or fragment"
    if key.startswith("/"):
        return "the key is absolute (keys are relative to the store's root)"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"the key is longer than {MAX_KEY_BYTES} bytes"
    for part in key.split("/"):
        if part == "":
            return "the key has an empty path part ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"the key has a {part!r} path part"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "the key is not valid UTF-8 (lone surrogate)"
    if not key.isascii() and unicodedata.normalize("NFC", key) != key:
        return "the key is not in Unicode NFC (normalise it with unicodedata.normalize('NFC', key))"
    return None


def validate_key(key: str, *, location: str = "") -> str:
    """Return ``key`` unchanged if valid, else raise InvalidKey naming the problem."""
    problem = key_problem(key)
    if problem is not None:
        raise InvalidKey(problem, location=location, key=key if isinstance(key, str) else repr(key))
    return key


def validate_prefix(prefix: str, *, location: str = "") -> str:
    """Validate a listing prefix: empty, or a key-like string that may end with '/'."""
    if prefix == "":
        return prefix
    body = prefix[:-1] if prefix.endswith("/") else prefix
    if body == "":
        raise InvalidKey("a prefix may not be just '/'", location=location, key=prefix)
    validate_key(body, location=location)
    return prefix


def join_root(root: str, key: str) -> str:
    """Join a root prefix (may be empty) and a relative key with one '/'."""
    return f"{root}/{key}" if root else key


def check_full_length(root: str, key: str, *, location: str = "") -> None:
    """Raise InvalidKey when root + key is longer than the services allow."""
    full = join_root(root, key)
    if len(full.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidKey(
            f"with the root prefix the key is longer than {MAX_KEY_BYTES} bytes", location=location, key=key
        )


def relative_to_root(root: str, path: str) -> str:
    """Strip ``root/`` from a full path (the inverse of :func:`join_root`)."""
    if not root:
        return path
    head = root + "/"
    if not path.startswith(head):
        raise ValueError(f"{path!r} is outside root {root!r}")
    return path[len(head):]


def check_range(start: int, length: int, *, location: str = "", key: str | None = None) -> None:
    """Raise InvalidRange unless ``start >= 0`` and ``length >= 0``."""
    if start < 0 or length < 0:
        raise InvalidRange(
            f"a range needs start >= 0 and length >= 0, got start={start}, length={length}",
            location=location,
            key=key,
        )
