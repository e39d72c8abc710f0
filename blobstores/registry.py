"""Finding store plugins through the ``shardstore.blobstores`` entry-point group.

A plugin is a class implementing :class:`~shardstore.blobstores.base.BlobStore`, built as
``cls(url, **options)``.  Built-in backends and third-party ones register the same way,
in their distribution's metadata::

    [project.entry-points."shardstore.blobstores"]
    myscheme = "mypackage.store:MyStore"

The registry only reads metadata; a plugin's module is imported when its scheme is
first opened, so a broken third-party plugin cannot break the others.
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


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        # The first distribution on sys.path wins, as for imports.
        found.setdefault(ep.name.lower(), ep)
    return found


def schemes() -> list[str]:
    """The URL schemes of every installed plugin, sorted."""
    return sorted(_entry_points())


def plugins() -> list[PluginInfo]:
    """Every installed plugin with its providing package and version."""
    out = []
    for scheme, ep in sorted(_entry_points().items()):
        dist = ep.dist
        out.append(
            PluginInfo(
                scheme,
                ep.value,
                dist.metadata["Name"] if dist is not None else "?",
                dist.version if dist is not None else "?",
            )
        )
    return out


def plugin_class(scheme: str) -> type[BlobStore]:
    """Load the store class registered for ``scheme``; ConfigError if none is."""
    ep = _entry_points().get(scheme.lower())
    if ep is None:
        installed = ", ".join(schemes()) or "(none: is shardstore installed, not just on sys.path?)"
        raise ConfigError(f"no blob-store plugin for scheme {scheme!r}; installed schemes: {installed}")
    try:
        cls: Any = ep.load()
    except Exception as exc:
        raise ConfigError(f"the plugin for scheme {scheme!r} ({ep.value}) failed to import: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BlobStore)):
        raise ConfigError(f"the plugin for scheme {scheme!r} ({ep.value}) is not a BlobStore class")
    return cls
