"""Operation types and the "no operations" seq#, shared by the translog, the segments and the engine."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["NO_OPS", "OP_NAMES", "OpType"]

#: The seq# (and checkpoint) of a shard that holds no operation yet.
NO_OPS = -1


class OpType(IntEnum):
    """The kind of an operation (stored as int8 in translog frames and operation batches)."""

    INDEX = 0
    DELETE = 1
    NO_OP = 2


#: The name of each operation type, as the changes feed reports it.
OP_NAMES: dict[OpType, str] = {OpType.INDEX: "index", OpType.DELETE: "delete", OpType.NO_OP: "noop"}
