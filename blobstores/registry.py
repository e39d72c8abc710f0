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
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
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


def _entry_points() -> dict[str, list[EntryPoint]]:
    """Scheme -> the entry points claiming it, one per distinct (distribution, target)."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        claims = found.setdefault(ep.name.lower(), [])
        # The same distribution seen twice on sys.path (e.g. a build dir) is not a conflict.
        if not any(_dist_name(c) == _dist_name(ep) and c.value == ep.value for c in claims):
            claims.append(ep)
    return found


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
        raise ConfigError(f"no blob-store plugin for scheme {scheme!r}; installed schemes: {installed}")
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
