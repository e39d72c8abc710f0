"""``oci://bucket/prefix``: Oracle Cloud Object Storage through its S3-compatible API.

The endpoint is ``https://<namespace>.compat.objectstorage.<region>.oraclecloud.com``
with path-style addressing and SigV4 signing; ``endpoint_url`` overrides it (that is
how tests reach an emulator).  Keys are "Customer Secret Keys" (an access key id and
secret), from options or the AWS-style environment and profiles.  Everything else,
including If-None-Match conditional create and keeping the keys out of logs and errors,
is the S3 store's.
"""

from __future__ import annotations

from typing import Any

from shardstore.blobstores.errors import ConfigError
from shardstore.blobstores.options import Option
from shardstore.plugins.s3 import S3_OPTIONS, S3Store


def oci_endpoint(namespace: str, region: str) -> str:
    """The S3-compatible endpoint of an OCI Object Storage namespace in a region."""
    return f"https://{namespace}.compat.objectstorage.{region}.oraclecloud.com"


class OCIStore(S3Store):
    """A store in an OCI Object Storage bucket, spoken to as S3."""

    scheme = "oci"
    OPTIONS = {
        **{k: v for k, v in S3_OPTIONS.items() if k not in ("addressing_style", "anon")},
        "namespace": Option("namespace", str, None, "Object Storage namespace of the tenancy"),
    }

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        o = self.options
        if not o["endpoint_url"]:
            if not (o["namespace"] and o["region"]):
                raise ConfigError(
                    "OCI needs the options namespace and region (or endpoint_url)", location=self.location
                )
            o["endpoint_url"] = oci_endpoint(o["namespace"], o["region"])

    def _s3_config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        client, config = super()._s3_config()
        config.update(
            {
                "s3": {"addressing_style": "path"},
                "signature_version": "s3v4",
                # OCI rejects the flexible checksums newer botocore adds by default.
                "request_checksum_calculation": "when_required",
                "response_checksum_validation": "when_required",
            }
        )
        return client, config
