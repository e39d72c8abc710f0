"""Run moto's S3 server with conditional writes made atomic (``python -m`` entry point).

moto checks ``If-None-Match: *`` and stores the object in two separate steps, without
a lock, so concurrent conditional puts of one key can both succeed (measured: 2 rounds
in 300 of an 8-thread race had two winners).  Real S3, GCS and Azure decide the
condition atomically, so the emulator is made to as well: the two handlers that
evaluate write conditions (PutObject, and CompleteMultipartUpload, served by the POST
handler) run under one process-wide lock.  Nothing else of moto is changed.

Usage: ``python -m shardstore.testing._moto_server -H 127.0.0.1 -p PORT``.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

_LOCK = threading.RLock()


def _locked(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)

    return wrapper


def patch_conditional_writes() -> None:
    """Serialise moto's PutObject and POST-on-key (CompleteMultipartUpload) handlers."""
    from moto.s3.responses import S3Response

    for name in ("put_object", "_key_response_post"):
        fn = getattr(S3Response, name)
        if not getattr(fn, "_shardstore_locked", False):
            wrapped = _locked(fn)
            wrapped._shardstore_locked = True  # type: ignore[attr-defined]
            setattr(S3Response, name, wrapped)


def main(argv: list[str] | None = None) -> None:
    """Patch, then hand over to moto's own server entry point."""
    patch_conditional_writes()
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
