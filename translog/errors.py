"""Typed errors of the translog, under the kinds of :mod:`shardstore.errors`."""

from __future__ import annotations

from shardstore.errors import ConflictError, CorruptError, InvalidError, ShardstoreError, UnavailableError


class TranslogError(ShardstoreError):
    """Base of every translog error."""


class InvalidOperation(TranslogError, InvalidError):
    """An operation of a batch is malformed; nothing of the batch was written."""

    def __init__(self, index: int | None, doc_id: str | None, reason: str) -> None:
        where = "the batch" if index is None else f"operation {index}" + (f" (id {doc_id!r})" if doc_id is not None else "")
        super().__init__(f"{where}: {reason}; nothing of this batch was written")
        self.index = index
        self.doc_id = doc_id
        self.reason = reason


class StaleTerm(TranslogError, ConflictError):
    """An operation carries a primary term lower than the one the log already knows."""


class TranslogCorruptedError(TranslogError, CorruptError):
    """Bytes of a translog file or blob fail their checksum or format check."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class TranslogUnavailable(TranslogError, UnavailableError):
    """The translog cannot make operations durable right now (disk or remote store failing)."""
