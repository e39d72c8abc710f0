"""Pure decisions for conditional create (put-if-absent) and its ambiguous retries.

A conditional put whose first attempt failed in an ambiguous way (timeout, connection
reset, 5xx: the write may or may not have landed) and whose retry then gets "already
exists" must not report a false conflict when the blob there is its own.  The writer
tags every conditional put with a unique token, stored as blob metadata where the
service keeps it; where it does not (the local filesystem), the bytes themselves are
compared.  See docs/design/blobstores.md, "Conditional create".
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

from shardstore.blobstores.base import BlobInfo


def default_writer_id() -> str:
    """A writer id unique to this process: host, pid and a random suffix."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def new_token(writer_id: str) -> str:
    """A token unique to one put call of ``writer_id``."""
    return f"{writer_id}/{uuid.uuid4().hex}"


def is_own_write(
    existing: BlobInfo, token: str, data: bytes | None, fetch: Callable[[], bytes]
) -> bool:
    """Decide whether the blob found at the key is this writer's earlier attempt.

    With a stored token the answer is exact.  Without one (a backend with no metadata),
    the blob is ours when its bytes equal ours; ``data`` None (a consumed stream) then
    means we cannot tell, which counts as not ours (a conflict is the safe answer).
    """
    if existing.writer is not None:
        return existing.writer == token
    if data is None or existing.size != len(data):
        return False
    return fetch() == data
