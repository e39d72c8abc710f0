"""The one error hierarchy of shardstore.

Every error raised by shardstore derives from :class:`ShardstoreError`, and from one
of a few *kinds* a caller can act on:

=================  =====================================================  =========
kind               meaning                                                retryable
=================  =====================================================  =========
ConflictError      someone else got there first (a key exists, a term     no
                   moved on); re-read state before trying again
UnavailableError   the service is throttling or did not answer; the       yes
                   same request may succeed later
InvalidError       the request or the configuration is wrong; fix it      no
CorruptError       bytes read back fail their checksum or format check    no
NotFoundError      the thing asked for does not exist                     no
=================  =====================================================  =========

Subsystems add concrete classes under these kinds (``BlobAlreadyExists`` is a
``ConflictError`` and a ``BlobStoreError``), so a caller may catch either by subsystem
or by kind.  ``err.retryable`` says whether repeating the same call can help.
"""

from __future__ import annotations


class ShardstoreError(Exception):
    """Base class of every error shardstore raises."""

    retryable: bool = False


class ConflictError(ShardstoreError):
    """Another writer won: re-read the current state before retrying."""


class UnavailableError(ShardstoreError):
    """The service is throttling or unreachable; the same call may succeed later."""

    retryable = True


class InvalidError(ShardstoreError, ValueError):
    """The request or the configuration is invalid; retrying will not help."""


class CorruptError(ShardstoreError):
    """Bytes read back failed their checksum, magic or format check."""


class NotFoundError(ShardstoreError, LookupError):
    """The requested object does not exist."""


class LocalDiskError(UnavailableError):
    """A local write or fsync of a shard copy failed (disk full, I/O error).

    The copy that hit it is failed for good (its files may hold a torn write, and after a
    failed fsync the page cache cannot be trusted) and rebuilt elsewhere; what it had not
    acknowledged was not acknowledged.  Retrying reaches the shard's new primary.
    """

    def __init__(self, path: str, op: str, cause: BaseException) -> None:
        super().__init__(f"{path}: local {op} failed ({type(cause).__name__}: {cause}); this shard copy is failed "
                         f"and rebuilt from another copy or the store; free space or replace the disk of its node")
        self.path = path
        self.op = op


class TooManyOpenFiles(UnavailableError):
    """The process reached its open-file limit (``EMFILE``/``ENFILE``): not a disk fault, nothing is failed.

    Retry once files are released (fewer shard copies on this node), or raise the limit
    (``ulimit -n``; ``LimitNOFILE`` under systemd).  The message names the limit.
    """

    def __init__(self, what: str, cause: BaseException | None = None, *, needed: int | None = None) -> None:
        soft, hard = open_file_limit()
        need = f"; it needs about {needed} more" if needed is not None else ""
        why = f" ({cause})" if cause is not None else ""
        super().__init__(f"{what}: too many open files{why}: this process may open {soft} (hard limit {hard}){need}; "
                         f"raise it with `ulimit -n` (LimitNOFILE under systemd) or put fewer shard copies on "
                         f"this node, then retry")
        self.limit = soft


def open_file_limit() -> tuple[int, int]:
    """(soft, hard) open-file limit of this process (-1 where unknown or unlimited)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return -1, -1
    inf = resource.RLIM_INFINITY
    return (-1 if soft == inf else soft), (-1 if hard == inf else hard)


def is_too_many_open_files(exc: BaseException) -> bool:
    """Whether ``exc`` is the process (EMFILE) or the system (ENFILE) running out of file descriptors."""
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


class UnsupportedFormatVersion(CorruptError):
    """A record was written in a format version this build does not understand."""

    def __init__(self, what: str, found: int, supported: int) -> None:
        super().__init__(
            f"{what}: format version {found} is newer than the newest this build of "
            f"shardstore reads ({supported}); upgrade shardstore to read it"
        )
        self.found = found
        self.supported = supported
