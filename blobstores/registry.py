"""Finding store plugins through the ``shardstore.blobstores`` entry-point group.

A plugin is a class implementing :class:`~shardstore.blobstores.base.BlobStore`, built as
``cls(url, **options)``.  Built-in backends and third-party ones register the same way,
in their distribution's metadata::

    [project.entry-points."shardstore.blobstores"]
    myscheme = "mypackage.store:MyStore"

The registry only reads metadata; a plugin's module is imported when its scheme is
first opened, so a broken third-party plugin cannot break the others.  Two different
distributions claiming one scheme is a configuration error (which one would win
depends on directory listing order): opening that scheme raises ConfigError naming both.

The scan of installed metadata (a few milliseconds) is cached per value of ``sys.path``:
a distribution on a directory added to ``sys.path`` later is found without further ado,
but one installed at runtime into a directory already on ``sys.path`` (``pip install``
from within the process) is only seen after :func:`refresh`.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

from shardstore.blobstores.base import BlobStore
from shardstore.blobstores.errors import ConfigError

GROUP = "shardstore.blobstores"


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One registered scheme: where its class lives and which distribution provides it."""

    scheme: str
    target: str
    package: str
    version: str
    conflicts: tuple[str, ...] = ()


def _dist_name(ep: EntryPoint) -> str:
    return ep.dist.metadata["Name"] if ep.dist is not None else "?"


@functools.lru_cache(maxsize=8)
def _scan(path: tuple[str, ...]) -> Mapping[str, tuple[EntryPoint, ...]]:
    """Scheme -> the entry points claiming it, one per distinct (distribution, target).

    ``path`` is ``tuple(sys.path)`` at the time of the call: it is only the cache key
    (``entry_points`` reads ``sys.path`` itself), so a changed ``sys.path`` rescans.
    """
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        claims = found.setdefault(ep.name.lower(), [])
        # The same distribution seen twice on sys.path (e.g. a build dir) is not a conflict.
        if not any(_dist_name(c) == _dist_name(ep) and c.value == ep.value for c in claims):
            claims.append(ep)
    # Read-only: the result is shared by every caller until the cache is cleared.
    return MappingProxyType({scheme: tuple(claims) for scheme, claims in found.items()})


def _entry_points() -> Mapping[str, tuple[EntryPoint, ...]]:
    """The (cached) scan of the entry-point group for the current ``sys.path``."""
    return _scan(tuple(sys.path))


def refresh() -> None:
    """Forget the cached plugin scan (and the import system's directory caches).

    Needed only after a distribution was installed, removed or changed at runtime in a
    directory that was already on ``sys.path``; a new ``sys.path`` entry is seen anyway.
    """
    _scan.cache_clear()
    importlib.invalidate_caches()


def schemes() -> list[str]:
    """The URL schemes of every installed plugin, sorted."""
    return sorted(_entry_points())


def plugins() -> list[PluginInfo]:
    """Every installed plugin with its providing package, version and any conflicting claims."""
    out = []
    for scheme, claims in sorted(_entry_points().items()):
        ep = claims[0]
        others = tuple(f"{_dist_name(c)} ({c.value})" for c in claims[1:])
        out.append(
            PluginInfo(scheme, ep.value, _dist_name(ep), ep.dist.version if ep.dist is not None else "?", others)
        )
    return out


def plugin_class(scheme: str) -> type[BlobStore]:
    """Load the store class registered for ``scheme``; ConfigError if none or several are."""
    claims = _entry_points().get(scheme.lower())
    if not claims:
        installed = ", ".join(schemes()) or "(none: is shardstore installed, not just on sys.path?)"
        raise ConfigError(
            f"no blob-store plugin for scheme {scheme!r}; installed schemes: {installed} (`shardstore plugins` "
            "lists them; a plugin installed into a running process: shardstore.blobstores.registry.refresh())"
        )
    if len(claims) > 1:
        who = ", ".join(f"{_dist_name(c)} ({c.value})" for c in claims)
        raise ConfigError(f"scheme {scheme!r} is claimed by several distributions: {who}; uninstall all but one")
    ep = claims[0]
    try:
        cls: Any = ep.load()
    except Exception as exc:
        raise ConfigError(f"the plugin for scheme {scheme!r} ({ep.value}) failed to import: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BlobStore)):
        raise ConfigError(f"the plugin for scheme {scheme!r} ({ep.value}) is not a BlobStore class")
    return cls
