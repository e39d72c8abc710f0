"""Pure classification of HTTP requests into the metric kinds put/get/list/delete/head.

Every cloud backend reports each HTTP request it sends (from the SDK's own per-request
hook) to this function, so ``metrics()`` counts what went on the wire, including the
parts of multipart uploads and the extra requests SDKs make on their own.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

_GCS_OBJECT_LIST = re.compile(r"/storage/v1/b/[^/]+/o$")
_GCS_OBJECT = re.compile(r"/storage/v1/b/[^/]+/o/.+")


def classify_request(method: str, url: str) -> str:
    """The metric kind of one HTTP request to S3, GCS or Azure Blob."""
    method = method.upper()
    parts = urlsplit(url)
    query = parse_qs(parts.query, keep_blank_values=True)
    if method == "HEAD":
        return "head"
    if method == "DELETE":
        return "delete"
    if method == "POST" and ("delete" in query or query.get("comp") == ["batch"] or parts.path.endswith("/batch/storage/v1")):
        return "delete"
    if method != "GET":
        return "put"  # PUT, POST (uploads, multipart initiate/complete), PATCH
    if "list-type" in query or query.get("comp") == ["list"] or _GCS_OBJECT_LIST.search(parts.path):
        return "list"
    if _GCS_OBJECT.search(parts.path) and query.get("alt") != ["media"] and "/download/" not in parts.path:
        return "head"  # a GCS object-resource GET: metadata only
    return "get"
