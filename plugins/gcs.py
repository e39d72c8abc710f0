"""``gs://bucket/prefix``: Google Cloud Storage, through gcsfs.

Conditional create is GCS's native ``ifGenerationMatch=0`` on a multipart upload (the
bytes in hand); the writer token is custom object metadata.  Listing uses the JSON
API's ``startOffset`` and 1,000-object pages.  gcsfs retries every request up to six
times inside ``_request``; this plugin uses a subclass whose ``_request`` makes one
attempt, so RetryingStore sees (and counts) every throttle.

Credentials: the ``token`` option (``"anon"``, ``"google_default"``, a service-account
JSON path, a raw access token, ...) as gcsfs takes it, else google-auth's default chain.
A raw token is scrubbed from every log record and from client-setup errors (gcsfs checks
it at ``/tokeninfo?access_token=...``, and a failed check quotes that URL): see
:mod:`shardstore.blobstores.redact`.

Emulator note: gcsfs stalls ~60 s per call against an emulator unless
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` is set before gcsfs is imported; this
module sets it (if unset) when ``endpoint_url`` is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from fsspec.asyn import sync

from shardstore.blobstores.base import WRITER_METADATA, BlobInfo
from shardstore.blobstores.errors import ConfigError
from shardstore.blobstores.fsspec_store import FsspecStore
from shardstore.blobstores.options import Option

PAGE = 1000
SIMPLE_UPLOAD_LIMIT = 32 * 1024 * 1024  # above this gcsfs uses a resumable upload
DELETE_BATCH = 100  # GCS batch requests hold at most 100 calls


class GCSStore(FsspecStore):
    """A store in a GCS bucket under a prefix."""

    scheme = "gs"
    _stream_extra_requests = 1  # a resumable upload: one initiating POST, then the chunks
    OPTIONS = {
        "endpoint_url": Option("endpoint_url", str, None, "service endpoint (emulators)"),
        "token": Option("token", str, None, "gcsfs token: anon, google_default, cloud, or a JSON key path", secret=True),
        "project": Option("project", str, None, "project id for bucket-level calls"),
    }

    def _make_fs(self) -> Any:
        """gcsfs making one attempt per request, the request counter hooked in."""
        o = self.options
        if o["endpoint_url"]:
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        kwargs: dict[str, Any] = {"token": o["token"], "use_listings_cache": False, "skip_instance_cache": True}
        if o["endpoint_url"]:
            kwargs["endpoint_url"] = o["endpoint_url"]
        if o["project"]:
            kwargs["project"] = o["project"]
        fs = _single_attempt_gcsfs()(**kwargs)
        fs.on_request = self._on_request
        return fs

    def _close_fs(self, fs: Any) -> None:
        session = getattr(fs, "_session", None)
        if session is not None:
            sync(fs.loop, session.close)

    def _pin_kwargs(self, version: str) -> dict[str, Any]:
        return {"generation": version}

    def _classify(self, exc: BaseException, key: str | None) -> Any:
        code = getattr(exc, "code", None)
        if type(exc).__name__ == "HttpError" and isinstance(code, int):
            message = str(getattr(exc, "message", "") or exc)[:300]
            return self._typed(None, code, f"{code}: {message}", key)
        if isinstance(exc, OSError) and str(exc).startswith("Forbidden"):
            return self._typed("denied", 403, "403", key)
        if type(exc).__name__ == "ProxyError":  # gcsfs raises it for 502
            return self._typed("transient", 502, "502 bad gateway", key)
        return None

    def _api(self, key: str | None, method: str, path: str, *args: str, **params: Any) -> Any:
        """One JSON-API call with translated errors."""
        return self._call(key, self.fs.call, method, path, *args, json_out=True, **params)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """A multipart upload (resumable above 32 MiB), with ifGenerationMatch=0 when ``if_absent``."""
        path = self._path(key)
        full = self._full(key)
        meta = {WRITER_METADATA: token} if token else None
        mode = "create" if if_absent else "overwrite"
        if len(data) <= SIMPLE_UPLOAD_LIMIT:
            from gcsfs.core import simple_upload

            res = self._call(key, self._run, simple_upload, self.fs, self.url.bucket, full, data, meta, mode=mode)
            self._metrics.add("bytes_out", len(data))
            return BlobInfo(key, int(res["size"]), str(res["generation"]), token)
        self._call(key, self.fs.pipe_file, path, data, metadata=meta, mode=mode)
        self._metrics.add("bytes_out", len(data))
        return self.stat(key)

    def _stream_kwargs(self, token: str | None) -> dict[str, Any]:
        return {"metadata": {WRITER_METADATA: token}} if token else {}

    def stat(self, key: str) -> BlobInfo:
        """GET of the object resource: size, generation and the writer token."""
        full = self._full(self._check(key))
        res = self._api(key, "GET", "b/{}/o/{}", self.url.bucket, full)
        return _info(key, res)

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """Pages of 1,000 objects from ``startOffset`` (inclusive, so the exact key is skipped)."""
        self._check_prefix(prefix)
        root = self.url.prefix + "/" if self.url.prefix else ""
        params: dict[str, Any] = {"prefix": root + prefix, "maxResults": PAGE}
        skip = None
        if start_after is not None and start_after >= prefix:
            params["startOffset"] = skip = root + start_after
        while True:
            page = self._api(prefix or None, "GET", "b/{}/o", self.url.bucket, **params)
            for item in page.get("items", ()):
                name = item["name"]
                if name == skip or not name.startswith(params["prefix"]):
                    continue
                yield _info(name[len(root):], item)
            token = page.get("nextPageToken")
            if not token:
                return
            params["pageToken"] = token

    def delete(self, keys: Iterable[str]) -> None:
        """Batch requests of 100 deletes on GCS (one DELETE per key on emulators); missing keys ignored."""
        paths = [self._path(k) for k in keys]
        if not paths:
            return
        fs = self.fs
        results = self._call(paths[0], self._run, fs._delete_files, paths, DELETE_BATCH)
        for res in results or ():
            if isinstance(res, Exception) and not isinstance(res, FileNotFoundError) and "No such object" not in str(res):
                raise self._error(res, None)


def _info(key: str, res: dict[str, Any]) -> BlobInfo:
    meta = res.get("metadata") or {}
    return BlobInfo(key, int(res["size"]), str(res.get("generation", "")), meta.get(WRITER_METADATA))


_GCSFS: type | None = None


def _single_attempt_gcsfs() -> type:
    """A GCSFileSystem subclass whose ``_request`` makes one attempt (RetryingStore retries)."""
    global _GCSFS
    if _GCSFS is None:
        import gcsfs

        wrapped = gcsfs.GCSFileSystem._request
        single = getattr(wrapped, "__wrapped__", None)
        if single is None:  # pragma: no cover - a gcsfs that changed its decorator
            raise ConfigError("this gcsfs version hides its request function; pin gcsfs>=2024.12")
        async def _request(fs: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            hook = getattr(fs, "on_request", None)
            if hook is not None:  # the store's request counter
                hook(method, fs._format_path(path, args))
            return await single(fs, method, path, *args, **kwargs)

        _GCSFS = type("SingleAttemptGCSFileSystem", (gcsfs.GCSFileSystem,), {"_request": _request})
    return _GCSFS
