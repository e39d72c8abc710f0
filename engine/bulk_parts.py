"""One bulk's parts for several shards sent to each primary node at once (``shard.bulk_many``, issue 30).

A bulk over many shards used to cost one ``shard.bulk`` per shard, each waiting for its own
translog upload.  Grouping the parts by the node holding each shard's primary lets that node
stage them all before its upload round starts, so the bulk costs one round per node.  The
pieces here are the wire shape of a part's result and the grouping; the routers
(``Cluster``, ``Coordinator``) send, and the nodes (``local_node``, ``node_service``) answer.

A part's result is ``{"ops": stamped}`` or ``{"error": "Type: message", "retry": bool}``;
``retry`` is true only when nothing of the part was applied (no primary there), so the
router may send that part again through the one-shard path, which waits out a failover.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardstore.engine.errors import ShardUnavailable


class PartFailed(Exception):
    """One part of a multi-shard bulk failed on its node (the message is the node's ``Type: message``)."""


def part_failure(exc: BaseException) -> dict[str, Any]:
    """The result of a part that failed with ``exc``."""
    return {"error": f"{type(exc).__name__}: {exc}", "retry": isinstance(exc, ShardUnavailable)}


def group_by_node(shards: Sequence[int], primary_of: Callable[[int], str | None]) -> dict[str | None, list[int]]:
    """Positions of ``shards`` grouped by the node holding each one's primary (None: no primary now)."""
    groups: dict[str | None, list[int]] = {}
    for i, s in enumerate(shards):
        groups.setdefault(primary_of(s), []).append(i)
    return groups


__all__ = ["PartFailed", "group_by_node", "part_failure"]
