"""shardstore.translog: a term-stamped, sequence-numbered operation log (see docs/design/translog.md).

Built so far: operation batches (``operations``), frame and checkpoint codecs
(``frames``, ``checkpoint``), the local checkpoint tracker (``tracker``), the pure purge
rules (``purge``), replay resolution (``replay``), the local translog (``local``) and the
remote translog (``remote``, ``remote_metadata``).
"""

from shardstore.translog.errors import (
    InvalidOperation,
    StaleTerm,
    TranslogCorruptedError,
    TranslogError,
    TranslogUnavailable,
)
from shardstore.translog.local import LocalTranslog
from shardstore.translog.operations import SCHEMA, OpType, index_batch, stamp, unstamped_batch, validate
from shardstore.translog.remote import RemoteTranslog
from shardstore.translog.remote_metadata import RemoteTranslogMetadata
from shardstore.translog.tracker import LocalCheckpointTracker

__all__ = [
    "SCHEMA",
    "InvalidOperation",
    "LocalCheckpointTracker",
    "LocalTranslog",
    "OpType",
    "RemoteTranslog",
    "RemoteTranslogMetadata",
    "StaleTerm",
    "TranslogCorruptedError",
    "TranslogError",
    "TranslogUnavailable",
    "index_batch",
    "stamp",
    "unstamped_batch",
    "validate",
]
