"""Where a shard's remote files live: pluggable, recorded path strategies (pure, no I/O).

Layouts (keys are relative to the store root; no prefix has a trailing ``/``):

- :class:`PlainPathStrategy` (``"plain"``)::

      <cluster_uuid>/<primary_term>/<index_uuid>/<shard>/<kind>          kind: segments | translog
      <cluster_uuid>/primary_terms/<index_uuid>/<shard>/<invert(term)>    term markers

- :class:`HashedPrefixPathStrategy` (``"hashed_prefix"``, ``bits`` = b): the same keys behind
  one more leading part, ``<h>/...``, where ``h`` is the first b bits of
  ``sha256("<cluster_uuid>/<index_uuid>/<shard>/<kind>")`` written as ``ceil(b/4)``
  lowercase hex digits (the term markers use kind ``primary_terms``).  Object stores
  partition (and throttle) by the leading characters of the key, so 2**b prefixes spread
  the shards' request load; the plain layout puts a whole cluster under one prefix.

  **The primary term is not hashed.**  Only one primary per shard writes at a time, so
  hashing the term would not spread the steady-state load any further; leaving it out
  keeps every term of one shard (and a commit naming files of older terms) under the
  same hashed prefix, makes the term-marker prefix (which must not depend on the term)
  use the same rule, and means a failover never moves a shard's traffic to a cold
  prefix.  The kind *is* hashed: segments and translog of one shard land on different
  prefixes, which splits the frequent translog uploads from the large segment uploads.

Invariants:

1. Pure and stable: a prefix depends only on the strategy's recorded parameters and the
   arguments (golden values are pinned in the tests; changing them orphans data).
2. Injective: distinct (cluster, term, index, shard, kind) give prefixes none of which
   is a prefix (as a ``/``-separated path) of another; term-marker prefixes never collide
   with data prefixes (``primary_terms`` is not an integer term).
3. Term markers: each new primary writes one blob ``term_marker_key(...)`` named
   :func:`invert` (term); inverted names sort lexicographically in *descending* term
   order, so ``LIST <term_marker_prefix>/`` yields the newest term first.  Markers list
   every term the shard has had, so a caller can find all data prefixes of a shard
   (one per marker term) without listing the whole cluster.
4. Recorded: :meth:`PathStrategy.to_dict` gives ``{"type", "version": 1, ...params}`` to
   store with the index metadata; :meth:`PathStrategy.from_dict` reads it back exactly
   and refuses unknown types or parameters (:class:`~shardstore.errors.InvalidError`)
   and newer versions (:class:`~shardstore.errors.UnsupportedFormatVersion`), so the
   layout of existing data never changes silently.
5. Validation: kinds outside {segments, translog}, negative or non-int terms/shards,
   UUIDs that are empty, ``.``/``..`` or hold ``/`` (or anything else a blob key may not
   hold) raise :class:`~shardstore.errors.InvalidError`.

Callers must LIST ``prefix + "/"`` (with the slash): ``.../shard/1`` is a string prefix of
``.../shard/10``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from shardstore.blobstores.keys import key_problem
from shardstore.errors import InvalidError, UnsupportedFormatVersion

#: The largest term/generation an inverted name can hold.
MAX_INVERTIBLE = 2**63 - 1
#: Width of an inverted name (digits of 2**63 - 1).
INVERTED_WIDTH = 19
#: Kinds of shard data a prefix may be asked for.
KINDS = frozenset({"segments", "translog"})
#: The path part under which term markers live (never an integer, so never a term).
TERM_MARKER_DIR = "primary_terms"
#: Format version of :meth:`PathStrategy.to_dict`.
FORMAT_VERSION = 1

_INVERTED = re.compile(r"[0-9]{19}")


def invert(n: int) -> str:
    """``2**63 - 1 - n`` zero-padded to 19 digits: larger ``n`` sorts lexicographically first."""
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_INVERTIBLE:
        raise InvalidError(f"an inverted name needs an int in 0..2**63-1, got {n!r}")
    return str(MAX_INVERTIBLE - n).zfill(INVERTED_WIDTH)


def uninvert(s: str) -> int:
    """The ``n`` of ``invert(n)``; InvalidError unless ``s`` is exactly 19 ASCII digits <= 2**63-1."""
    if not isinstance(s, str) or not _INVERTED.fullmatch(s) or int(s) > MAX_INVERTIBLE:
        raise InvalidError(f"not an inverted name (19 digits, at most 2**63-1): {s!r}")
    return MAX_INVERTIBLE - int(s)


def term_marker_key(marker_prefix: str, primary_term: int) -> str:
    """The marker blob of ``primary_term`` under a :meth:`PathStrategy.term_marker_prefix`."""
    if not isinstance(marker_prefix, str) or not marker_prefix or marker_prefix.endswith("/"):
        raise InvalidError(f"a term-marker prefix is non-empty without a trailing '/': {marker_prefix!r}")
    return f"{marker_prefix}/{invert(primary_term)}"


def parse_term_marker_key(key: str) -> int:
    """The primary term of a term-marker key (a bare marker name is accepted too)."""
    if not isinstance(key, str):
        raise InvalidError(f"a term-marker key is a str, got {key!r}")
    name = key.rsplit("/", 1)[-1]
    try:
        return uninvert(name)
    except InvalidError:
        raise InvalidError(f"not a term-marker key: {key!r}") from None


def latest_term(marker_keys: Iterable[str]) -> int | None:
    """The newest term among listed marker keys (None if none); any other key is InvalidError."""
    terms = [parse_term_marker_key(k) for k in marker_keys]
    return max(terms) if terms else None


def _check_uuid(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidError(f"{what} must be a non-empty str, got {value!r}")
    if "/" in value:
        raise InvalidError(f"{what} may not hold '/': {value!r}")
    problem = key_problem(value)
    if problem is not None:
        raise InvalidError(f"{what} {value!r} cannot be a path part: {problem}")
    return value


def _check_nat(what: str, value: object, top: int = MAX_INVERTIBLE) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise InvalidError(f"{what} must be an int in 0..{top}, got {value!r}")
    return value


def _check_kind(kind: object) -> str:
    if kind not in KINDS:
        raise InvalidError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return kind  # type: ignore[return-value]


@dataclass(frozen=True)
class PathStrategy:
    """Base of the path strategies: maps a shard (and term, kind) to its key prefixes."""

    name: ClassVar[str] = ""

    def shard_prefix(self, cluster_uuid: str, primary_term: int, index_uuid: str, shard: int, kind: str) -> str:
        """Prefix (no trailing '/') of one shard's ``kind`` blobs written under ``primary_term``."""
        _check_uuid("cluster_uuid", cluster_uuid)
        _check_nat("primary_term", primary_term)
        _check_uuid("index_uuid", index_uuid)
        _check_nat("shard", shard)
        _check_kind(kind)
        plain = f"{cluster_uuid}/{primary_term}/{index_uuid}/{shard}/{kind}"
        return self._wrap(plain, cluster_uuid, index_uuid, shard, kind)

    def term_marker_prefix(self, cluster_uuid: str, index_uuid: str, shard: int) -> str:
        """Term-independent prefix (no trailing '/') of the shard's term-marker blobs."""
        _check_uuid("cluster_uuid", cluster_uuid)
        _check_uuid("index_uuid", index_uuid)
        _check_nat("shard", shard)
        plain = f"{cluster_uuid}/{TERM_MARKER_DIR}/{index_uuid}/{shard}"
        return self._wrap(plain, cluster_uuid, index_uuid, shard, TERM_MARKER_DIR)

    def term_marker_key(self, cluster_uuid: str, index_uuid: str, shard: int, primary_term: int) -> str:
        """Key of the marker blob the primary of ``primary_term`` writes for the shard."""
        return term_marker_key(self.term_marker_prefix(cluster_uuid, index_uuid, shard), primary_term)

    def _wrap(self, plain: str, cluster_uuid: str, index_uuid: str, shard: int, kind: str) -> str:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The record to store with the index: ``{"type", "version", ...params}``."""
        return {"type": self.name, "version": FORMAT_VERSION, **self._params()}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PathStrategy:
        """The strategy a :meth:`to_dict` record describes; unknown type/params or newer version raise."""
        if not isinstance(d, Mapping):
            raise InvalidError(f"a path strategy record is a mapping, got {type(d).__name__}")
        kind = d.get("type")
        cls = _TYPES.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise InvalidError(f"unknown path strategy type {kind!r} (known: {sorted(_TYPES)})")
        version = d.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidError(f"path strategy {kind!r}: version must be an int >= 1, got {version!r}")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatVersion(f"path strategy {kind!r}", version, FORMAT_VERSION)
        params = {k: v for k, v in d.items() if k not in ("type", "version")}
        return cls._from_params(params)

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> PathStrategy:
        raise NotImplementedError


@dataclass(frozen=True)
class PlainPathStrategy(PathStrategy):
    """``<cluster_uuid>/<primary_term>/<index_uuid>/<shard>/<kind>``: the seed's layout."""

    name: ClassVar[str] = "plain"

    def _wrap(self, plain: str, cluster_uuid: str, index_uuid: str, shard: int, kind: str) -> str:
        return plain

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> PathStrategy:
        if params:
            raise InvalidError(f"path strategy 'plain' takes no parameters, got {sorted(params)}")
        return cls()


@dataclass(frozen=True)
class HashedPrefixPathStrategy(PathStrategy):
    """The plain layout behind ``<h>/``: the first ``bits`` bits of a term-independent sha256, in hex."""

    name: ClassVar[str] = "hashed_prefix"
    MIN_BITS: ClassVar[int] = 1
    MAX_BITS: ClassVar[int] = 32

    bits: int = 8

    def __post_init__(self) -> None:
        b = self.bits
        if not isinstance(b, int) or isinstance(b, bool) or not self.MIN_BITS <= b <= self.MAX_BITS:
            raise InvalidError(f"bits must be an int in {self.MIN_BITS}..{self.MAX_BITS}, got {b!r}")

    @property
    def prefix_count(self) -> int:
        """How many distinct leading prefixes the strategy spreads shards over."""
        return 1 << self.bits

    def hash_prefix(self, cluster_uuid: str, index_uuid: str, shard: int, kind: str) -> str:
        """The leading part: first ``bits`` bits of sha256 of ``cluster/index/shard/kind`` in hex."""
        identity = f"{cluster_uuid}/{index_uuid}/{shard}/{kind}".encode()
        top = int.from_bytes(hashlib.sha256(identity).digest()[:8], "big") >> (64 - self.bits)
        return format(top, "x").zfill((self.bits + 3) // 4)

    def _wrap(self, plain: str, cluster_uuid: str, index_uuid: str, shard: int, kind: str) -> str:
        return f"{self.hash_prefix(cluster_uuid, index_uuid, shard, kind)}/{plain}"

    def _params(self) -> dict[str, Any]:
        return {"bits": self.bits}

    @classmethod
    def _from_params(cls, params: dict[str, Any]) -> PathStrategy:
        extra = set(params) - {"bits"}
        if extra or "bits" not in params:
            raise InvalidError(
                f"path strategy 'hashed_prefix' takes exactly 'bits', got {sorted(params)}"
            )
        return cls(bits=params["bits"])


_TYPES: dict[str, type[PathStrategy]] = {
    PlainPathStrategy.name: PlainPathStrategy,
    HashedPrefixPathStrategy.name: HashedPrefixPathStrategy,
}

__all__ = [
    "FORMAT_VERSION",
    "INVERTED_WIDTH",
    "KINDS",
    "MAX_INVERTIBLE",
    "TERM_MARKER_DIR",
    "HashedPrefixPathStrategy",
    "PathStrategy",
    "PlainPathStrategy",
    "invert",
    "latest_term",
    "parse_term_marker_key",
    "term_marker_key",
    "uninvert",
]
