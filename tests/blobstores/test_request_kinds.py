"""The pure HTTP-request classifier behind metrics(), on the URLs each SDK really sends."""

from __future__ import annotations

import pytest

from shardstore.blobstores.request_kinds import classify_request

CASES = [
    # S3 / OCI (path style)
    ("PUT", "http://h/bkt/p/key", "put"),
    ("GET", "http://h/bkt/p/key", "get"),
    ("HEAD", "http://h/bkt/p/key", "head"),
    ("GET", "http://h/bkt?list-type=2&prefix=p%2F&max-keys=1000", "list"),
    ("POST", "http://h/bkt?delete", "delete"),
    ("POST", "http://h/bkt/p/key?uploads", "put"),
    ("PUT", "http://h/bkt/p/key?partNumber=1&uploadId=x", "put"),
    ("POST", "http://h/bkt/p/key?uploadId=x", "put"),
    ("DELETE", "http://h/bkt/p/key?uploadId=x", "delete"),
    # GCS JSON API
    ("POST", "http://h/upload/storage/v1/b/bkt/o?uploadType=multipart", "put"),
    ("PUT", "http://h/upload/storage/v1/b/bkt/o?uploadType=resumable&upload_id=x", "put"),
    ("GET", "http://h/storage/v1/b/bkt/o/p%2Fkey", "head"),
    ("GET", "http://h/download/storage/v1/b/bkt/o/p%2Fkey?alt=media", "get"),
    ("GET", "http://h/storage/v1/b/bkt/o/p%2Fkey?alt=media&generation=1", "get"),
    ("GET", "http://h/storage/v1/b/bkt/o", "list"),
    ("DELETE", "http://h/storage/v1/b/bkt/o/p%2Fkey", "delete"),
    ("POST", "http://h/batch/storage/v1", "delete"),
    # Azure Blob
    ("PUT", "http://h/acct/cont/p/key", "put"),
    ("PUT", "http://h/acct/cont/p/key?comp=block&blockid=AAA", "put"),
    ("PUT", "http://h/acct/cont/p/key?comp=blocklist", "put"),
    ("GET", "http://h/acct/cont/p/key", "get"),
    ("HEAD", "http://h/acct/cont/p/key", "head"),
    ("GET", "http://h/acct/cont?restype=container&comp=list&prefix=p%2F", "list"),
    ("POST", "http://h/acct/cont?restype=container&comp=batch", "delete"),
    ("DELETE", "http://h/acct/cont/p/key", "delete"),
]


@pytest.mark.parametrize(("method", "url", "kind"), CASES)
def test_classify(method: str, url: str, kind: str) -> None:
    assert classify_request(method, url) == kind
    assert classify_request(method.lower(), url) == kind
