"""A real HTTP reverse proxy that can answer chosen requests with a throttling response.

It sits between a store and an emulator, forwards every request and response
unchanged (method, target, headers, body; a chunked request or response body is
de-chunked and sent with a Content-Length), and, when told, answers the next ``n``
requests matching a method and a target pattern with the *service's own* throttling
reply instead of forwarding them:

=========  ==================================================================
flavor     reply
=========  ==================================================================
s3, oci    ``503 Slow Down``, S3 XML error body with code ``SlowDown``
gcs        ``429 Too Many Requests``, JSON ``{"error": {"code": 429, "message":
           "rateLimitExceeded", "errors": [...reason "rateLimitExceeded"]}}``
azure      ``503 Server Busy``, header ``x-ms-error-code: ServerBusy``, XML body
=========  ==================================================================

So a store's error translation and retries are exercised end to end over HTTP, through
the same SDK code paths as a real throttled call.  ``drop_reply`` forwards a request
(it lands) and then closes the connection unanswered: the ambiguous "did my write
happen?" failure a conditional put must resolve.

>>> proxy = FaultProxy(emu.endpoint, "s3").start()                 # doctest: +SKIP
>>> store = open_store(url, **emu_via_proxy_options(emu, proxy))    # doctest: +SKIP
>>> proxy.throttle(2, method="PUT")                                 # doctest: +SKIP

The ``Host`` header is forwarded as the client sent it (it names the proxy), because
S3 signatures cover it; ``Location`` headers naming the upstream (GCS resumable
uploads) are rewritten to name the proxy, so follow-up requests come back through it.
Standard library only.
"""

from __future__ import annotations

import collections
import http.client
import json
import re
import socket
import threading
import uuid
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FLAVORS", "FaultProxy", "emu_via_proxy_options", "start_fault_proxy"]

FLAVORS = ("s3", "oci", "gcs", "azure")

# Hop-by-hop headers (RFC 9110 7.6.1) and Expect (the proxy answers 100-continue itself).
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


@dataclass
class _Rule:
    remaining: int
    method: str | None
    pattern: re.Pattern[str] | None
    action: str = "throttle"  # or "drop": forward, then close the connection unanswered
    fired: int = 0

    def matches(self, method: str, target: str) -> bool:
        return (
            self.remaining > 0
            and (self.method is None or self.method == method)
            and (self.pattern is None or self.pattern.search(target) is not None)
        )


@dataclass
class _Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def throttle_reply(flavor: str, method: str, target: str) -> _Reply:
    """The throttling response a service of ``flavor`` sends (see the module docstring)."""
    request_id = uuid.uuid4().hex.upper()[:16]
    date = formatdate(usegmt=True)
    if flavor in ("s3", "oci"):
        resource = urlsplit(target).path
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
            f"<Resource>{_xml_escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
            "<HostId>shardstore-fault-proxy</HostId></Error>"
        ).encode()
        headers = [
            ("x-amz-request-id", request_id),
            ("x-amz-id-2", "shardstore-fault-proxy"),
            ("Content-Type", "application/xml"),
            ("Date", date),
            ("Server", "AmazonS3"),
        ]
        return _Reply(503, "Slow Down", headers, body)
    if flavor == "gcs":
        body = json.dumps(
            {
                "error": {
                    "code": 429,
                    "message": "rateLimitExceeded",
                    "errors": [
                        {"message": "rateLimitExceeded", "domain": "usageLimits", "reason": "rateLimitExceeded"}
                    ],
                }
            }
        ).encode()
        headers = [("Content-Type", "application/json; charset=UTF-8"), ("Date", date)]
        return _Reply(429, "Too Many Requests", headers, body)
    if flavor == "azure":
        body = (
            '\ufeff<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
            "<Message>Operations per second is over the account limit.\n"
            f"RequestId:{request_id}\nTime:{date}</Message></Error>"
        ).encode("utf-8")
        headers = [
            ("Content-Type", "application/xml"),
            ("x-ms-error-code", "ServerBusy"),
            ("x-ms-request-id", request_id),
            ("x-ms-version", "2021-12-02"),
            ("Date", date),
            ("Server", "Windows-Azure-Blob/1.0 Microsoft-HTTPAPI/2.0"),
        ]
        return _Reply(503, "Server Busy", headers, body)
    raise ValueError(f"unknown flavor {flavor!r}; known: {', '.join(FLAVORS)}")


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: FaultProxy


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 300  # an idle client connection is dropped after this many seconds
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers: dropped
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)  # CRLF after the chunk
            return b"".join(parts)
        length = self.headers.get("Content-Length")
        return self.rfile.read(int(length)) if length else b""

    def _handle(self) -> None:
        proxy = self.server.owner
        method = self.command
        target = self.path
        body = self._read_body()
        action, reply = proxy._decide(method, target)
        if reply is None:
            reply = proxy._forward(method, target, list(self.headers.items()), body, "Content-Length" in self.headers)
        if action == "drop":
            # The request reached the service; its reply is lost: close without answering.
            proxy._record(method, target, -reply.status)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        proxy._record(method, target, reply.status)
        self.send_response_only(reply.status, reply.reason)
        sent_length = False
        no_body = method == "HEAD" or reply.status in (204, 304) or 100 <= reply.status < 200
        for name, value in reply.headers:
            low = name.lower()
            if low in _HOP:
                continue
            if low == "content-length":
                if not no_body:
                    continue  # replaced by the buffered body's length below
                sent_length = True
            self.send_header(name, value)
        if not no_body:
            self.send_header("Content-Length", str(len(reply.body)))
        elif not sent_length and method == "HEAD" and reply.status >= 400:
            self.send_header("Content-Length", "0")
        self.end_headers()
        if not no_body:
            self.wfile.write(reply.body)
        self.wfile.flush()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _handle


class FaultProxy:
    """Forward to ``upstream`` (``http://host:port``); throttle on request (see module doc)."""

    def __init__(self, upstream: str, flavor: str, *, host: str = "127.0.0.1", port: int = 0,
                 timeout: float = 300.0) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"unknown flavor {flavor!r}; known: {', '.join(FLAVORS)}")
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = f"http://{parts.hostname}:{parts.port or 80}"
        self.flavor = flavor
        self._up_host = parts.hostname
        self._up_port = parts.port or 80
        self._bind = (host, port)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._requests: collections.Counter[str] = collections.Counter()
        self._throttled: collections.Counter[str] = collections.Counter()
        self._dropped: collections.Counter[str] = collections.Counter()
        self._log: collections.deque[tuple[str, str, int]] = collections.deque(maxlen=10_000)
        self._conns: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen on a free port (or the one given) and serve in a daemon thread."""
        if self._server is not None:
            return self
        server = _Server(self._bind, _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"fault-proxy-{self.flavor}", daemon=True)
        self._thread.start()
        return self

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy (after start())."""
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop serving and drop open client connections; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint if self._server is not None else "stopped"
        return f"FaultProxy({self.flavor!r}, {where} -> {self.upstream})"

    # -- faults and counters -----------------------------------------------------------

    def throttle(self, n: int = 1, method: str | None = None, path: str | None = None) -> None:
        """Answer the next ``n`` requests matching ``method`` and ``path`` with a throttle.

        ``method`` is an HTTP method (None: any); ``path`` a regular expression searched
        in the request target, path and query string as sent (None: any).
        """
        self._arm(n, method, path, "throttle")

    def drop_reply(self, n: int = 1, method: str | None = None, path: str | None = None) -> None:
        """Forward the next ``n`` matching requests, then close the connection unanswered.

        The request lands at the service but the client sees the connection drop: the
        ambiguous failure (did my write happen?) that conditional puts must resolve.
        """
        self._arm(n, method, path, "drop")

    def _arm(self, n: int, method: str | None, path: str | None, action: str) -> None:
        if n < 0:
            raise ValueError("n must be >= 0")
        rule = _Rule(n, method.upper() if method else None, re.compile(path) if path else None, action)
        with self._lock:
            self._rules.append(rule)

    def pending(self) -> int:
        """Throttles and drops armed but not yet fired."""
        with self._lock:
            return sum(r.remaining for r in self._rules)

    def clear(self) -> None:
        """Disarm every pending throttle and drop."""
        with self._lock:
            self._rules.clear()

    @property
    def requests(self) -> dict[str, int]:
        """Requests received so far, by HTTP method (throttled ones included)."""
        with self._lock:
            return dict(self._requests)

    @property
    def throttled(self) -> dict[str, int]:
        """Throttle replies sent so far, by HTTP method."""
        with self._lock:
            return dict(self._throttled)

    @property
    def dropped(self) -> dict[str, int]:
        """Replies dropped so far (requests forwarded, connection closed), by HTTP method."""
        with self._lock:
            return dict(self._dropped)

    @property
    def total_requests(self) -> int:
        """All requests received so far."""
        with self._lock:
            return sum(self._requests.values())

    @property
    def log(self) -> list[tuple[str, str, int]]:
        """(method, target, status) of the last 10,000 requests, oldest first.

        A dropped reply is logged with the negated status the service had answered.
        """
        with self._lock:
            return list(self._log)

    def reset_counts(self) -> None:
        """Zero the request and throttle counters and the log (armed throttles stay)."""
        with self._lock:
            self._requests.clear()
            self._throttled.clear()
            self._dropped.clear()
            self._log.clear()

    # -- internals (called from handler threads) ------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _decide(self, method: str, target: str) -> tuple[str | None, _Reply | None]:
        with self._lock:
            self._requests[method] += 1
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.remaining -= 1
                    rule.fired += 1
                    break
            else:
                return None, None
            if rule.action == "drop":
                self._dropped[method] += 1
                return "drop", None
            self._throttled[method] += 1
        return "throttle", throttle_reply(self.flavor, method, target)

    def _record(self, method: str, target: str, status: int) -> None:
        with self._lock:
            self._log.append((method, target, status))

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes, had_length: bool
    ) -> _Reply:
        conn = http.client.HTTPConnection(self._up_host, self._up_port, timeout=self._timeout)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() in _HOP or name.lower() == "content-length":
                    continue
                conn.putheader(name, value)
            if had_length or body or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            out = []
            for name, value in resp.getheaders():
                if name.lower() == "location" and value.startswith(self.upstream):
                    value = self.endpoint + value[len(self.upstream):]
                out.append((name, value))
            return _Reply(resp.status, resp.reason, out, data)
        except (OSError, http.client.HTTPException) as exc:
            text = f"shardstore fault proxy: upstream {self.upstream} failed: {type(exc).__name__}: {exc}"
            return _Reply(502, "Bad Gateway", [("Content-Type", "text/plain")], text.encode())
        finally:
            conn.close()


def emu_via_proxy_options(emu: Any, proxy: FaultProxy) -> dict[str, Any]:
    """``emu.store_options()`` with the endpoint (Azure: the BlobEndpoint) at ``proxy``."""
    return emu.store_options(endpoint=proxy.endpoint)


def start_fault_proxy(emu: Any) -> FaultProxy:
    """A started proxy in front of emulator ``emu``, of the matching flavor."""
    return FaultProxy(emu.endpoint, emu.kind).start()
