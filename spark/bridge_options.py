"""What the bridge's planner (:mod:`.bridge`) and the sink's fast path (:mod:`.fast_write`) share.

The bridge's JVM package (where its classes are found through Py4J) and the ``fastPath`` option
that decides, for reads and writes alike, whether the fast path is taken.  Both modules import
them from here; :mod:`.bridge` re-exports them (issue 42: the bridge imports the fast write, not
the other way round).
"""

from __future__ import annotations

from shardstore.errors import InvalidError

#: The bridge's JVM package; its classes exist only when the jar is on the driver's classpath.
JVM_PACKAGE = "io.shardstore.spark"
_FAST_PATH_VALUES = ("auto", "true", "false")


def use_fast_path(master: str, options: dict[str, str]) -> bool:
    """Whether a read takes the fast path: ``fastPath`` true/false, or auto (true on ``local[...]`` masters)."""
    value = next((str(v).strip().lower() for k, v in options.items() if str(k).lower() == "fastpath"), "auto")
    if value not in _FAST_PATH_VALUES:
        raise InvalidError(f"option fastPath={value!r}: expected one of {', '.join(_FAST_PATH_VALUES)}")
    if value == "auto":
        return master.startswith("local")
    return value == "true"


__all__ = ["JVM_PACKAGE", "use_fast_path"]
