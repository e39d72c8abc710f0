"""``az://container/prefix``: Azure Blob Storage, through adlfs and azure-storage-blob.

Conditional create is Azure's native ``If-None-Match: *`` (``upload_blob(overwrite=False)``);
the writer token is blob metadata.  Listing pages 1,000 blobs at a time; Azure has no
server-side "start after", so keys up to ``start_after`` are skipped client-side.
Deletes go as blob batches of up to 256.  The SDK's retry policy is set to zero retries:
RetryingStore decides.

Credentials: ``connection_string``, or ``account_name`` with ``account_key`` /
``sas_token``, else azure-identity's DefaultAzureCredential chain through adlfs.  The
account key, SAS tokens and their signatures (also inside a connection string) are
scrubbed from every log record and from client-setup errors: see
:mod:`shardstore.blobstores.redact` (azure-core already hides them in its own logs).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs

from fsspec.asyn import sync

from shardstore.blobstores.base import BlobInfo
from shardstore.blobstores.errors import AccessDenied, ConfigError
from shardstore.blobstores.fsspec_store import FsspecStore
from shardstore.blobstores.options import Option

PAGE = 1000
DELETE_BATCH = 256  # the Blob Batch API's limit
#: Azure metadata names must be C# identifiers, so no hyphen here.
WRITER_METADATA = "shardstore_writer"
#: What Azure error codes and exception classes mean beyond the status (see fsspec_store._typed).
_CODE_KINDS = {
    "ContainerNotFound": "bucket_missing",
    "BlobNotFound": "not_found",
    "BlobAlreadyExists": "exists",
    "ConditionNotMet": "exists",
    "InvalidRange": "range",
    "ServerBusy": "throttled",
    "OperationTimedOut": "throttled",
    "TooManyRequests": "throttled",
    "InternalError": "transient",
}
_NAME_KINDS = {
    "ResourceNotFoundError": "not_found",
    "ResourceExistsError": "exists",
    "ResourceModifiedError": "exists",
    "ClientAuthenticationError": "denied",
    "ServiceRequestError": "transient",
    "ServiceResponseError": "transient",
}


class AzureStore(FsspecStore):
    """A store in an Azure Blob container under a prefix."""

    scheme = "az"
    OPTIONS = {
        "connection_string": Option("connection_string", str, None, "a full connection string", secret=True),
        "account_name": Option("account_name", str, None, "storage account name"),
        "account_key": Option("account_key", str, None, "storage account key", secret=True),
        "sas_token": Option("sas_token", str, None, "shared access signature", secret=True),
        "account_host": Option("account_host", str, None, "blob endpoint host (sovereign clouds, emulators)"),
        "anon": Option("anon", bool, None, "anonymous access to a public container"),
        "batch_delete": Option(
            "batch_delete", bool, None, "use the Blob Batch API for deletes (default: on for *.core.windows.net)"
        ),
    }

    def _extra_secrets(self) -> list[str]:
        """The key, SAS and signature inside a connection string or SAS token (redacted like the options)."""
        return credential_parts(self.options)

    def _make_fs(self) -> Any:
        """adlfs whose service client makes one attempt per request."""
        o = self.options
        if not (o["connection_string"] or o["account_name"]):
            raise ConfigError("Azure needs connection_string or account_name", location=self.location)
        kwargs = {k: v for k, v in o.items() if v is not None and k != "batch_delete"}
        return _single_attempt_adlfs()(skip_instance_cache=True, **kwargs)

    @property
    def _hook(self) -> dict[str, Any]:
        """Per-operation keyword: azure-core calls it for every HTTP request the operation sends."""
        return {"raw_request_hook": self._on_azure_request}

    def _on_azure_request(self, request: Any) -> None:
        """azure-core hook: count the HTTP request."""
        self._on_request(request.http_request.method, request.http_request.url)

    def _close_fs(self, fs: Any) -> None:
        sync(fs.loop, fs.service_client.close)

    @property
    def container(self) -> str:
        """The container name (the URL's netloc)."""
        return self.url.bucket

    def _classify(self, exc: BaseException, key: str | None) -> Any:
        if not type(exc).__module__.startswith("azure."):
            return None
        name = type(exc).__name__
        status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
        raw_code = getattr(exc, "error_code", "") or ""
        code = str(getattr(raw_code, "value", raw_code))
        kind = _CODE_KINDS.get(code) or _NAME_KINDS.get(name)
        if kind is None and status is None:
            return None
        if name == "ClientAuthenticationError" and status is None:  # no service answer: no credential to send
            return AccessDenied(f"no usable Azure credential for account {self.options['account_name']!r} (azure-identity "
                                f"found none); give -o account_key=..., -o sas_token=... or -o connection_string=..., "
                                f"or sign in (az login)", location=self.location, key=key)
        return self._typed(kind, status, code or (str(status) if status is not None else name), key)

    def _blob(self, key: str) -> Any:
        return self.fs.service_client.get_blob_client(container=self.container, blob=self._full(key))

    def _read(self, key: str, start: int | None, length: int | None, version: str | None = None) -> bytes:
        """download_blob (ranged, and If-Match pinned to ``version`` when given)."""
        self._check(key)
        pin: dict[str, Any] = {}
        if version:
            from azure.core import MatchConditions

            pin = {"etag": f'"{version}"', "match_condition": MatchConditions.IfNotModified}

        async def download() -> bytes:
            async with self._blob(key) as bc:
                stream = await bc.download_blob(offset=start, length=length, max_concurrency=4, **pin, **self._hook)
                return await stream.readall()

        data = self._call(key, self._run, download)
        self._metrics.add("bytes_in", len(data))
        return data

    def _upload(self, key: str, source: Any, if_absent: bool, token: str | None) -> dict[str, Any]:
        """upload_blob of bytes or a stream; ``if_absent`` sends If-None-Match: * (on the commit for blocks)."""
        self._check(key)
        meta = {WRITER_METADATA: token} if token else None
        # The SDK sizes a regular file by its whole length, wherever it is positioned: a file read part-way
        # then sends fewer bytes than it announced and the request hangs until it times out (seen on
        # Azurite).  A seekable stream's length is what is left of it.
        length = None if isinstance(source, (bytes, bytearray, memoryview)) else _remaining(source)

        async def upload() -> dict[str, Any]:
            async with self._blob(key) as bc:
                return await bc.upload_blob(
                    source, length=length, overwrite=not if_absent, metadata=meta, max_concurrency=4, **self._hook
                )

        return self._call(key, self._run, upload)

    def put(self, key: str, data: bytes, *, if_absent: bool = False, token: str | None = None) -> BlobInfo:
        """One Put Blob (staged blocks above 64 MiB)."""
        res = self._upload(key, data, if_absent, token)
        self._metrics.add("bytes_out", len(data))
        return BlobInfo(key, len(data), str(res.get("etag", "")).strip('"'), token)

    def put_stream(
        self, key: str, readable: Any, *, if_absent: bool = False, token: str | None = None
    ) -> BlobInfo:
        """Stream as staged blocks and one commit."""
        self._upload(key, readable, if_absent, token)
        info = self.stat(key)
        self._metrics.add("bytes_out", info.size)
        return info

    def stat(self, key: str) -> BlobInfo:
        """Get Blob Properties: size, ETag and the writer token."""
        self._check(key)

        async def props() -> Any:
            async with self._blob(key) as bc:
                return await bc.get_blob_properties(**self._hook)

        p = self._call(key, self._run, props)
        return BlobInfo(key, int(p.size), str(p.etag).strip('"'), (p.metadata or {}).get(WRITER_METADATA))

    def list(self, prefix: str = "", *, start_after: str | None = None) -> Iterator[BlobInfo]:
        """List Blobs pages of 1,000; keys up to ``start_after`` are skipped client-side."""
        self._check_prefix(prefix)
        root = self.url.prefix + "/" if self.url.prefix else ""
        full_prefix = root + prefix
        skip_to = root + start_after if start_after is not None else None
        cc = self.fs.service_client.get_container_client(self.container)

        async def page(token: str | None) -> tuple[list[Any], str | None]:
            pager = cc.list_blobs(name_starts_with=full_prefix or None, results_per_page=PAGE,
                                  include=["metadata"], **self._hook).by_page(continuation_token=token)
            async for items in pager:
                return [b async for b in items], pager.continuation_token
            return [], None

        token: str | None = None
        while True:
            items, token = self._call(prefix or None, self._run, page, token)
            for b in items:
                if skip_to is not None and b.name <= skip_to:
                    continue
                yield BlobInfo(b.name[len(root):], int(b.size), str(b.etag).strip('"'),
                               (b.metadata or {}).get(WRITER_METADATA))
            if not token:
                return

    def _batch_delete(self) -> bool:
        """Whether to use Blob Batch: Azure has it, Azurite answers InvalidInput to it."""
        if self.options["batch_delete"] is not None:
            return bool(self.options["batch_delete"])
        host = self.fs.service_client.primary_hostname or ""
        return host.endswith(".core.windows.net")

    def delete(self, keys: Iterable[str]) -> None:
        """Blob batches of 256 deletes (one DELETE per blob where batches are unsupported)."""
        names = [self._full(self._check(k)) for k in keys]
        if not names:
            return
        cc = self.fs.service_client.get_container_client(self.container)

        async def batch(chunk: list[str]) -> list[int]:
            responses = await cc.delete_blobs(*chunk, raise_on_any_failure=False, **self._hook)
            return [r.status_code async for r in responses]

        async def one_by_one(chunk: list[str]) -> list[int]:
            gate = asyncio.Semaphore(16)

            async def drop(name: str) -> int:
                async with gate:
                    try:
                        await cc.delete_blob(name, **self._hook)
                    except Exception as exc:  # a missing blob is already deleted
                        if getattr(exc, "status_code", None) != 404:
                            raise
                return 202

            return list(await asyncio.gather(*(drop(n) for n in chunk)))

        use_batch = self._batch_delete()
        for start in range(0, len(names), DELETE_BATCH):
            chunk = names[start : start + DELETE_BATCH]
            for status in self._call(chunk[0], self._run, batch if use_batch else one_by_one, chunk):
                if status not in (200, 202, 404):
                    raise self._typed(None, status, f"batch delete answered {status} for a blob", None)


def credential_parts(options: Mapping[str, Any]) -> list[str]:
    """The secrets inside the options: a connection string's AccountKey and SAS, each SAS's signature."""
    parts: list[str] = []
    sas = [options.get("sas_token")]
    for item in str(options.get("connection_string") or "").split(";"):
        name, _, value = item.partition("=")
        name = name.strip().lower()
        if name == "accountkey":
            parts.append(value.strip())
        elif name == "sharedaccesssignature":
            sas.append(value.strip())
    for token in sas:
        if isinstance(token, str) and token:
            parts += [token, *parse_qs(token.lstrip("?")).get("sig", [])]
    return parts


_ADLFS: type | None = None


def _single_attempt_adlfs() -> type:
    """An AzureBlobFileSystem whose service client makes one attempt per request."""
    global _ADLFS
    if _ADLFS is None:
        import adlfs

        def do_connect(self: Any) -> None:
            adlfs.AzureBlobFileSystem.do_connect(self)
            self.service_client._config.retry_policy.total_retries = 0

        _ADLFS = type("SingleAttemptAzureBlobFileSystem", (adlfs.AzureBlobFileSystem,), {"do_connect": do_connect})
    return _ADLFS


def _remaining(readable: Any) -> int | None:
    """How many bytes a seekable stream holds from its position on (None if it cannot say)."""
    try:
        if not readable.seekable():
            return None
        here = readable.tell()
        end = readable.seek(0, os.SEEK_END)
        readable.seek(here)
    except (AttributeError, OSError, ValueError):
        return None
    return end - here
