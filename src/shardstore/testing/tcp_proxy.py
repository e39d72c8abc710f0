"""A byte-level TCP proxy that delays, drops and cuts the traffic between two nodes.

Node processes talk gRPC (Arrow Flight over HTTP/2) on 127.0.0.1; the HTTP/1.1
:mod:`shardstore.testing.fault_proxy` cannot carry that, so this proxy forwards raw bytes
and knows nothing of the protocol.  Point a node at :attr:`TcpFaultProxy.address` instead
of its peer's, and every accepted connection is paired with a fresh one to ``upstream``
and pumped both ways (``upstream``: client to server; ``downstream``: server to client).

Faults, thread-safe and changeable while connections are live:

- :meth:`~TcpFaultProxy.delay`: every chunk forwarded in a direction waits ``seconds``
  after it was read (order kept; chunks are pipelined, so it is latency, not a throughput cap).
- :meth:`~TcpFaultProxy.blackhole`: bytes (and FINs) are read and discarded, connections
  stay open: to a gRPC client a partition or a SIGSTOPped peer, so a call times out.
  ``blackhole(hold=True)`` keeps the bytes instead and delivers them, in order, on
  ``heal()``: a partition that heals within TCP's retransmission time, or SIGSTOP then
  SIGCONT (the peer then sees the requests that timed out at the caller).
- :meth:`~TcpFaultProxy.heal`: forward again and clear every delay.  A connection that
  lost bytes to a blackhole has a hole in its byte stream (HTTP/2 on it is corrupt: gRPC
  would fail a later call with a HPACK parse error), so heal resets it, as TCP would have
  dropped it after its retransmission timeout; the next call reconnects.
- :meth:`~TcpFaultProxy.reset_connections`: close every live connection, both sides,
  with a TCP RST (``SO_LINGER`` 0): a dropped link.
- :meth:`~TcpFaultProxy.refuse`: close new connections right after accept (with a RST).

:meth:`~TcpFaultProxy.stats` counts connections and bytes.  A test tool (it lives in
:mod:`shardstore.testing`, which no library package imports).  Standard library only.

>>> with TcpFaultProxy("127.0.0.1:8815") as proxy:                 # doctest: +SKIP
...     client = flight.connect(f"grpc://{proxy.address}")
...     proxy.blackhole()
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DIRECTIONS", "TcpFaultProxy", "TcpProxyStats"]

DIRECTIONS = ("upstream", "downstream")
_TICK = 0.05  # the longest any proxy thread sits in a syscall: how fast faults and stop() bite
_CHUNK = 65536
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


@dataclass(frozen=True)
class TcpProxyStats:
    """Counters of a :class:`TcpFaultProxy` since it was made."""

    accepted: int  # connections accepted and forwarded
    refused: int  # connections closed right after accept (refuse, or upstream unreachable)
    active: int  # connections open now
    bytes_upstream: int  # forwarded client -> server
    bytes_downstream: int  # forwarded server -> client
    bytes_dropped: int  # read and discarded by blackhole() (held bytes are not counted)


def _split(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {hostport!r}")
    return host.strip("[]"), int(port)


def _close(sock: socket.socket, *, rst: bool) -> None:
    try:
        if rst:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        sock.close()
    except OSError:
        pass


class _Link:
    """One proxied connection: the client's socket and ours to the upstream."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False
        self.lost = False  # bytes were discarded: the stream has a hole, heal() resets it
        self._open_directions = 2
        self._lock = threading.Lock()

    def close(self, *, rst: bool) -> bool:
        """Close both sockets once; False if already closed."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
        _close(self.client, rst=rst)
        _close(self.upstream, rst=rst)
        return True

    def direction_done(self) -> bool:
        """Mark one direction finished; True when it was the last one."""
        with self._lock:
            self._open_directions -= 1
            return self._open_directions == 0


class TcpFaultProxy:
    """Forward TCP connections from ``listen`` to ``upstream``, with faults on demand (see module doc)."""

    def __init__(self, upstream: str, listen: str = "127.0.0.1:0", *, connect_timeout: float = 5.0) -> None:
        self.upstream = upstream
        self._upstream = _split(upstream)
        self._listen = _split(listen)
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._delays = {d: 0.0 for d in DIRECTIONS}
        self._blackhole: str | None = None  # None, "drop" or "hold"
        self._refusing = False
        self._stopped = threading.Event()
        self._links: set[_Link] = set()
        self._threads: set[threading.Thread] = set()
        self._counts = collections.Counter[str]()
        self._listener: socket.socket | None = None
        self.address = ""

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> TcpFaultProxy:
        """Listen (a free port unless one was given) and accept in a daemon thread."""
        if self._listener is not None:
            return self
        listener = socket.create_server(self._listen, backlog=128)
        listener.settimeout(_TICK)
        self._listener = listener
        host, port = listener.getsockname()[:2]
        self.address = f"{host}:{port}"
        self._spawn(self._accept_loop, "accept")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and join the threads (within a second); idempotent."""
        if self._listener is None or self._stopped.is_set():
            return
        self._stopped.set()
        self._listener.close()
        self.reset_connections()
        deadline = time.monotonic() + 1.0
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> TcpFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"TcpFaultProxy({self.address or 'not started'} -> {self.upstream})"

    # -- faults and counters -----------------------------------------------------------

    def delay(self, seconds: float, direction: str = "both") -> None:
        """Hold every chunk forwarded in ``direction`` ("both", "upstream", "downstream") ``seconds``."""
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        targets = DIRECTIONS if direction == "both" else (direction,)
        if any(d not in DIRECTIONS for d in targets):
            raise ValueError(f"direction must be 'both', 'upstream' or 'downstream', got {direction!r}")
        with self._lock:
            for d in targets:
                self._delays[d] = float(seconds)

    def blackhole(self, hold: bool = False) -> None:
        """Stop forwarding both ways, connections kept open: discard the bytes, or ``hold`` them until heal()."""
        with self._lock:
            self._blackhole = "hold" if hold else "drop"

    def heal(self) -> None:
        """Forward again, clear every delay, and RST each connection that lost bytes to a blackhole."""
        with self._lock:
            self._blackhole = None
            self._delays = {d: 0.0 for d in DIRECTIONS}
            holed = {link for link in self._links if link.lost}
            self._links -= holed
        for link in holed:
            link.close(rst=True)

    def refuse(self, on: bool = True) -> None:
        """Close new connections right after accept (on) or forward them again (off)."""
        with self._lock:
            self._refusing = on

    def reset_connections(self) -> int:
        """Close every live connection, both sides, with a TCP RST; the number closed."""
        with self._lock:
            links, self._links = list(self._links), set()
        return sum(link.close(rst=True) for link in links)

    def stats(self) -> TcpProxyStats:
        """A snapshot of the counters."""
        with self._lock:
            c = self._counts
            return TcpProxyStats(c["accepted"], c["refused"], len(self._links),
                                 c["upstream"], c["downstream"], c["dropped"])

    # -- threads -----------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"tcp-proxy-{name}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed by stop()
            with self._lock:
                refusing = self._refusing
                self._counts["refused" if refusing else "accepted"] += 1
            if refusing:
                _close(client, rst=True)
            else:
                self._spawn(self._serve, "conn", client)

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=self._connect_timeout)
        except OSError:
            with self._lock:
                self._counts["accepted"] -= 1
                self._counts["refused"] += 1
            _close(client, rst=True)
            return
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(_TICK)
        link = _Link(client, upstream)
        with self._lock:
            if self._stopped.is_set():
                link.close(rst=True)
                return
            self._links.add(link)
        self._spawn(self._pump, "down", link, "downstream")
        self._pump(link, "upstream")

    def _pump(self, link: _Link, direction: str) -> None:
        """Copy one direction of ``link``, applying the faults; RST both sides on a socket error."""
        src, dst = (link.client, link.upstream) if direction == "upstream" else (link.upstream, link.client)
        pending: collections.deque[tuple[float, bytes]] = collections.deque()  # (read at, bytes); b"": EOF
        eof = done = False
        try:
            while not link.closed and not done:
                due: float | None = 0.0
                while pending:
                    due = self._due(link, direction, pending[0][0])
                    if due is not None and due > time.monotonic():
                        break
                    data = pending.popleft()[1]
                    if due is None:  # blackholed: discarded (a FIN too: the direction ends unseen)
                        self._count("dropped", len(data))
                        done = not data
                    elif data:
                        self._count(direction, len(data))  # first: a peer that has the bytes sees them counted
                        self._send(link, dst, data)
                    else:
                        dst.shutdown(socket.SHUT_WR)
                        done = True
                if done:
                    break
                timeout = _TICK if not pending or due is None else min(_TICK, max(0.001, due - time.monotonic()))
                if eof:
                    time.sleep(timeout)
                elif select.select([src], [], [], timeout)[0]:
                    try:
                        data = src.recv(_CHUNK)
                    except (TimeoutError, BlockingIOError):
                        continue
                    pending.append((time.monotonic(), data))
                    eof = not data
        except (OSError, ValueError):  # reset by a peer, or closed under us (ValueError: fd -1 in select)
            self._drop(link, rst=True)
            return
        if link.direction_done():
            self._drop(link, rst=False)

    def _due(self, link: _Link, direction: str, read_at: float) -> float | None:
        """When a chunk read at ``read_at`` may go (inf: held), or None: discard it (marks ``link`` lost)."""
        with self._lock:
            if self._blackhole == "drop":
                link.lost = True
                return None
            return float("inf") if self._blackhole == "hold" else read_at + self._delays[direction]

    def _send(self, link: _Link, sock: socket.socket, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if link.closed:
                raise OSError("link closed")
            try:
                view = view[sock.send(view):]
            except (TimeoutError, BlockingIOError):
                continue

    def _drop(self, link: _Link, *, rst: bool) -> None:
        with self._lock:
            self._links.discard(link)
        link.close(rst=rst)

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._counts[key] += n
