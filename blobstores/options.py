"""Pure parsing of store URLs and options (no I/O).

Options come from the URL query (``s3://b/p?endpoint_url=http://...``) and from keyword
arguments to ``open_store``; keyword arguments win.  Each plugin declares the options it
takes as a table of :class:`Option`; values from a query arrive as strings and are
coerced to the declared type.  Secrets are never echoed in an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from shardstore.blobstores.errors import ConfigError, UnknownOption
from shardstore.blobstores.keys import CONTROL_CHARACTER, key_problem

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL: scheme, bucket (container, namespace name...) and root prefix."""

    scheme: str
    bucket: str
    prefix: str
    query: Mapping[str, str]

    @property
    def location(self) -> str:
        """The URL without its query: what messages and reprs show."""
        if self.scheme == "file":
            return f"file://{self.prefix}"
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def url(self) -> str:
        """The URL without its query, percent-encoded: :func:`parse_url` reads it back unchanged."""
        if self.scheme == "file":
            return "file://" + _quote(self.prefix)
        return f"{self.scheme}://{_quote(self.bucket, safe='')}" + (f"/{_quote(self.prefix)}" if self.prefix else "")


def _quote(text: str, safe: str = "/") -> str:
    return quote(text, safe=safe, errors="surrogateescape")


def _unquote(text: str) -> str:
    # surrogateescape: a byte that is not UTF-8 stays that byte (a file name), never U+FFFD
    return unquote(text, errors="surrogateescape")


def _file_root(path: str, shown: str) -> str:
    """The absolute root of a file URL's decoded path; ConfigError unless it is a normalized path."""
    root = "/" + path.strip("/")
    if CONTROL_CHARACTER.search(root):
        raise ConfigError(f"the file root of {shown!r} holds a control character (a NUL byte?)")
    if root != "/" and any(part in ("", ".", "..") for part in root[1:].split("/")):
        raise ConfigError(
            f"the file root {root!r} is not a normalized path (no '.', '..' or empty parts); "
            "resolve it first, e.g. with os.path.realpath"
        )
    return root


def parse_url(url: str) -> StoreURL:
    """Split ``scheme://bucket/prefix?opt=v`` (a bare path means ``file://``).

    Errors quote the URL without its query, which may hold credentials.
    """
    if not isinstance(url, str):
        raise ConfigError(f"a store URL must be a string, not {type(url).__name__}")
    if not url:
        raise ConfigError("the store URL is empty (give one such as file:///srv/store or s3://bucket/prefix)")
    shown = url.split("?", 1)[0]
    if "://" not in url:
        if not url.startswith("/"):
            raise ConfigError(
                f"{shown!r} is not a store URL: expected scheme://bucket/prefix "
                "(or an absolute path for the local filesystem)"
            )
        url = "file://" + url
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise ConfigError(
            "store URLs may not carry credentials (user:password@); pass them as options "
            "or let the SDK's credential chain find them"
        )
    if parts.fragment:
        raise ConfigError(f"store URLs take no #fragment: {shown!r}")
    scheme = parts.scheme.lower()
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = _unquote(parts.path)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file URLs take an absolute path (file:///dir), got {shown!r}")
        return StoreURL(scheme, "", _file_root(path, shown), query)
    prefix = path.strip("/")
    if prefix and (problem := key_problem(prefix)) is not None:
        raise ConfigError(f"the root prefix {prefix!r} is not valid: {problem}")
    bucket = _unquote(parts.netloc)
    if CONTROL_CHARACTER.search(bucket):
        raise ConfigError(f"the bucket of {shown!r} holds a control character (a NUL byte?)")
    return StoreURL(scheme, bucket, prefix, query)


@dataclass(frozen=True, slots=True)
class Option:
    """One option a plugin accepts: its type, default and whether it is a secret."""

    name: str
    type: type = str
    default: Any = None
    doc: str = ""
    secret: bool = False


def coerce_options(
    declared: Mapping[str, Option], given: Mapping[str, Any], *, location: str
) -> dict[str, Any]:
    """Check and type-convert options; unknown names and bad values raise ConfigError."""
    out = {name: opt.default for name, opt in declared.items()}
    for name, value in given.items():
        opt = declared.get(name)
        if opt is None:
            raise UnknownOption(name, sorted(declared), location=location)
        out[name] = _convert(opt, value, location)
    return out


def _convert(opt: Option, value: Any, location: str) -> Any:
    if value is None:
        return value
    shown = "<secret>" if opt.secret else repr(value)
    if opt.type is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"option {opt.name!r} must be true or false, got {shown}", location=location)
    if isinstance(value, opt.type):
        return value
    try:
        return opt.type(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"option {opt.name!r} must be {opt.type.__name__}, got {shown}", location=location
        ) from None
