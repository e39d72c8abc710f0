"""The TCP fault proxy (shardstore.testing.tcp_proxy) against a real echo server and a real Flight pair.

Timing asserts are lower bounds only (a delay makes a round trip at least that slow), or
generous upper bounds where the point is "fails fast, not at the timeout".
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pyarrow.flight as flight
import pytest

from shardstore.testing.tcp_proxy import TcpFaultProxy

# -- a real echo server ------------------------------------------------------------------


class EchoServer:
    """Echoes every byte back on each connection; closes its side after the client's EOF."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()
        self.listener.close()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(2)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.stop()


@pytest.fixture
def echo_proxy(echo: EchoServer) -> Iterator[TcpFaultProxy]:
    with TcpFaultProxy(echo.address) as proxy:
        yield proxy


def connect(proxy: TcpFaultProxy, timeout: float = 5.0) -> socket.socket:
    host, port = proxy.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def assert_reset_on_connect(proxy: TcpFaultProxy) -> None:
    """A new connection is accepted by the kernel, then reset by the proxy.

    The RST can beat connect()'s return (it then raises) or come after (recv raises); same fault.
    """
    with pytest.raises(ConnectionResetError):
        with connect(proxy) as sock:
            sock.recv(10)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"EOF after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def round_trip(sock: socket.socket, data: bytes) -> float:
    start = time.monotonic()
    sock.sendall(data)
    assert recv_exactly(sock, len(data)) == data
    return time.monotonic() - start


def test_echo_passes_bytes_through_and_counts_them(echo_proxy: TcpFaultProxy) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: many chunks, back-pressure both ways
    with connect(echo_proxy) as a, connect(echo_proxy) as b:
        round_trip(a, b"hello")
        sender = threading.Thread(target=b.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(b, len(payload)) == payload
        sender.join()
        b.shutdown(socket.SHUT_WR)  # a half-close goes through: the server sees EOF and closes
        assert b.recv(10) == b""
    stats = echo_proxy.stats()
    assert stats.accepted == 2 and stats.refused == 0
    assert stats.bytes_upstream == stats.bytes_downstream == 5 + len(payload)
    assert stats.bytes_dropped == 0


def test_echo_delay_is_a_lower_bound_per_direction(echo_proxy: TcpFaultProxy) -> None:
    with connect(echo_proxy) as sock:
        round_trip(sock, b"warm")
        echo_proxy.delay(0.3)
        assert round_trip(sock, b"x") >= 0.6  # 0.3 each way
        echo_proxy.delay(0.0)
        echo_proxy.delay(0.3, direction="downstream")
        assert round_trip(sock, b"y") >= 0.3
        echo_proxy.heal()  # clears delays
        assert round_trip(sock, b"z") < 0.3
    with pytest.raises(ValueError):
        echo_proxy.delay(1, direction="sideways")


def test_echo_blackhole_discards_keeps_the_connection_and_heal_resets_it(echo_proxy: TcpFaultProxy) -> None:
    with connect(echo_proxy) as old:
        round_trip(old, b"before")
        echo_proxy.blackhole()
        old.sendall(b"lost")
        old.settimeout(0.5)
        with pytest.raises(TimeoutError):
            old.recv(10)
        assert echo_proxy.stats().active == 1  # still open
        assert echo_proxy.stats().bytes_dropped == 4
        echo_proxy.heal()
        old.settimeout(5)
        with pytest.raises(ConnectionResetError):  # its byte stream had a hole: heal RSTs it
            old.recv(10)
    with connect(echo_proxy) as new:
        assert round_trip(new, b"after") < 5


def test_echo_blackhole_hold_delivers_in_order_on_heal(echo_proxy: TcpFaultProxy) -> None:
    with connect(echo_proxy) as sock:
        echo_proxy.blackhole(hold=True)
        sock.sendall(b"one ")
        sock.sendall(b"two")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        echo_proxy.heal()
        sock.settimeout(5)
        assert recv_exactly(sock, 7) == b"one two"
    assert echo_proxy.stats().bytes_dropped == 0


def test_echo_reset_connections_sends_rst(echo_proxy: TcpFaultProxy) -> None:
    with connect(echo_proxy) as a, connect(echo_proxy) as b:
        round_trip(a, b"a")
        round_trip(b, b"b")
        assert echo_proxy.reset_connections() == 2
        for sock in (a, b):
            with pytest.raises(ConnectionResetError):  # RST, not a clean EOF (b"")
                sock.recv(10)
    assert echo_proxy.stats().active == 0
    with connect(echo_proxy) as c:
        round_trip(c, b"c")


def test_echo_refuse_resets_new_connections_only(echo_proxy: TcpFaultProxy) -> None:
    with connect(echo_proxy) as live:
        round_trip(live, b"live")
        echo_proxy.refuse(True)
        assert_reset_on_connect(echo_proxy)
        round_trip(live, b"still")  # an open connection keeps working
        echo_proxy.refuse(False)
        with connect(echo_proxy) as again:
            round_trip(again, b"again")
    assert echo_proxy.stats().refused == 1


def test_echo_unreachable_upstream_resets_the_client() -> None:
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens there now
    with TcpFaultProxy(f"127.0.0.1:{port}") as proxy:
        assert_reset_on_connect(proxy)
        assert proxy.stats().refused == 1


def test_stop_closes_everything_and_joins_within_a_second(echo: EchoServer) -> None:
    proxy = TcpFaultProxy(echo.address).start()
    socks = [connect(proxy) for _ in range(3)]
    for sock in socks:
        round_trip(sock, b"hi")
    proxy.delay(10)  # a pump waiting on a delay does not hold stop() up
    socks[0].sendall(b"held")
    start = time.monotonic()
    proxy.stop()
    assert time.monotonic() - start < 1.5
    assert not [t for t in threading.enumerate() if t.name.startswith("tcp-proxy-")]
    for sock in socks:
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        sock.close()
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.stop()  # idempotent


# -- a real Arrow Flight (gRPC, HTTP/2) pair -------------------------------------------------


class EchoFlight(flight.FlightServerBase):
    """do_action returns the body; a body b"sleep:S" sleeps S seconds first (set ``started`` then)."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.started = threading.Event()

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[flight.Result]:
        body = action.body.to_pybytes()
        if body.startswith(b"sleep:"):
            self.started.set()
            time.sleep(float(body[6:]))
        yield flight.Result(body)


@pytest.fixture
def flight_server() -> Iterator[EchoFlight]:
    server = EchoFlight()
    yield server
    server.shutdown()


@pytest.fixture
def flight_proxy(flight_server: EchoFlight) -> Iterator[TcpFaultProxy]:
    with TcpFaultProxy(f"127.0.0.1:{flight_server.port}") as proxy:
        yield proxy


def new_client(proxy: TcpFaultProxy) -> flight.FlightClient:
    return flight.connect(f"grpc://{proxy.address}")


def call(client: flight.FlightClient, body: bytes = b"ping", timeout: float = 10.0) -> bytes:
    results = list(client.do_action(flight.Action("echo", body), flight.FlightCallOptions(timeout=timeout)))
    return results[0].body.to_pybytes()


def test_flight_passes_through(flight_proxy: TcpFaultProxy) -> None:
    with new_client(flight_proxy) as client:
        for i in range(5):
            assert call(client, b"body %d" % i) == b"body %d" % i
    stats = flight_proxy.stats()
    assert stats.accepted == 1  # one HTTP/2 connection carries every call
    assert stats.bytes_upstream > 0 and stats.bytes_downstream > 0


def test_flight_delay_slows_a_round_trip(flight_proxy: TcpFaultProxy) -> None:
    with new_client(flight_proxy) as client:
        call(client)  # connect first: the delay is then on the call alone
        flight_proxy.delay(0.3)
        start = time.monotonic()
        assert call(client, b"slow") == b"slow"
        assert time.monotonic() - start >= 0.3


def test_flight_blackhole_times_out_and_heal_lets_a_new_call_through(flight_proxy: TcpFaultProxy) -> None:
    with new_client(flight_proxy) as client:
        call(client)
        flight_proxy.blackhole()
        # The connection stays open and silent, so gRPC waits for the deadline: DEADLINE_EXCEEDED,
        # which pyarrow raises as FlightTimedOutError (not Unavailable: nothing told it the link died).
        with pytest.raises(flight.FlightTimedOutError):
            call(client, b"lost", timeout=0.5)
        flight_proxy.heal()
        # heal() RSTs the connection that lost bytes; the client learns that asynchronously (a call
        # racing it fails Unavailable, as on any dropped link), so give it a moment, then it reconnects.
        time.sleep(0.5)
        assert call(client, b"after") == b"after"
    assert flight_proxy.stats().accepted == 2


def test_flight_blackhole_hold_resumes_the_same_connection(flight_proxy: TcpFaultProxy) -> None:
    with new_client(flight_proxy) as client:
        call(client)
        flight_proxy.blackhole(hold=True)
        with pytest.raises(flight.FlightTimedOutError):  # same as above: a silent link, the deadline passes
            call(client, b"held", timeout=0.5)
        flight_proxy.heal()
        assert call(client, b"after") == b"after"  # the held bytes arrive: HTTP/2 stays intact
    assert flight_proxy.stats().accepted == 1


def test_flight_reset_fails_the_call_in_flight_and_the_next_reconnects(
    flight_proxy: TcpFaultProxy, flight_server: EchoFlight
) -> None:
    with new_client(flight_proxy) as client:
        call(client)
        failure: list[BaseException] = []

        def in_flight() -> None:
            try:
                call(client, b"sleep:3")
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                failure.append(exc)

        caller = threading.Thread(target=in_flight)
        start = time.monotonic()
        caller.start()
        assert flight_server.started.wait(5)
        assert flight_proxy.reset_connections() == 1
        caller.join(10)
        # gRPC reports the RST as UNAVAILABLE ("Connection reset by peer"), before the server's reply was due.
        assert len(failure) == 1 and isinstance(failure[0], flight.FlightUnavailableError), failure
        assert time.monotonic() - start < 3
        assert call(client, b"next") == b"next"
    assert flight_proxy.stats().accepted == 2


def test_flight_refuse_fails_fast_with_unavailable(flight_proxy: TcpFaultProxy) -> None:
    flight_proxy.refuse(True)
    with new_client(flight_proxy) as client:
        start = time.monotonic()
        # The connection is closed right after accept: "failed to connect to all addresses", UNAVAILABLE,
        # at once rather than at the 10 s deadline.
        with pytest.raises(flight.FlightUnavailableError):
            call(client, timeout=10)
        assert time.monotonic() - start < 5
    assert flight_proxy.stats().refused >= 1
    flight_proxy.refuse(False)
    with new_client(flight_proxy) as client:  # a fresh client (the old one backs off before retrying)
        assert call(client, b"open") == b"open"
