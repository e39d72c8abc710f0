"""A network transport over Arrow Flight, with the interface of :class:`shardstore.transport.Transport`.

One :class:`FlightTransport` per process: it hosts zero or one local node (``register``
starts a Flight server on ``listen`` serving that node's handler) and sends to peers named
in its address book (``set_peer``).  Engine code written against ``register``,
``unregister``, ``send``, ``nodes``, ``is_registered`` and ``default_timeout`` takes either.

A request travels as one wire frame (:mod:`shardstore.net.wire`): the caller encodes
``request`` with ``{"sender", "target"}`` meta, the server decodes it, calls
``handler(action, request)`` on one of gRPC's server threads, and answers with the encoded
response or the encoded exception, which the caller raises (same class for shardstore
errors, :class:`~shardstore.net.wire.RemoteError` otherwise).  Frames under
:data:`EXCHANGE_OVER` bytes go as a Flight ``do_action`` (action type = the action name,
body = the frame, one ``Result`` = the reply frame); larger frames, and actions matching
``exchange_actions``, go as a ``do_exchange`` carrying the frame as the single cell of a
``large_binary`` record batch, which gRPC sends without the protobuf copies of an action
body (measured: the two cross near 160 KiB; at 2.4 MB the exchange is 2.5x faster; see
``docs/design/transport.md``).  The reply takes the request's route, so an action with a
small request and a large response belongs in ``exchange_actions``.  A send to the local
node goes over loopback like any other (same timeouts, auth and codec; ~0.5 ms).

Errors, and what ``delivered`` means on the caller's side (:class:`NodeDisconnected`):

- unknown name (not in the address book): :class:`UnknownPeer` (a ``NodeDisconnected`` and a
  ``NodeNotFound``), ``delivered=False``;
- connection refused / no server listening / TLS handshake refused: ``delivered=False``;
- the server refused before the handler (it hosts another node than the target, or none):
  ``delivered=False``; a target named ``ANY_NODE + anything`` is accepted by whichever node
  listens at its address; an undecodable or newer-version frame comes back as the codec's own
  error (``WireCorrupted``, ``WireVersionUnsupported``), nothing applied;
- a missing or wrong cluster secret: :class:`~shardstore.net.security.TransportAuthError`
  (not retryable, nothing applied);
- deadline exceeded (``FlightTimedOutError``) or the connection broke mid-call (e.g. the
  peer was SIGKILLed while handling): ``delivered=None`` (unknown: it may have been applied);
- the handler ran but its response cannot be read (or the node was unregistered while
  handling it): ``delivered=True``.

Connections: one ``FlightClient`` per peer address, created on first use and shared by all
threads (a gRPC channel is thread-safe); ``clients_created`` counts them.  gRPC's reconnect
backoff is capped at 1 s so a restarted peer is reachable again within about a second.
Every call carries a deadline: ``timeout`` if given, else the first ``action_timeouts`` glob
matching the action (dict order), else ``default_timeout``.
"""

from __future__ import annotations

import fnmatch
import struct
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from shardstore.errors import ShardstoreError
from shardstore.net import wire
from shardstore.net.security import Security, TransportAuthError, check_secret
from shardstore.transport import (
    ActionStats,
    Handler,
    InvalidTransportRequest,
    NodeDisconnected,
    NodeNotFound,
    call_timeout,
)

#: Request frames of at least this many bytes go as ``do_exchange`` rather than ``do_action``.
EXCHANGE_OVER = 128 * 1024
DEFAULT_TIMEOUT = 30.0
#: gRPC channel options of every client: reconnect to a restarted peer within ~1 s.
GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: Python threads that run handlers; a handler may wait on calls to other nodes, which may call back
SERVER_WORKERS = 128
_CELL_SCHEMA = pa.schema([("frame", pa.large_binary())])
#: Substrings of an UNAVAILABLE error that mean no connection was made (the request never left).
_NOT_CONNECTED = ("failed to connect", "connection refused", "dns resolution", "name resolution",
                  "handshake", "certificate", "no route to host", "network is unreachable")

_thread = threading.local()


#: a peer name starting with this names whatever node listens at its address (discovery, clients):
#: ``"@127.0.0.1:9400"`` is answered by the node there, whatever its name
ANY_NODE = "@"


class UnknownPeer(NodeDisconnected, NodeNotFound):
    """No address is known for the target node; the request was not sent (``delivered=False``)."""

    def __init__(self, sender: str, target: str, action: str) -> None:
        reason = f"no address known for node {target!r} (FlightTransport.set_peer)"
        ShardstoreError.__init__(
            self, f"[{action}] {sender} -> {target}: {reason}; the request was not delivered, nothing was applied")
        self.sender = sender
        self.target = target
        self.action = action
        self.reason = reason
        self.delivered = False
        self.node = target


class ListenFailed(InvalidTransportRequest):
    """The Flight server could not listen on the address asked for (in use, not local...)."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) as ``(host, port)``; raise InvalidTransportRequest if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidTransportRequest(f"an address must be 'host:port', not {address!r}")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cell(frame: bytes) -> pa.RecordBatch:
    """A frame as the single cell of a large_binary batch (no copy of the frame)."""
    offsets = pa.py_buffer(struct.pack("<qq", 0, len(frame)))
    arr = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(frame)])
    return pa.RecordBatch.from_arrays([arr], schema=_CELL_SCHEMA)


def _uncell(batch: pa.RecordBatch | None) -> pa.Buffer:
    """The frame carried by :func:`_cell`'s batch (no copy)."""
    if batch is None or batch.num_rows != 1 or not batch.schema.equals(_CELL_SCHEMA):
        raise wire.WireCorrupted("an exchange must carry one batch of one large_binary cell")
    arr = batch.column(0)
    _, offsets, data = arr.buffers()
    start, end = struct.unpack_from("<qq", offsets, arr.offset * 8)
    return data.slice(start, end - start)


def _flight_reason(exc: BaseException) -> str:
    """The first line of a Flight error's message, without pyarrow's prefix."""
    text = str(exc).split("\n", 1)[0]
    marker = "with message: "
    text = text.split(marker, 1)[1] if marker in text else text
    return text.split(". Detail:", 1)[0]


@dataclass
class _Local:
    node: str
    handler: Handler
    server: _FlightServer
    address: str
    token: object = field(default_factory=object)


class _FlightServer(flight.FlightServerBase):
    """Serves the local node's handler: ``do_action`` for small frames, ``do_exchange`` for big ones."""

    def __init__(self, owner: FlightTransport, location: str, **options: Any) -> None:
        self._owner = owner  # set first: the server serves as soon as the base class is initialised
        super().__init__(location, **options)

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> list[flight.Result]:
        check_secret(context)
        reply = self._owner._serve_on_worker(action.type, action.body)
        return [flight.Result(pa.py_buffer(reply))]

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader, writer: flight.MetadataRecordBatchWriter) -> None:
        check_secret(context)
        try:
            frame = _uncell(reader.read_chunk().data)
            action = (descriptor.command or b"").decode()
        except (wire.WireCorrupted, UnicodeDecodeError, pa.ArrowException) as exc:
            reply = wire.encode_error(exc if isinstance(exc, wire.WireError) else wire.WireCorrupted(str(exc)))
        else:
            reply = self._owner._serve_on_worker(action, frame)
        writer.begin(_CELL_SCHEMA)
        writer.write_batch(_cell(reply))
        writer.close()

    def list_actions(self, context: flight.ServerCallContext) -> list[Any]:
        return []


class FlightTransport:
    """Network transport over Arrow Flight: one local node (optional) and an address book of peers."""

    def __init__(
        self,
        listen: str = "127.0.0.1:0",
        *,
        peers: Mapping[str, str] | None = None,
        security: Security | None = None,
        default_timeout: float | None = DEFAULT_TIMEOUT,
        action_timeouts: Mapping[str, float] | None = None,
        exchange_over: int = EXCHANGE_OVER,
        exchange_actions: Iterable[str] = (),
    ) -> None:
        split_address(listen)
        self.listen = listen
        self.security = security or Security()
        self.default_timeout = default_timeout
        self.action_timeouts: dict[str, float] = dict(action_timeouts or {})
        self.exchange_over = exchange_over
        self.exchange_actions = tuple(exchange_actions)
        self._client_options = self.security.client_options()  # reads the PEM files now: errors surface here
        self._lock = threading.RLock()
        self._peers: dict[str, str] = {}
        self._clients: dict[str, flight.FlightClient] = {}
        self._local: _Local | None = None
        self._stats: dict[str, ActionStats] = {}
        self._workers: ThreadPoolExecutor | None = None  # handlers run here (see _serve_on_worker)
        self.clients_created = 0
        for name, address in (peers or {}).items():
            self.set_peer(name, address)

    # -- nodes and peers ------------------------------------------------------------------------

    @property
    def address(self) -> str | None:
        """``"host:port"`` the local node listens on (None before ``register``)."""
        local = self._local
        return local.address if local is not None else None

    @property
    def local_node(self) -> str | None:
        """The name of the node this transport hosts (None if none)."""
        local = self._local
        return local.node if local is not None else None

    def register(self, node: str, handler: Handler) -> None:
        """Host ``node``: start a Flight server on ``listen`` answering with ``handler(action, request)``."""
        if not isinstance(node, str) or not node:
            raise InvalidTransportRequest(f"a node name must be a non-empty string, not {node!r}")
        if not callable(handler):
            raise InvalidTransportRequest(f"the handler of node {node!r} is not callable")
        with self._lock:
            if self._local is not None:
                raise InvalidTransportRequest(
                    f"this FlightTransport hosts node {self._local.node!r} already (one node per transport)")
            host, port = split_address(self.listen)
            self.security.check_bind(host)
            options = self.security.server_options()
            try:
                server = _FlightServer(self, f"{self.security.scheme}://{_join(host, port)}", **options)
            except (pa.ArrowException, OSError) as exc:
                raise ListenFailed(f"node {node!r} cannot listen on {self.listen}: {_flight_reason(exc)}") from exc
            self._local = _Local(node, handler, server, _join(host, server.port))

    def unregister(self, node: str, wait: float | None = None) -> bool:
        """Stop hosting ``node``: new calls are refused, in-flight ones lose their responses; the server stops.

        The server's shutdown waits for the calls it is serving; with ``wait`` it runs on a daemon
        thread and this returns after at most ``wait`` seconds.  True once the server stopped.
        """
        with self._lock:
            local = self._local
            if local is None or local.node != node:
                raise NodeNotFound(node)
            self._local = None
        if getattr(_thread, "serving", False) or wait is not None:  # a handler's own call would never finish
            stopper = threading.Thread(target=local.server.shutdown, name=f"flight-shutdown-{node}", daemon=True)
            stopper.start()
            if wait is None:
                return False
            stopper.join(wait)
            return not stopper.is_alive()
        local.server.shutdown()
        return True

    def nodes(self) -> frozenset[str]:
        """The names this transport can send to: the local node and the address book."""
        with self._lock:
            local = {self._local.node} if self._local is not None else set()
            return frozenset(self._peers) | local

    def is_registered(self, node: str) -> bool:
        """Whether ``node`` is the local node or in the address book (reachability shows at ``send``)."""
        with self._lock:
            return node in self._peers or (self._local is not None and self._local.node == node)

    def set_peer(self, name: str, address: str) -> None:
        """Name the ``"host:port"`` at which peer ``name`` listens (replaces an earlier address)."""
        if not isinstance(name, str) or not name:
            raise InvalidTransportRequest(f"a node name must be a non-empty string, not {name!r}")
        host, port = split_address(address)
        with self._lock:
            old = self._peers.get(name)
            self._peers[name] = _join(host, port)
            if old is not None and old != self._peers[name]:
                self._forget_client(old)

    def remove_peer(self, name: str) -> None:
        """Drop ``name`` from the address book (raise NodeNotFound if absent)."""
        with self._lock:
            old = self._peers.pop(name, None)
            if old is None:
                raise NodeNotFound(name)
            self._forget_client(old)

    def reconnect(self, name: str) -> None:
        """Drop the pooled connection to peer ``name``: the next call dials anew (a restarted peer is reached
        at once instead of after the failing channel's reconnect backoff).  Calls in flight finish."""
        with self._lock:
            address = self._peers.get(name)
            if address is not None:
                self._clients.pop(address, None)

    def peers(self) -> dict[str, str]:
        """A copy of the address book: node name -> ``"host:port"``."""
        with self._lock:
            return dict(self._peers)

    def _forget_client(self, address: str) -> None:
        """Drop the pooled client of an address no name uses any more (lock held; calls in flight finish)."""
        if address not in self._peers.values():
            self._clients.pop(address, None)

    def _client(self, address: str) -> flight.FlightClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = flight.FlightClient(f"{self.security.scheme}://{address}", generic_options=GRPC_OPTIONS,
                                             **self._client_options)
                self._clients[address] = client
                self.clients_created += 1
            return client

    def close(self, wait: float | None = None) -> bool:
        """Unregister the local node (if any; ``wait``: see :meth:`unregister`) and close every pooled
        connection.  False when the server still serves a call after ``wait`` seconds (a handler waiting
        on a peer that stopped answering): the caller may exit without it."""
        local = self._local
        stopped = self.unregister(local.node, wait) if local is not None else True
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            workers, self._workers = self._workers, None
        if stopped:
            for client in clients:
                client.close()
        if workers is not None:
            workers.shutdown(wait=False)
        return stopped

    def __enter__(self) -> FlightTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- counters ---------------------------------------------------------------------------------

    def stats(self) -> dict[str, ActionStats]:
        """Per-action counters: sent/responded/errors/disconnected/timed_out as a caller, delivered as a server."""
        with self._lock:
            return {action: ActionStats(**vars(s)) for action, s in self._stats.items()}

    def _count(self, action: str, what: str) -> None:
        with self._lock:
            st = self._stats.setdefault(action, ActionStats())
            setattr(st, what, getattr(st, what) + 1)

    # -- sending ----------------------------------------------------------------------------------

    def timeout_for(self, action: str, timeout: float | None = None) -> float | None:
        """The deadline of a call: ``timeout``, else the first matching ``action_timeouts`` glob, else the default."""
        return call_timeout(action, timeout, self.action_timeouts, self.default_timeout)

    def _address_of(self, sender: str, target: str, action: str) -> str:
        with self._lock:
            local = self._local
            if local is not None and local.node == target:
                return local.address
            address = self._peers.get(target)
        if address is None:
            raise UnknownPeer(sender, target, action)
        return address

    def send(self, sender: str, target: str, action: str, request: Any, timeout: float | None = None) -> Any:
        """Deliver ``request`` to ``target``'s handler over Flight and return its response (see the module doc)."""
        self._count(action, "sent")
        try:
            address = self._address_of(sender, target, action)
        except UnknownPeer:
            self._count(action, "disconnected")
            raise
        seconds = self.timeout_for(action, timeout)
        frame = wire.encode(request, meta={"sender": sender, "target": target})
        client = self._client(address)
        options = flight.FlightCallOptions(timeout=seconds)
        try:
            if len(frame) >= self.exchange_over or any(fnmatch.fnmatchcase(action, g) for g in self.exchange_actions):
                reply = self._exchange(client, action, frame, options)
            else:
                results = list(client.do_action(flight.Action(action, frame), options=options))
                if len(results) != 1:
                    raise wire.WireCorrupted(f"expected one result, got {len(results)}")
                reply = results[0].body
        except (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError) as exc:
            self._count(action, "disconnected")
            raise TransportAuthError(sender, target, action, _flight_reason(exc)) from None
        except flight.FlightTimedOutError:
            self._count(action, "timed_out")
            self._count(action, "disconnected")
            raise NodeDisconnected(sender, target, action, f"no response within {seconds}s (at {address})",
                                   delivered=None) from None
        except flight.FlightUnavailableError as exc:
            reason = _flight_reason(exc)
            delivered = False if any(m in reason.lower() for m in _NOT_CONNECTED) else None
            self._count(action, "disconnected")
            raise NodeDisconnected(sender, target, action, f"{address} unavailable: {reason}",
                                   delivered=delivered) from None
        except wire.WireCorrupted as exc:
            self._count(action, "disconnected")
            raise NodeDisconnected(sender, target, action, f"the response is unreadable: {exc}",
                                   delivered=True) from exc
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            self._count(action, "disconnected")
            raise NodeDisconnected(sender, target, action, f"{type(exc).__name__}: {_flight_reason(exc)}",
                                   delivered=None) from exc
        try:
            message = wire.decode(reply)
        except wire.WireError as exc:
            self._count(action, "disconnected")
            raise NodeDisconnected(sender, target, action, f"the response is unreadable: {exc}",
                                   delivered=True) from exc
        self._count(action, "responded")
        if message.error is not None:
            self._count(action, "errors")
        return message.result()

    @staticmethod
    def _exchange(client: flight.FlightClient, action: str, frame: bytes,
                  options: flight.FlightCallOptions) -> pa.Buffer:
        writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(action.encode()), options=options)
        try:
            writer.begin(_CELL_SCHEMA)
            writer.write_batch(_cell(frame))
            writer.done_writing()
            return _uncell(reader.read_chunk().data)
        finally:
            writer.close()

    # -- serving ----------------------------------------------------------------------------------

    def _serve_on_worker(self, action: str, frame: pa.Buffer) -> bytes:
        """Run :meth:`_serve` on one of this transport's Python worker threads and wait for it.

        gRPC's server threads are not Python threads: each call gets a fresh Python thread state,
        cleared when the call returns, and clearing one that holds thread-local objects (ours, the
        translog's frame writers, any library's) corrupted the heap in CPython 3.11
        (``_PyTrash_end`` writing into the freed state, found with valgrind: "double free or
        corruption" in a node process under a 1,000-row replicated bulk).  Handlers therefore run
        on long-lived Python threads, whose thread states live as long as the transport.
        """
        with self._lock:
            if self._workers is None:
                self._workers = ThreadPoolExecutor(max_workers=SERVER_WORKERS, thread_name_prefix="flight-handler")
            workers = self._workers
        return workers.submit(self._serve, action, frame).result()

    def _serve(self, action: str, frame: pa.Buffer) -> bytes:
        """Decode a request, run the local handler, encode its response or exception (server threads)."""
        local = self._local
        try:
            message = wire.decode(frame)
        except wire.WireError as exc:  # refused before the handler: nothing applied
            return wire.encode_error(exc)
        sender, target = str(message.meta.get("sender")), str(message.meta.get("target"))
        if message.error is not None:
            return wire.encode_error(wire.WireCorrupted("a request frame carries an exception"))
        if local is None or (local.node != target and not target.startswith(ANY_NODE)):
            here = f"node {local.node!r}" if local is not None else "no node"
            return wire.encode_error(NodeDisconnected(
                sender, target, action, f"this address hosts {here}, not {target!r}", delivered=False))
        self._count(action, "delivered")
        _thread.serving = True
        try:
            try:
                response = local.handler(action, message.value)
            except BaseException as exc:  # noqa: BLE001 - travels back to the caller
                reply = wire.encode_error(exc)
            else:
                try:
                    reply = wire.encode(response)
                except wire.WireUnencodable as exc:
                    reply = wire.encode_error(wire.WireUnencodable(
                        f"the response of [{action}] from {target} (the handler ran): {exc.reason}"))
        finally:
            _thread.serving = False
        if self._local is not local:
            return wire.encode_error(NodeDisconnected(
                sender, target, action, f"node {target!r} was unregistered before it responded", delivered=True))
        return reply

    def __repr__(self) -> str:
        return f"FlightTransport(node={self.local_node!r}, address={self.address!r}, peers={sorted(self._peers)})"
