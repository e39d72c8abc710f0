"""FlightTransport over real Flight servers on 127.0.0.1: round trips, errors, delivered semantics, timeouts, pooling.

One test runs the peer in a real subprocess and SIGKILLs it, idle and mid-call.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from shardstore.errors import InvalidError, LocalDiskError
from shardstore.net import flight as net_flight
from shardstore.net import wire
from shardstore.net.flight import ANY_NODE, FlightTransport, ListenFailed, UnknownPeer
from shardstore.transport import InvalidTransportRequest, NodeDisconnected, NodeNotFound

REPO = Path(__file__).resolve().parents[2]
Make = Callable[..., FlightTransport]


class Handler:
    """A test node's handler: echoes, sleeps, raises on demand; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, action: str, request: Any) -> Any:
        with self.lock:
            self.calls += 1
        if action.startswith("slow"):
            time.sleep(request)
            return "slept"
        if action == "disk":
            raise LocalDiskError("/data/x", "fsync", OSError(5, "I/O error"))
        if action == "lost":
            raise NodeDisconnected("b", "c", "shard.replicate", "response dropped", delivered=True)
        if action == "plain":
            raise ValueError("not a shardstore error")
        if action == "unencodable":
            return object()
        return request


@pytest.fixture
def pair(transports: Make) -> tuple[FlightTransport, FlightTransport, Handler]:
    """Node ``a`` serving a :class:`Handler`, and a client transport knowing it."""
    handler = Handler()
    server = transports()
    server.register("a", handler)
    client = transports(peers={"a": server.address}, default_timeout=10)
    return server, client, handler


def test_round_trip_and_the_address_book(pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    server, client, handler = pair
    assert server.address is not None and server.address.startswith("127.0.0.1:")
    assert not server.address.endswith(":0")
    assert client.send("b", "a", "echo", {"ops": (1, 2), "b": b"x"}) == {"ops": (1, 2), "b": b"x"}
    assert client.nodes() == frozenset({"a"}) and client.is_registered("a") and not client.is_registered("b")
    assert server.nodes() == frozenset({"a"}) and server.local_node == "a"
    assert server.send("a", "a", "echo", 5) == 5  # to itself, over loopback
    assert client.peers() == {"a": server.address}
    st = client.stats()["echo"]
    assert (st.sent, st.responded, st.errors) == (1, 1, 0)
    assert server.stats()["echo"].delivered == 2
    client.remove_peer("a")
    with pytest.raises(NodeNotFound):
        client.remove_peer("a")


def test_a_1000_row_batch_round_trips(pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    _, client, _ = pair
    batch = pa.record_batch({"_id": [f"d{i}" for i in range(1000)], "seq": pa.array(range(1000), pa.int64())},
                            metadata={"index": "logs"})
    out = client.send("b", "a", "echo", {"rows": batch})["rows"]
    assert isinstance(out, pa.RecordBatch) and out.equals(batch) and out.schema.metadata == {b"index": b"logs"}


def test_big_frames_go_as_an_exchange(pair: tuple[FlightTransport, FlightTransport, Handler],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, client, _ = pair
    used: list[int] = []
    real = FlightTransport._exchange

    def spy(c: flight.FlightClient, action: str, frame: bytes, options: flight.FlightCallOptions) -> pa.Buffer:
        used.append(len(frame))
        return real(c, action, frame, options)

    monkeypatch.setattr(FlightTransport, "_exchange", staticmethod(spy))
    big = pa.table({"x": pa.array(range(200_000), pa.int64())})
    assert client.send("b", "a", "echo", big).equals(big)
    assert used and used[0] >= net_flight.EXCHANGE_OVER
    assert client.send("b", "a", "echo", "small") == "small" and len(used) == 1
    client.exchange_actions = ("ec*",)
    assert client.send("b", "a", "echo", "small") == "small" and len(used) == 2


def test_handler_exceptions_keep_their_class_and_attributes(
        pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    _, client, _ = pair
    with pytest.raises(LocalDiskError) as disk:
        client.send("b", "a", "disk", None)
    assert (disk.value.path, disk.value.op, disk.value.retryable) == ("/data/x", "fsync", True)
    with pytest.raises(NodeDisconnected) as lost:
        client.send("b", "a", "lost", None)
    assert (lost.value.sender, lost.value.target, lost.value.delivered) == ("b", "c", True)
    with pytest.raises(wire.RemoteError, match="not a shardstore error") as plain:
        client.send("b", "a", "plain", None)
    assert plain.value.remote_type == "builtins.ValueError"
    assert client.stats()["disk"].errors == 1


def test_values_that_cannot_travel(pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    _, client, handler = pair
    with pytest.raises(wire.WireUnencodable):
        client.send("b", "a", "echo", object())
    assert handler.calls == 0  # refused before sending
    with pytest.raises(wire.WireUnencodable, match="the handler ran"):
        client.send("b", "a", "unencodable", None)
    assert handler.calls == 1


def test_pooled_connections_are_reused(transports: Make) -> None:
    servers = [transports() for _ in range(2)]
    for i, s in enumerate(servers):
        s.register(f"n{i}", Handler())
    client = transports(peers={f"n{i}": s.address for i, s in enumerate(servers)})
    for k in range(30):
        assert client.send("c", f"n{k % 2}", "echo", k) == k
    assert client.clients_created == 2
    client.set_peer("n1", servers[0].address)  # n1's entry now points at n0's server (refused there)
    with pytest.raises(NodeDisconnected):
        client.send("c", "n1", "echo", 1)
    assert client.clients_created == 2  # n0's address: n0's pooled connection


def test_concurrent_sends_from_8_threads(pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    _, client, handler = pair
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                assert client.send(f"t{t}", "a", "echo", (t, i, b"x" * i)) == (t, i, b"x" * i)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == [] and handler.calls == 320 and client.clients_created == 1


def test_a_per_action_timeout_fires(transports: Make) -> None:
    server = transports()
    server.register("a", Handler())
    client = transports(peers={"a": server.address}, default_timeout=10, action_timeouts={"slow.*": 0.3})
    assert client.timeout_for("slow.x") == 0.3 and client.timeout_for("other") == 10
    assert client.timeout_for("slow.x", 2.0) == 2.0
    start = time.monotonic()
    with pytest.raises(NodeDisconnected) as err:
        client.send("b", "a", "slow.op", 3.0)
    assert time.monotonic() - start < 2.0
    assert err.value.delivered is None and "0.3" in err.value.reason
    assert client.stats()["slow.op"].timed_out == 1
    assert client.send("b", "a", "slowish", 0.5) == "slept"  # not matched by the glob: default timeout
    with pytest.raises(NodeDisconnected):
        client.send("b", "a", "slowish", 3.0, timeout=0.2)


def test_unknown_name_and_dead_port_are_not_delivered(transports: Make) -> None:
    client = transports(default_timeout=5)
    with pytest.raises(UnknownPeer) as err:
        client.send("b", "nobody", "echo", 1)
    assert isinstance(err.value, NodeDisconnected) and isinstance(err.value, NodeNotFound)
    assert err.value.delivered is False and err.value.node == "nobody" and err.value.retryable
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client.set_peer("dead", f"127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(NodeDisconnected) as dead:
        client.send("b", "dead", "echo", 1)
    assert dead.value.delivered is False and time.monotonic() - start < 2


def test_a_silent_peer_is_bounded_by_the_timeout(transports: Make) -> None:
    with socket.socket() as s:  # accepts TCP connections (backlog) but never speaks HTTP/2
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        client = transports(peers={"hole": f"127.0.0.1:{s.getsockname()[1]}"}, default_timeout=0.5)
        start = time.monotonic()
        with pytest.raises(NodeDisconnected) as err:
            client.send("b", "hole", "echo", 1)
        assert time.monotonic() - start < 3
        assert err.value.delivered in (None, False)


def test_a_wrong_address_book_entry_is_refused_before_the_handler(
        pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    server, client, handler = pair
    client.set_peer("z", server.address)  # z's entry points at a's server
    with pytest.raises(NodeDisconnected) as err:
        client.send("b", "z", "echo", 1)
    assert err.value.delivered is False and "hosts node 'a'" in err.value.reason and handler.calls == 0
    client.set_peer(f"{ANY_NODE}{server.address}", server.address)  # whichever node listens there
    assert client.send("b", f"{ANY_NODE}{server.address}", "echo", 7) == 7 and handler.calls == 1


def test_frames_the_server_cannot_read_are_refused_before_the_handler(
        pair: tuple[FlightTransport, FlightTransport, Handler]) -> None:
    server, _, handler = pair
    raw = flight.connect(f"grpc://{server.address}")
    frame = bytearray(wire.encode(1, meta={"sender": "b", "target": "a"}))
    from tests.net.test_wire import hand_frame
    future = hand_frame({"meta": {"sender": "b", "target": "a"}, "value": 1}, version=2)
    for body, kind in [(future, wire.WireVersionUnsupported), (bytes(frame[:-1]) + b"\0", wire.WireCorrupted)]:
        (result,) = raw.do_action(flight.Action("echo", body))
        with pytest.raises(kind):
            wire.decode_value(result.body)
    assert handler.calls == 0
    raw.close()


def test_register_unregister_and_restart(transports: Make) -> None:
    handler = Handler()
    server = transports()
    server.register("a", handler)
    with pytest.raises(InvalidTransportRequest, match="hosts node 'a' already"):
        server.register("b", handler)
    with pytest.raises(InvalidTransportRequest):
        server.register("", handler)
    with pytest.raises(NodeNotFound):
        server.unregister("b")
    client = transports(peers={"a": server.address}, default_timeout=5)
    in_flight: list[BaseException] = []

    def slow() -> None:
        try:
            client.send("b", "a", "slow", 0.6)
        except BaseException as exc:  # noqa: BLE001
            in_flight.append(exc)

    th = threading.Thread(target=slow)
    th.start()
    time.sleep(0.2)
    server.unregister("a")  # waits for the in-flight call, whose response is lost
    th.join(10)
    assert len(in_flight) == 1 and isinstance(in_flight[0], NodeDisconnected) and in_flight[0].delivered is True
    assert server.address is None and not server.is_registered("a")
    with pytest.raises(NodeDisconnected) as err:
        client.send("b", "a", "echo", 1)
    assert err.value.delivered is False
    server.register("a", handler)  # restart, on a new port
    client.set_peer("a", server.address)
    assert client.send("b", "a", "echo", 2) == 2


def test_a_handler_may_unregister_its_own_node(transports: Make) -> None:
    server = transports()
    server.register("a", lambda action, request: server.unregister("a"))
    client = transports(peers={"a": server.address}, default_timeout=5)
    with pytest.raises(NodeDisconnected) as err:
        client.send("b", "a", "die", None)
    assert err.value.delivered is True


def test_listen_on_a_port_in_use_fails_clearly(transports: Make) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        t = transports(listen=f"127.0.0.1:{s.getsockname()[1]}")
        with pytest.raises(ListenFailed) as err:
            t.register("a", Handler())
        assert isinstance(err.value, InvalidError)
    with pytest.raises(InvalidTransportRequest):
        FlightTransport(listen="nowhere")


# -- a peer in another process, SIGKILLed ------------------------------------------------------------

CHILD = """
import sys, time
from shardstore.net.flight import FlightTransport
def handler(action, request):
    if action == "slow":
        print("handling", flush=True)
        time.sleep(request)
    return request
t = FlightTransport()
t.register("child", handler)
print(t.address, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def child() -> Iterator[Callable[[], tuple[subprocess.Popen[str], str]]]:
    """Start a FlightTransport node in a real subprocess; returns (process, address)."""
    procs: list[subprocess.Popen[str]] = []

    def start() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        return proc, address

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _send_until_refused(client: FlightTransport, timeout: float) -> list[bool | None]:
    """Send until the dead peer refuses the connection; each send bounded by ``timeout``; the delivered values seen."""
    seen: list[bool | None] = []
    deadline = time.monotonic() + 3 * timeout
    while not seen or seen[-1] is not False:
        assert time.monotonic() < deadline, seen
        start = time.monotonic()
        with pytest.raises(NodeDisconnected) as err:
            client.send("me", "child", "echo", 1)
        assert time.monotonic() - start < timeout
        seen.append(err.value.delivered)
    return seen


def test_a_sigkilled_peer_never_makes_send_hang(transports: Make,
                                                child: Callable[[], tuple[subprocess.Popen[str], str]]) -> None:
    """A SIGKILLed peer: every send fails within the timeout; the call it was handling is "unknown" (None).

    The first sends after the kill may still meet the dead connection before gRPC has
    noticed it closed ("Stream removed": None, conservatively); then connecting is refused
    (False).  A client without a connection to the dead port gets False at once.
    """
    timeout = 5.0
    client = transports(default_timeout=timeout)
    # killed while idle
    proc, address = child()
    client.set_peer("child", address)
    assert client.send("me", "child", "echo", {"x": 1}) == {"x": 1}
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    seen = _send_until_refused(client, timeout)
    assert set(seen[:-1]) <= {None} and seen[-1] is False
    fresh = transports(peers={"child": address}, default_timeout=timeout)
    with pytest.raises(NodeDisconnected) as dead:
        fresh.send("me", "child", "echo", 2)
    assert dead.value.delivered is False
    # killed while handling
    proc, address = child()
    client.set_peer("child", address)
    assert client.send("me", "child", "echo", 3) == 3

    def kill_once_handling() -> None:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() == "handling":
            os.kill(proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_handling)
    killer.start()
    start = time.monotonic()
    with pytest.raises(NodeDisconnected) as mid:
        client.send("me", "child", "slow", 30)
    assert time.monotonic() - start < timeout and mid.value.delivered is None
    killer.join(10)
    seen = _send_until_refused(client, timeout)
    assert set(seen[:-1]) <= {None} and seen[-1] is False
