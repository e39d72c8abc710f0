"""shardstore.translog: a term-stamped, sequence-numbered operation log (see docs/design/translog.md).

Entry points: :class:`LocalTranslog` (generation files of checksummed Arrow frames, an
atomically replaced checkpoint, group commit, torn-tail recovery, term trims),
:class:`RemoteTranslog` (acknowledges an append once its upload landed; reads a
shard's operations back from the blob store) with :class:`RemoteTranslogMetadata`, the
operation batches (:data:`SCHEMA`, :func:`index_batch`, :func:`unstamped_batch`,
:func:`stamp`, :func:`validate`) and :class:`LocalCheckpointTracker`.  Inside: frame,
record and checkpoint codecs (``frames``, ``records``, ``checkpoint``), the pure purge
rules (``purge``) and replay resolution (``replay``).  It builds on :mod:`shardstore.core`
(``OpType``, ``NO_OPS``), :mod:`shardstore.blobstores` and :mod:`shardstore.fileio`; it
imports neither the segments nor the engine.
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
