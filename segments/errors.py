"""Typed errors of segments, commit points and the remote segment store.

Each class sits under one kind of :mod:`shardstore.errors`, so a caller may catch by
subsystem (``SegmentError``) or by what to do about it (``InvalidError``...).
"""

from __future__ import annotations

from shardstore.core.records import RecordCorrupted
from shardstore.errors import (
    ConflictError,
    InvalidError,
    NotFoundError,
    ShardstoreError,
    UnavailableError,
)


class SegmentError(ShardstoreError):
    """Base of every segments error."""


class MappingConflict(SegmentError, InvalidError):
    """A value does not fit the type its field is mapped to; nothing of its batch was applied."""

    def __init__(self, field: str, doc_id: str | None, mapped: str, found: str) -> None:
        who = f"document {doc_id!r}" if doc_id is not None else "a document"
        super().__init__(
            f"field {field!r} of {who}: value of type {found} conflicts with the mapped type {mapped}; "
            f"nothing of this batch was applied"
        )
        self.field = field
        self.doc_id = doc_id
        self.mapped = mapped
        self.found = found


class InvalidDocument(SegmentError, InvalidError):
    """A document is malformed (no id, source not a JSON object...); nothing of its batch was applied."""

    def __init__(self, index: int | None, doc_id: str | None, reason: str) -> None:
        where = "the batch" if index is None else f"document {index}" + (f" (id {doc_id!r})" if doc_id is not None else "")
        super().__init__(f"{where}: {reason}; nothing of this batch was applied")
        self.index = index
        self.doc_id = doc_id
        self.reason = reason


class SegmentCorrupted(SegmentError, RecordCorrupted):
    """A segment, live-docs file, commit point or remote metadata failed its checksum or format check."""


class CommitNotFound(SegmentError, NotFoundError):
    """No (valid) commit exists where one was asked for; ``skipped``: (commit key, why) of each commit tried and refused."""

    def __init__(self, message: str, *, skipped: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.skipped = skipped


class CommitConflict(SegmentError, ConflictError):
    """Another writer committed first (the same commit name exists with other content, or a newer term owns the shard)."""


class TermAlreadyClaimed(CommitConflict):
    """An exclusive claim found its term's marker already written by another writer; nothing was written."""


class UploadCancelled(SegmentError, UnavailableError):
    """An upload stopped because its copy is closing; nothing of it is referenced by a commit, a retry may finish it."""
