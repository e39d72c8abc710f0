"""One node's link to the in-process transport, with the surface of a network transport (issue 42).

A node process (:class:`~shardstore.engine.node.process.NodeProcess`) talks to its peers
through a :class:`~shardstore.net.flight.FlightTransport`: it hosts one node, keeps an
address book (``set_peer``, ``remove_peer``, ``peers``), reaches a seed host through an
alias before it knows the name behind it, and closes.  :class:`LocalLink` gives a node
the same surface over the shared in-process :class:`~shardstore.transport.Transport`, so
that N instances of the production roles run in one Python process (the embedded
launcher, :mod:`shardstore.engine.cluster`), as Elasticsearch's internal cluster tests
run production node code in one JVM.  Faults stay the shared transport's (partitions,
drops, delays, hooks); the addresses are the node names.

A link can be *severed* (:meth:`sever`): every message to its node then fails with
:class:`~shardstore.transport.NodeDisconnected` at once, as after a SIGKILL, and every
message from it with :class:`~shardstore.transport.TransportClosed`, which no retry loop
catches: a handler of the dead node still running in a caller's thread ends at its next
send instead of retrying until its deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from shardstore.transport import ActionStats, Handler, NodeNotFound, Transport, TransportClosed, call_timeout


class LocalLink:
    """A node's view of the in-process transport: register one node, an address book, close (see above)."""

    def __init__(self, transport: Transport, *, default_timeout: float | None = None,
                 action_timeouts: Mapping[str, float] | None = None) -> None:
        self._transport = transport
        self.default_timeout = default_timeout
        self.action_timeouts: dict[str, float] = dict(action_timeouts or {})
        self._lock = threading.Lock()
        self._peers: dict[str, str] = {}
        self._node: str | None = None
        self._severed = False

    @property
    def address(self) -> str | None:
        """The node's address: its name (None before ``register``)."""
        return self._node

    def register(self, node: str, handler: Handler) -> None:
        """Host ``node`` on the shared transport."""
        self._transport.register(node, handler)
        self._node = node

    def unregister(self, node: str, wait: float | None = None) -> bool:
        """Stop hosting ``node``: messages to it fail from now on (``wait`` is accepted for symmetry)."""
        if node != self._node:
            raise NodeNotFound(node)
        self._node = None
        if self._transport.is_registered(node):
            self._transport.unregister(node)
        return True

    def sever(self) -> None:
        """Fail every message from or to this node from now on, and unregister it (a SIGKILL)."""
        self._severed = True
        if self._node is not None and self._transport.is_registered(self._node):
            self._transport.unregister(self._node)

    def set_peer(self, name: str, address: str) -> None:
        """Reach ``name`` (a node, or a seed alias) at node ``address``."""
        with self._lock:
            self._peers[name] = address

    def remove_peer(self, name: str) -> None:
        """Drop ``name`` from the address book (raise NodeNotFound if absent)."""
        with self._lock:
            if self._peers.pop(name, None) is None:
                raise NodeNotFound(name)

    def reconnect(self, name: str) -> None:
        """Nothing to redial in one process."""

    def peers(self) -> dict[str, str]:
        """A copy of the address book: name -> node."""
        with self._lock:
            return dict(self._peers)

    def send(self, sender: str, target: str, action: str, request: Any, timeout: float | None = None) -> Any:
        """``request`` to the node ``target`` names (an alias resolved through the address book)."""
        with self._lock:
            node = self._peers.get(target, target)
        if self._severed:  # a killed node's handler still running in a caller's thread: it is gone, so it stops here
            raise TransportClosed(sender, action)
        return self._transport.send(sender, node, action, request, timeout=self.timeout_for(action, timeout))

    def timeout_for(self, action: str, timeout: float | None = None) -> float | None:
        """The deadline of a call: ``timeout``, else the first matching ``action_timeouts`` glob, else the default."""
        return call_timeout(action, timeout, self.action_timeouts, self.default_timeout)

    def stats(self) -> dict[str, ActionStats]:
        """The shared transport's per-action counters."""
        return self._transport.stats()

    def close(self, wait: float | None = None) -> bool:
        """Unregister the node if it is still hosted."""
        if self._node is not None:
            return self.unregister(self._node, wait)
        return True
