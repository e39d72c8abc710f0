"""``s3://bucket/prefix``: Amazon S3 and S3-compatible services, through s3fs.

Conditional create is S3's native ``If-None-Match: *`` on PutObject (and on
CompleteMultipartUpload for streamed writes); the writer token rides in user metadata
(``x-amz-meta-shardstore-writer``).  Listing uses ListObjectsV2 with ``StartAfter`` and
1,000-key pages; deletes use DeleteObjects, 1,000 keys a request.  botocore's and s3fs's
own retries are off: RetryingStore decides.  Credentials come from options or from
botocore's chain (environment, profiles, instance metadata).  Credentials given as options
are scrubbed from every log record (botocore logs them at DEBUG in each request's headers)
and from client-setup errors: see :mod:`shardstore.blobstores.redact`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fsspec.asyn import sync

from shardstore.blobstores.base import WRITER_METADATA, BlobInfo
from shardstore.blobstores.errors import ConfigError
from shardstore.blobstores.fsspec_store import FsspecStore
from shardstore.blobstores.keys import relative_to_root
from shardstore.blobstores.options import Option

PAGE = 1000  # ListObjectsV2 and DeleteObjects both take at most 1,000 keys

#: What an S3 error code means where it says more than the HTTP status (see fsspec_store._typed).
_CODE_KINDS = {
    "NoSuchBucket": "bucket_missing",
    "NoSuchKey": "not_found",
    "NotFound": "not_found",
    "PreconditionFailed": "exists",
    "InvalidRange": "range",
    **dict.fromkeys(("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                     "TooManyRequests", "TooManyRequestsException", "ServiceUnavailable"), "throttled"),
    **dict.fromkeys(("InternalError", "RequestTimeout", "RequestTimeTooSkewed", "ConditionalRequestConflict",
                     "OperationAborted", "BadDigest"), "transient"),
    **dict.fromkeys(("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                     "InvalidToken", "AllAccessDisabled", "AccountProblem"), "denied"),
}

S3_OPTIONS = {
    "endpoint_url": Option("endpoint_url", str, None, "service endpoint (S3-compatible stores, emulators)"),
    "region": Option("region", str, None, "region name (default: the SDK's chain)"),
    "key": Option("key", str, None, "access key id (default: the SDK's chain)", secret=True),
    "secret": Option("secret", str, None, "secret access key (default: the SDK's chain)", secret=True),
    "token": Option("token", str, None, "session token", secret=True),
    "profile": Option("profile", str, None, "profile in ~/.aws/config"),
    "anon": Option("anon", bool, False, "unsigned requests (public buckets)"),
    "addressing_style": Option("addressing_style", str, None, "auto, path or virtual"),
}


class S3Store(FsspecStore):
    """A store in an S3 bucket under a prefix."""

    scheme = "s3"
    OPTIONS = S3_OPTIONS

    def _s3_config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(client_kwargs, config_kwargs) for s3fs."""
        o = self.options
        client: dict[str, Any] = {}
        if o["region"]:
            client["region_name"] = o["region"]
        config: dict[str, Any] = {"retries": {"total_max_attempts": 1}}
        if o.get("addressing_style"):
            if o["addressing_style"] not in ("auto", "path", "virtual"):
                raise ConfigError("addressing_style must be auto, path or virtual", location=self.location)
            config["s3"] = {"addressing_style": o["addressing_style"]}
        return client, config

    def _make_fs(self) -> Any:
        """s3fs making one attempt per call, its session open and the request hook installed."""
        o = self.options
        client, config = self._s3_config()
        fs = _single_attempt_s3fs()(
            skip_instance_cache=True,
            key=o["key"],
            secret=o["secret"],
            token=o["token"],
            profile=o["profile"],
            anon=o.get("anon", False),
            endpoint_url=o["endpoint_url"],
            client_kwargs=client,
            config_kwargs=config,
            use_listings_cache=False,
            version_aware=False,
        )
        sync(fs.loop, fs.set_session)
        fs.s3.meta.events.register("before-send.s3", self._before_send)
        return fs

    def _before_send(self, request: Any, **_: Any) -> None:
        """botocore hook: count the HTTP request (returning None lets it go out)."""
        self._on_request(request.method, request.url)

    def _close_fs(self, fs: Any) -> None:
        sync(fs.loop, fs.s3.close)

    def _read(self, key: str, start: int | None, length: int | None, version: str | None = None) -> bytes:
        """One GetObject (ranged, and If-Match pinned to ``version`` when given)."""
        self._path(key)
        params: dict[str, Any] = {"Bucket": self.url.bucket, "Key": self._full(key)}
        if start is not None:
            params["Range"] = f"bytes={start}-{start + (length or 0) - 1}"
        if version:
            params["IfMatch"] = f'"{version}"'
        fs = self.fs

        async def get() -> bytes:
            resp = await fs._call_s3("get_object", **params)
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()

        data = self._call(key, self._run, get)
        self._metrics.add("bytes_in", len(data))
        return data

    def _classify(self, exc: BaseException, key: str | None) -> Any:
        response = getattr(exc, "response", None)
        if not isinstance(response, dict) or "Error" not in response:
            return None
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = str(response.get("Error", {}).get("Message", "")) or code
        return self._typed(_CODE_KINDS.get(code), status, f"{code or status}: {message}", key)

    def _api(self, key: str | None, op: str, **params: Any) -> dict[str, Any]:
        """One S3 API call with translated errors."""
        return self._call(key, self.fs.call_s3, op, Bucket=self.url.bucket, **params)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """PutObject (multipart above 100 MiB), with If-None-Match: * when ``if_absent``."""
        path = self._path(key)
        extra: dict[str, Any] = {"Metadata": {WRITER_METADATA: token}} if token else {}
        out = self._call(key, self.fs.pipe_file, path, data, mode="create" if if_absent else "overwrite", **extra)
        self._metrics.add("bytes_out", len(data))
        etag = out.get("ETag") if isinstance(out, dict) else None
        if etag is None:
            return self.stat(key)
        return BlobInfo(key, len(data), etag.strip('"'), token)

    def _stream_kwargs(self, token: str | None) -> dict[str, Any]:
        return {"Metadata": {WRITER_METADATA: token}} if token else {}

    def stat(self, key: str) -> BlobInfo:
        """HeadObject: size, ETag and the writer token."""
        full = self._full(self._check(key))
        head = self._api(key, "head_object", Key=full)
        meta = head.get("Metadata") or {}
        return BlobInfo(key, int(head["ContentLength"]), str(head.get("ETag", "")).strip('"'), meta.get(WRITER_METADATA))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """ListObjectsV2 pages of 1,000, starting after ``start_after`` on the server."""
        self._check_prefix(prefix)
        root = self.url.prefix + "/" if self.url.prefix else ""
        params: dict[str, Any] = {"Prefix": root + prefix, "MaxKeys": PAGE}
        if start_after is not None and start_after >= prefix:
            params["StartAfter"] = root + start_after
        while True:
            page = self._api(prefix or None, "list_objects_v2", **params)
            for item in page.get("Contents", ()):
                yield BlobInfo(item["Key"][len(root):], int(item["Size"]), str(item.get("ETag", "")).strip('"'))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            params["ContinuationToken"] = token

    def delete(self, keys: Iterable[str]) -> None:
        """DeleteObjects, 1,000 keys a request; missing keys count as deleted."""
        full = [self._full(self._check(k)) for k in keys]
        for start in range(0, len(full), PAGE):
            batch = full[start : start + PAGE]
            out = self._api(
                batch[0], "delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            errors = [e for e in out.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                code, full_key = errors[0].get("Code", ""), errors[0].get("Key", "")
                rel = relative_to_root(self.url.prefix, full_key) if full_key else None
                detail = f"{code}: {errors[0].get('Message', '')} ({len(errors)} of {len(batch)} keys failed)"
                raise self._typed(_CODE_KINDS.get(code), None, detail, rel)


_S3FS: type | None = None


def _single_attempt_s3fs() -> type:
    """An S3FileSystem subclass making one attempt per call (RetryingStore retries)."""
    global _S3FS
    if _S3FS is None:
        import s3fs

        _S3FS = type("SingleAttemptS3FileSystem", (s3fs.S3FileSystem,), {"retries": 1})
    return _S3FS
